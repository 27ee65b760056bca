"""``ablate.py mode=gates gates.method=optimal``: optimal ablation (Li & Janson 2024) of every head of an encoder.

A head's optimal ablation replaces its context vector by the constant that minimises the expected task loss when that
head alone is replaced; its **gap** is the loss that remains, the expected loss of the ablated model minus the full
model's. Every constant is one of the ablations a constant can be (zero, the mean), so the optimal gap is at most
theirs on the data the constants minimise.

The constants of all heads are learned in one Lightning fit (``constant_training``: each row of a batch replaces one
head), from each head's mean context over the fit split (the training split's first ``gates.max_examples``
examples), ``gates.max_steps`` steps of Adam at ``gates.lr``. Then on the eval splits, never on the fit data, every
head is replaced alone by its constant and, separately, by that same mean (mean ablation over the fit split, where
the constants start), with ``mode=sweep_heads``' code: each head's gap under both, and the paired difference of the
two (optimal - mean loss, on the same examples) with its bootstrap CI and permutation p-value, Holm or BH across the
heads (``report``'s settings).

=============================  ==============================================================================
``constants.json``             the constants file (``mask=optimal mask.heads=... mask.constants=FILE``)
``heads.csv``                  per head and eval split: the optimal and the mean gap (loss change), the main
                               metric's change under each, the difference of the gaps with CI and p-values
``optimal.json``               the settings, the fit, the baseline, the per-head table, the share of heads whose
                               optimal gap is below the mean gap (and significantly so)
``optimal_gaps.png``           the optimal gap against the mean gap of every head (the diagonal: equal)
``fits/optimal/``              the fit (resumable after a kill)
``records.parquet``            per example of the first eval split: the baseline's (``policy`` empty) and each
                               head's under each policy (``policy``, ``head``)
``results.json``               the summary; a complete one for the same config makes a rerun skip the job
=============================  ==============================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf
from rich.console import Console
from torch.utils.data import DataLoader

from headlab.analysis.evaluation.layer_inputs import LayerInputs
from headlab.analysis.evaluation.sweep_heads import LayerSweepEvaluator
from headlab.analysis.evaluation.sweep_plans import family_plans
from headlab.analysis.gates.gate_fit import fit_data, fit_gates, fit_settings
from headlab.analysis.gates.gate_reports import warn_at_chance
from headlab.analysis.importance.prune_curve import prune_plan
from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.jobs.plan_evaluator import Variant
from headlab.core.model_files import architecture, model_shape
from headlab.core.substitutes.constants import constants_record
from headlab.core.substitutes.means import HeadMeans, head_means
from headlab.files import write_frame_atomic, write_json_atomic
from headlab.reporting import plots
from headlab.reporting.statistics import Resampling, adjust_p_values, paired_tests
from headlab.tasks.record_metrics import metrics_from_records
from headlab.training.tracking import log_artifacts

POLICIES = ("optimal", "mean")  # each head's constant, and its mean over the fit split


class FitMeans:
    """What ``mean`` heads take in this job's sweeps: the means over the fit split (the constants' start)."""

    draws = 1

    def __init__(self, means: HeadMeans):
        self._means = means

    def means(self, model: torch.nn.Module) -> HeadMeans:
        return self._means

    def start_pass(self, features: Any) -> None:
        pass


def fit_split_means(job: EvalJob, data: Any) -> HeadMeans:
    """Every head's mean context over the fit split, by the unablated model (float64)."""
    device = next(job.model.parameters()).device
    loader = DataLoader(data.train_features, batch_size=data.eval_batch_size, collate_fn=data.collator)
    with torch.no_grad():
        return head_means(job.model, ({k: v.to(device) for k, v in batch.items()} for batch in loader))


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Learn every head's constant, then sweep the heads under it and under the mean; ``cfg`` passed ``check_mode``."""
    shape = model_shape(cfg.model)
    job = EvalJob(cfg, identity, plans=[prune_plan(["L0H0"], shape)])
    warn_at_chance(job)
    data = fit_data(job)
    means = fit_split_means(job, data)
    fit = fit_gates(job, data, identity.output_dir / "fits" / "optimal", fit_settings(cfg, "optimal"), job.logger,
                    means.values, "fit_split_means")
    constants = HeadMeans("tokens", fit.parameters, np.zeros((), dtype=np.int64))
    records, baseline = sweep_both(job, constants, means, shape)
    summary = {}
    if job.is_global_zero:
        summary = write_optimal(cfg, job, fit, constants, records, baseline, shape)
    job.finish()
    return summary


def sweep_both(job: EvalJob, constants: HeadMeans, means: HeadMeans, shape: tuple[int, int]) -> tuple[dict, dict]:
    """``{(policy, head, split): records}`` of every head replaced alone by its constant and by its mean, on the eval
    splits, and the baseline's records per split (``mode=sweep_heads``' layer replay, a pass per layer and policy)."""
    found, baseline, inputs = {}, None, LayerInputs()
    substitutes = FitMeans(means)
    for policy in POLICIES:
        plans = family_plans("single_head", policy, *shape)
        for layer in range(shape[0]):
            variants = [Variant(f"{policy}_{name}", plan) for name, group, plan in plans if group == layer]
            def replay(chosen, extra, layer=layer):
                return LayerSweepEvaluator(job.model, job.cfg.task, layer, chosen, job.data.eval_examples,
                                           job.cfg.sweep.heads_per_batch, extra[0] if extra else None, substitutes,
                                           inputs, constants)

            if job.is_global_zero:  # a line per pass: the sweeps take a while on a CPU
                Console().print(f"single heads under {policy}: layer {layer + 1} of {shape[0]}", markup=False)
            records, baseline = job.evaluate(variants, replay)
            found |= {(policy, v.name.split("_", 1)[1], split): records[(v.name, split)]
                      for v in variants for split in baseline}
    return found, baseline


