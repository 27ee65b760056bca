"""``ablate.py mode=prune_curve``: heads pruned step by step in order of importance (Michel et al. 2019).

Each step scores the heads by gradients on the estimation split (``importance.split``, a training subset by
default) under the current mask, prunes the ``prune_curve.step`` fraction of all heads that score lowest
(``prune_curve.estimator``: a granularity normalised as ``importance`` says, or ``estimate_prune``, the
first-order loss change; never a layer below ``min_heads_per_layer``), and evaluates the mask on the eval
splits with the ``prune`` plan, exactly as ``mode=eval`` would. It stops after the step whose main metric on
the first eval split falls below ``stop_below`` x the baseline, or when no head may be pruned any more. With
``recompute=false`` the full model's importance orders every step. Random pruning orders (one per
``random_seeds`` entry, evaluated at the same head counts) are the baseline curves.

The final mask is the last step at or above the threshold (HF run_bertology's choice); it is timed physically
pruned (``headlab.prune_heads``) against the full model on the eval batches, alternating rounds, medians.

=============================  ==============================================================================
``prune_curve.csv`` / .md      one row per curve (importance, random seed), step and eval split: heads pruned,
                               every metric, the main metric relative to the baseline
``prune_curve.png``            the main metric against heads pruned: importance, each random order, their mean
``final_mask.json``            the final mask (``rules`` as ``mask.rules`` takes them), its metrics, timing
``steps.json``                 progress after every step (scores, heads, metrics): a killed job resumes there
``records.parquet``            per example of the first eval split: the baseline's (``order`` baseline, step 0),
                               each importance step's (``steps/step<N>.parquet`` as it runs) and each random
                               order's records: what the area difference's paired bootstrap CI resamples
``results.json``               the summary; a complete one for the same config makes a rerun skip the job
=============================  ==============================================================================
"""

from __future__ import annotations

import copy
import logging
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console

from headlab.analysis.importance.importance_run import score_heads
from headlab.analysis.importance.timing import forward_seconds
from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.jobs.plan_evaluator import Variant
from headlab.core.head_names import head_name, parse_head_name
from headlab.core.importance import normalize_importance
from headlab.core.model_files import model_shape
from headlab.core.plans import GRANULARITIES, HeadPlan
from headlab.core.pruning import prune_heads, shared_prune_conflict
from headlab.files import read_json, write_frame_atomic, write_json_atomic, write_text_atomic
from headlab.reporting import plots
from headlab.reporting.layouts import to_markdown
from headlab.tasks.record_metrics import metrics_from_records
from headlab.training.tracking import log_artifacts

log = logging.getLogger(__name__)


def lowest_heads(scores: np.ndarray, pruned: list[str], count: int, min_heads_per_layer: int) -> list[str]:
    """Up to ``count`` more heads to prune: the lowest scores first (ties: lower layer, then head), skipping
    heads already pruned and heads whose layer would fall below ``min_heads_per_layer``."""
    num_layers, num_heads = scores.shape
    gone = {parse_head_name(name) for name in pruned}
    left = [num_heads - sum(layer == i for layer, _ in gone) for i in range(num_layers)]
    chosen = []
    for flat in np.argsort(scores, axis=None, kind="stable"):
        layer, head = divmod(int(flat), num_heads)
        if len(chosen) == count:
            break
        if (layer, head) in gone or left[layer] <= min_heads_per_layer:
            continue
        chosen.append(head_name(layer, head))
        left[layer] -= 1
    return chosen


def random_heads(seed: int, shape: tuple[int, int], count: int, min_heads_per_layer: int) -> list[str]:
    """The first ``count`` heads of seed ``seed``'s random pruning order (same layer floor as the curve)."""
    ranks = np.empty(shape[0] * shape[1])
    ranks[np.random.default_rng(seed).permutation(ranks.size)] = np.arange(ranks.size)
    return lowest_heads(ranks.reshape(shape), [], count, min_heads_per_layer)


