"""The ``shapley`` section of ``conf/ablate.yaml`` (``mode=shapley``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from headlab.errors import UserError, at_least, one_of, within
from headlab.reporting.settings import MAX_RESAMPLES, RESAMPLES_WHY

OVER = ("types", "layers", "heads")  # the players: head types (mask.clusters), layers, single heads
REMOVALS = ("prune", "uniform", "mean", "resample", "optimal")  # how a group outside the coalition loses its heads
EXACT_LIMIT = 12  # at most this many groups: all 2^k coalitions (4096)


@dataclass
class ShapleyConfig:
    """Shapley values of head groups: exact over up to ``EXACT_LIMIT`` groups, else by permutation sampling."""

    over: str = "types"  # types (the labels of mask.clusters) | layers | heads
    policy: str = "prune"  # removal: prune | uniform | mean | resample (mask.reference ...) | optimal (mask.constants)
    score: str | None = None  # per-example score: accuracy | exact_match | f1 | loss (null: main metric, else loss)
    target_se: float | None = None  # sampling: stop once every value's standard error is at most this
    max_permutations: int = 200  # sampling: at most this many permutations (in antithetic pairs)
    floor: float | None = None  # sampling: a chain stops once its score is no better than this (the rest get 0)
    coalitions_per_batch: int = 0  # coalitions per batched forward (rows stacked); 0: all on a GPU, 1 on a CPU
    resamples: int = 2000  # bootstrap resamples of the examples for the confidence intervals
    confidence: float = 0.95

    def __post_init__(self) -> None:
        one_of("shapley.over", self.over, OVER)
        one_of("shapley.policy", self.policy, REMOVALS)
        if self.target_se is not None and not 0 < self.target_se < math.inf:  # (inf stopped after one pair)
            raise UserError(f"shapley.target_se={self.target_se} must be a number > 0 (or null: exact values only)")
        if self.floor is not None and not math.isfinite(self.floor):  # (nan: never applied)
            raise UserError(f"shapley.floor={self.floor} must be a finite score (or null: no truncation)")
        at_least("shapley.max_permutations", self.max_permutations, 2)
        if self.max_permutations % 2:
            raise UserError(f"shapley.max_permutations={self.max_permutations} must be even: orders are drawn in "
                            "antithetic pairs (an order and its reverse)")
        at_least("shapley.coalitions_per_batch", self.coalitions_per_batch, 0)
        within("shapley.resamples", self.resamples, 100, MAX_RESAMPLES, RESAMPLES_WHY)
        within("shapley.confidence", self.confidence, 0.5, 0.999)
