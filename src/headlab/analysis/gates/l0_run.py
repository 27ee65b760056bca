"""``ablate.py mode=gates gates.method=l0``: Voita et al. (2019)'s head pruning by L0-penalised hard concrete gates.

For each penalty of ``gates.lambdas`` one fit (``gate_fit``) learns a gate per head on the fit split (the training
split's first ``gates.max_examples`` examples): the objective is the task loss + lambda x the expected number of open
gates. At evaluation the gates are deterministic (``hard_concrete.deterministic``); a head whose gate is 0 is closed
and pruned (the ``prune`` plan, as ``mode=eval`` runs it), every other head stays whole. Each penalty's pruned model
is scored on the eval splits beside the cached unablated baseline, with the paired bootstrap CI and permutation p of
its change (``report``'s settings; Holm or BH across the penalties).

=============================  ==============================================================================
``gates.json``                 per penalty: the learned log alpha, the deterministic gates, P(open), the closed
                               heads, the metrics and the paired statistics; the settings
``gates.csv`` / .md            one row per penalty and eval split: heads kept and pruned, the metrics, the main
                               metric's change with its CI and p-values
``heads_lambda_<l>.json``      the heads' states (``open`` / ``closed``) as a clusters file: ``mask=prune
                               mask.heads=cluster:closed mask.clusters=FILE`` evaluates the penalty's pruned model
``gates_curve.png``            the main metric against heads pruned, a point per penalty with its CI; with
                               ``gates.prune_curve`` the importance and random orders of that curve beside
``gates_heads.png``            the deterministic gates of every penalty, layers x heads
``records.parquet``            per example of the first eval split: the baseline's and each penalty's records
``fits/lambda_<l>/``           each fit: its checkpoint while it runs (a killed job goes on from there), then
                               ``fit.json`` (and ``model/`` when ``gates.train_model``)
``results.json``               the summary; a complete one for the same config makes a rerun skip the job
=============================  ==============================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf
from rich.console import Console

from headlab.analysis.gates import hard_concrete
from headlab.analysis.gates.gate_fit import GateFit, fit_data, fit_gates, fit_settings
from headlab.analysis.gates.gate_reports import eval_command, evaluate_plans, labels_file, paired_table, warn_at_chance
from headlab.analysis.importance.prune_curve import prune_plan
from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.jobs.plan_evaluator import Variant
from headlab.core.head_names import head_name
from headlab.core.model_files import architecture, model_shape
from headlab.files import write_frame_atomic, write_json_atomic, write_text_atomic
from headlab.reporting import head_plots, plots
from headlab.reporting.layouts import to_markdown
from headlab.tasks.record_metrics import metrics_from_records
from headlab.training.tracking import log_artifacts


def fit_name(penalty: float) -> str:
    return f"lambda_{penalty:g}"


def closed_heads(parameters: np.ndarray) -> list[str]:
    """The heads whose deterministic gate is 0, in layer then head order."""
    gates = hard_concrete.deterministic(torch.as_tensor(parameters)).numpy()
    return [head_name(layer, head) for layer, head in zip(*np.nonzero(gates == 0))]


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Fit the gates of every penalty, evaluate each pruned model; ``cfg`` passed ``check_mode``."""
    shape = model_shape(cfg.model)
    job = EvalJob(cfg, identity, plans=[prune_plan(["L0H0"], shape)])
    warn_at_chance(job)
    data = fit_data(job)
    fits = {}
    for index, penalty in enumerate(cfg.gates.lambdas):
        settings = fit_settings(cfg, fit_name(penalty), l0_lambda=penalty)
        if job.is_global_zero:
            Console().print(f"gate fit {index + 1} of {len(cfg.gates.lambdas)}: lambda {penalty:g}, "
                            f"{settings['max_steps']} steps", markup=False, soft_wrap=True)
        fits[penalty] = fit_gates(job, data, identity.output_dir / "fits" / fit_name(penalty), settings, job.logger)
    variants = [Variant(fit_name(p), prune_plan(closed_heads(fit.parameters), shape)) for p, fit in fits.items()]
    models = {fit_name(p): fit.model for p, fit in fits.items()} if cfg.gates.train_model else None
    records, baseline = evaluate_plans(job, variants, models)
    summary = {}
    if job.is_global_zero:
        summary = write_gates(cfg, job, fits, records, baseline, shape)
    job.finish()
    return summary


