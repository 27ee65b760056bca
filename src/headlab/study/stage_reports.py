"""The reports a stage writes beside its jobs: each of Guan et al.'s tables per fine-tuned model (and across seeds),
and each single-head sweep (a paired CI and adjusted p-value per head, which Michel et al.'s finding reads)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from rich.console import Console

from headlab.files import read_json
from headlab.reporting.report import Report, report_folder, report_settings, write_report
from headlab.study.stages import STAGE_MODES, TABLES, Study

REPORTED = ("tables", "sweep")  # the stages with reports of their own


def report_sources(study: Study, stage: str) -> list[Path]:
    """The folders ``stage`` reports: ``tables/<table>/<model>`` (and ``tables/<table>`` across seeds when the head
    types mean the same in every seed, ``same_types_in_every_seed``); ``sweep/<model>``."""
    if stage == "sweep":
        return [study.stage_dir("sweep") / name for name, _ in study.models]
    folders = []
    for table in TABLES:
        root = study.stage_dir("tables") / table
        folders += [root / name for name, _ in study.models]
        if len(study.models) > 1 and same_types_in_every_seed(study):
            folders.append(root)
    return folders


def same_types_in_every_seed(study: Study) -> bool:
    """Whether every seed's clusters are named by their profiles (Guan et al.'s four types): then ``prune_dense``
    prunes each seed's dense heads, and a mean over seeds means something. Other clusters are numbered by their
    first head (and names by hand follow that numbering), so ``cluster0`` of one seed is not ``cluster0`` of
    another: no across-seed table."""
    labels = [read_json(study.stage_dir("cluster") / name / "clusters.json", "clusters") for name, _ in study.models]
    return all(clusters.get("named") and not clusters.get("named_by_hand") for clusters in labels)


def stage_report_settings(study: Study, stage: str) -> Any:
    """The ``report`` section of ``stage`` (``study.<stage>.report`` laid over the study's)."""
    return study.analysis(stage, STAGE_MODES[stage], None).report


def stage_report_folder(study: Study, stage: str, folder: Path) -> Path:
    """Where ``stage`` writes the report of ``folder``: its settings' folder (``report/`` for the defaults,
    ``headlab.reporting.report.report_folder``)."""
    return report_folder(folder, *report_settings(stage_report_settings(study, stage)))


def write_stage_reports(study: Study, stage: str) -> list[Report]:
    """``report/`` of every folder ``stage`` reports (tidy table, plan grid or head grid with paired CIs and adjusted
    p-values, plots)."""
    resampling, correction, formats = report_settings(stage_report_settings(study, stage))
    reports = []
    for folder in report_sources(study, stage):
        report = write_report(folder, resampling, correction, formats)
        Console().print(report.summary(), markup=False, soft_wrap=True)
        reports.append(report)
    return reports


RETIRED = ".retired"  # <stage>/.retired/<table>/<model>/<job>: jobs of plans the study no longer has


def retire_other_jobs(study: Study, stage: str, jobs: list[Path]) -> list[str]:
    """Move the job folders of ``tables/<table>/<model>`` that are not among ``jobs`` (this run's) to
    ``tables/.retired/``, and return their names: the plans of another clustering (``prune_cluster3`` of k = 4 after
    k = 3) would stay in the folder the table's report reads, and mix two settings in one table."""
    if stage != "tables":
        return []
    ours, moved, stage_dir = {Path(job).absolute() for job in jobs}, [], study.stage_dir(stage)
    for folder in (stage_dir / table / name for table in TABLES for name, _ in study.models):
        found = sorted(path for path in folder.iterdir() if path.is_dir() and (
            (path / ".hydra").is_dir() or (path / "results.json").is_file())) if folder.is_dir() else []
        for job in (path for path in found if path.absolute() not in ours):
            target = stage_dir / RETIRED / job.relative_to(stage_dir)
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(job, target)
            moved.append(str(job.relative_to(stage_dir)))
    return moved
