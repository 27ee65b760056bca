"""``ablate.py mode=gates gates.method=chg``: causal head gating (Nam et al. 2025) on an encoder.

A soft gate ``G = sigmoid(logit)`` per head multiplies its context; the model is frozen. Each of ``gates.chg_fits``
independent fits (seeds ``seed``, ``seed + 1``, ...) has three stages of ``gates.max_steps`` steps, a fresh Adam each:

1. ``free``: from gates drawn uniformly in (0, 1), the task loss alone;
2. ``retain``: from the free fit, the task loss - ``chg_lambda`` x the mean of the logits clipped to [-4, 4], which
   pushes every gate toward 1: ``G+``;
3. ``remove``: from the free fit again, with ``+ chg_lambda``: toward 0, ``G-``.

A head is **facilitating** when both G+ and G- are high (the task keeps it even when pushed to remove it),
**interfering** when both are low (the task removes it even when pushed to keep it), **irrelevant** when G+ is high
and G- low (it goes where the regulariser pushes); "high" is at or above ``gates.chg_threshold`` (0.5). G+ low with
G- high contradicts itself (the task would both remove and keep it) and is called **inconsistent**. The class of a head
is read from its G+ and G- averaged over the fits; its stability is the share of heads whose class is the same in
every fit. Each class's heads are then pruned together and scored beside the baseline with paired CIs, the
validation Nam et al. ran by ablation.

=============================  ==============================================================================
``heads.csv``                  per head: G+ and G- (mean over fits and per fit), the class, whether every fit gave
                               it, the scores facilitation = G-, interference = 1 - G+, irrelevance = G+ - G-
``heads_chg.json``             the classes as a clusters file: ``mask=prune mask.heads=cluster:irrelevant
                               mask.clusters=FILE`` prunes a class's heads
``chg.csv`` / .md              each class pruned: heads, metrics, the change with its CI and p-values
``chg.json``                   the settings, every fit's G+ and G-, the classes, their counts and stability
``records.parquet``            per example of the first eval split: the baseline's (``plan`` empty) and each class
                               pruned (``plan`` ``prune_<class>``): the study's finding recomputes its CI from them
``chg_heads.png``              layers x heads: G+, G-, the classes
``fits/fit<k>/<stage>/``       each stage's fit (resumable after a kill, as ``mode=gates`` L0 fits)
``results.json``               the summary; a complete one for the same config makes a rerun skip the job
=============================  ==============================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf
from rich.console import Console

from headlab.analysis.gates.gate_fit import fit_data, fit_gates, fit_settings
from headlab.analysis.gates.gate_reports import eval_command, evaluate_plans, labels_file, paired_table, warn_at_chance
from headlab.analysis.importance.prune_curve import prune_plan
from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.jobs.plan_evaluator import Variant
from headlab.core.head_names import head_name
from headlab.core.model_files import architecture, model_shape
from headlab.files import write_frame_atomic, write_json_atomic, write_text_atomic
from headlab.reporting import head_plots
from headlab.reporting.layouts import to_markdown
from headlab.tasks.record_metrics import metrics_from_records
from headlab.training.tracking import log_artifacts

CLASSES = ("facilitating", "interfering", "irrelevant", "inconsistent")
UNIFORM_EDGE = 1e-4  # the free fit's gates are drawn from [1e-4, 1 - 1e-4]: finite logits


def head_classes(retain: np.ndarray, remove: np.ndarray, threshold: float) -> np.ndarray:
    """Each head's class from its G+ (``retain``) and G- (``remove``), ``[layers, heads]`` of strings."""
    high_plus, high_minus = retain >= threshold, remove >= threshold
    return np.select([high_plus & high_minus, ~high_plus & ~high_minus, high_plus & ~high_minus],
                     CLASSES[:3], CLASSES[3])


