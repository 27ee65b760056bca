"""The checks of the evaluation modes (eval, sweep_heads, report, demo): no weights read, no torch imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.analysis.jobs.checks import check_evaluation, warn_about_plan
from headlab.errors import UserError


def check_eval(cfg: Any) -> None:
    """The plan against the model's shape, the checkpoint, the baseline folder (no weights read)."""
    warn_about_plan(cfg, check_evaluation(cfg))


def check_sweep_heads(cfg: Any) -> None:
    """The sweep's policy and family against the model's shape, the checkpoint, the baseline folder."""
    warn_about_plan(cfg, check_evaluation(cfg, per_head=True))


def check_report(cfg: Any) -> None:
    """A sweep folder to report (unless only the per-head table of ``report.heads`` is asked for)."""
    if not cfg.report.heads or cfg.sweep_dir is not None:
        check_sweep_dir(cfg.sweep_dir)


def check_demo(cfg: Any) -> None:
    """Nothing beyond the groups' checks: the demo checks each of its plans as it builds it."""


def check_sweep_dir(sweep_dir: str | None) -> None:
    """``mode=report`` needs an existing directory of ablate.py results."""
    if sweep_dir is None:
        raise UserError("mode=report needs sweep_dir=DIR: a directory of ablate.py results (a sweep's "
                        "hydra.sweep.dir), or report.heads=[{features: DIR, ...}] for the per-head table")
    if not Path(sweep_dir).is_dir():
        raise UserError(f"sweep_dir={sweep_dir!r}: no such directory")
