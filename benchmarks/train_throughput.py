"""Fine-tuning throughput of headlab (train.py's Lightning module, data and trainer) vs a plain loop.

    python benchmarks/train_throughput.py [--task demo_pairs] [--batch 32] [--steps 20] [--rounds 5]
        [--device cpu|cuda] [--precision 32-true|bf16-mixed] [--shape tiny|minilm|bert-base|bert-large]
        [--plan none|one_head_prune|half_uniform] [--gates | --optimal]

Both sides train the same model on the same tokenised data, batch size, precision, AdamW with
linear warm-up and decay, and gradient clipping at 1.0. The plain side is the loop one writes by
hand: the same batches in the same order, the transformers model (stock SDPA, no plan), forward (under autocast for
bf16-mixed), backward, clip, step. The headlab side fine-tunes under ``--plan``; with ``--gates`` it fits L0 head gates
on the frozen model instead (``mode=gates``' module: a hard concrete draw per head and step, Adam on the gates only):
what a gate fit costs against fine-tuning the same steps; with ``--optimal`` it learns optimal ablation's constants
(``gates.method=optimal``: each row of a batch replaces one head by its constant, per-row plans), what the constants
of every head cost per example against fine-tuning. ``--shape minilm``
is the embedded MiniLM; the BERT shapes are random weights with the tiny tokenizer (speed does not
depend on the weights). Each round runs both, order alternating; the first ``--warmup`` steps of
each run are not timed. The script prints the median samples/s of each side and the median of the
per-round ratios (headlab / plain).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import lightning.pytorch as pl
import torch
from common import SHAPES, Parser, add_device_arguments, check_device, clock, machine
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader
from transformers import get_linear_schedule_with_warmup

from headlab.cli.schema import register_configs
from headlab.core.models import load_model
from headlab.training.datamodule import TaskDataModule
from headlab.training.modules import MODEL_INPUTS, task_module

ROOT = Path(__file__).resolve().parents[1]


class SameBatches(TaskDataModule):
    """The task's data module with a fixed batch order, so both sides train on identical (equally padded) batches."""

    def train_dataloader(self) -> DataLoader:
        order = torch.Generator().manual_seed(0)
        return DataLoader(self.train_features, batch_size=self.batch_size, shuffle=True, generator=order,
                          collate_fn=self.collator)


class StepTimer(pl.Callback):
    """Wall time from the start of step ``warmup`` to the end of step ``warmup + steps - 1``."""

    def __init__(self, warmup: int, steps: int, device: torch.device):
        self.warmup, self.steps, self.device, self.start, self.seconds = warmup, steps, device, 0.0, 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx == self.warmup:
            self.start = clock(self.device)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if batch_idx == self.warmup + self.steps - 1:
            self.seconds = clock(self.device) - self.start


GATES = {"method": "l0", "l0_lambda": 0.01, "init": 0.0, "lr": 0.1, "train_model": False}  # --gates


def run_headlab(cfg, data, warmup: int, steps: int, device: torch.device, precision: str, side: str = "finetune"
                ) -> float:
    timer = StepTimer(warmup, steps, device)
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    trainer = pl.Trainer(accelerator=accelerator, devices=1, precision=precision, max_steps=warmup + steps,
                         gradient_clip_val=1.0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer])
    if side == "gates":
        from headlab.analysis.gates.gate_training import gated_module

        module = gated_module(cfg.model, cfg.task, cfg.mask, cfg.optim, GATES)
    elif side == "optimal":
        from headlab.analysis.gates.constant_training import constant_module
        from headlab.core.model_files import config_json

        config = config_json(cfg.model)
        heads = config["num_attention_heads"]
        start = torch.zeros(config["num_hidden_layers"], heads, config["hidden_size"] // heads)  # values: no matter
        module = constant_module(cfg.model, cfg.task, cfg.mask, cfg.optim, {"method": "optimal", "lr": 0.01}, None,
                                 start)
    else:
        module = task_module(cfg.model, cfg.task, cfg.mask, cfg.optim)
    trainer.fit(module, datamodule=data)
    return steps * cfg.data.batch_size / timer.seconds


def run_plain(cfg, data, warmup: int, steps: int, device: torch.device, precision: str) -> float:
    model = load_model(cfg.model, "sequence_classification", {"num_labels": cfg.task.num_labels}).to(device).train()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.optim.weight_decay},
         {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}], lr=cfg.optim.lr, eps=cfg.optim.adam_eps)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, warmup + steps)
    loader = data.train_dataloader()
    start = 0.0
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    for step, batch in enumerate(loader):
        if step == warmup:
            start = clock(device)
        with autocast:
            loss = model(**{k: batch[k].to(device, non_blocking=True) for k in MODEL_INPUTS if k in batch}).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step == warmup + steps - 1:
            return steps * cfg.data.batch_size / (clock(device) - start)
    raise ValueError(f"the training split has fewer than {warmup + steps} batches")


