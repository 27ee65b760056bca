"""The checks of the evaluation modes (eval, sweep_heads, report, demo): no weights read, no torch imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from headlab.analysis.jobs.checks import check_evaluation, warn_about_plan
from headlab.core.masks import check_mask, plan_from_mask, refuse_substituted
from headlab.core.model_files import model_shape
from headlab.core.plans import HeadPlan
from headlab.errors import UserError
from headlab.reporting.head_table import check_sources
from headlab.reporting.sweep_jobs import finished_results


def check_eval(cfg: Any) -> None:
    """The plan against the model's shape, the checkpoint, the baseline folder (no weights read)."""
    warn_about_plan(cfg, check_evaluation(cfg))


def check_sweep_heads(cfg: Any) -> None:
    """The sweep's policy and family against the model's shape, the checkpoint, the baseline folder."""
    warn_about_plan(cfg, check_evaluation(cfg, per_head=True))
    if cfg.sweep.family == "random":  # each size against the model's heads
        from headlab.analysis.evaluation.sweep_plans import random_plans

        random_plans(cfg.mask.policy, *model_shape(cfg.model), tuple(cfg.sweep.sizes), 1, cfg.sweep.seed)


def check_report(cfg: Any) -> None:
    """A sweep folder to report (unless only the per-head table of ``report.heads`` is asked for)."""
    for entry in cfg.report.get("heads") or []:
        check_sources(**head_sources(entry))
    if not cfg.report.heads or cfg.sweep_dir is not None:
        check_sweep_dir(cfg.sweep_dir)
        finished_results(cfg.sweep_dir, cfg.get("latest_multirun", False))


def head_sources(entry: Any) -> dict[str, Any]:
    """The ``headlab.head_table`` arguments of one ``report.heads`` entry (``sweeps``: one folder or a list)."""
    sources = OmegaConf.to_container(entry, resolve=True)
    sweeps = sources.pop("sweeps", None) or []
    return sources | {"sweeps": [sweeps] if isinstance(sweeps, str) else sweeps}


def check_demo(cfg: Any) -> None:
    """Every plan of the demo (its presets and the command line's mask) against the model's shape."""
    demo_plans(cfg)


def demo_plans(cfg: Any) -> tuple[dict[str, Any], dict[str, HeadPlan]]:
    """The demo's masks and their plans by name: the command line's mask first (unless empty), then
    ``demo.plans`` with the mask's unit and renormalize."""
    shared = {"unit": cfg.mask.unit, "renormalize": cfg.mask.renormalize}
    masks = {name: OmegaConf.merge(shared, plan) for name, plan in cfg.demo.plans.items()}
    if cfg.mask.get("rules") != []:  # a mask given on the command line is shown too
        masks = {"mask (command line)": cfg.mask, **masks}
    for mask in masks.values():
        check_mask(mask)
    num_layers, num_heads = model_shape(cfg.model)  # reads the config only
    plans = {name: plan_from_mask(mask, num_layers, num_heads, cfg.model) for name, mask in masks.items()}
    for plan in plans.values():
        refuse_substituted(plan, "mode=demo")
    return masks, plans


def check_sweep_dir(sweep_dir: str | None) -> None:
    """``mode=report`` needs an existing directory of ablate.py results."""
    if sweep_dir is None:
        raise UserError("mode=report needs sweep_dir=DIR: a directory of ablate.py results (a sweep's "
                        "hydra.sweep.dir), or report.heads=[{features: DIR, ...}] for the per-head table")
    if not str(sweep_dir).strip():  # (Path("") is the working directory)
        raise UserError("sweep_dir='' names no directory: give a sweep's hydra.sweep.dir")
    if Path(sweep_dir).is_file():
        raise UserError(f"sweep_dir={sweep_dir!r} is a file, not a directory: give the sweep's folder (its "
                        "hydra.sweep.dir)")
    if not Path(sweep_dir).is_dir():
        raise UserError(f"sweep_dir={sweep_dir!r}: no such directory")
