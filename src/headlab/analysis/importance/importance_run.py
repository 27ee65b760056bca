"""``ablate.py mode=importance``: every head scored by gradients on an estimation split (DESIGN.md section 4).

The estimation data is ``importance.split`` (the task's training split by default, its first
``importance.max_examples`` examples), never the evaluation split unless asked. One forward and one backward
per batch under ``mask`` (heads it prunes score 0, and the job says so). The job directory gets:

=========================  ==============================================================================
``importance.json``        the importance file of DESIGN.md section 5: ``importance`` (``importance.granularity``,
                           normalised as configured), ``estimators`` {example, token, batch, fisher (normalised),
                           estimate_<policy> (raw: the first-order mean loss change of ablating the head alone)},
                           ``raw`` (every estimator before normalisation), ``key_types``, the settings
``per_example.parquet``    one row per estimation example and quantity (gate, token_abs, estimate_<policy>,
                           key_<type>), one column per head
``key_types.csv`` / .md    per head: mean |d loss / d attention weight| to [CLS], [SEP], ./, and other keys
``*.png``                  layers x heads heatmaps of every estimator and key type
``agreement.csv`` / .md    with ``importance.sweep``: Spearman, Kendall, top-k overlap against measured deltas,
                           and a scatter plot per policy; with ``importance.learned`` (``mode=gates`` jobs) their
                           learned measures too (``scores`` "learned", ``analysis.gates.scores``)
``results.json``           the summary; a complete one for the same config makes a rerun skip the job
=========================  ==============================================================================
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console

from headlab.analysis.gates.scores import learned_scores
from headlab.analysis.importance.agreement import (
    agreement_markdown,
    agreement_table,
    normalisation_label,
    read_head_sweep,
)
from headlab.analysis.importance.scoring import HeadScorer
from headlab.analysis.jobs.checks import listed
from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.core.head_names import head_name
from headlab.core.importance import HeadGradients, normalize_importance, punctuation_ids
from headlab.core.masks import plan_from_mask
from headlab.core.model_files import architecture, model_shape
from headlab.core.models import load_tokenizer
from headlab.core.plans import GRANULARITIES, HeadPlan
from headlab.errors import UserError
from headlab.files import write_frame_atomic, write_json_atomic, write_text_atomic
from headlab.reporting import plots
from headlab.reporting.layouts import to_markdown
from headlab.training.checkpoints import tokenizer_config
from headlab.training.tracking import log_artifacts

log = logging.getLogger(__name__)


def score_heads(job: EvalJob, plan: HeadPlan, policies: tuple[str, ...], key_types: bool) -> HeadGradients:
    """Per-example head gradients of the job's model on its estimation split, under ``plan``: the gate
    gradients, first-order estimates of ``policies``, and with ``key_types`` the gradients by key type."""
    cfg = job.cfg
    key_ids = punctuation_ids(load_tokenizer(tokenizer_config(job.checkpoint, cfg.model))) if key_types else None
    scorer = HeadScorer(job.model, plan, policies, cfg.mask.renormalize, None, key_ids, job.substitutes)
    job.scoring_trainer.validate(scorer, datamodule=job.estimation_data, verbose=False)
    scorer.gradients.settings["unit"] = cfg.mask.unit
    return scorer.gradients


def estimators_of(gradients: HeadGradients, options: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(estimators as written, raw): granularities normalised as configured, estimates raw."""
    raw = {g: gradients.importance(g) for g in GRANULARITIES}
    raw |= {f"estimate_{p}": gradients.estimate(p) for p in gradients.estimates}
    written = {name: normalize_importance(scores, options.normalize_layer, options.normalize_global)
               if name in GRANULARITIES else scores for name, scores in raw.items()}
    return written, raw


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Score ``cfg.ckpt_path``'s heads on ``cfg.importance.split``; ``cfg`` passed ``check_mode``."""
    plan = plan_from_mask(cfg.mask, *model_shape(cfg.model))
    pruned = [head_name(layer, head) for layer, head in plan.heads_with("prune")]
    if pruned:
        Console().print(f"note: the mask prunes {', '.join(pruned)}: their importance is 0", markup=False,
                        soft_wrap=True)
    job = EvalJob(cfg, identity, estimation=cfg.importance, evaluation=False, estimates=tuple(cfg.importance.policies))
    gradients = score_heads(job, plan, tuple(cfg.importance.policies), cfg.importance.key_types)
    summary = {}
    if job.is_global_zero:
        summary = write_importance(cfg, job, gradients, pruned, identity.output_dir)
        write_json_atomic(identity.output_dir / "results.json", summary)
        Console().print(f"importance of every head from {gradients.num_examples} examples of "
                        f"{job.estimation_data.eval_splits[0]} -> "
                        f"{identity.output_dir / 'importance.json'}", markup=False, soft_wrap=True)
    job.finish()
    return summary


