"""Evaluation speed: ``mode=eval`` vs a plain loop, and ``mode=sweep_heads`` vs separate evaluations.

    python benchmarks/eval_speed.py throughput [--task demo_qa] [--examples 200] [--batch 32] [--rounds 5]
    python benchmarks/eval_speed.py sweep [--shape minilm|bert-base] [--task demo_qa] [--examples 32]
        [--policy prune] [--rounds 3]
    python benchmarks/eval_speed.py importance [--task demo_qa] [--examples 200] [--batch 32] [--rounds 5]
    python benchmarks/eval_speed.py pruned [--shape minilm|bert-base] [--task demo_qa] [--examples 200] [--rounds 5]
    python benchmarks/eval_speed.py by_length [--task qnli_articles] [--examples 1000] [--batch 64] [--rounds 5]
    python benchmarks/eval_speed.py collate [--task demo_qa] [--examples 200] [--batch 32] [--rounds 5]
    python benchmarks/eval_speed.py plans_at_cls [--task qnli_articles] [--policy prune] [--heads 11] [--plans 5]

``throughput``: what ``mode=eval`` runs once the baseline is cached (``Trainer.validate`` of a
``PlanEvaluator`` under a keep plan: forward, predictions, per-example losses and records, gathered)
against the loop one writes by hand: the same model over the same batches from its own DataLoader (collated inside
the timed run, pinned on a GPU), forward and the logits to the CPU. Examples/s of each side, order alternating per
round; the ratio is headlab / plain. ``--profile``: then one headlab pass under cProfile (where its host time goes).

``sweep``: every single-head ablation of the model under ``--policy`` (L x H plans) as one
``mode=sweep_heads`` job runs them (one ``LayerSweepEvaluator`` pass per layer) against L x H
separate evaluations as ``mode=eval`` runs each (one ``PlanEvaluator`` pass per plan; model, data
and trainer built once, process start excluded). The ratio is sweep seconds / separate seconds.
``importance``: what ``mode=importance`` runs (``Trainer.validate`` of a ``HeadScorer``: one forward and one
backward per batch giving every estimator, the first-order estimates of all four policies and the key-type
gradients) against plain evaluation of the same batches (``throughput``'s ``PlanEvaluator``). The ratio is
importance seconds / evaluation seconds.
``pruned``: the forward pass over the same batches of the model with half of its heads (a random half, seed 0)
removed by ``headlab.prune_heads`` against the full model (what ``mode=prune_curve`` times for its final mask),
and the same half pruned by the ``prune`` plan (masked, not removed). The ratio is pruned seconds / full seconds.
``by_length``: ``mode=eval``'s pass (``throughput``'s headlab side) over batches of rows of similar lengths (the
default, ``TaskDataModule(by_length=True)``) against the same rows batched in file order. The ratio is by-length
seconds / file-order seconds; the padded tokens of each side are printed.
``collate``: the DataLoader's work per batch, ``PaddedRows`` (one gather per column) against the ``Collator`` over the
rows the HF dataset returns (what the loaders did before); the ratio is padded-rows seconds / collator seconds.
``plans_at_cls``: ``--plans`` random sets of ``--heads`` heads under ``--policy`` evaluated as ``mode=eval`` runs them
(one ``PlanEvaluator`` pass; a classification head reading [CLS] alone: each plan's last layer at [CLS] only)
against the same pass with the whole last layer. The ratio is [CLS]-only seconds / whole-layer seconds.
``--only SIDE[,SIDE...]`` times those sides (one: no ratio), e.g. ``sweep --only sweep_heads``;
``sweep --only sweep_heads,sweep_whole_layers`` times the sweep against itself without its two savings (each layer's
pass recomputing the layers below it, and the whole last layer although a classification head reads only [CLS]).

``--shape minilm`` is the embedded MiniLM; ``bert-base`` (``tiny``, ``dispatch``) a random model of that shape with the
tiny tokenizer (speed does not depend on the weights); ``--shape tiny --batch 32`` is the CPU's launch-bound proxy of
a GPU pass (a forward of ~12 ms a batch, what BERT-base takes at batch 128 on an H200).
``--device cuda --precision bf16-mixed`` runs both sides on the GPU (Lightning's precision for the Trainer sides,
autocast for the plain loops; clocks read after the device is done). ``--rows N`` (``demo_pairs``): the validation
split repeated to N rows, e.g. the 9,815 rows of MNLI-matched's validation set; ``--examples`` then defaults to all of
them.

GPU rows (../shared/gpu/README.md), e.g. the GPU issue's sweep row:
    python benchmarks/eval_speed.py sweep --device cuda --precision bf16-mixed --shape bert-base \
        --task demo_pairs --rows 9815 --batch 128 --rounds 1
"""

