"""``train.py``: check the config (no weights read), then fine-tune (``headlab.training.finetune``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.cli.hydra_glue import job_dir, log_lightning_once, model_and_task_overrides, progress_bars_follow
from headlab.cli.schema import check_config
from headlab.core.masks import check_mask, plan_from_mask
from headlab.errors import UserError


def check_train_config(cfg: Any) -> None:
    """Every check that needs no weights: types and ranges, the plan against the model's shape, paths."""
    check_config(cfg)
    check_mask(cfg.mask)
    if cfg.ckpt_path not in (None, "last") and not Path(cfg.ckpt_path).is_file():
        kept = (" (a finished run keeps it only with keep_training_state=true)"
                if cfg.ckpt_path.endswith("last.ckpt") else "")
        raise UserError(f"ckpt_path={cfg.ckpt_path!r}: no such checkpoint file{kept} (or use ckpt_path=last / null)")
    from headlab.core.model_files import model_shape  # torch and transformers load only once the config is sane

    plan_from_mask(cfg.mask, *model_shape(cfg.model), cfg.model.name)


def run_train(cfg: Any) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` on ``cfg.task`` under ``cfg.mask`` in this job's directory."""
    check_train_config(cfg)
    from headlab.training.finetune import run_finetuning  # Lightning loads only for a valid config

    log_lightning_once()
    progress_bars_follow(cfg.trainer)
    return run_finetuning(cfg, job_dir(), model_and_task_overrides())
