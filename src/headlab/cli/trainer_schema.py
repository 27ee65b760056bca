"""The ``trainer`` group (``conf/trainer/``): the ``lightning.pytorch.Trainer`` arguments a config may set, checked
by Lightning's own rules before Lightning is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headlab.errors import UserError, at_least, one_of

PRECISIONS = ("64-true", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "64", "32", "16", "bf16")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
STRATEGIES = ("auto", "ddp", "ddp_find_unused_parameters_false", "ddp_find_unused_parameters_true", "ddp_fork",
              "ddp_fork_find_unused_parameters_false", "ddp_fork_find_unused_parameters_true", "ddp_notebook",
              "ddp_notebook_find_unused_parameters_false", "ddp_notebook_find_unused_parameters_true", "ddp_spawn",
              "ddp_spawn_find_unused_parameters_false", "ddp_spawn_find_unused_parameters_true", "deepspeed",
              "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
              "deepspeed_stage_3_offload", "deepspeed_stage_3_offload_nvme", "fsdp", "fsdp_cpu_offload",
              "single_device", "single_tpu", "single_xla", "xla", "xla_debug")  # Lightning's registry (a test checks)


SPAWNED = ("ddp_spawn", "ddp_fork", "ddp_notebook")  # DDP whose processes are not started from the command line


def check_devices(accelerator: str, devices: Any) -> None:
    """``trainer.devices`` by Lightning's rules (checked when its Trainer is built, after the imports): on CPU a
    number of processes > 0 or ``auto``; on an accelerator also -1 (all), a list of device indices or ``"0,1"``."""
    given = devices
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, (list, tuple)) or (hasattr(devices, "__len__") and not isinstance(devices, str)):
        valid = accelerator != "cpu" and len(devices) > 0 and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
    elif isinstance(devices, str):
        indices = devices.split(",")
        valid = devices == "auto" or (accelerator != "cpu" and all(index.strip().isdigit() for index in indices))
    else:
        valid = isinstance(devices, int) and (devices > 0 or (devices == -1 and accelerator != "cpu"))
    if not valid:
        allowed = ("a number of processes > 0 or auto" + (" (-1, every GPU, is trainer=ddp's default)" if given == -1
                                                           else "") if accelerator == "cpu" else
                   "a number of devices > 0, -1 (all), auto, a list of device indices or '0,1'")
        raise UserError(f"trainer.devices={given!r} is not valid with trainer.accelerator={accelerator}: "
                        f"give {allowed}")


@dataclass
class TrainerConfig:
    """``trainer/``: ``lightning.pytorch.Trainer`` arguments (any of these as ``trainer.NAME=VALUE``)."""

    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_epochs: int | None = 3
    min_epochs: int | None = None
    max_steps: int = -1
    min_steps: int | None = None
    max_time: str | None = None  # "DD:HH:MM:SS"
    limit_train_batches: Any = None  # a fraction (float) or a number of batches (int)
    limit_val_batches: Any = None
    limit_test_batches: Any = None
    overfit_batches: Any = 0.0
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None
    val_check_interval: Any = None  # a fraction of an epoch (float) or a number of training batches (int)
    check_val_every_n_epoch: int | None = 1
    num_sanity_val_steps: int | None = None
    log_every_n_steps: int | None = None
    deterministic: Any | None = None  # true, false or "warn"
    benchmark: bool | None = None
    enable_progress_bar: bool | None = None
    enable_model_summary: bool | None = None
    fast_dev_run: Any = False
    detect_anomaly: bool = False
    profiler: str | None = None
    sync_batchnorm: bool = False
    reload_dataloaders_every_n_epochs: int = 0

    def __post_init__(self) -> None:
        one_of("trainer.precision", self.precision, PRECISIONS)
        one_of("trainer.accelerator", self.accelerator, ACCELERATORS)
        one_of("trainer.strategy", self.strategy, STRATEGIES)
        if str(self.strategy).startswith(SPAWNED):
            raise UserError(f"trainer.strategy={self.strategy}: headlab's DDP starts its processes from the command "
                            "line (Lightning's ddp); use trainer=ddp (trainer.strategy=ddp)")
        check_devices(self.accelerator, self.devices)
        at_least("trainer.num_nodes", self.num_nodes, 1)
        at_least("trainer.max_steps", self.max_steps, -1)
        if self.max_epochs == -1:
            if self.max_steps <= 0:
                raise UserError("trainer.max_epochs=-1 (no epoch limit) needs trainer.max_steps > 0")
        else:
            at_least("trainer.max_epochs", self.max_epochs, 0, allow_none=True)
        at_least("trainer.accumulate_grad_batches", self.accumulate_grad_batches, 1)
        at_least("trainer.gradient_clip_val", self.gradient_clip_val, 0, allow_none=True)
        if self.gradient_clip_algorithm is not None:
            one_of("trainer.gradient_clip_algorithm", self.gradient_clip_algorithm, ("norm", "value"))
        at_least("trainer.check_val_every_n_epoch", self.check_val_every_n_epoch, 1, allow_none=True)
        at_least("trainer.log_every_n_steps", self.log_every_n_steps, 1, allow_none=True)
        for key in ("val_check_interval", "limit_train_batches", "limit_val_batches", "limit_test_batches"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise UserError(f"trainer.{key}={value!r} must be a fraction (float) or a number of batches (int)")
