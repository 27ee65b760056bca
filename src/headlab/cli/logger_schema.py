"""The ``logger`` group of ``conf/train.yaml`` and ``conf/ablate.yaml`` (``conf/logger/``): one schema per logger."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class WandbLoggerConfig:
    """``logger=wandb``: Weights & Biases (offline by default)."""

    _target_: str = "lightning.pytorch.loggers.WandbLogger"
    project: str = "headlab"
    entity: str | None = None
    offline: bool = True
    group: str | None = None
    job_type: str | None = None
    name: str | None = None  # null: TASK-MODEL-HASH
    id: str | None = None  # null: the job's config hash
    tags: list[str] = field(default_factory=list)
    save_dir: str = "."
    settings: dict[str, Any] | None = None  # wandb.Settings fields for wandb.init ({silent: false}: W&B's own lines)


@dataclass
class CSVLoggerConfig:
    """``logger=csv``: metrics as CSV files in the job directory."""

    _target_: str = "lightning.pytorch.loggers.CSVLogger"
    save_dir: str = "."
    name: str = "csv"


@dataclass
class NoLoggerConfig:
    """``logger=none``."""

    _target_: str | None = None