def prune_plan(heads: list[str], shape: tuple[int, int], policy: str = "prune") -> HeadPlan:
    """The plan that takes ``heads`` away under ``policy``."""
    return HeadPlan.from_rules([{"heads": heads, "policy": policy}] if heads else [], *shape)


def estimated_policies(estimator: str) -> tuple[str, ...]:
    """The policy whose first-order estimate ranks the heads (``estimate_mean``: ``("mean",)``); none for a
    granularity of gradient importance."""
    return () if estimator in GRANULARITIES else (estimator.removeprefix("estimate_"),)


class PruneCurve:
    """The importance curve of one job, resumable from ``steps.json``."""

    def __init__(self, job: EvalJob):
        self.job, self.options = job, job.cfg.prune_curve
        self.policy = self.options.policy
        config = job.model.config
        self.shape = (config.num_hidden_layers, config.num_attention_heads)
        self.per_step = max(1, round(self.options.step * self.shape[0] * self.shape[1]))
        self.most_steps = most_steps(*self.shape, self.options.step, self.options.min_heads_per_layer)
        self.split, self.metric = job.data.eval_splits[0], job.cfg.task.main_metric
        self.path = job.output_dir / "steps.json"
        saved = read_json(self.path, "prune curve progress") if self.path.is_file() else {}
        if saved.get("config_hash") != job.job_hash:
            saved = {}
        self.steps: list[dict[str, Any]] = saved.get("steps", [])
        self.baseline: dict[str, dict[str, float]] | None = saved.get("baseline")
        self.stopped: str | None = saved.get("stopped")
        self.records: dict[str, pd.DataFrame] = {}  # the last evaluation's, per mask
        self.random_records: dict[tuple[int, int], pd.DataFrame] = {}  # (seed, step) -> records
        if self.steps:
            Console().print(f"resuming after step {len(self.steps)} ({self.path})", markup=False, soft_wrap=True)

    @property
    def threshold(self) -> float:
        """``stop_below`` x the baseline; a baseline of 0 or less (an untrained head's F1, a negative correlation)
        has no meaningful fraction: no threshold, every step runs (``note_baseline`` says so)."""
        base = self.baseline[self.split][self.metric]
        return self.options.stop_below * base if base > 0 else float("-inf")

    def note_baseline(self) -> None:
        base = self.baseline[self.split][self.metric]
        if base <= 0 and self.job.is_global_zero:
            Console().print(f"note: the unablated {self.split} {self.metric} is {base:.4f}: prune_curve.stop_below="
                            f"{self.options.stop_below:g} of it means nothing, so no step stops the curve",
                            markup=False, soft_wrap=True)

    def run(self) -> None:
        """Score, prune, evaluate, until the metric falls below the threshold or no head may go."""
        if self.baseline is not None:
            self.note_baseline()
        for step in self.steps:  # a step saved without its records (killed between the two): evaluated again
            if not self.step_records(step["step"]).is_file():
                self.evaluate({"curve": step["pruned"]})
                if self.job.is_global_zero:
                    write_frame_atomic(self.records["curve"], self.step_records(step["step"]))
        while self.stopped is None:
            pruned = self.steps[-1]["pruned"] if self.steps else []
            scores = self._scores(pruned)
            new = lowest_heads(scores, pruned, self.per_step, self.options.min_heads_per_layer)
            if not new:
                self.stopped = "no head left to prune"
            else:
                heads = pruned + new
                metrics = self.evaluate({"curve": heads})["curve"]
                self.steps.append({"step": len(self.steps) + 1, "heads_pruned": len(heads), "new": new,
                                   "pruned": heads, "scores": scores.tolist(), "metrics": metrics})
                if self.job.is_global_zero:  # before steps.json names the step: a resumed curve finds its records
                    write_frame_atomic(self.records["curve"], self.step_records(len(self.steps)))
                self._announce(self.steps[-1])
                if metrics[self.split][self.metric] < self.threshold:
                    self.stopped = f"{self.metric} below {self.options.stop_below:g} x the baseline"
            if self.job.is_global_zero:
                write_json_atomic(self.path, {"config_hash": self.job.job_hash, "baseline": self.baseline,
                                              "steps": self.steps, "stopped": self.stopped})

    def step_records(self, step: int) -> Path:
        folder = self.job.output_dir / "steps"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"step{step}.parquet"

    def _scores(self, pruned: list[str]) -> np.ndarray:
        """``[layers, heads]`` scores of the estimator under the mask pruning ``pruned`` (lowest go first)."""
        if self.steps and not self.options.recompute:
            return np.array(self.steps[0]["scores"])
        estimator, importance = self.options.estimator, self.job.cfg.importance
        policies = estimated_policies(estimator)
        gradients = score_heads(self.job, prune_plan(pruned, self.shape, self.policy), policies, key_types=False)
        if estimator in GRANULARITIES:
            return normalize_importance(gradients.importance(estimator), importance.normalize_layer,
                                        importance.normalize_global)
        return gradients.estimate(policies[0])

    def evaluate(self, masks: dict[str, list[str]]) -> dict[str, dict[str, dict[str, float]]]:
        """``{name: {split: metrics}}`` of each mask (pruned head names), in one pass over the eval data."""
        variants = [Variant(name, prune_plan(heads, self.shape, self.policy)) for name, heads in masks.items()]
        records, baseline = self.job.evaluate(variants)
        task = self.job.cfg.task
        self.records = {v.name: records[(v.name, self.split)] for v in variants}  # the main split's, per mask
        if self.baseline is None:
            self.baseline = {split: metrics_from_records(rows, task) for split, rows in baseline.items()}
            self.note_baseline()
        return {v.name: {split: metrics_from_records(records[(v.name, split)], task) for split in baseline}
                for v in variants}

    def random_curves(self) -> dict[int, list[dict[str, Any]]]:
        """Per random seed, one point per step of the importance curve: the same number of heads, random ones."""
        counts = [step["heads_pruned"] for step in self.steps]
        masks = {f"random{seed}_{count}": random_heads(seed, self.shape, count, self.options.min_heads_per_layer)
                 for seed in self.options.random_seeds for count in counts}
        metrics = self.evaluate(masks) if masks else {}
        self.random_records = {(seed, i + 1): self.records[f"random{seed}_{count}"]
                               for seed in self.options.random_seeds for i, count in enumerate(counts)}
        return {seed: [{"step": i + 1, "heads_pruned": count, "pruned": masks[f"random{seed}_{count}"],
                        "metrics": metrics[f"random{seed}_{count}"]} for i, count in enumerate(counts)]
                for seed in self.options.random_seeds}

    def final_step(self) -> dict[str, Any]:
        """The last step at or above the threshold (step 0, nothing pruned, if even the first fell below)."""
        kept = [s for s in self.steps if s["metrics"][self.split][self.metric] >= self.threshold]
        return kept[-1] if kept else {"step": 0, "heads_pruned": 0, "pruned": [], "metrics": self.baseline}

    def _announce(self, step: dict[str, Any]) -> None:
        if not self.job.is_global_zero:
            return
        value, base = step["metrics"][self.split][self.metric], self.baseline[self.split][self.metric]
        total = self.shape[0] * self.shape[1]
        Console().print(f"step {step['step']} of at most {self.most_steps}: {step['heads_pruned']}/{total} heads "
                        f"pruned, {self.split} "
                        f"{self.metric} {value:.4f} ({relative(value, base):.1%} of the baseline {base:.4f})",
                        markup=False, soft_wrap=True)
        if self.job.logger:
            self.job.logger.log_metrics({f"prune_curve/{self.split}/{self.metric}": value,
                                         "prune_curve/heads_pruned": step["heads_pruned"]}, step=step["step"])


