"""Evaluate the tiny random BERT on a demo task with N CPU processes; rank 0 writes metrics (and predictions).

    python tests/scripts/ddp_eval.py DEVICES TASK OUT.json [OVERRIDE ...]

Run by tests/test_ddp.py; Lightning's DDP launcher starts the other processes by rerunning this script.
"""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
from hydra import compose, initialize_config_dir

from headlab.cli.schema import register_configs
from headlab.training.datamodule import TaskDataModule
from headlab.training.finetune import write_predictions
from headlab.training.modules import task_module
from headlab.training.tracking import release_process_group

ROOT = Path(__file__).resolve().parents[2]


def main(devices: int, task: str, out: str, *overrides: str) -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["model=tiny_random", f"task={task}", *overrides])
    data = TaskDataModule(cfg.task, cfg.model, unit=cfg.mask.unit, seed=cfg.seed, **cfg.data)
    module = task_module(cfg.model, cfg.task, cfg.mask, cfg.optim)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.validate(module, datamodule=data, verbose=False)
    if trainer.is_global_zero:
        write_predictions(module, Path(out).parent / f"{Path(out).stem}_predictions")
        Path(out).write_text(json.dumps({"world_size": trainer.world_size, "metrics": module.last_metrics,
                                           "evaluated": module.last_counts}))
    release_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], *sys.argv[4:])
