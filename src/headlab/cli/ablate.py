"""``ablate.py``: ``mode=`` picks the analysis stage; each stage is one function in ``headlab.analysis``."""

from __future__ import annotations

import importlib
from typing import Any

from headlab.cli.hydra_glue import job_dir
from headlab.cli.schema import check_config

# mode -> "module:function"; a stage's module (and torch) loads only when it runs.
MODES = {"demo": "headlab.analysis.demo:run_demo"}


def run_ablate(cfg: Any) -> Any:
    check_config(cfg)
    module, _, function = MODES[cfg.mode].partition(":")
    return getattr(importlib.import_module(module), function)(cfg, job_dir())