def write_importance(cfg: Any, job: EvalJob, gradients: HeadGradients, pruned: list[str],
                     output_dir: Path) -> dict[str, Any]:
    """Every file of the module docstring; returns the summary for ``results.json``."""
    options, formats = cfg.importance, tuple(cfg.report.formats)
    written, raw = estimators_of(gradients, options)
    key_types = gradients.key_type_means()
    listed = lambda scores: np.asarray(scores).tolist()  # noqa: E731
    settings = {"split": job.estimation_data.eval_splits[0], "num_examples": gradients.num_examples,
                "granularity": options.granularity, "normalize_layer": options.normalize_layer,
                "normalize_global": options.normalize_global, **gradients.settings, "pruned_by_mask": pruned}
    write_json_atomic(output_dir / "importance.json", {
        "model": cfg.model.name, "architecture": architecture(cfg.model), "task": cfg.task.name,
        "checkpoint": job.checkpoint_record(),
        "importance": listed(written[options.granularity]), "estimators": {k: listed(v) for k, v in written.items()},
        "raw": {k: listed(v) for k, v in raw.items()}, "key_types": {k: listed(v) for k, v in key_types.items()},
        "settings": settings})
    _per_example(gradients, output_dir / "per_example.parquet")
    files = ["importance.json", "per_example.parquet"]
    table = _head_table(key_types) if key_types else None
    if table is not None:
        write_frame_atomic(table, output_dir / "key_types.csv")
        write_text_atomic(output_dir / "key_types.md", to_markdown(table.round(6)))
        files += ["key_types.csv", "key_types.md"]
    images = {}
    for name, scores in written.items():
        signed = name.startswith("estimate_")
        label = "first-order loss change" if signed else f"{name} importance"
        images[name] = plots.score_heatmap(scores, label, f"{cfg.model.name} on {cfg.task.name}: {name}",
                                           output_dir / f"importance_{name}", formats, signed)[0]
    for kind, scores in key_types.items():
        images[f"key_{kind}"] = plots.score_heatmap(scores, f"mean |dL/dA| to {kind}", f"gradient to {kind} keys",
                                                    output_dir / f"key_{kind}", formats)[0]
    agreement = _agreement(cfg, job, raw, written, output_dir, formats, images) if options.sweep else None
    files += [p.name for p in images.values()] + (["agreement.csv", "agreement.md"] if agreement is not None else [])
    log_artifacts(job.logger, {"key_types": table, "agreement": agreement}, images)
    return job.identity.complete({
        "kind": "importance", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name,
        "checkpoint": job.checkpoint_record(), "seed": cfg.seed, "settings": settings, "files": files,
        "agreement": None if agreement is None else agreement.to_dict("records")})


def _agreement(cfg, job, raw, written, output_dir, formats, images) -> pd.DataFrame:
    """Agreement of every estimator with each measured head sweep (``importance.sweep``: one or several), on the raw
    scores and, for the granularities, on the normalised scores ``importance.json`` ranks heads by."""
    sources = [cfg.importance.sweep] if isinstance(cfg.importance.sweep, str) else list(cfg.importance.sweep)
    tables = []
    for source in sources:
        sweep = read_head_sweep(source, job.weights)
        tables.append(agreement_table(raw, sweep, cfg.task.main_metric, cfg.importance.top_k))
        label = normalisation_label(cfg.importance.normalize_layer, cfg.importance.normalize_global)
        if label != "raw":
            normalised = {name: written[name] for name in GRANULARITIES}
            tables.append(agreement_table(normalised, sweep, cfg.task.main_metric, cfg.importance.top_k, label))
        measures = learned_measures(cfg.importance.learned, job)
        if measures:
            tables.append(agreement_table(measures, sweep, cfg.task.main_metric, cfg.importance.top_k, "learned"))
        policy = sweep["policy"]
        if f"estimate_{policy}" in raw:
            measured = np.array(next(iter(sweep["tables"].values()))["loss"]["delta"], dtype=float)
            images[f"agreement_{policy}"] = plots.estimate_scatter(
                raw[f"estimate_{policy}"], measured, f"first-order estimate ({policy})", "measured loss change",
                f"{policy}: estimate vs ablation", output_dir / f"agreement_{policy}", formats)[0]
    table = pd.concat(tables, ignore_index=True)
    write_frame_atomic(table, output_dir / "agreement.csv")
    text = agreement_markdown(table, 3)
    write_text_atomic(output_dir / "agreement.md", text)
    Console().print(f"Agreement with measured single-head ablations\n{text}", markup=False, soft_wrap=True)
    return table


def learned_measures(sources: Any, job: EvalJob) -> dict[str, np.ndarray]:
    """The per-head scores of the ``mode=gates`` jobs ``importance.learned`` (``analysis.gates.scores``), each of
    this job's weights."""
    measures = {}
    for source in listed(sources):
        data, scores = learned_scores(source)
        theirs = data.get("checkpoint", {}).get("weights_hash")
        if theirs != job.weights:
            raise UserError(f"importance.learned entry {source!r} learned on other weights ({theirs}); this "
                            f"checkpoint's are {job.weights}")
        measures |= scores
    return measures


def _head_table(per_head: dict[str, np.ndarray]) -> pd.DataFrame:
    """One row per head, one column per entry of ``per_head`` (each ``[layers, heads]``)."""
    layers, heads = next(iter(per_head.values())).shape
    rows = [{"head": head_name(layer, head), **{k: float(v[layer, head]) for k, v in per_head.items()}}
            for layer in range(layers) for head in range(heads)]
    return pd.DataFrame(rows)


def _per_example(gradients: HeadGradients, path: Path) -> None:
    """``per_example.parquet``: (example, quantity) rows, one column per head."""
    layers, heads = gradients.gate.shape[1:]
    quantities = {"gate": gradients.gate, "token_abs": gradients.token_abs,
                  **{f"estimate_{p}": v for p, v in gradients.estimates.items()},
                  **{f"key_{k}": v for k, v in gradients.key_types.items()}}
    columns = [head_name(layer, head) for layer in range(layers) for head in range(heads)]
    frames = [pd.DataFrame(values.reshape(len(values), -1), columns=columns).assign(
        example=gradients.order[:, 0], quantity=name) for name, values in quantities.items()]
    write_frame_atomic(pd.concat(frames, ignore_index=True)[["example", "quantity", *columns]], path)

