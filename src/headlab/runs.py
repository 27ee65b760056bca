"""What the entry scripts run, one function per script; ``mode=`` picks the ablate stage."""

from __future__ import annotations

from typing import Any

from hydra.core.hydra_config import HydraConfig
from rich.console import Console

from headlab.config import check_mask, plan_from_mask
from headlab.demo import run_demo
from headlab.models import load_model, model_shape

ABLATE_MODES = {"demo": run_demo}


def _output_dir() -> str:
    return HydraConfig.get().runtime.output_dir


def run_ablate(cfg: Any) -> Any:
    if cfg.mode not in ABLATE_MODES:
        raise ValueError(f"unknown mode {cfg.mode!r}; valid modes: {', '.join(ABLATE_MODES)}")
    return ABLATE_MODES[cfg.mode](cfg, _output_dir())


def run_train(cfg: Any) -> None:
    """Checks the model and the head plan a fine-tuning run would use (fine-tuning: issue #3)."""
    check_mask(cfg.mask)
    plan = plan_from_mask(cfg.mask, *model_shape(cfg.model))
    model = load_model(cfg.model)
    Console().print(
        f"model {cfg.model.name}: {type(model).__name__}, {plan.num_layers} layers x {plan.num_heads} heads; "
        f"plan: {plan.describe()}; output dir {_output_dir()}"
    )
