"""The checks of ``mode=importance`` and ``mode=prune_curve``: no weights read, no torch imported."""

from __future__ import annotations

from typing import Any

from headlab.analysis.jobs.checks import check_estimation, check_evaluation, warn_about_plan
from headlab.core.masks import refuse_substituted
from headlab.errors import UserError


def check_importance(cfg: Any) -> None:
    """The plan, the checkpoint, the estimation split and the sweeps to compare with (no weights read)."""
    plan = check_evaluation(cfg)
    refuse_substituted(plan, "mode=importance")
    check_estimation(cfg)
    warn_about_plan(cfg, plan)


def check_prune_curve(cfg: Any) -> None:
    """The full model's plan, the checkpoint, the estimation split, and that some head can be pruned."""
    plan = check_evaluation(cfg)
    check_estimation(cfg)
    check_curve_start(cfg, plan)
    warn_about_plan(cfg, plan)


def check_curve_start(cfg: Any, plan: Any) -> None:
    """A prune curve starts from the full model and must be able to prune a head."""
    if not plan.is_identity:
        raise UserError(f"mode=prune_curve starts from the full model; the mask changes heads ({plan.describe()}): "
                        "use mask=none")
    if cfg.prune_curve.min_heads_per_layer >= plan.num_heads:
        raise UserError(f"prune_curve.min_heads_per_layer={cfg.prune_curve.min_heads_per_layer}: the model has "
                        f"{plan.num_heads} heads per layer, so none could be pruned (allowed: 0-{plan.num_heads - 1})")
