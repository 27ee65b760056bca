"""How every ``ablate.py`` job that writes ``results.json`` starts and ends (DESIGN.md section 6).

A job is a pure function of its config and of the files it names: its directory, its resolved config and the
hash of what it computes (``JobIdentity``). ``resumable`` turns a mode's ``run(cfg, job)`` into ``ablate.py``'s
``run(cfg, output_dir)``: when that directory already holds the complete results of this very config and these
very inputs it returns them (a killed sweep resumes by running it again); otherwise it runs the job as one tracked
W&B run, ended (and marked failed when the job raised) before the next job of a multirun starts.

The inputs count by their size and content digest (``input_stamps``): a checkpoint, features or clusters file
written again at the same path (a model fine-tuned again into ``hydra.run.dir=runs/tuned``) makes the jobs that
read it run again instead of returning results of the old file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from omegaconf import OmegaConf

from headlab.core.units import UNITS_VERSION
from headlab.files import RESULT_NEUTRAL, input_stamps, job_hash, relative_paths, without_added_keys, without_keys
from headlab.reporting.results import (
    already_done,
    library_versions,
    note_why_again,
    refuse_another_job,
    retire_results,
)
from headlab.training.tracking import build_logger, tracked_job

# Keys that do not change what a job computes: left out of its config hash (and headlab.files.RESULT_NEUTRAL).
RUNTIME_KEYS = ("logger", "group", "baseline_dir", "demo", "report", "sweep_dir", "paths_root")
# Sections read by these modes only: the other modes' hashes leave them out (importance.top_k is no eval's).
SECTION_MODES = {"importance": ("importance", "prune_curve"), "prune_curve": ("prune_curve",),
                 "features": ("features",), "cluster": ("cluster",), "compare": ("compare",), "sweep": ("sweep_heads",),
                 "syntax": ("syntax",), "study": ("study",), "shapley": ("shapley",), "patch": ("patch",),
                 "gates": ("gates",), "optim": ("gates",)}

# The modes whose per-example records carry ``task.cluster_field`` (what the statistics resample); the others'
# hashes leave it out
CLUSTERED_MODES = ("eval", "sweep_heads", "prune_curve", "shapley", "patch", "gates", "study")

# Config keys that name files or job directories a job reads (as far as its mode reads that section): what
# researchers write and may write again. ``model.name_or_path`` too, when it is a folder outside the installed
# packages (``files.input_stamps``: reinstalling a package would otherwise run every job again).
INPUT_KEYS = ("ckpt_path", "task.data_files", "mask.clusters", "mask.importance", "mask.reference", "mask.constants",
              "importance.sweep", "features.text_file", "cluster.features", "compare.runs", "compare.syntax",
              "syntax.conllu", "syntax.train_conllu", "syntax.text", "syntax.train_text", "syntax.spacy_model",
              "patch.pairs", "gates.prune_curve", "importance.learned")

Result = dict[str, Any]


# Modes whose results hold paired statistics computed with the ``report`` settings (their resamples, level, method,
# correction, seed): those count in their hash (the formats and the rest of ``report`` do not)
REPORTING_MODES = ("gates",)
REPORT_STATISTICS = ("resamples", "permutations", "confidence", "ci_method", "correction", "ci", "seed")


def computed_config(resolved: dict[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that changes what its mode computes (no ``RESULT_NEUTRAL`` setting)."""
    unread = {section for section, modes in SECTION_MODES.items() if resolved["mode"] not in modes}
    neutral = (*RESULT_NEUTRAL, *([] if resolved["mode"] in CLUSTERED_MODES else ["task.cluster_field"]))
    computed = {k: v for k, v in resolved.items() if k not in RUNTIME_KEYS and k not in unread}
    if resolved["mode"] in REPORTING_MODES and isinstance(resolved.get("report"), dict):
        computed["report"] = {k: resolved["report"][k] for k in REPORT_STATISTICS if k in resolved["report"]}
    return without_keys(without_added_keys(computed), neutral)


def hashed_part(resolved: dict[str, Any]) -> dict[str, Any]:
    """``computed_config`` as hashed: paths inside ``paths_root`` (a study's folder) relative to it."""
    return relative_paths(computed_config(resolved), resolved.get("paths_root"))


def hashed_config(cfg: Any) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The resolved config, the stamps of its inputs and the hash of what the job computes (config and inputs)."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    inputs = input_stamps(computed_config(resolved), INPUT_KEYS)  # the files where they are now
    # the unit ids' rule (headlab.core.units) decides what drop_* computes, and a mode's own rules what it computes:
    # a job of an earlier rule runs again
    rules = {"units": UNITS_VERSION, **MODE_RULES.get(resolved["mode"], {}),
             **METHOD_RULES.get((resolved["mode"], (resolved.get("gates") or {}).get("method")), {})}
    return resolved, inputs, job_hash({**hashed_part(resolved), **rules}, inputs)


# a mode's rules that changed what its jobs compute without a setting to show it: raised with each change
MODE_RULES = {"syntax": {"offset_control": 2},  # 2: the role's own arcs out of their baseline, the bar tau - 1
              "cluster": {"kmeans_starts": 50}}  # headlab.analysis.types.clusters.KMEANS_STARTS (was 10)
# the same for one method of a mode: a CHG job writes its per-example records (its fits are kept: only the
# evaluation runs again)
METHOD_RULES = {("gates", "chg"): {"records": 1}}


@dataclass(frozen=True)
class JobIdentity:
    """Where a job writes, its resolved config, its inputs' stamps and the hash of what it computes (its W&B run id
    too)."""

    output_dir: Path
    resolved: dict[str, Any]
    hash: str
    inputs: dict[str, Any]

    def logger(self, logger_cfg: Any, run_name: str) -> Logger | None:
        """The configured logger (None for ``logger=none``) for run ``<run_name>-<hash[:6]>``, config logged."""
        logger = build_logger(logger_cfg, run_id=self.hash, run_name=f"{run_name}-{self.hash[:6]}")
        if logger:
            logger.log_hyperparams(self.resolved)
        return logger

    def complete(self, summary: Result) -> Result:
        """``summary`` as a complete ``results.json`` of this job: with its config, hash and library versions."""
        return summary | {"config_hash": self.hash, "config": self.resolved, "inputs": self.inputs,
                          "versions": library_versions(), "complete": True}


def resumable(run: Callable[[Any, JobIdentity], Result]) -> Callable[[Any, str | Path], Result]:
    """``run(cfg, job)`` as ``run(cfg, output_dir)``: earlier complete results, or one tracked run of the job."""

    @functools.wraps(run)
    def start(cfg: Any, output_dir: str | Path) -> Result:
        output_dir = Path(output_dir)
        refuse_another_job(output_dir / "results.json", cfg.mode, "ablate.py")
        resolved, inputs, this_hash = hashed_config(cfg)
        done = already_done(output_dir / "results.json", this_hash)
        if done is not None:
            return done
        note_why_again(output_dir / "results.json", hashed_part(resolved), inputs, hashed_part)
        retire_results(output_dir / "results.json")
        with tracked_job():
            return run(cfg, JobIdentity(output_dir, resolved, this_hash, inputs))

    del start.__wrapped__  # its signature is (cfg, output_dir), not the wrapped (cfg, job)
    return start
