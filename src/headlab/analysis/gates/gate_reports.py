"""What the gate methods share once their fits are done: their plans scored beside the baseline with paired
statistics, the heads' labels as a plan file, and the ``mode=eval`` command that scores a plan again."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.plan_evaluator import PlanEvaluator, Variant
from headlab.core.head_names import head_name
from headlab.core.model_files import architecture
from headlab.core.plans import HeadPlan
from headlab.files import write_json_atomic
from headlab.reporting.statistics import Resampling, adjust_p_values, paired_tests
from headlab.tasks.record_metrics import metrics_from_records
from headlab.training.finetune import pasteable

log = logging.getLogger(__name__)


def warn_at_chance(job: EvalJob) -> None:
    """Score the baseline before the fits (cached for the evaluations after them) and warn when the model scores no
    better than one that learned nothing of the task: it needs none of its heads, so every gate, class and gap the
    fits learn is noise (a fine-tuning too short, or weights not fine-tuned for the task)."""
    keep = HeadPlan.keep_all(job.model.config.num_hidden_layers, job.model.config.num_attention_heads)
    _, baseline = job.evaluate([Variant("baseline", keep)])
    if not job.is_global_zero:
        return
    split, metric = job.data.eval_splits[0], job.cfg.task.main_metric
    chance, score = job.chance(split), metrics_from_records(baseline[split], job.cfg.task)[metric]
    if chance is not None and score <= chance:
        log.warning(f"the model scores {metric} {score:.4g} on {split}, no better than chance ({chance:.4g}): it "
                    "learned nothing of the task, so what the gates learn of its heads is noise; fine-tune it "
                    "further first")


def evaluate_plans(job: EvalJob, variants: list[Variant], models: dict[str, torch.nn.Module] | None = None
                   ) -> tuple[dict[tuple[str, str], Any], dict[str, Any]]:
    """``{(variant, split): records}`` and the baseline's records per split. Without ``models`` every variant runs
    on the job's model, all in one pass; with them (weights trained with their gates, by variant name) the baseline
    comes first from the job's own weights, then each variant on its own weights."""
    if models is None:
        records, baseline = job.evaluate(variants)
        return {(v.name, split): records[(v.name, split)] for v in variants for split in baseline}, baseline
    shape = variants[0].plan.num_layers, variants[0].plan.num_heads
    _, baseline = job.evaluate([Variant("baseline", HeadPlan.keep_all(*shape))])  # cached from here on
    found = {}
    for variant in variants:
        def trained(chosen, extra, model=models[variant.name]):
            if extra:  # the baseline is of the job's weights, never of weights trained with gates
                raise RuntimeError("the baseline must be cached before gates trained with the model are evaluated")
            return PlanEvaluator(model, job.cfg.task, chosen, job.data.eval_examples, job.substitutes, job.constants)

        records, _ = job.evaluate([variant], trained)
        found |= {(variant.name, split): records[(variant.name, split)] for split in baseline}
    return found, baseline


def paired_table(cfg: Any, records: dict[tuple[str, str], Any], baseline: dict[str, Any], names: list[str],
                 column: str) -> pd.DataFrame:
    """One row per plan (``column``: its name) and eval split: every metric, the baseline's main metric, and the
    paired change with its CI, permutation p-value and p-value adjusted across the plans (``report``'s settings)."""
    report = cfg.report
    resampling = Resampling(report.resamples, report.permutations, report.confidence, report.ci_method, report.seed)
    rows = []
    for split, base in baseline.items():
        tests = paired_tests(cfg.task.main_metric, [records[(name, split)] for name in names], base, resampling, names)
        adjusted = adjust_p_values([test.p_value for test in tests], report.correction)
        for name, test, p_adjusted in zip(names, tests, adjusted):
            rows.append({column: name, "split": split, **metrics_from_records(records[(name, split)], cfg.task),
                         "baseline": test.baseline, "delta": test.delta, "ci_low": test.ci_low,
                         "ci_high": test.ci_high, "p_value": test.p_value, "p_adjusted": float(p_adjusted)})
    return pd.DataFrame(rows)


def labels_file(cfg: Any, job: EvalJob, labels: dict[str, str], path: Path, **record: Any) -> Path:
    """The heads' labels (``{"L0H0": label}``, every head) as a clusters file of this model and checkpoint:
    ``mask.heads=cluster:LABEL mask.clusters=PATH`` selects a label's heads, and another model's are refused."""
    layers, heads = job.model.config.num_hidden_layers, job.model.config.num_attention_heads
    ordered = {head_name(i, j): labels[head_name(i, j)] for i in range(layers) for j in range(heads)}
    return write_json_atomic(path, {"labels": ordered, "shape": [layers, heads], "model": cfg.model.name,
                                    "architecture": architecture(cfg.model), "task": cfg.task.name,
                                    "checkpoint": job.checkpoint_record(), **record})


def eval_command(cfg: Any, label: str, selects: bool, plan_path: Path, weights: Path | None = None) -> str:
    """The ``mode=eval`` command that prunes the heads labelled ``label`` in ``plan_path`` (``mask=none`` when
    ``selects`` is false: no head has the label), on the job's model, task and eval examples (by their config names:
    a job's own ``model.*`` or ``task.*`` overrides are to be added)."""
    checkpoint = pasteable("ckpt_path", weights.absolute()) if weights is not None else (
        "" if cfg.ckpt_path is None else pasteable("ckpt_path", Path(cfg.ckpt_path).absolute()))
    mask = (f"mask=prune mask.heads=cluster:{label} " + pasteable("mask.clusters", plan_path.absolute())) if selects \
        else "mask=none"
    examples = cfg.data.get("max_eval_examples")
    data = "" if examples is None else f"data.max_eval_examples={examples}"
    return " ".join(part for part in ("python ablate.py mode=eval", f"model={cfg.model.name}", f"task={cfg.task.name}",
                                      data, checkpoint, mask) if part)
