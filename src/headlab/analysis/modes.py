"""The analysis modes of ``ablate.py``: the registry, and one check and one run of a mode.

Every mode has a ``check(cfg)``, every check that needs no weights (a bad value is one ``error:`` line, not a
traceback after minutes), in its question's ``checks`` module, which imports neither torch nor transformers nor
Lightning, so a typo answers in about a second; and a ``run(cfg, output_dir)``, the mode's job, in its own module.
``ablate.py`` and the study (``headlab.study``) both go through ``check_mode`` and ``run_mode``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Mode:
    """Where a mode's check and run are, as ``"module:function"`` (imported when the mode is asked for)."""

    check: str
    run: str


def _mode(question: str, check: str, run_module: str) -> Mode:
    return Mode(f"headlab.analysis.{question}.checks:{check}", f"headlab.analysis.{question}.{run_module}:run")


ANALYSIS_MODES = {
    "eval": _mode("evaluation", "check_eval", "eval_run"),
    "sweep_heads": _mode("evaluation", "check_sweep_heads", "sweep_heads"),
    "importance": _mode("importance", "check_importance", "importance_run"),
    "prune_curve": _mode("importance", "check_prune_curve", "prune_curve"),
    "shapley": _mode("shapley", "check_shapley", "shapley_run"),
    "gates": _mode("gates", "check_gates", "gates_run"),
    "patch": _mode("patching", "check_patch", "patch_run"),
    "features": _mode("types", "check_features", "features_run"),
    "cluster": _mode("types", "check_cluster", "cluster_run"),
    "compare": _mode("types", "check_compare", "compare_run"),
    "syntax": _mode("syntax", "check_syntax", "syntax_run"),
    "report": _mode("evaluation", "check_report", "report_run"),
    "demo": _mode("evaluation", "check_demo", "demo"),
}


def function_at(reference: str) -> Any:
    """The function a ``"module:function"`` reference names."""
    module, name = reference.split(":")
    return getattr(importlib.import_module(module), name)


ONE_PROCESS = ("prune_curve", "shapley", "patch", "demo")  # modes that run their model in one process only


def check_mode(cfg: Any) -> None:
    """``cfg.mode``'s check (the groups' types and ranges were checked by ``check_config``)."""
    function_at(ANALYSIS_MODES[cfg.mode].check)(cfg)


def run_mode(cfg: Any, out_dir: str | Path) -> Any:
    """``cfg.mode``'s ``run(cfg, out_dir)`` (a config that passed ``check_mode``)."""
    return function_at(ANALYSIS_MODES[cfg.mode].run)(cfg, out_dir)