def uniform_logits(seed: int, shape: tuple[int, int]) -> np.ndarray:
    """The free fit's start: gates uniform in (0, 1) from ``seed``, as logits."""
    gates = np.random.default_rng(seed).uniform(UNIFORM_EDGE, 1 - UNIFORM_EDGE, shape)
    return np.log(gates) - np.log1p(-gates)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits))


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Fit every seed's three stages, classify the heads, evaluate each class pruned; ``cfg`` passed ``check_mode``."""
    shape = model_shape(cfg.model)
    job = EvalJob(cfg, identity, plans=[prune_plan(["L0H0"], shape)])
    warn_at_chance(job)
    data = fit_data(job)
    lam, fits = cfg.gates.chg_lambda, []
    for k in range(cfg.gates.chg_fits):
        seed, folder = cfg.seed + k, identity.output_dir / "fits" / f"fit{k}"
        if job.is_global_zero:
            Console().print(f"CHG fit {k + 1} of {cfg.gates.chg_fits} (seed {seed}): free, retain, remove",
                            markup=False, soft_wrap=True)
        free = fit_gates(job, data, folder / "free", fit_settings(cfg, f"fit{k}/free", chg_lambda=0.0), job.logger,
                         uniform_logits(seed, shape), f"uniform:{seed}")
        stages = {stage: fit_gates(job, data, folder / stage, fit_settings(cfg, f"fit{k}/{stage}", chg_lambda=weight),
                                   job.logger, free.parameters, free.key)
                  for stage, weight in (("retain", lam), ("remove", -lam))}
        fits.append({"seed": seed, "free": sigmoid(free.parameters), "retain": sigmoid(stages["retain"].parameters),
                     "remove": sigmoid(stages["remove"].parameters)})
    retain, remove = (np.mean([fit[stage] for fit in fits], axis=0) for stage in ("retain", "remove"))
    classes = head_classes(retain, remove, cfg.gates.chg_threshold)
    present = [c for c in CLASSES[:3] if (classes == c).any()]
    variants = [Variant(f"prune_{c}", prune_plan(_heads_of(classes, c), shape)) for c in present]
    records, baseline = evaluate_plans(job, variants) if variants else ({}, None)
    summary = {}
    if job.is_global_zero:
        summary = write_chg(cfg, job, fits, retain, remove, classes, present, records, baseline)
    job.finish()
    return summary


def _heads_of(classes: np.ndarray, name: str) -> list[str]:
    return [head_name(layer, head) for layer, head in zip(*np.nonzero(classes == name))]


def head_frame(fits: list[dict[str, Any]], retain: np.ndarray, remove: np.ndarray, classes: np.ndarray,
               threshold: float) -> pd.DataFrame:
    """``heads.csv``: one row per head."""
    per_fit = [head_classes(fit["retain"], fit["remove"], threshold) for fit in fits]
    rows = []
    for layer, head in np.ndindex(classes.shape):
        row = {"head": head_name(layer, head), "layer": layer, "head_index": head, "g_retain": retain[layer, head],
               "g_remove": remove[layer, head], "class": classes[layer, head],
               "stable": all(c[layer, head] == classes[layer, head] for c in per_fit),
               "facilitation": remove[layer, head], "interference": 1 - retain[layer, head],
               "irrelevance": retain[layer, head] - remove[layer, head]}
        for k, fit in enumerate(fits):
            row |= {f"fit{k}_g_retain": fit["retain"][layer, head], f"fit{k}_g_remove": fit["remove"][layer, head],
                    f"fit{k}_class": per_fit[k][layer, head]}
        rows.append(row)
    return pd.DataFrame(rows)