def head_table(cfg: Any, records: dict, baseline: dict, shape: tuple[int, int]) -> pd.DataFrame:
    """``heads.csv``: per head and split, both gaps and their paired difference (module docstring)."""
    report, metric = cfg.report, cfg.task.main_metric
    resampling = Resampling(report.resamples, report.permutations, report.confidence, report.ci_method, report.seed)
    heads = [f"L{layer}H{head}" for layer in range(shape[0]) for head in range(shape[1])]
    rows = []
    for split, base in baseline.items():
        base_metrics = metrics_from_records(base, cfg.task)
        tests = [paired_tests("loss", [records[("optimal", head, split)]], records[("mean", head, split)], resampling,
                              [head])[0] for head in heads]  # each head's optimal run against its own mean run
        adjusted = adjust_p_values([t.p_value for t in tests], report.correction)
        for head, test, p_adjusted in zip(heads, tests, adjusted):
            optimal = metrics_from_records(records[("optimal", head, split)], cfg.task)
            mean = metrics_from_records(records[("mean", head, split)], cfg.task)
            rows.append({"head": head, "split": split, "optimal_gap": optimal["loss"] - base_metrics["loss"],
                         "mean_gap": mean["loss"] - base_metrics["loss"], "difference": test.delta,
                         "ci_low": test.ci_low, "ci_high": test.ci_high, "p_value": test.p_value,
                         "p_adjusted": float(p_adjusted),
                         f"optimal_{metric}_change": optimal[metric] - base_metrics[metric],
                         f"mean_{metric}_change": mean[metric] - base_metrics[metric]})
    return pd.DataFrame(rows)


def write_optimal(cfg: Any, job: EvalJob, fit: Any, constants: HeadMeans, records: dict, baseline: dict,
                  shape: tuple[int, int]) -> dict[str, Any]:
    """The files of the module docstring; prints the constants file and how the gaps compare."""
    out = job.output_dir
    identity = {"model": cfg.model.name, "architecture": architecture(cfg.model), "task": cfg.task.name,
                "checkpoint": job.checkpoint_record()}
    write_json_atomic(out / "constants.json", constants_record(constants.values, **identity,
                                                              steps=fit.steps, fit_split=cfg.gates.split))
    table = head_table(cfg, records, baseline, shape)
    write_frame_atomic(table, out / "heads.csv")
    split = job.data.eval_splits[0]
    parts = [baseline[split].assign(policy=None, head=None)] + [
        rows.assign(policy=policy, head=head) for (policy, head, s), rows in records.items() if s == split]
    write_frame_atomic(pd.concat(parts, ignore_index=True), out / "records.parquet")
    main = table[table["split"] == split]
    below = float((main["optimal_gap"] <= main["mean_gap"]).mean())
    significant = float((main["ci_high"] < 0).mean())
    image = plots.estimate_scatter(main["mean_gap"].to_numpy(), main["optimal_gap"].to_numpy(),
                                   "mean ablation's gap (loss change)", "optimal ablation's gap",
                                   f"{cfg.model.name} on {cfg.task.name}: single heads, {split}",
                                   out / "optimal_gaps", tuple(cfg.report.formats))[0]
    base_metrics = {s: metrics_from_records(rows, cfg.task) for s, rows in baseline.items()}
    record = {**identity, "method": "optimal", "settings": OmegaConf.to_container(cfg.gates), "steps": fit.steps,
              "baseline": base_metrics, "below_mean": below, "significantly_below_mean": significant,
              "heads": table.to_dict("records")}
    write_json_atomic(out / "optimal.json", record)
    log_artifacts(job.logger, {"optimal_heads": table}, {"optimal_gaps": image})
    summary = job.identity.complete({
        "kind": "gates", "method": "optimal", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name,
        "checkpoint": job.checkpoint_record(), "seed": cfg.seed, "baseline": base_metrics, "below_mean": below,
        "significantly_below_mean": significant, "constants": str(out / "constants.json"),
        "files": ["constants.json", "heads.csv", "optimal.json", "records.parquet", image.name]})
    write_json_atomic(out / "results.json", summary)
    Console().print("\n".join([
        f"optimal gap below the mean gap: {below:.1%} of {len(main)} heads on {split} ({significant:.1%} with the "
        f"paired CI of the difference below 0); median gaps: optimal {main['optimal_gap'].median():+.4f}, mean "
        f"{main['mean_gap'].median():+.4f}",
        f"constants -> {out / 'constants.json'} (mask=optimal mask.heads=SELECTOR mask.constants=that file)",
        f"-> {out / 'heads.csv'}"]), markup=False, soft_wrap=True)
    return summary
