"""The ``gates`` section of ``conf/ablate.yaml`` (``mode=gates``, docs/gates.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from headlab.errors import UserError, at_least, one_of

# l0: Voita et al. 2019's hard concrete gates; chg: causal head gating (Nam et al. 2025); optimal: the constants of
# optimal ablation (Li & Janson 2024)
GATE_METHODS = ("l0", "chg", "optimal")
METHOD_DEFAULTS = {"l0": {"lr": 0.1, "max_steps": 300}, "chg": {"lr": 1.0, "max_steps": 500},
                   "optimal": {"lr": 0.01, "max_steps": 500}}  # where gates.lr / gates.max_steps are null


@dataclass
class GatesConfig:
    """Learned head gates on a fine-tuned model: the method, its penalties, and the fit's data and steps."""

    method: str = "l0"
    lambdas: list[float] = field(default_factory=lambda: [0.001, 0.003, 0.01, 0.03])  # l0: one fit per penalty
    train_model: bool = False  # the model trains with its gates (Voita et al.'s setting); false: frozen
    init: float = 0.0  # l0: log alpha at the start (Louizos et al.'s and Voita et al.'s: about 0)
    chg_lambda: float = 0.1  # chg: the regulariser's weight (+ toward retention, - toward removal)
    chg_fits: int = 3  # chg: independent fits (seeds seed, seed + 1, ...): the classes' stability
    chg_threshold: float = 0.5  # chg: a gate at or above it is high
    lr: float | None = None  # Adam's learning rate for the gates (null: l0 0.1, chg 1.0; the model keeps optim.lr)
    max_steps: int | None = None  # optimizer steps of each fit (chg: of each of its three stages; null: 300, 500)
    split: str = "train"  # the data the gates are fit on: never an evaluation split
    max_examples: int | None = 2000  # its first N examples (null: all)
    checkpoint_every: int = 50  # steps between the checkpoints a killed fit resumes from
    prune_curve: str | None = None  # a mode=prune_curve job of the same checkpoint: its curves on the figure

    def __post_init__(self) -> None:
        one_of("gates.method", self.method, GATE_METHODS)
        if not self.lambdas:
            raise UserError("gates.lambdas=[] names no penalty: give one or more, e.g. gates.lambdas=[0.01]")
        for index, value in enumerate(self.lambdas):
            if not math.isfinite(value) or value < 0:
                raise UserError(f"gates.lambdas[{index}]={value!r}: a penalty per expected open gate must be a "
                                "finite number >= 0 (a negative one would reward open gates)")
        if len(set(self.lambdas)) != len(self.lambdas):
            raise UserError(f"gates.lambdas={list(self.lambdas)} names a penalty twice (one fit counted twice)")
        if not math.isfinite(self.init):
            raise UserError(f"gates.init={self.init!r} must be a finite log alpha")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"gates.lr={self.lr!r} must be a positive learning rate (or null: the method's)")
        at_least("gates.max_steps", self.max_steps, 1, allow_none=True)
        if not (math.isfinite(self.chg_lambda) and self.chg_lambda > 0):
            raise UserError(f"gates.chg_lambda={self.chg_lambda!r} must be above 0: the fits use +lambda (toward "
                            "retention) and -lambda (toward removal)")
        at_least("gates.chg_fits", self.chg_fits, 1)
        if not 0 < self.chg_threshold < 1:
            raise UserError(f"gates.chg_threshold={self.chg_threshold!r} must be a gate value in (0, 1)")
        at_least("gates.max_examples", self.max_examples, 1, allow_none=True)
        at_least("gates.checkpoint_every", self.checkpoint_every, 1)


def method_setting(gates, key: str):
    """``gates.lr`` / ``gates.max_steps``, or the method's default where null."""
    value = gates[key]
    return METHOD_DEFAULTS[gates.method][key] if value is None else value
