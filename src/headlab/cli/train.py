"""``train.py``: check the config (no weights read), then fine-tune (``headlab.training.finetune``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.cli.hydra_glue import job_dir, log_lightning_once, model_and_task_overrides, progress_bars_follow
from headlab.cli.schema import check_config
from headlab.core.masks import check_mask, plan_from_mask
from headlab.core.model_files import check_weights_folder, looks_local, model_shape
from headlab.errors import UserError
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
    plan_from_mask(cfg.mask, *model_shape(cfg.model), cfg.model.name)
    if not cfg.model.get("random_init") and looks_local(cfg.model.name_or_path):
        check_weights_folder(cfg.model.name_or_path, f"model.name_or_path={cfg.model.name_or_path!r}")
    if cfg.ckpt_path not in (None, "last"):
        check_lightning_checkpoint(Path(cfg.ckpt_path), cfg.model, cfg.task)


def run_train(cfg: Any) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` on ``cfg.task`` under ``cfg.mask`` in this job's directory."""
    check_train_config(cfg)
    from headlab.training.finetune import run_finetuning  # Lightning loads only for a valid config

    log_lightning_once()
    progress_bars_follow(cfg.trainer)
    return run_finetuning(cfg, job_dir(), model_and_task_overrides())
