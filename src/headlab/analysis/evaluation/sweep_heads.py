"""``ablate.py mode=sweep_heads``: every plan of a family (each head alone, all heads but one, whole layers)
under ``mask.policy``, in one job, exactly as separate ``mode=eval`` jobs would score them, but faster.

A plan that changes only layer l leaves layers 0..l-1 unchanged, and in layer l only its heads'
columns of the self-attention output (heads are computed independently). So per batch, layer l's
input and its self-attention output are computed twice, once unablated and once with every head of
the layer under the policy; each plan's output takes its heads' columns from the second and the rest
from the first, is replayed in place of layer l's self-attention (no query, key or value projections)
and the forward runs from there: the plans differ only from layer l's output projection on (on a family whose depths
share their modules, ALBERT, each plan runs a whole forward, as ``mode=eval`` does: the same numbers). One pass
over the data per layer: a layer's results are written when its pass ends, and a rerun skips the
layers already written. ``sweep.heads_per_batch`` plans share a forward (0: all of a layer's on a GPU,
one at a time on a CPU, where larger batches run slower per row; see BENCHMARKS.md).

Per plan, ``PLAN/results.json`` and ``PLAN/records.parquet`` in the job directory (the format of a
``mode=eval`` job); the job's own ``results.json`` holds the layers x heads tables of metrics and deltas,
also written as ``deltas_<split>.csv`` (the task's main metric).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from rich.console import Console

from headlab.analysis.evaluation.layer_inputs import LayerInputs
from headlab.analysis.evaluation.sweep_plans import family_plans
from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.jobs.plan_evaluator import PlanEvaluator, Variant
from headlab.core.families import family_of
from headlab.core.head_names import head_name
from headlab.core.model_files import model_shape
from headlab.core.model_parts import (
    encoder_layers,
    head_width,
    replay_self_attention,
    self_attention_output,
    start_at_layer,
)
from headlab.core.patch.ablate import ablate, headlab_implementation
from headlab.core.patch.attention import Controller
from headlab.core.patch.first_token import last_layer_at_first_token, reads_first_token
from headlab.core.plans import HeadPlan
from headlab.files import config_hash, write_json_atomic, written_beside
from headlab.reporting.results import read_complete


class LayerSweepEvaluator(PlanEvaluator):
    """Scores the plans of one layer (``variants``: each puts some heads of ``layer`` under one common policy)."""

    def __init__(self, model, task, layer: int, variants: list[Variant], examples: dict[str, Any],
                 per_forward: int = 0, baseline: Variant | None = None, substitutes: Any = None,
                 inputs: LayerInputs | None = None, constants: Any = None):
        super().__init__(model, task, [*variants, *([baseline] if baseline else [])], examples, substitutes,
                         constants)
        self.layer, self.sweep, self.baseline = layer, list(variants), baseline
        self.per_forward = per_forward  # 0: chosen by device in the first step
        self.inputs = inputs  # the layers' unablated inputs kept between a sweep's layer passes (None: not kept)
        self.last = layer == model.config.num_hidden_layers - 1
        self.first_token = task.type != "extractive_qa" and reads_first_token(model)  # the head reads [CLS] alone
        self.every_head = _every_head_plan(layer, self.sweep)  # each head as the plans ablate it
        head_dim = head_width(model)
        self.columns = torch.tensor([[v.plan.policy_of(layer, h) != "keep" for h in range(v.plan.num_heads)]
                                     for v in self.sweep]).repeat_interleave(head_dim, dim=1)  # [plans, heads * dim]

    def on_validation_start(self) -> None:
        super().on_validation_start()
        if not self.per_forward:  # on CPUs a bigger batch is not faster per row (measured: slower); GPUs gain
            self.per_forward = len(self.sweep) if self.device.type == "cuda" else 1
        self.columns = self.columns.to(self.device)

    @torch.no_grad()
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.splits[dataloader_idx]
        inputs = self.model_inputs(batch)
        plain = {name: t for name, t in inputs.items() if name != "sentence_ids"}  # the stock model's inputs
        hidden, kept = self._layer_input(plain, batch, (dataloader_idx, batch_idx), split)
        # [batch, seq, hidden], [batch, seq, heads * dim]
        draws = 1
        if self.resampled:  # every row once per draw (draw-major), each with its draw's source
            draws = self.substitutes.draws
            repeat = lambda t: t.repeat(draws, *[1] * (t.dim() - 1))  # noqa: E731
            inputs, plain, hidden, kept = ({n: repeat(t) for n, t in inputs.items()},
                                           {n: repeat(t) for n, t in plain.items()}, repeat(hidden), repeat(kept))
            inputs["head_sources"] = self.substitutes.sources(self.model, batch, split)
        ablated = self._ablated_output(inputs, hidden)  # [draws * batch, seq, heads * dim]
        size = len(batch["input_ids"]) * draws
        for start in range(0, len(self.sweep), self.per_forward):
            chunk = self.sweep[start : start + self.per_forward]
            columns = self.columns[start : start + len(chunk), None, None]  # [plans, 1, 1, heads * dim]
            output = torch.where(columns, ablated, kept).flatten(0, 1)  # [plans * batch, seq, heads * dim]
            many = {name: t.repeat(len(chunk), *[1] * (t.dim() - 1)) for name, t in plain.items()}
            # the layers above run as under the plans' ablate: headlab's attention (and padding mask), every head kept
            with headlab_implementation(Controller.of(self.model)), \
                    start_at_layer(self.model, self.layer, hidden.repeat(len(chunk), 1, 1)), \
                    self._replayed(output, many["attention_mask"]):
                out = self.model(**many)
            for i, variant in enumerate(chunk):
                rows = SimpleNamespace(**{name: value[i * size : (i + 1) * size] for name, value in out.items()
                                          if isinstance(value, torch.Tensor) and value.dim() > 0})
                self._pending.setdefault((variant.name, split), []).append(self._batch_rows(rows, batch, draws))

    def _replayed(self, output: torch.Tensor, key_mask: torch.Tensor):
        """The swept layer's contexts ``output`` replayed; the last layer at the first token where the head reads
        nothing else (``core/patch/first_token.py``), the swept one's contexts given to it if it is the last."""
        if not self.first_token:
            return replay_self_attention(self.model, self.layer, output)
        stack = ExitStack()
        if not self.last:
            stack.enter_context(replay_self_attention(self.model, self.layer, output))
        stack.enter_context(last_layer_at_first_token(self.model, key_mask, output if self.last else None))
        return stack

    def _layer_input(self, plain: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], key: tuple[int, int],
                     split: str):
        """The unablated input of ``self.layer`` and its self-attention output. The input is the one kept by the
        previous layer's pass if there is one (else the layers below run); the next layer's input is kept for its
        pass; the layers above run only when the baseline's records are wanted too."""
        _, layers = encoder_layers(self.model)
        tokens = plain["input_ids"].shape
        stored = self.inputs.take(self.layer, key, tokens) if self.inputs is not None else None
        keep_next = self.inputs is not None and not self.last and self.inputs.has_room()
        stop = None if self.baseline is not None else _Stopped  # else nothing after what is recorded is needed
        seen, after = [], []

        def next_input(module, args):
            after.append(args[0])
            if stop is not None:
                raise stop

        with ExitStack() as stack:
            if stored is not None:
                seen.append(stored)
                stack.enter_context(start_at_layer(self.model, self.layer, stored))
            else:
                hook = lambda module, args: seen.append(args[0])  # noqa: E731
                stack.callback(layers[self.layer].register_forward_pre_hook(hook).remove)
            if keep_next:
                stack.callback(layers[self.layer + 1].register_forward_pre_hook(next_input).remove)
            kept = stack.enter_context(self_attention_output(self.model, self.layer, None if keep_next else stop))
            try:
                out = self.model(**plain)
                self._pending.setdefault((self.baseline.name, split), []).append(self._batch_rows(out, batch))
            except _Stopped:
                pass
        if keep_next:
            self.inputs.keep(self.layer + 1, key, after[0])
        return seen[0], kept[0]

    def _ablated_output(self, inputs: dict[str, torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
        """The swept layer's self-attention output with every head under the plans' policy: heads are computed
        independently, so a plan's output takes its heads' columns from here and the others' from the kept one."""
        try:
            with ablate(self.model, self.every_head, self.sweep[0].renormalize, means=self.means,
                        constants=self.constants), \
                    start_at_layer(self.model, self.layer, hidden), \
                    self_attention_output(self.model, self.layer, _Stopped) as seen:
                self.model(**inputs)
        except _Stopped:
            pass
        return seen[0]


class _Stopped(Exception):
    """Raised once the swept layer's self-attention output is known."""


def _every_head_plan(layer: int, variants: list[Variant]) -> HeadPlan:
    """Every head of ``layer`` under the one policy the variants use; they may change no other layer."""
    first = variants[0].plan
    policies = {policy for v in variants for policy, count in v.plan.counts().items() if count and policy != "keep"}
    changed = {l for v in variants for policy in policies for l, _ in v.plan.heads_with(policy)}
    if len(policies) != 1 or changed != {layer} or len({v.renormalize for v in variants}) != 1:
        raise ValueError(f"a layer sweep needs plans that change only layer {layer}, with one policy and one "
                         f"renormalize; got policies {sorted(policies)} in layers {sorted(changed)}")
    return HeadPlan.from_rules([{"heads": f"L{layer}", "policy": policies.pop()}], first.num_layers, first.num_heads)


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Every plan of ``cfg.sweep.family`` under ``cfg.mask.policy``; ``cfg`` passed ``check_mode``."""
    num_layers, num_heads = model_shape(cfg.model)
    plans = sweep_family(cfg, num_layers, num_heads)
    plan_hash = lambda name: config_hash([identity.hash, name])  # noqa: E731  each plan's results belong to this job
    console = Console()
    job, output_dir = EvalJob(cfg, identity, plans=[plan for _, _, plan in plans]), identity.output_dir
    # a layer's plans replay it (not across layers: random sets; nor where depths share modules, ALBERT: whole forwards)
    replays = cfg.sweep.family != "random" and not family_of(job.model).shared
    what = "size" if cfg.sweep.family == "random" else "layer"
    results, baseline, inputs = {}, None, LayerInputs()
    groups = list(dict.fromkeys(group for _, group, _ in plans))
    for group in groups:
        variants = [Variant(name, plan, cfg.mask.renormalize) for name, g, plan in plans if g == group]
        finished = {v.name: read_complete(output_dir / v.name / "results.json", plan_hash(v.name))
                    for v in variants}
        if all(finished.values()):
            console.print(f"{what} {group}: already done", markup=False, soft_wrap=True)
            results |= finished
            continue
        if job.trainer.is_global_zero:  # progress over plans; Lightning's bar shows the pass's batches
            span = f" ({groups[0]}-{groups[-1]})" if what == "layer" else ""
            console.print(f"{what} {group}{span}: {len(variants)} plans; {len(results)} of {len(plans)} plans done",
                          markup=False)
        replay = None if not replays else (lambda chosen, extra, layer=group: LayerSweepEvaluator(
            job.model, cfg.task, layer, chosen, job.data.eval_examples, cfg.sweep.heads_per_batch,
            extra[0] if extra else None, job.substitutes, inputs, job.constants))
        records, baseline = job.evaluate(variants, replay)
        done = []
        for variant in variants:
            mine = {split: records[(variant.name, split)] for split in job.data.eval_splits}
            result = job.result(variant, mine, baseline, output_dir / variant.name, plan_hash(variant.name))
            results[variant.name] = result.__dict__
            done.append(result)
            job.log_metrics(result, prefix=f"{variant.name}/")
        if job.trainer.is_global_zero:  # one line per group, not a line and a path per plan
            console.print(group_line(f"{what} {group}", done, cfg.task.main_metric), markup=False, soft_wrap=True)
    summary = (random_summary if cfg.sweep.family == "random" else sweep_summary)(
        cfg, plans, results, num_layers, num_heads, identity)
    if job.trainer.is_global_zero:
        if cfg.sweep.family != "random":
            write_tables(summary, cfg.task.main_metric, output_dir)
        write_json_atomic(output_dir / "results.json", summary)
        console.print(f"sweep of {len(plans)} plans ({cfg.sweep.family}, {cfg.mask.policy}) -> "
                      f"{output_dir / 'results.json'}", markup=False, soft_wrap=True)
    job.finish()
    return summary


def sweep_family(cfg: Any, num_layers: int, num_heads: int) -> list[tuple[str, int, HeadPlan]]:
    """The plans of ``cfg.sweep`` (``sweep_plans.family_plans``)."""
    return family_plans(cfg.sweep.family, cfg.mask.policy, num_layers, num_heads, tuple(cfg.sweep.sizes),
                        cfg.sweep.draws, cfg.sweep.seed)


def group_line(group: str, done: list, metric: str) -> str:
    """``layer L done: N plans [policy]; split metric delta from D (plan) to D (plan)`` over the plans just run."""
    parts = []
    for split in done[0].delta:
        deltas = sorted((result.delta[split][metric], result.plan_name) for result in done)
        (low, low_plan), (high, high_plan) = deltas[0], deltas[-1]
        parts.append(f"{split} {metric} delta from {low:+.4f} ({low_plan}) to {high:+.4f} ({high_plan})")
    return f"{group} done: {len(done)} plans [{done[0].policy}]; " + "; ".join(parts)


def sweep_summary(cfg, plans, results, num_layers, num_heads, identity: JobIdentity) -> dict[str, Any]:
    """The job's ``results.json``: per split and metric, a layers x heads (or layers x 1) table of values and deltas."""
    columns = 1 if cfg.sweep.family == "layer" else num_heads
    first = next(iter(results.values()))
    tables: dict[str, dict[str, dict[str, list]]] = {}
    for split, metrics in first["metrics"].items():
        tables[split] = {}
        for metric in metrics:
            value = [[None] * columns for _ in range(num_layers)]
            delta = [[None] * columns for _ in range(num_layers)]
            for index, (name, layer, _) in enumerate(plans):
                column = 0 if columns == 1 else index % num_heads
                value[layer][column] = results[name]["metrics"][split][metric]
                delta[layer][column] = results[name]["delta"][split][metric]
            tables[split][metric] = {"value": value, "delta": delta, "baseline": first["baseline"][split][metric]}
    return {"kind": "sweep_heads", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name,
            "family": cfg.sweep.family, "policy": cfg.mask.policy, "unit": cfg.mask.unit,
            "renormalize": cfg.mask.renormalize, "checkpoint": first["checkpoint"], "seed": cfg.seed,
            "plans": [name for name, _, _ in plans], "tables": tables, "config_hash": identity.hash,
            "config": identity.resolved, "inputs": identity.inputs, "versions": first["versions"], "complete": True}


def random_summary(cfg, plans, results, num_layers, num_heads, identity: JobIdentity) -> dict[str, Any]:
    """The job's ``results.json`` of the random family: per size, each set's heads, metrics and deltas."""
    first = next(iter(results.values()))
    sets = {str(size): [{"plan": name, "heads": [head_name(l, h) for l, h in plan.heads_with(cfg.mask.policy)],
                         "metrics": results[name]["metrics"], "delta": results[name]["delta"]}
                        for name, group, plan in plans if group == size] for size in dict.fromkeys(cfg.sweep.sizes)}
    return {"kind": "sweep_heads", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name,
            "family": "random", "policy": cfg.mask.policy, "unit": cfg.mask.unit, "renormalize": cfg.mask.renormalize,
            "checkpoint": first["checkpoint"], "seed": cfg.seed, "sizes": list(cfg.sweep.sizes),
            "draws": cfg.sweep.draws, "draw_seed": cfg.sweep.seed, "plans": [name for name, _, _ in plans],
            "baseline": first["baseline"], "sets": sets, "shape": [num_layers, num_heads], "config_hash": identity.hash,
            "config": identity.resolved, "inputs": identity.inputs, "versions": first["versions"], "complete": True}


def write_tables(summary: dict[str, Any], metric: str, output_dir: Path) -> None:
    """``deltas_<split>.csv``: the main metric's deltas, one row per layer, one column per head."""
    import pandas as pd

    for split, tables in summary["tables"].items():
        delta = tables[metric]["delta"]
        columns = ["layer"] if len(delta[0]) == 1 else [f"H{h}" for h in range(len(delta[0]))]
        frame = pd.DataFrame(delta, columns=columns, index=[f"L{l}" for l in range(len(delta))])
        with written_beside(output_dir / f"deltas_{split}.csv") as tmp:
            frame.to_csv(tmp, index_label=f"{metric} delta")