def most_steps(layers: int, heads: int, step: float, min_heads_per_layer: int) -> int:
    """The most steps a prune curve can take: the heads it may prune (``min_heads_per_layer`` stay in each layer),
    ``step`` of all heads at a time."""
    per_step = max(1, round(step * layers * heads))
    prunable = layers * max(0, heads - min_heads_per_layer)
    return math.ceil(prunable / per_step)


def time_final_mask(job: EvalJob, heads: list[str], shape: tuple[int, int], rounds: int) -> dict[str, Any] | None:
    """Forward seconds over the first eval split, physically pruned vs full model (None if nothing is pruned, if the
    heads leave under another policy than prune, or if the mask cannot be pruned physically: ALBERT's depths share
    weights, and the mask prunes them differently)."""
    if not heads or job.cfg.prune_curve.policy != "prune":
        return None
    conflict = shared_prune_conflict(job.model, prune_plan(heads, shape))
    if conflict:
        Console().print(f"note: the final mask is not timed: {conflict.split(';')[0]}", markup=False, soft_wrap=True)
        return None
    split = job.data.eval_splits[0]
    batches = list(job.data.eval_dataloader(split))
    device = job.trainer.strategy.root_device
    pruned = prune_heads(copy.deepcopy(job.model), prune_plan(heads, shape))
    seconds = forward_seconds({"full": job.model, "pruned": pruned}, batches, rounds, device)
    speedups = [full / fewer for full, fewer in zip(seconds["full"], seconds["pruned"])]  # paired by round
    return {"split": split, "examples": sum(len(b["input_ids"]) for b in batches), "device": str(device),
            "rounds": rounds, "full_seconds": statistics.median(seconds["full"]),
            "pruned_seconds": statistics.median(seconds["pruned"]), "speedup": statistics.median(speedups),
            "seconds": seconds}


