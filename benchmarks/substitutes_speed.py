"""Mean and resample ablation, and Shapley values: their cost against the obvious alternatives.

    python benchmarks/substitutes_speed.py eval [--task demo_qa] [--examples 200] [--batch 32] [--rounds 5]
    python benchmarks/substitutes_speed.py shapley [--over types|layers] [--examples 64] [--rounds 3]
    python benchmarks/substitutes_speed.py heads [--examples 64] [--permutations 4] [--floor F]

``eval``: what ``mode=eval`` runs (``Trainer.validate`` of a ``PlanEvaluator``) under one plan, half of every
layer's heads (``H0-5``), under ``mean`` (means computed once before, as the cache gives them) and ``resample``
(one draw: the sources' unablated forward per batch, then the plan's) against the same plan under ``prune``.
Alternating rounds; the ratios are mean / prune and resample / prune.
``shapley``: every coalition of 4 head types (16; types: the heads of each layer in four blocks of three, a stand-in
for a clusters file) or of the layers (64), scored as ``mode=shapley`` does (one ``CoalitionEvaluator`` pass:
per-row plans, each forward starting at its coalitions' lowest changed layer) against each coalition evaluated
alone as a ``mode=eval`` job does (one ``PlanEvaluator`` pass each; model, data and trainer built once, process
start and the cached baseline excluded: the separate jobs' real cost is higher). The ratio is shapley / separate.
``heads``: sampled Shapley values of every head (removal chains in antithetic pairs): coalitions evaluated per
second, seconds per permutation, and the standard error reached, extrapolated to an hour (SE ~ 1/sqrt(time)).
"""

from __future__ import annotations

import statistics
import tempfile
import time

import numpy as np
from common import Parser, check_device, machine
from eval_speed import report, setup

from headlab.analysis.jobs.plan_evaluator import PlanEvaluator, Variant
from headlab.analysis.jobs.substitutes import JobSubstitutes
from headlab.analysis.shapley.coalitions import CoalitionEvaluator, coalition_plan
from headlab.analysis.shapley.scores import example_scores
from headlab.analysis.shapley.values import PermutationEstimate, antithetic_orders
from headlab.core.plans import HeadPlan


def substitutes_for(cfg, data, model, trainer, policy: str) -> JobSubstitutes:
    """The job's reference set (the evaluated split's first examples) with its means computed, as cached."""
    cfg.mask.reference_examples = min(512, data.num_examples["validation"])
    cfg.baseline_dir = tempfile.mkdtemp(prefix="substitutes_speed_")
    substitutes = JobSubstitutes(cfg, cfg.model, data, resample=policy == "resample")
    substitutes.weights = "benchmark"
    substitutes.means(model.to(trainer.strategy.root_device))
    return substitutes


def evaluation(args) -> None:
    cfg, data, model, trainer = setup(args)
    shape = model.config.num_hidden_layers, model.config.num_attention_heads
    substitutes = substitutes_for(cfg, data, model, trainer, "resample")

    def evaluate(policy):
        plan = HeadPlan.from_rules([{"heads": f"H0-{shape[1] // 2 - 1}", "policy": policy}], *shape)
        used = substitutes if policy != "prune" else None
        return lambda: trainer.validate(PlanEvaluator(model, cfg.task, [Variant(policy, plan)], data.eval_examples,
                                                      used), datamodule=data, verbose=False)

    what = f"{len(data.eval_features['validation'])} features, batch {args.batch}; half the heads of every layer"
    report(args, {"mean": evaluate("mean"), "prune": evaluate("prune")}, lambda s: s, "s", what, "<= 1.05", False)
    report(args, {"resample": evaluate("resample"), "prune": evaluate("prune")}, lambda s: s, "s", what, "<= 2.1",
           False)


def groups_of(over: str, shape: tuple[int, int]) -> list[list[tuple[int, int]]]:
    layers, heads = shape
    if over == "layers":
        return [[(layer, h) for h in range(heads)] for layer in range(layers)]
    block = heads // 4
    return [[(layer, h) for layer in range(layers) for h in range(t * block, (t + 1) * block)] for t in range(4)]


