"""The ``importance`` and ``prune_curve`` sections of ``conf/ablate.yaml`` (``mode=importance`` / ``prune_curve``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headlab.core.plans import ESTIMABLE, ESTIMATED, GRANULARITIES
from headlab.errors import UserError, check_seed, one_of

CURVE_POLICIES = ("prune", "uniform", "mean", "resample")  # how a prune curve's heads leave


@dataclass
class ImportanceConfig:
    """Gradient importance: the estimation data, the estimators and their normalisation (DESIGN.md section 4)."""

    split: str = "train"  # estimation split: the task's training split (a subset), or an eval split if you must
    max_examples: int | None = 2000  # the first N examples of the estimation split (null: all)
    granularity: str = "example"  # the estimator the file's "importance" holds: example | token | batch | fisher
    normalize_layer: bool = True  # per-layer L2 normalisation
    normalize_global: bool = True  # then min-max to [0, 1]
    policies: list[str] = field(default_factory=lambda: list(ESTIMATED))  # first-order estimates (+ mean, resample)
    key_types: bool = True  # gradients of the attention weights to [CLS], [SEP], ./, and other keys
    sweep: Any = None  # mode=sweep_heads job directories (one, or a list) of the same checkpoint: agreement
    learned: Any = None  # mode=gates job directories (one, or a list) of the same checkpoint: in the agreement too
    top_k: int = 10  # agreement: overlap of the k most important heads

    def __post_init__(self) -> None:
        one_of("importance.granularity", self.granularity, GRANULARITIES)
        for policy in self.policies:
            one_of("importance.policies entry", policy, ESTIMABLE)
        if self.max_examples is not None and self.max_examples < 1:
            raise UserError(f"importance.max_examples={self.max_examples} must be at least 1 (or null: all)")
        if self.top_k < 1:
            raise UserError(f"importance.top_k={self.top_k} must be at least 1")


@dataclass
class PruneCurveConfig:
    """Iterative pruning by importance (Michel et al. 2019), with random orders as the baseline."""

    estimator: str = "example"  # what ranks the heads: a granularity, or estimate_<policy> (first-order loss change)
    policy: str = "prune"  # how a head leaves: prune (Michel et al.) | uniform | mean | resample (mask.reference ...)
    step: float = 0.1  # fraction of all heads pruned per step
    stop_below: float = 0.9  # stop after the step whose main metric falls below this fraction of the baseline
    min_heads_per_layer: int = 0  # never prune a layer below this many heads (e.g. 1)
    recompute: bool = True  # recompute importance under the current mask after each step (HF); false: once
    random_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # random pruning orders, the baseline
    timing_rounds: int = 5  # final mask physically pruned vs the full model: alternating rounds, median

    def __post_init__(self) -> None:
        one_of("prune_curve.estimator", self.estimator, (*GRANULARITIES, *(f"estimate_{p}" for p in CURVE_POLICIES)))
        one_of("prune_curve.policy", self.policy, CURVE_POLICIES)
        if self.policy == "resample" and self.recompute:
            raise UserError("prune_curve.policy=resample: rescoring the heads under the mask at every step would need "
                            "a forward per draw; set prune_curve.recompute=false (the full model's importance orders "
                            "every step)")
        if not 0 < self.step <= 1:
            raise UserError(f"prune_curve.step={self.step} must be a fraction of the heads in (0, 1]")
        if not 0 <= self.stop_below <= 1:
            raise UserError(f"prune_curve.stop_below={self.stop_below} must be a fraction of the baseline in [0, 1]")
        if self.min_heads_per_layer < 0:
            raise UserError(f"prune_curve.min_heads_per_layer={self.min_heads_per_layer} must be >= 0")
        if self.timing_rounds < 1:
            raise UserError(f"prune_curve.timing_rounds={self.timing_rounds} must be at least 1")
        for index, seed in enumerate(self.random_seeds):  # (a negative one failed after the whole curve had run)
            check_seed(f"prune_curve.random_seeds[{index}]", seed)
        if len(set(self.random_seeds)) != len(self.random_seeds):
            raise UserError(f"prune_curve.random_seeds={list(self.random_seeds)} names a seed twice (its random curve "
                            "would be one curve counted twice)")