def relative(value: float, base: float) -> float:
    """``value`` as a fraction of a positive ``base``; NaN when ``base`` is 0 or less (no meaningful fraction)."""
    return value / base if base > 0 else float("nan")


def curve_table(curve: PruneCurve, random: dict[int, list[dict[str, Any]]]) -> pd.DataFrame:
    """One row per curve, step and split; step 0 is the baseline."""
    total = curve.shape[0] * curve.shape[1]
    start = {"step": 0, "heads_pruned": 0, "metrics": curve.baseline}
    curves = [("importance", None, curve.steps)] + [("random", seed, points) for seed, points in random.items()]
    rows = []
    for order, seed, points in curves:
        for point in [start, *points]:
            for split, metrics in point["metrics"].items():
                rows.append({"order": order, "seed": seed, "step": point["step"],
                             "heads_pruned": point["heads_pruned"], "fraction_pruned": point["heads_pruned"] / total,
                             "split": split, **metrics,
                             "relative": relative(metrics[curve.metric], curve.baseline[split][curve.metric])})
    return pd.DataFrame(rows).astype({"seed": "Int64"})


def curve_records(curve: PruneCurve) -> pd.DataFrame:
    """Every curve's per-example records of the main split: the baseline (step 0), each importance step, each random
    order's steps; ``order``, ``seed`` and ``step`` say which."""
    parts = [curve.job.baseline_records(curve.split).assign(order="baseline", seed=pd.NA, step=0)]
    parts += [pd.read_parquet(curve.step_records(step["step"])).assign(order="importance", seed=pd.NA,
                                                                       step=step["step"]) for step in curve.steps]
    parts += [records.assign(order="random", seed=seed, step=step)
              for (seed, step), records in curve.random_records.items()]
    return pd.concat(parts, ignore_index=True).astype({"seed": "Int64"})


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """The prune curve of ``cfg.ckpt_path`` on ``cfg.task``; ``cfg`` passed ``check_mode``."""
    options = cfg.prune_curve
    shape = model_shape(cfg.model)
    job = EvalJob(cfg, identity, estimation=cfg.importance, plans=[prune_plan(["L0H0"], shape, options.policy)],
                  estimates=estimated_policies(options.estimator))
    curve = PruneCurve(job)
    curve.run()
    random = curve.random_curves()
    summary = {}
    if job.is_global_zero:
        final = curve.final_step()
        timing = time_final_mask(job, final["pruned"], curve.shape, cfg.prune_curve.timing_rounds)
        summary = write_prune_curve(cfg, job, curve, random, final, timing)
    job.finish()
    return summary


