"""How many training batches an epoch has, and whether an integer ``trainer.val_check_interval`` fits in one:
plain arithmetic (no torch, no Lightning), asked before anything loads when the number of training examples is
known from the files, and again once the data are tokenized."""

from __future__ import annotations

import math
from typing import Any

from headlab.errors import UserError


def check_val_check_interval(trainer_cfg: Any, num_train: int, batch_size: int, world_size: int) -> None:
    """An integer ``val_check_interval`` must fit in an epoch unless it counts across epochs (Lightning says so
    only once the model is loaded, with a traceback)."""
    interval, limit = trainer_cfg.val_check_interval, trainer_cfg.limit_train_batches
    if not isinstance(interval, int) or isinstance(interval, bool) or trainer_cfg.check_val_every_n_epoch is None:
        return
    batches = math.ceil(math.ceil(num_train / world_size) / batch_size)  # per process, as the sampler shards
    if isinstance(limit, int) and not isinstance(limit, bool):
        batches = min(batches, limit)
    elif isinstance(limit, float):
        batches = int(batches * limit)
    if interval > batches:
        raise UserError(f"trainer.val_check_interval={interval} is more than the {batches} training batches of an "
                        f"epoch: use at most {batches}, a fraction of an epoch (e.g. 0.5), or "
                        "trainer.check_val_every_n_epoch=null to count batches across epochs")


def world_size(trainer_cfg: Any) -> int | None:
    """The number of training processes a config asks for, where it says so without looking at the machine."""
    devices = trainer_cfg.devices
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        return None  # auto, -1 (all), a list of devices: known once Lightning looks
    return devices * trainer_cfg.num_nodes
