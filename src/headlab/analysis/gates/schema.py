"""The ``gates`` section of ``conf/ablate.yaml`` (``mode=gates``, docs/gates.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from headlab.errors import UserError, at_least, one_of

GATE_METHODS = ("l0",)  # l0: Voita et al. 2019's hard concrete gates


@dataclass
class GatesConfig:
    """Learned head gates on a fine-tuned model: the method, its penalties, and the fit's data and steps."""

    method: str = "l0"
    lambdas: list[float] = field(default_factory=lambda: [0.001, 0.003, 0.01, 0.03])  # l0: one fit per penalty
    train_model: bool = False  # the model trains with its gates (Voita et al.'s setting); false: frozen
    init: float = 0.0  # log alpha at the start (Louizos et al.'s and Voita et al.'s: about 0)
    lr: float = 0.1  # Adam's learning rate for the gates (train_model: the model keeps optim.lr)
    max_steps: int = 300  # optimizer steps of each fit
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
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"gates.lr={self.lr!r} must be a positive learning rate")
        at_least("gates.max_steps", self.max_steps, 1)
        at_least("gates.max_examples", self.max_examples, 1, allow_none=True)
        at_least("gates.checkpoint_every", self.checkpoint_every, 1)
