"""Fine-tuning throughput of headlab (train.py's Lightning module, data and trainer) vs a plain loop.

    python benchmarks/train_throughput.py [--task demo_pairs] [--batch 32] [--steps 20] [--rounds 5]

Both sides train MiniLM on the same tokenised data, batch size, precision (fp32), AdamW with
linear warm-up and decay, and gradient clipping at 1.0. The plain side is the loop one writes by
hand: a DataLoader, the transformers model, forward, backward, clip, step. Each round runs both,
order alternating; the first ``--warmup`` steps of each run are not timed. The script prints the
median samples/s of each side and the median of the per-round ratios (headlab / plain).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

from headlab.cli.schema import register_configs
from headlab.core.models import load_model
from headlab.training.datamodule import TaskDataModule
from headlab.training.modules import MODEL_INPUTS, task_module

ROOT = Path(__file__).resolve().parents[1]


class StepTimer(pl.Callback):
    """Wall time from the start of step ``warmup`` to the end of step ``warmup + steps - 1``."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps, self.start, self.seconds = warmup, steps, 0.0, 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx == self.warmup:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == self.warmup + self.steps - 1:
            self.seconds = time.perf_counter() - self.start


def run_headlab(cfg, data, warmup: int, steps: int) -> float:
    timer = StepTimer(warmup, steps)
    trainer = pl.Trainer(accelerator="cpu", devices=1, precision="32-true", max_steps=warmup + steps,
                         gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer])
    module = task_module(cfg.model, cfg.task, cfg.mask, cfg.optim)
    trainer.fit(module, datamodule=data)
    return steps * cfg.data.batch_size / timer.seconds


def run_plain(cfg, data, warmup: int, steps: int) -> float:
    model = load_model(cfg.model, "sequence_classification", num_labels=cfg.task.num_labels).train()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.optim.weight_decay},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=cfg.optim.lr, eps=cfg.optim.adam_eps)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, warmup + steps)
    loader = DataLoader(data.train_features, batch_size=cfg.data.batch_size, shuffle=True, collate_fn=data.collator)
    start = 0.0
    for step, batch in enumerate(loader):
        if step == warmup:
            start = time.perf_counter()
        loss = model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step == warmup + steps - 1:
            return steps * cfg.data.batch_size / (time.perf_counter() - start)
    raise ValueError(f"the training split has fewer than {warmup + steps} batches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="demo_pairs")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["model=minilm", f"task={args.task}", f"data.batch_size={args.batch}"])
    data = TaskDataModule(cfg.task, cfg.model, unit=cfg.mask.unit, **cfg.data)
    data.setup()
    pl.seed_everything(0, verbose=False)
    rates = {"headlab": [], "plain": []}
    ratios = []
    for round_ in range(args.rounds):
        order = ("headlab", "plain") if round_ % 2 == 0 else ("plain", "headlab")
        this = {}
        for side in order:
            run = run_headlab if side == "headlab" else run_plain
            this[side] = run(cfg, data, args.warmup, args.steps)
            rates[side].append(this[side])
        ratios.append(this["headlab"] / this["plain"])
        print(f"round {round_}: headlab {this['headlab']:.2f} samples/s, plain {this['plain']:.2f}, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"\n{platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads; MiniLM on "
          f"{args.task}, batch {args.batch}, {args.steps} timed steps x {args.rounds} rounds")
    print(f"median samples/s: headlab {statistics.median(rates['headlab']):.2f}, "
          f"plain {statistics.median(rates['plain']):.2f}; median ratio {statistics.median(ratios):.3f} "
          "(target >= 0.95)")


if __name__ == "__main__":
    main()
