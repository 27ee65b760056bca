"""The ``patch`` section of ``conf/ablate.yaml`` (``mode=patch``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headlab.errors import UserError, at_least, one_of, within
from headlab.reporting.settings import MAX_RESAMPLES, RESAMPLES_WHY

SITE_KINDS = ("head", "attention", "mlp", "residual")  # as headlab.core.activation_sites (no torch here)
DIRECTIONS = ("noising", "denoising")  # noising: the clean run takes the corrupted activation; denoising: reverse
METHODS = ("exact", "attribution", "both")  # patched forwards, first-order estimates (attribution patching), both
POSITIONS = ("all", "each", "units")  # every position at once, each position in turn, or each unit's positions


INPUTS = ("query", "key", "value")  # a receiver head's inputs (path patching)


@dataclass
class PathConfig:
    """Path patching (docs/patching.md): each sender head's paths to the receivers' inputs, or to the output."""

    senders: Any = None  # heads whose paths are patched, each in turn (a selector: L0H1,L2 or [L0H1,L2]); null: none
    receivers: Any = "output"  # heads whose inputs receive the paths (a selector), or output (the model's)
    inputs: list[str] = field(default_factory=lambda: list(INPUTS))  # which inputs of the receivers

    def __post_init__(self) -> None:
        for key in ("senders", "receivers"):  # (Any: a selector may be a list, as plans.md's)
            value = getattr(self, key)
            if not (isinstance(value, str) or (key == "senders" and value is None) or (
                    isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value))):
                raise UserError(f"patch.path.{key}={value!r} is not a head selector: give one such as L0H1,L2 or "
                                "[L0H1,L2]" + (" (or output)" if key == "receivers" else ""))
        if not self.inputs:
            raise UserError(f"patch.path.inputs is empty; give some of {', '.join(INPUTS)}")
        for name in self.inputs:
            one_of("patch.path.inputs", name, INPUTS)
        if len(set(self.inputs)) < len(self.inputs):
            raise UserError(f"patch.path.inputs={list(self.inputs)} names an input twice")


@dataclass
class PatchConfig:
    """Which activations are patched, in which direction, at which positions (docs/patching.md)."""

    pairs: str | None = None  # a data file in the task's format with corrupt_<field> columns (null: the eval split's)
    sites: list[str] = field(default_factory=lambda: list(SITE_KINDS))  # head | attention | mlp | residual
    direction: str = "noising"  # noising | denoising
    positions: str = "all"  # all | each | units
    method: str = "exact"  # exact | attribution | both (the estimates' agreement with the exact effects)
    patches_per_forward: int = 0  # patches stacked in one forward; 0: a layer's on a GPU, 1 on a CPU
    resamples: int = 2000  # bootstrap resamples of the examples (confidence intervals)
    confidence: float = 0.95
    path: PathConfig = field(default_factory=PathConfig)  # path patching instead of the sites, when it has senders

    def __post_init__(self) -> None:
        if not self.sites:
            raise UserError(f"patch.sites is empty; give some of {', '.join(SITE_KINDS)}")
        for kind in self.sites:
            one_of("patch.sites", kind, SITE_KINDS)
        if len(set(self.sites)) < len(self.sites):
            raise UserError(f"patch.sites={list(self.sites)} names a kind twice; give each of "
                            f"{', '.join(SITE_KINDS)} at most once")
        one_of("patch.direction", self.direction, DIRECTIONS)
        one_of("patch.positions", self.positions, POSITIONS)
        one_of("patch.method", self.method, METHODS)
        at_least("patch.patches_per_forward", self.patches_per_forward, 0)
        within("patch.resamples", self.resamples, 100, MAX_RESAMPLES, RESAMPLES_WHY)
        within("patch.confidence", self.confidence, 0.5, 0.999)