def shapley(args) -> None:
    cfg, data, model, trainer = setup(args)
    shape = model.config.num_hidden_layers, model.config.num_attention_heads
    groups = groups_of(args.over, shape)
    variants = [Variant(f"S{c}", coalition_plan(groups, c, "prune", shape)) for c in range(2 ** len(groups) - 1)]

    def together():
        trainer.validate(CoalitionEvaluator(model, cfg.task, variants, data.eval_examples), datamodule=data,
                         verbose=False)

    def separate():
        for variant in variants:
            trainer.validate(PlanEvaluator(model, cfg.task, [variant], data.eval_examples), datamodule=data,
                             verbose=False)

    report(args, {"shapley": together, "separate": separate}, lambda s: s, "s",
           f"{len(variants)} coalitions of {len(groups)} groups ({args.over}; the full model is the cached baseline), "
           f"{len(data.eval_features['validation'])} features, batch {args.batch}", "<= 1", False)


def heads(args) -> None:
    cfg, data, model, trainer = setup(args)
    shape = model.config.num_hidden_layers, model.config.num_attention_heads
    groups = [[(layer, h)] for layer in range(shape[0]) for h in range(shape[1])]
    full = (1 << len(groups)) - 1
    known, generator = {}, np.random.default_rng(0)
    estimate = PermutationEstimate(len(groups), data.num_examples["validation"])
    evaluated, start = 0, time.perf_counter()
    for _ in range(args.permutations // 2):
        for order in antithetic_orders(len(groups), generator):
            chain, kept = [full], full
            for player in order:
                kept &= ~(1 << player)
                chain.append(kept)
            missing = [c for c in chain if c not in known]
            variants = [Variant(f"S{c:x}", coalition_plan(groups, c, "prune", shape)) for c in missing]
            evaluator = CoalitionEvaluator(model, cfg.task, variants, data.eval_examples)
            trainer.validate(evaluator, datamodule=data, verbose=False)
            for c, variant in zip(missing, variants):
                known[c] = example_scores(_frame(evaluator.records[(variant.name, "validation")]), "f1")
            evaluated += len(missing)
            scores = [known[c] for c in chain]
            if args.floor is not None:
                reached = next((i for i, s in enumerate(scores) if i and s.mean() <= args.floor), len(scores) - 1)
                scores = scores[: reached + 1]
            estimate.add_chain(order, np.stack(scores))
    seconds = time.perf_counter() - start
    se = estimate.standard_errors()
    per_hour = statistics.median(se) * np.sqrt(seconds / 3600)
    print(f"\n{machine(args.device)}; {args.shape} on {args.task}, {len(groups)} heads, "
          f"{len(data.eval_features['validation'])} features, batch {args.batch}, floor {args.floor}")
    print(f"{estimate.permutations} permutations in {seconds:.1f} s: {evaluated / seconds:.2f} coalitions/s, "
          f"{seconds / estimate.permutations:.1f} s per permutation; median SE {statistics.median(se):.3f} F1 points "
          f"(max {se.max():.3f}); SE reached in an hour: about {per_hour:.3f} (median)")


def _frame(rows):
    import pandas as pd

    return pd.DataFrame(rows)


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["eval", "shapley", "heads"])
    parser.add_argument("--shape", default="minilm", choices=["minilm", "bert-base"])
    parser.add_argument("--task", default="demo_qa", choices=["demo_qa", "demo_pairs"])
    parser.add_argument("--examples", type=int, default=None, help="eval examples (default 200 / 64)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--over", default="types", choices=["types", "layers"])
    parser.add_argument("--permutations", type=int, default=4, help="heads: removal orders (pairs: even)")
    parser.add_argument("--floor", type=float, default=None, help="heads: truncate a chain at this F1")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5 / 3)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    args = parser.parse_args()
    args.device = check_device(parser, args.device)
    args.rows = None
    args.examples = args.examples or (200 if args.what == "eval" else 64)
    args.rounds = args.rounds or (5 if args.what == "eval" else 3)
    if args.examples < 1 or args.batch < 1 or args.rounds < 1 or args.permutations < 2:
        parser.error("--examples, --batch and --rounds must be positive, --permutations at least 2")
    {"eval": evaluation, "shapley": shapley, "heads": heads}[args.what](args)


if __name__ == "__main__":
    main()
