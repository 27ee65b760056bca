"""The checks of ``mode=shapley``: no weights read, no torch imported."""

from __future__ import annotations

from typing import Any

from headlab.analysis.jobs.checks import check_evaluation
from headlab.analysis.shapley.players import player_groups
from headlab.analysis.shapley.schema import EXACT_LIMIT
from headlab.analysis.shapley.scores import shapley_score
from headlab.core.model_files import model_shape
from headlab.errors import UserError


def check_shapley(cfg: Any) -> None:
    """The full model's plan, the players, the score, and sampling settings past the exact limit."""
    plan = check_evaluation(cfg)  # also: mask.clusters is this model's
    if not plan.is_identity:
        raise UserError(f"mode=shapley builds its own plans (every coalition of head groups); the mask changes heads "
                        f"({plan.describe()}): use mask=none (mask.clusters names the head types)")
    names, _ = player_groups(cfg.shapley.over, model_shape(cfg.model), cfg.mask.clusters)
    if len(names) > EXACT_LIMIT and cfg.shapley.target_se is None:
        raise UserError(f"mode=shapley shapley.over={cfg.shapley.over}: {len(names)} groups are more than the "
                        f"{EXACT_LIMIT} whose 2^k coalitions are evaluated exactly; set shapley.target_se=SE to sample "
                        "permutations (at most shapley.max_permutations)")
    shapley_score(cfg.task, cfg.shapley.score)