PLANS = {"none": [], "one_head_prune": ["mask=prune", "mask.heads=L{middle}H0"],
         "half_uniform": ["mask=uniform", "mask.heads=H0-{half}"]}


def overrides(shape: str, plan: str, task: str, batch: int) -> list[str]:
    layers, heads, hidden, _, _ = SHAPES[shape]
    model = ["model=minilm"] if shape == "minilm" else [
        "model=tiny_random", f"model.config.num_hidden_layers={layers}", f"model.config.num_attention_heads={heads}",
        f"model.config.hidden_size={hidden}", f"model.config.intermediate_size={4 * hidden}"]
    mask = [o.format(middle=layers // 2, half=heads // 2 - 1) for o in PLANS[plan]]
    return [*model, *mask, f"task={task}", f"data.batch_size={batch}"]


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    add_device_arguments(parser)
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--plan", default="none", choices=list(PLANS), help="the headlab side's head plan")
    sides = parser.add_mutually_exclusive_group()
    sides.add_argument("--gates", action="store_true", help="the headlab side fits L0 gates on the frozen model")
    sides.add_argument("--optimal", action="store_true", help="the headlab side learns optimal-ablation constants")
    parser.add_argument("--task", default="demo_pairs")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = check_device(parser, args.device)

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides(args.shape, args.plan, args.task, args.batch))
    data = SameBatches(cfg.task, cfg.model, unit=cfg.mask.unit, **cfg.data)
    data.setup()
    pl.seed_everything(0, verbose=False)
    rates = {"headlab": [], "plain": []}
    ratios = []
    for round_ in range(args.rounds):
        order = ("headlab", "plain") if round_ % 2 == 0 else ("plain", "headlab")
        this = {}
        for side in order:
            if side == "headlab":
                what = "gates" if args.gates else "optimal" if args.optimal else "finetune"
                this[side] = run_headlab(cfg, data, args.warmup, args.steps, device, args.precision, what)
            else:
                this[side] = run_plain(cfg, data, args.warmup, args.steps, device, args.precision)
            rates[side].append(this[side])
        ratios.append(this["headlab"] / this["plain"])
        print(f"round {round_}: headlab {this['headlab']:.2f} samples/s, plain {this['plain']:.2f}, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    # the constants of every head cost at most 2x an epoch of fine-tuning, their start (a forward pass) included
    target = 0.5 if args.optimal else 0.97 if device.type == "cuda" else 0.95
    what = ("L0 gate fit (frozen model)" if args.gates else "optimal constants (a head per row, frozen model)"
            if args.optimal else f"plan {args.plan}")
    print(f"\n{machine(device)}; {args.shape} on {args.task}, {what}, {args.precision}, batch {args.batch}, "
          f"{args.steps} timed steps x {args.rounds} rounds")
    print(f"median samples/s: headlab {statistics.median(rates['headlab']):.2f}, "
          f"plain {statistics.median(rates['plain']):.2f}; median ratio {statistics.median(ratios):.3f} "
          f"(target >= {target})")


if __name__ == "__main__":
    main()
