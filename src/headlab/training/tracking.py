"""Experiment tracking: the ``logger`` config group (W&B offline by default, CSV, or none), and the end of a job."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hydra
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from rich.console import Console


def build_logger(logger_cfg: Any, run_id: str, run_name: str) -> Logger | None:
    """The configured Lightning logger, or None for ``logger=none``.

    W&B runs get a stable ``id`` (``run_id``, a hash of the job's config) when the config leaves
    it null, so rerunning a job continues its W&B run instead of starting a second one. W&B prints nothing (its
    banner and summary are some 20 lines a job) and the job one line, ``wandb_line``; ``logger.settings.silent=false``
    gives W&B's own lines back.
    """
    if logger_cfg is None or logger_cfg.get("_target_") is None:
        return None
    fill = {}
    if "id" in logger_cfg and logger_cfg.id is None:
        fill["id"] = run_id
    if "name" in logger_cfg and logger_cfg.name is None:
        fill["name"] = run_name
    settings = logger_cfg.get("settings") or {}
    quiet = "WandbLogger" in str(logger_cfg.get("_target_")) and settings.get("silent", True) is not False
    if quiet:  # W&B's own banner and summary are some 20 lines a job: one line of ours instead
        fill["settings"] = {**settings, "silent": True}
    logger = hydra.utils.instantiate(logger_cfg, _convert_="all", **fill)  # plain dicts (W&B's settings)
    init = getattr(logger, "_wandb_init", None)  # Lightning passes anonymous=None to wandb.init, which W&B 0.31
    if isinstance(init, dict) and init.get("anonymous") is None:  # warns about ("has no effect") in every job
        init.pop("anonymous", None)
    if quiet and rank_zero_only.rank == 0:  # one line, not one a DDP process
        Console(soft_wrap=True).print(wandb_line(logger_cfg, fill.get("name", logger_cfg.get("name")),
                                                 fill.get("id", logger_cfg.get("id")),
                                                 alone=not in_multirun() and "silent" not in settings),
                                      markup=False, highlight=False)
    return logger


def wandb_line(logger_cfg: Any, name: str, run_id: str, alone: bool) -> str:
    """``W&B: run NAME in FOLDER``: the job's one line of W&B. A job run ``alone`` (not one of a multirun or a study,
    whose jobs print a line each and whose study ends with the command that uploads all its runs) adds the command
    that uploads its offline run."""
    offline = bool(logger_cfg.get("offline")) or os.environ.get("WANDB_MODE") in ("offline", "dryrun")
    where = f"{logger_cfg.save_dir}/wandb/{'offline-' if offline else ''}run-*-{run_id}"
    return f"W&B: run {name} in {where}" + (f" (offline; upload: wandb sync {where})" if offline and alone else "")


def in_multirun() -> bool:
    """The running job is one of a Hydra multirun (its W&B line leaves out the upload command)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def log_artifacts(logger: Logger | None, tables: dict[str, Any] | None = None,
                  images: dict[str, Any] | None = None) -> None:
    """Tables (DataFrames; empty ones skipped) and images (paths) to the job's logger when it takes them (W&B; CSV
    and none do not). Missing values go as None, which W&B types as optional: pandas' NA (a nullable integer
    column) stopped the job."""
    if logger is None or not hasattr(logger, "log_table"):
        return
    for key, frame in (tables or {}).items():
        if frame is not None and len(frame):
            logger.log_table(key=key, dataframe=frame.astype(object).where(frame.notna(), None))
    for key, path in (images or {}).items():
        logger.log_image(key=key, images=[str(path)])


def finish_tracking(failed: bool = False) -> None:
    """End the W&B run of this job, if any, so the next job of a multirun starts its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=1 if failed else 0)


def release_process_group() -> None:
    """Destroy the process group a DDP job opened. Lightning does so at exit for NCCL only; a gloo group (DDP on
    CPUs) left to interpreter shutdown can abort the process ("terminate called without an active exception",
    pytorch/pytorch#190489), and Lightning then kills the other ranks."""
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.destroy_process_group()


@contextmanager
def tracked_job() -> Iterator[None]:
    """The block runs one job; on exit its W&B run (if any) ends, marked failed when the block raised, and a
    finished job releases its process group."""
    try:
        yield
    except BaseException:
        finish_tracking(failed=True)
        raise
    finish_tracking(failed=False)
    release_process_group()
