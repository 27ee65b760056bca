"""The analysis modes of ``ablate.py``: the registry, and one check and one run of a mode.

Every mode's module exposes the same two functions: ``check(cfg)``, every check that needs no weights (a bad
value is one ``error:`` line, not a traceback after minutes), and ``run(cfg, out_dir)``, the mode's job in
``out_dir``. ``ablate.py`` and the study (``headlab.study``) both go through ``check_mode`` and ``run_mode``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

# mode -> its module (with torch, loaded once the config's groups are checked)
ANALYSIS_MODES = {
    "eval": "headlab.analysis.evaluation.eval_run",
    "sweep_heads": "headlab.analysis.evaluation.sweep_heads",
    "importance": "headlab.analysis.importance.importance_run",
    "prune_curve": "headlab.analysis.importance.prune_curve",
    "features": "headlab.analysis.types.features_run",
    "cluster": "headlab.analysis.types.cluster_run",
    "compare": "headlab.analysis.types.compare_run",
    "syntax": "headlab.analysis.syntax.syntax_run",
    "report": "headlab.analysis.evaluation.report_run",
    "demo": "headlab.analysis.evaluation.demo",
}


def mode_module(mode: str) -> ModuleType:
    return importlib.import_module(ANALYSIS_MODES[mode])


def check_mode(cfg: Any) -> None:
    """``cfg.mode``'s ``check(cfg)`` (the groups' types and ranges were checked by ``check_config``)."""
    mode_module(cfg.mode).check(cfg)


def run_mode(cfg: Any, out_dir: str | Path) -> Any:
    """``cfg.mode``'s ``run(cfg, out_dir)`` (a config that passed ``check_mode``)."""
    return mode_module(cfg.mode).run(cfg, out_dir)
