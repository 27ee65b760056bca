"""How many processes a ``trainer`` config starts: what a mode or the study that runs in one process refuses."""

from __future__ import annotations

from typing import Any


def several_processes(trainer: Any) -> bool:
    """Whether a ``trainer`` config starts more than one process (DDP, several devices or nodes)."""
    return "ddp" in str(trainer.strategy) or trainer.num_nodes > 1 or str(trainer.devices) not in ("1", "auto")