from __future__ import annotations

import contextlib
import copy
import cProfile
import json
import pstats
import statistics
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
from common import SHAPES, Parser, check_device, clock, machine
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader

from headlab.analysis.evaluation.layer_inputs import LayerInputs
from headlab.analysis.evaluation.sweep_heads import LayerSweepEvaluator
from headlab.analysis.evaluation.sweep_plans import family_plans, random_plans
from headlab.analysis.importance.prune_curve import prune_plan, random_heads
from headlab.analysis.importance.scoring import HeadScorer
from headlab.analysis.jobs.plan_evaluator import MODEL_INPUTS, PlanEvaluator, Variant
from headlab.cli.schema import register_configs
from headlab.core.importance import punctuation_ids
from headlab.core.models import load_model, load_tokenizer
from headlab.core.patch.ablate import ablate
from headlab.core.plans import ESTIMATED, HeadPlan
from headlab.core.pruning import prune_heads
from headlab.tasks.batches import collated
from headlab.training.datamodule import ExactlyOnceSampler, TaskDataModule
from headlab.training.modules import task_head

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"throughput": ("headlab", "plain"), "sweep": ("sweep_heads", "separate", "sweep_whole_layers"),
         "importance": ("importance", "evaluation"), "pruned": ("pruned", "full", "masked"),
         "by_length": ("by_length", "file_order"), "collate": ("padded_rows", "collator"),
         "plans_at_cls": ("cls_only", "whole_last_layer")}  # (--only: some of them)
OPTIONAL = ("sweep_whole_layers",)  # timed only when --only names them


def setup(args):
    layers, heads, hidden, _, _ = SHAPES[args.shape]
    model = ["model=minilm"] if args.shape == "minilm" else [
        "model=tiny_random", f"model.config.num_hidden_layers={layers}", f"model.config.num_attention_heads={heads}",
        f"model.config.hidden_size={hidden}", f"model.config.intermediate_size={4 * hidden}"]
    rows = [f"task.data_files.validation={repeated_rows(args.task, args.rows)}"] if args.rows else []
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("ablate", overrides=[*model, f"task={args.task}", *rows])
    data = TaskDataModule(cfg.task, cfg.model, eval_batch_size=args.batch, max_eval_examples=args.examples,
                          train=False)
    data.setup()
    model = load_model(cfg.model, *task_head(cfg.task)).to(args.device)
    return cfg, data, model, trainer_for(args)


def trainer_for(args, inference_mode: bool = True) -> pl.Trainer:
    """A Trainer on ``--device`` at ``--precision`` (it moves the model there, and back to the CPU when done)."""
    devices = [args.device.index or 0] if args.device.type == "cuda" else 1
    return pl.Trainer(accelerator=args.device.type, devices=devices, precision=args.precision, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, inference_mode=inference_mode)


