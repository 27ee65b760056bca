"""``train.py``: check the config (no weights read), then fine-tune (``headlab.training.finetune``); Ctrl-C or
SIGTERM ends it with status 130 or 143 and a note of where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.cli.errors import say
from headlab.cli.hydra_glue import job_dir, log_lightning_once, model_and_task_overrides, progress_bars_follow
from headlab.cli.schema import check_config
from headlab.cli.unread_config import refuse_unread_model_config
from headlab.core.masks import check_mask, plan_from_mask, refuse_substituted
from headlab.core.model_files import check_fits_positions, check_weights_folder, looks_local, model_shape
from headlab.errors import UserError
from headlab.study.interrupts import stopping_on_signals
from headlab.tasks.hub_data import cached_rows, check_hub_dataset
from headlab.tasks.local_files import count_rows
from headlab.training.batches import check_val_check_interval, world_size
from headlab.training.checkpoints import check_lightning_checkpoint


def check_train_config(cfg: Any) -> None:
    """Every check that needs no weights (none imports torch, transformers or Lightning, but reading a ``.ckpt``
    needs torch): types and ranges, the plan against the model's shape, the weights folder, the checkpoint."""
    check_config(cfg)
    check_mask(cfg.mask)
    if cfg.ckpt_path not in (None, "last") and not Path(cfg.ckpt_path).is_file():
        kept = (" (a finished run keeps it only with keep_training_state=true)"
                if cfg.ckpt_path.endswith("last.ckpt") else "")
        raise UserError(f"ckpt_path={cfg.ckpt_path!r}: no such checkpoint file{kept} (or use ckpt_path=last / null)")
    refuse_substituted(plan_from_mask(cfg.mask, *model_shape(cfg.model), cfg.model), "train.py")
    check_fits_positions(cfg.model, cfg.task.max_length)
    if cfg.task.train_split in cfg.task.eval_splits:
        raise UserError(f"task.train_split={cfg.task.train_split} is also in task.eval_splits="
                        f"{list(cfg.task.eval_splits)}: the model would be scored on the examples it trained on; "
                        "evaluate on a split of other examples")
    if not cfg.task.get("data_files"):  # offline, a hub data set may have its validation split only
        check_hub_dataset(cfg.task.name, cfg.task.dataset, cfg.task.get("subset"), [cfg.task.train_split])
    if not cfg.model.get("random_init") and looks_local(cfg.model.name_or_path):
        check_weights_folder(cfg.model.name_or_path, f"model.name_or_path={cfg.model.name_or_path!r}")
    refuse_unread_model_config(cfg)
    if cfg.ckpt_path not in (None, "last"):
        check_lightning_checkpoint(Path(cfg.ckpt_path), cfg.model, cfg.task)
    check_epoch_fits_interval(cfg)


def check_epoch_fits_interval(cfg: Any) -> None:
    """An integer ``trainer.val_check_interval`` against the training batches, where the number of training
    examples is known without loading the data: a classification task's local file or cached hub split (a QA
    task's windows are known once tokenized; the run checks again then)."""
    processes = world_size(cfg.trainer)
    if cfg.task.type == "extractive_qa" or processes is None:
        return
    split = cfg.task.train_split
    if cfg.task.get("data_files"):
        rows = count_rows(cfg.task.data_files[split])
    else:
        rows = cached_rows(cfg.task.dataset, cfg.task.get("subset"), split)
    if rows is not None:
        limit = cfg.data.max_train_examples
        check_val_check_interval(cfg.trainer, rows if limit is None else min(rows, limit), cfg.data.batch_size,
                                 processes)


RERUN = "run the same command to go on from there (it resumes from checkpoints/last.ckpt, if one was saved)"


def run_train(cfg: Any) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` on ``cfg.task`` under ``cfg.mask`` in this job's directory."""
    with stopping_on_signals(say, lambda: f"train.py, job {job_dir()}", RERUN):
        check_train_config(cfg)
        from headlab.training.finetune import run_finetuning  # Lightning loads only for a valid config

        log_lightning_once()
        progress_bars_follow(cfg.trainer)
        return run_finetuning(cfg, job_dir(), model_and_task_overrides())