def write_chg(cfg: Any, job: EvalJob, fits: list[dict[str, Any]], retain: np.ndarray, remove: np.ndarray,
              classes: np.ndarray, present: list[str], records: dict, baseline: dict | None) -> dict[str, Any]:
    """The files of the module docstring; prints the classes, their stability and each class's cost."""
    out, formats, threshold = job.output_dir, tuple(cfg.report.formats), cfg.gates.chg_threshold
    heads = head_frame(fits, retain, remove, classes, threshold)
    write_frame_atomic(heads, out / "heads.csv")
    stability = float(heads["stable"].mean())
    counts = {c: int((classes == c).sum()) for c in CLASSES}
    labels = dict(zip(heads["head"], heads["class"]))
    plan_path = labels_file(cfg, job, labels, out / "heads_chg.json", method="chg")
    files = ["heads.csv", "heads_chg.json", "chg.json"]
    table, commands = None, {}
    if present:
        table = paired_table(cfg, records, baseline, [f"prune_{c}" for c in present], "plan")
        table.insert(1, "heads", [counts[name.removeprefix("prune_")] for name in table["plan"]])
        write_frame_atomic(table, out / "chg.csv")
        write_text_atomic(out / "chg.md", to_markdown(table.round(4)))
        split = job.data.eval_splits[0]
        write_frame_atomic(pd.concat([baseline[split].assign(plan=None)] +
                                     [records[(f"prune_{c}", split)].assign(plan=f"prune_{c}") for c in present],
                                     ignore_index=True), out / "records.parquet")
        files += ["chg.csv", "chg.md", "records.parquet"]
        commands = {c: eval_command(cfg, c, True, plan_path) for c in present}
    codes = np.vectorize({"interfering": 0.0, "irrelevant": 1.0, "facilitating": 2.0, "inconsistent": np.nan}.get)(
        classes)
    image = head_plots.head_panels({"G+ (pushed toward 1)": retain, "G- (pushed toward 0)": remove,
                                    "class: 0 interfering, 1 irrelevant, 2 facilitating": codes},
                                   f"{cfg.model.name} on {cfg.task.name}: causal head gating",
                                   out / "chg_heads", formats)[0]
    files.append(image.name)
    base_metrics = None if baseline is None else {s: metrics_from_records(r, cfg.task) for s, r in baseline.items()}
    record = {"model": cfg.model.name, "architecture": architecture(cfg.model), "task": cfg.task.name,
              "checkpoint": job.checkpoint_record(), "method": "chg", "settings": OmegaConf.to_container(cfg.gates),
              "classes": counts, "stability": stability, "baseline": base_metrics,
              "fits": [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in fit.items()} for fit in fits],
              "g_retain": retain.tolist(), "g_remove": remove.tolist(), "eval_commands": commands,
              "pruned": None if table is None else table.to_dict("records")}
    write_json_atomic(out / "chg.json", record)
    log_artifacts(job.logger, {"chg_heads": heads, "chg": table}, {"chg_heads": image})
    summary = job.identity.complete({
        "kind": "gates", "method": "chg", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name,
        "checkpoint": job.checkpoint_record(), "seed": cfg.seed, "classes": counts, "stability": stability,
        "baseline": base_metrics, "pruned": record["pruned"], "files": files})
    write_json_atomic(out / "results.json", summary)
    _print(cfg, counts, stability, table, commands, out, len(fits))
    return summary


def _print(cfg, counts, stability, table, commands, out, fits) -> None:
    total = sum(counts.values())
    lines = [", ".join(f"{name} {count}/{total}" for name, count in counts.items() if count or name != "inconsistent"),
             f"stability: {stability:.1%} of the heads have the same class in all {fits} fits"]
    if table is not None:
        metric = cfg.task.main_metric
        for row in table[table["split"] == table["split"].iloc[0]].itertuples():
            lines.append(f"{row.plan} ({row.heads} heads): {row.split} {metric} {getattr(row, metric):.4f} (baseline "
                         f"{row.baseline:.4f}, change {row.delta:+.4f}, CI [{row.ci_low:+.4f}, {row.ci_high:+.4f}])")
    lines += [f"evaluate prune_{name}: {command}" for name, command in commands.items()]
    lines.append(f"-> {out / 'heads.csv'}, {out / 'chg.json'}")
    Console().print("\n".join(lines), markup=False, soft_wrap=True)