def repeated_rows(task: str, rows: int) -> str:
    """A JSON-lines file of the task's validation rows repeated (with new ids) to ``rows`` rows."""
    source = (ROOT / f"src/headlab/tasks/data/{task}/validation.jsonl").read_text().splitlines()
    path = Path(tempfile.mkdtemp(prefix="eval_speed_")) / "validation.jsonl"
    lines = [json.loads(source[i % len(source)]) | {"idx": i} for i in range(rows)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def autocast(args):
    """The plain loops' mixed precision: what Lightning's ``bf16-mixed`` does for the Trainer sides."""
    if args.precision == "bf16-mixed":
        return torch.autocast(args.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def on_device(batch: dict, device: torch.device) -> dict:
    return {k: batch[k].to(device, non_blocking=True) for k in MODEL_INPUTS if k in batch}


def throughput(args) -> None:
    cfg, data, model, trainer = setup(args)
    keep = Variant("baseline", HeadPlan.keep_all(model.config.num_hidden_layers, model.config.num_attention_heads))
    rows = len(data.eval_features["validation"])

    def plain():
        model.to(args.device)  # as the Trainer side does: Lightning moves the model back to the CPU after a run
        loader = DataLoader(data.padded_rows("validation"), batch_size=args.batch, sampler=ExactlyOnceSampler(
            order["groups"], 1, 0, lengths=order["lengths"]), collate_fn=collated,
            pin_memory=args.device.type == "cuda")
        with torch.no_grad(), autocast(args):
            for batch in loader:  # the same batches as headlab's, collated inside the timed run
                out = model(**on_device(batch, args.device))
                [value.cpu() for value in out.values() if isinstance(value, torch.Tensor)]

    features = data.eval_features["validation"]
    order = {"groups": list(features["example_index"]), "lengths": [len(ids) for ids in features["input_ids"]]}
    sides = {"headlab": lambda: trainer.validate(PlanEvaluator(model, cfg.task, [keep], data.eval_examples),
                                                 datamodule=data, verbose=False), "plain": plain}
    report(args, sides, lambda seconds: rows / seconds, "examples/s", f"{rows} rows, batch {args.batch}",
           target=">= 0.95", higher_is_better=True)
    if args.profile:  # where the headlab side's host time goes: one more pass under cProfile
        profile = cProfile.Profile()
        profile.runcall(sides["headlab"])
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


def collate(args) -> None:
    _, data, _, _ = setup(args)
    features, collator = data.eval_features["validation"], data.collator
    batches = [list(b) for b in DataLoader(range(len(features)), batch_size=args.batch)]  # [rows] per batch
    padded = data.padded_rows("validation")
    report(args, {"padded_rows": lambda: [padded.__getitems__(b) for b in batches],
                  "collator": lambda: [collator(features.__getitems__(b)) for b in batches]},
           lambda seconds: seconds, "s", f"{len(features)} rows, batch {args.batch}: the DataLoader's work per batch",
           target="< 1", higher_is_better=False)


def sweep(args) -> None:
    cfg, data, model, trainer = setup(args)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    plans = family_plans("single_head", args.policy, layers, heads)

    def separate():
        for name, _, plan in plans:
            trainer.validate(PlanEvaluator(model, cfg.task, [Variant(name, plan)], data.eval_examples),
                             datamodule=data, verbose=False)

    def swept(whole_layers: bool = False):
        inputs = None if whole_layers else LayerInputs()
        for layer in range(layers):
            variants = [Variant(name, plan) for name, l, plan in plans if l == layer]
            evaluator = LayerSweepEvaluator(model, cfg.task, layer, variants, data.eval_examples, args.per_forward,
                                            inputs=inputs)
            evaluator.first_token &= not whole_layers
            trainer.validate(evaluator, datamodule=data, verbose=False)

    def warmup():  # CUDA's start (kernels, the allocator's pools) outside the timed rounds: the last layer's pass
        variants = [Variant(name, plan) for name, l, plan in plans if l == layers - 1]
        trainer.validate(LayerSweepEvaluator(model, cfg.task, layers - 1, variants, data.eval_examples,
                                             args.per_forward), datamodule=data, verbose=False)

    bound = (layers + 1) / (2 * layers)
    if args.device.type == "cuda":
        warmup()
    report(args, {"sweep_heads": swept, "separate": separate, "sweep_whole_layers": lambda: swept(True)},
           lambda seconds: seconds, "s",
           f"{len(plans)} plans ({args.policy}), {len(data.eval_features['validation'])} features, batch {args.batch}, "
           f"{args.per_forward or 'auto (1 on CPU)'} plans per forward; layer-reuse bound (L+1)/2L = {bound:.3f}",
           target="<= 0.6", higher_is_better=False)


def importance(args) -> None:
    cfg, data, model, trainer = setup(args)
    scoring = trainer_for(args, inference_mode=False)
    keep = HeadPlan.keep_all(model.config.num_hidden_layers, model.config.num_attention_heads)
    tokenizer = load_tokenizer(cfg.model)

    def scored():
        scoring.validate(HeadScorer(model, keep, ESTIMATED, False, None, punctuation_ids(tokenizer)),
                         datamodule=data, verbose=False)

    def evaluated():
        trainer.validate(PlanEvaluator(model, cfg.task, [Variant("baseline", keep)], data.eval_examples),
                         datamodule=data, verbose=False)

    report(args, {"importance": scored, "evaluation": evaluated}, lambda seconds: seconds, "s",
           f"{len(data.eval_features['validation'])} features, batch {args.batch}; every estimator, "
           f"estimates of {', '.join(ESTIMATED)}, key types", target="<= 3", higher_is_better=False)


def pruned(args) -> None:
    _, data, model, _ = setup(args)
    shape = model.config.num_hidden_layers, model.config.num_attention_heads
    half = prune_plan(random_heads(0, shape, shape[0] * shape[1] // 2, 0), shape)
    removed = prune_heads(copy.deepcopy(model), half).eval()
    model.eval()
    batches = [on_device(b, args.device) for b in data.eval_dataloader("validation")]

    def forward(net, plan=None):
        with torch.no_grad(), autocast(args), ablate(net, plan) if plan is not None else contextlib.nullcontext():
            for batch in batches:
                net(**batch)

    report(args, {"pruned": lambda: forward(removed), "full": lambda: forward(model),
                  "masked": lambda: forward(model, half)}, lambda seconds: seconds, "s",
           f"{len(data.eval_features['validation'])} features, batch {args.batch}; "
           f"{half.counts()['prune']} of {shape[0] * shape[1]} heads removed", target="< 1", higher_is_better=False)


def by_length(args) -> None:
    cfg, data, model, trainer = setup(args)
    keep = Variant("baseline", HeadPlan.keep_all(model.config.num_hidden_layers, model.config.num_attention_heads))

    def evaluated(grouped: bool):
        data.by_length = grouped
        trainer.validate(PlanEvaluator(model, cfg.task, [keep], data.eval_examples), datamodule=data, verbose=False)

    padded = {}
    for grouped in (True, False):
        data.by_length = grouped
        padded[grouped] = sum(batch["input_ids"].numel() for batch in data.eval_dataloader("validation"))
    tokens = sum(len(ids) for ids in data.eval_features["validation"]["input_ids"])
    report(args, {"by_length": lambda: evaluated(True), "file_order": lambda: evaluated(False)},
           lambda seconds: seconds, "s", f"{len(data.eval_features['validation'])} rows ({tokens} tokens), batch "
           f"{args.batch}; padded tokens by length {padded[True]}, in file order {padded[False]}",
           target="< 1", higher_is_better=False)


def plans_at_cls(args) -> None:
    cfg, data, model, trainer = setup(args)
    shape = model.config.num_hidden_layers, model.config.num_attention_heads
    drawn = random_plans(args.policy, *shape, (args.heads,), args.plans, 0)
    variants = [Variant(name, plan) for name, _, plan in drawn]

    def evaluated(first_token: bool):
        evaluator = PlanEvaluator(model, cfg.task, variants, data.eval_examples)
        evaluator.first_token = evaluator.first_token and first_token
        trainer.validate(evaluator, datamodule=data, verbose=False)

    evaluated(True)  # warm-up
    sides = {"cls_only": lambda: evaluated(True), "whole_last_layer": lambda: evaluated(False)}
    report(args, sides, lambda s: s, "s", f"{args.plans} random sets of {args.heads} heads under {args.policy}, "
           f"{args.examples} examples, batch {args.batch}", "< 1", higher_is_better=False)


def report(args, sides: dict, value, unit: str, what: str, target: str, higher_is_better: bool) -> None:
    names = args.only.split(",") if args.only else [name for name in sides if name not in OPTIONAL]
    alone = len(names) == 1
    results: dict[str, list[float]] = {name: [] for name in names}
    ratios = []
    for round_ in range(args.rounds):
        this = {}
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = clock(args.device)
            sides[name]()
            this[name] = value(clock(args.device) - start)
            results[name].append(this[name])
        ratios.append(this[names[0]] / this[names[-1 if alone else 1]])
        print(f"round {round_}: " + ", ".join(f"{n} {this[n]:.2f} {unit}" for n in names)
              + ("" if alone else f", ratio {ratios[-1]:.3f}"), flush=True)
    print(f"\n{machine(args.device)}, {args.precision}; {args.shape} on {args.task}: {what}; {args.rounds} rounds")
    print("median " + ", ".join(f"{n} {statistics.median(results[n]):.2f} {unit}" for n in names)
          + ("" if alone else f"; median ratio {names[0]} / {names[1]} {statistics.median(ratios):.3f} "
                                  f"(target {target})"))


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["throughput", "sweep", "importance", "pruned", "by_length", "collate",
                                         "plans_at_cls"])
    parser.add_argument("--shape", default="minilm", choices=["minilm", "bert-base", "tiny", "dispatch"])
    parser.add_argument("--task", default="demo_qa", choices=["demo_qa", "demo_pairs", "qnli_articles"])
    parser.add_argument("--examples", type=int, default=None, help="eval examples (default 200 / 32)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--policy", default="prune", choices=["prune", "uniform", "drop_intra", "drop_inter"])
    parser.add_argument("--heads", type=int, default=11, help="plans_at_cls: heads per random set")
    parser.add_argument("--plans", type=int, default=5, help="plans_at_cls: random sets")
    parser.add_argument("--per-forward", type=int, default=0, help="sweep: plans per batched forward (0: a layer's)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5 / 3)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--rows", type=int, default=None, help="demo_pairs: validation rows repeated to this many")
    parser.add_argument("--profile", action="store_true", help="throughput: then one headlab pass under cProfile")
    parser.add_argument("--only", default=None, help="time these sides (comma-separated; the ratio: first / second), "
                        "e.g. sweep_heads,sweep_whole_layers; one side: no ratio")
    args = parser.parse_args()
    args.device = check_device(parser, args.device)
    unknown = [side for side in (args.only or "").split(",") if args.only is not None and side not in SIDES[args.what]]
    if unknown:
        parser.error(f"--only {args.only!r}: {', '.join(map(repr, unknown))} is not a side of {args.what}; choose "
                     f"from {', '.join(SIDES[args.what])}")
    if args.rows is not None and (args.task != "demo_pairs" or args.rows < 1):
        parser.error(f"--rows {args.rows} needs --task demo_pairs and a positive count")
    args.examples = args.examples or args.rows or (32 if args.what == "sweep" else 200)
    args.rounds = args.rounds or (3 if args.what == "sweep" else 5)
    if args.examples < 1 or args.batch < 1 or args.rounds < 1:
        parser.error("--examples, --batch and --rounds must be positive")
    {"throughput": throughput, "sweep": sweep, "importance": importance, "pruned": pruned,
     "by_length": by_length, "collate": collate, "plans_at_cls": plans_at_cls}[args.what](args)


if __name__ == "__main__":
    main()
