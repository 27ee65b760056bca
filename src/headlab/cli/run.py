"""What the entry scripts run, one function per script; ``mode=`` picks the ablate stage."""

from __future__ import annotations

from typing import Any

from hydra.core.hydra_config import HydraConfig

from headlab.demo import run_demo
from headlab.training import check_train_config, run_finetuning

ABLATE_MODES = {"demo": run_demo}


def _output_dir() -> str:
    return HydraConfig.get().runtime.output_dir


def run_ablate(cfg: Any) -> Any:
    if cfg.mode not in ABLATE_MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}; valid modes: {', '.join(ABLATE_MODES)}")
    return ABLATE_MODES[cfg.mode](cfg, _output_dir())


def run_train(cfg: Any) -> dict[str, Any]:
    """Fine-tune (see ``headlab.training``); every check runs before a model loads."""
    check_train_config(cfg)
    return run_finetuning(cfg, _output_dir())
