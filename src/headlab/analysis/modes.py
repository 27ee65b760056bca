"""The analysis modes of ``ablate.py``: their registry, the checks that need no weights, and one run of a mode.

``check_mode(cfg)`` runs before any weights load (a bad value is one ``error:`` line, not a traceback after
minutes); ``run_mode(cfg, out_dir)`` then runs the mode's stage in ``out_dir``. ``ablate.py`` and the study
(``headlab.study``) both call these two.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict

from headlab.core.masks import check_mask, plan_from_mask
from headlab.errors import UserError, one_of
from headlab.files import check_writable

log = logging.getLogger(__name__)

# mode -> "module:function"; a stage's module (and torch) loads only when it runs.
ANALYSIS_MODES = {
    "eval": "headlab.analysis.eval_run:run_eval",
    "sweep_heads": "headlab.analysis.sweep_heads:run_sweep_heads",
    "importance": "headlab.analysis.importance_run:run_importance",
    "prune_curve": "headlab.analysis.prune_curve:run_prune_curve",
    "features": "headlab.analysis.features_run:run_features",
    "cluster": "headlab.analysis.cluster_run:run_cluster",
    "compare": "headlab.analysis.compare_run:run_compare",
    "report": "headlab.analysis.report_run:run_report",
    "demo": "headlab.analysis.demo:run_demo",
}
EVALUATING = ("eval", "sweep_heads", "importance", "prune_curve")  # modes that score a checkpoint on a task


def job_mask(cfg: Any) -> Any:
    """``mask`` with the fields of the named ``plan`` (a preset's plan) laid over it."""
    if cfg.plan is None:
        return cfg.mask
    one_of("plan", cfg.plan, list(cfg.plans))
    fields = OmegaConf.to_container(cfg.plans[cfg.plan], resolve=True)
    if "rules" in fields:  # a plan gives rules, or one policy on heads: the other form is cleared
        fields |= {"policy": None, "heads": None}
    elif "policy" in fields:
        fields |= {"rules": None}
    return OmegaConf.merge(cfg.mask, fields)


def check_mode(cfg: Any) -> None:
    """Every check of ``cfg.mode``'s config that needs no weights (the groups' types and ranges were checked by
    ``check_config``): the plan against the model's shape, the checkpoint, the files the mode reads."""
    if cfg.mode == "report" and (not cfg.report.heads or cfg.sweep_dir is not None):
        check_sweep_dir(cfg.sweep_dir)
    if cfg.mode == "features":
        check_features(cfg)
    if cfg.mode == "cluster":
        from headlab.analysis.cluster_run import check_cluster

        check_cluster(cfg)
    if cfg.mode == "compare":
        from headlab.analysis.compare_run import check_compare

        check_compare(cfg)
    if cfg.mode not in EVALUATING:
        return
    check_writable(cfg.baseline_dir, "baseline_dir")  # written after the baseline's evaluation: checked before it
    check_preset_clusters(cfg)
    with open_dict(cfg):
        cfg.mask = job_mask(cfg)
    if cfg.mode == "sweep_heads":
        from headlab.analysis.sweep_plans import check_sweep_mask

        check_sweep_mask(cfg.mask)
    else:
        check_mask(cfg.mask)
    if cfg.mode in ("importance", "prune_curve"):
        check_estimation(cfg)
    from headlab.core.models import model_shape  # torch and transformers load only once the config is sane
    from headlab.training.checkpoints import locate_checkpoint

    plan = plan_from_mask(cfg.mask, *model_shape(cfg.model), cfg.model.name) if cfg.mode != "sweep_heads" else None
    locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)
    if cfg.mode == "prune_curve":
        check_prune_curve(cfg, plan)
    warn_about_plan(cfg, plan)