def write_prune_curve(cfg: Any, job: EvalJob, curve: PruneCurve, random: dict, final: dict[str, Any],
                      timing: dict[str, Any] | None) -> dict[str, Any]:
    """The files of the module docstring; prints the final mask and how to evaluate it with ``mode=eval``."""
    output_dir, formats = job.output_dir, tuple(cfg.report.formats)
    table = curve_table(curve, random)
    write_frame_atomic(table, output_dir / "prune_curve.csv")
    write_frame_atomic(curve_records(curve), output_dir / "records.parquet")
    write_text_atomic(output_dir / "prune_curve.md", to_markdown(table.round(4)))
    main = table[table["split"] == curve.split]
    image = plots.prune_curve(main, curve.metric, curve.threshold,
                              f"{cfg.model.name} on {cfg.task.name}: heads removed ({curve.policy}) by "
                              f"{cfg.prune_curve.estimator} importance",
                              output_dir / "prune_curve", formats, job.chance(curve.split))[0]
    rules = [{"heads": final["pruned"], "policy": curve.policy}] if final["pruned"] else []
    override = (f"'mask.rules=[{{heads: [{','.join(final['pruned'])}], policy: {curve.policy}}}]'" if rules
                else "mask=none")
    final_record = {"rules": rules, "step": final["step"], "heads_pruned": final["heads_pruned"],
                    "metrics": final["metrics"], "baseline": curve.baseline, "timing": timing,
                    "eval_override": override}
    write_json_atomic(output_dir / "final_mask.json", final_record)
    log_artifacts(job.logger, {"prune_curve": table}, {"prune_curve": image})
    summary = {"kind": "prune_curve", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name,
               "checkpoint": job.checkpoint_record(), "seed": cfg.seed, "settings": dict(
                   estimator=cfg.prune_curve.estimator, policy=curve.policy, per_step=curve.per_step,
                   stopped=curve.stopped,
                   threshold=curve.threshold, split=curve.split, metric=curve.metric),
               "baseline": curve.baseline,
               "steps": [{k: v for k, v in step.items() if k != "scores"} for step in curve.steps],
               "random": random, "final": final_record,
               "files": ["prune_curve.csv", "prune_curve.md", image.name, "final_mask.json", "steps.json",
                         "records.parquet"]}
    summary = job.identity.complete(summary)
    write_json_atomic(output_dir / "results.json", summary)
    _print_final(curve, final_record, output_dir)
    return summary


def _print_final(curve: PruneCurve, final: dict[str, Any], output_dir: Path) -> None:
    value = final["metrics"][curve.split][curve.metric]
    lines = [f"stopped: {curve.stopped}",
             f"final mask: {final['heads_pruned']} heads pruned (step {final['step']}), {curve.split} {curve.metric} "
             f"{value:.4f} (baseline {curve.baseline[curve.split][curve.metric]:.4f})"]
    if final["timing"]:
        timing = final["timing"]
        lines.append(f"physically pruned: {timing['pruned_seconds'] * 1e3:.1f} ms vs full "
                     f"{timing['full_seconds'] * 1e3:.1f} ms per pass over {timing['examples']} {timing['split']} "
                     f"examples (medians of {timing['rounds']} alternating rounds; speedup "
                     f"{timing['speedup']:.2f}x, the median of the rounds' ratios; {timing['device']})")
    lines.append(f"evaluate it: python ablate.py mode=eval ... {final['eval_override']}")
    lines.append(f"-> {output_dir / 'prune_curve.csv'}, {output_dir / 'final_mask.json'}")
    Console().print("\n".join(lines), markup=False, soft_wrap=True)
