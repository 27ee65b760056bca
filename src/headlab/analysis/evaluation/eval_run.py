"""``ablate.py mode=eval``: a checkpoint evaluated under one plan, beside its cached unablated baseline.

The job directory gets ``results.json`` (``headlab.reporting.results.EvalResult``) and
``records.parquet`` (one row per example and split); a job whose results are complete for the same
config prints "already done" and stops, so rerunning a killed sweep runs only what is missing.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from headlab.analysis.jobs.eval_job import EvalJob, summary_line
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.jobs.plan_evaluator import Variant
from headlab.core.masks import mask_rules, plan_from_mask
from headlab.core.model_files import model_shape


def plan_name(cfg: Any) -> str:
    """The plan's name in tables: the preset's ``plan``, else its rules (``prune L0H1,L2``), else ``baseline``."""
    if cfg.plan is not None:
        return cfg.plan
    rules = mask_rules(cfg.mask)
    heads = lambda h: h if isinstance(h, str) else ",".join(h)  # noqa: E731
    return "; ".join(f"{rule['policy']} {heads(rule['heads'])}" for rule in rules) or "baseline"


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Evaluate ``cfg.ckpt_path`` on ``cfg.task`` under ``cfg.mask``; ``cfg`` passed ``check_mode``."""
    variant = Variant(plan_name(cfg), plan_from_mask(cfg.mask, *model_shape(cfg.model)), cfg.mask.renormalize)
    job = EvalJob(cfg, identity, plans=[variant.plan])
    records, baseline = job.evaluate([variant])
    mine = {split: records[(variant.name, split)] for split in job.data.eval_splits}
    result = job.result(variant, mine, baseline, identity.output_dir)
    job.log_metrics(result)
    if job.trainer.is_global_zero:
        Console().print(summary_line(result, cfg.task.main_metric, identity.output_dir / "results.json"),
                        markup=False, soft_wrap=True)
    job.finish()
    return result.__dict__