def check_preset_clusters(cfg: Any) -> None:
    """Every ``cluster:NAME`` the preset's plans use is a label of ``mask.clusters`` (all missing names at once)."""
    from headlab.core.head_files import load_clusters

    selectors = []
    for plan in cfg.plans.values():
        rules = plan.get("rules") or [{"heads": plan.get("heads")}]
        for rule in rules:
            heads = rule.get("heads")
            selectors += [heads] if isinstance(heads, str) else list(heads or [])
    needed = sorted({token.strip().removeprefix("cluster:") for selector in selectors
                     for token in str(selector).split(",") if token.strip().startswith("cluster:")})
    if not needed or cfg.mask.clusters is None:
        return
    labels = set(load_clusters(cfg.mask.clusters).values())
    if set(needed) - labels:
        raise UserError(f"the plans of {cfg.group} need clusters named {', '.join(needed)}; mask.clusters="
                        f"{cfg.mask.clusters!r} has {', '.join(sorted(labels))} (name them with mode=cluster "
                        "cluster.names=[...])")


def check_estimation(cfg: Any) -> None:
    """The estimation split exists; the evaluation split only when asked for (selection bias); sweeps exist."""
    split = cfg.importance.split
    one_of("importance.split", split, ["train", cfg.task.train_split, *cfg.task.eval_splits])
    if split in cfg.task.eval_splits and split != cfg.task.train_split:
        log.warning(f"importance.split={split}: heads are scored on the evaluation split, so evaluating a mask "
                    "chosen by this importance on it is biased (the default estimates on a training subset)")
    sweeps = cfg.importance.sweep
    for sweep in [] if sweeps is None else [sweeps] if isinstance(sweeps, str) else list(sweeps):
        if not Path(sweep).exists():
            raise UserError(f"importance.sweep={sweep!r}: no such mode=sweep_heads job directory")


def check_prune_curve(cfg: Any, plan: Any) -> None:
    """A prune curve starts from the full model and must be able to prune a head."""
    if not plan.is_identity:
        raise UserError(f"mode=prune_curve starts from the full model; the mask changes heads ({plan.describe()}): "
                        "use mask=none")
    if cfg.prune_curve.min_heads_per_layer >= plan.num_heads:
        raise UserError(f"prune_curve.min_heads_per_layer={cfg.prune_curve.min_heads_per_layer}: the model has "
                        f"{plan.num_heads} heads per layer, so none could be pruned (allowed: 0-{plan.num_heads - 1})")


def check_features(cfg: Any) -> None:
    """The text file has lines, or the split is one of the task's; the checkpoint exists (no weights read)."""
    from headlab.analysis.feature_data import read_text_lines
    from headlab.training.checkpoints import locate_checkpoint

    if cfg.features.text_file is not None:
        read_text_lines(cfg.features.text_file)
    else:
        one_of("features.split", cfg.features.split, ["train", cfg.task.train_split, *cfg.task.eval_splits])
    locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)


def check_sweep_dir(sweep_dir: str | None) -> None:
    """``mode=report`` needs an existing directory of ablate.py results."""
    if sweep_dir is None:
        raise UserError("mode=report needs sweep_dir=DIR: a directory of ablate.py results (a sweep's "
                        "hydra.sweep.dir), or report.heads=[{features: DIR, ...}] for the per-head table")
    if not Path(sweep_dir).is_dir():
        raise UserError(f"sweep_dir={sweep_dir!r}: no such directory")


def warn_about_plan(cfg: Any, plan: Any) -> None:
    """Plans that run but are probably not what was meant."""
    if plan is not None and plan.is_identity and any(rule.policy != "keep" for rule in plan.rules):
        log.warning("the mask selects no head (every head keeps its attention): this job equals the baseline")
    policies = [cfg.mask.policy] if plan is None else [p for p, n in plan.counts().items() if n]
    single_segment = cfg.task.type != "extractive_qa" and len(cfg.task.text_fields) == 1
    if cfg.mask.unit == "segment" and single_segment and any(str(p).startswith("drop_") for p in policies):
        log.warning(f"unit=segment on task {cfg.task.name}, which has one segment: every key is intra-segment, so "
                    "drop_intra equals prune and drop_inter changes nothing (use unit=sentence)")


def run_mode(cfg: Any, out_dir: str | Path) -> Any:
    """Run ``cfg.mode`` (a config that passed ``check_mode``) in ``out_dir``."""
    module, _, function = ANALYSIS_MODES[cfg.mode].partition(":")
    return getattr(importlib.import_module(module), function)(cfg, out_dir)