def write_gates(cfg: Any, job: EvalJob, fits: dict[float, GateFit], records: dict, baseline: dict,
                shape: tuple[int, int]) -> dict[str, Any]:
    """The files of the module docstring; prints each penalty's result and how to evaluate its plan."""
    out, metric = job.output_dir, cfg.task.main_metric
    penalties = list(fits)
    split = job.data.eval_splits[0]
    names = {fit_name(p): p for p in penalties}
    table = paired_table(cfg, records, baseline, list(names), "fit")
    table.insert(0, "lambda", table.pop("fit").map(names))
    total = shape[0] * shape[1]
    pruned = {p: closed_heads(fits[p].parameters) for p in penalties}
    table.insert(1, "heads_pruned", [len(pruned[p]) for p in table["lambda"]])
    table.insert(1, "heads_kept", total - table["heads_pruned"])
    between = {p: int(((gates > 0) & (gates < 1)).sum()) for p in penalties  # kept whole by the pruned model
               for gates in [hard_concrete.deterministic(torch.as_tensor(fits[p].parameters)).numpy()]}
    table.insert(3, "fractional", [between[p] for p in table["lambda"]])
    write_frame_atomic(table, out / "gates.csv")
    write_text_atomic(out / "gates.md", to_markdown(table.round(4)))
    entries, lines, files = [], [], ["gates.json", "gates.csv", "gates.md"]
    current = {f"heads_{fit_name(p)}.json" for p in penalties}
    for stale in out.glob("heads_lambda_*.json"):  # the plans of penalties this job no longer has
        if stale.name not in current:
            stale.unlink()
    for penalty in penalties:
        fit, name = fits[penalty], fit_name(penalty)
        gates = hard_concrete.deterministic(torch.as_tensor(fit.parameters)).numpy()
        labels = {head_name(i, j): "closed" if gates[i, j] == 0 else "open"
                  for i in range(shape[0]) for j in range(shape[1])}
        plan_path = labels_file(cfg, job, labels, out / f"heads_{name}.json", method="l0", penalty=penalty)
        files.append(plan_path.name)
        rows = table[table["lambda"] == penalty]
        weights = out / "fits" / name / "model" if cfg.gates.train_model else None
        entries.append({
            "lambda": penalty, "steps": fit.steps, "log_alpha": fit.parameters.tolist(), "gates": gates.tolist(),
            "open_probability": hard_concrete.open_probability(torch.as_tensor(fit.parameters)).numpy().tolist(),
            "closed": pruned[penalty], "heads_kept": total - len(pruned[penalty]),
            "fractional": int(((gates > 0) & (gates < 1)).sum()), "plan": plan_path.name,
            "weights": None if weights is None else str(weights),
            "eval_command": eval_command(cfg, "closed", bool(pruned[penalty]), plan_path, weights),
            "results": rows.drop(columns=["lambda"]).to_dict("records")})
        main = rows[rows["split"] == split].iloc[0]
        lines.append(f"lambda {penalty:g}: {len(pruned[penalty])}/{total} heads pruned, {split} {metric} "
                     f"{main[metric]:.4f} (baseline {main['baseline']:.4f}, change {main['delta']:+.4f}, "
                     f"CI [{main['ci_low']:+.4f}, {main['ci_high']:+.4f}])")
    records_file = pd.concat([baseline[split].assign(penalty=np.nan)] +
                             [records[(fit_name(p), split)].assign(penalty=p) for p in penalties], ignore_index=True)
    write_frame_atomic(records_file, out / "records.parquet")
    images = _figures(cfg, job, fits, table, split)
    base_metrics = {s: metrics_from_records(rows, cfg.task) for s, rows in baseline.items()}
    write_json_atomic(out / "gates.json", {
        "model": cfg.model.name, "architecture": architecture(cfg.model), "task": cfg.task.name,
        "checkpoint": job.checkpoint_record(), "method": "l0", "settings": OmegaConf.to_container(cfg.gates),
        "baseline": base_metrics, "fits": entries})
    log_artifacts(job.logger, {"gates": table}, images)
    files += ["records.parquet", *(path.name for path in images.values())]
    summary = job.identity.complete({
        "kind": "gates", "method": "l0", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name,
        "checkpoint": job.checkpoint_record(), "seed": cfg.seed, "baseline": base_metrics,
        "fits": [{k: v for k, v in e.items() if k not in ("log_alpha", "gates", "open_probability")}
                 for e in entries], "files": files})
    write_json_atomic(out / "results.json", summary)
    lines += [f"evaluate lambda {e['lambda']:g}: {e['eval_command']}" for e in entries]
    lines.append(f"-> {out / 'gates.csv'}, {out / 'gates.json'}")
    Console().print("\n".join(lines), markup=False, soft_wrap=True)
    return summary


def _figures(cfg: Any, job: EvalJob, fits: dict[float, GateFit], table: pd.DataFrame, split: str) -> dict[str, Path]:
    metric, formats = cfg.task.main_metric, tuple(cfg.report.formats)
    points = table[table["split"] == split].copy()
    points["ci_low"], points["ci_high"] = points["baseline"] + points["ci_low"], points["baseline"] + points["ci_high"]
    curve = None
    if cfg.gates.prune_curve is not None:
        source = Path(cfg.gates.prune_curve)
        frame = pd.read_csv(source / "prune_curve.csv" if source.is_dir() else source.parent / "prune_curve.csv")
        curve = frame[frame["split"] == split]
    title = f"{cfg.model.name} on {cfg.task.name}: heads pruned by L0 gates"
    curve_image = plots.gates_curve(points, metric, title, job.output_dir / "gates_curve", formats, curve,
                                    job.chance(split))[0]
    panels = {f"lambda {p:g}": hard_concrete.deterministic(torch.as_tensor(fit.parameters)).numpy()
              for p, fit in fits.items()}
    heads_image = head_plots.head_panels(panels, f"{cfg.model.name} on {cfg.task.name}: deterministic gates",
                                         job.output_dir / "gates_heads", formats)[0]
    return {"gates_curve": curve_image, "gates_heads": heads_image}
