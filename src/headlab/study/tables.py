"""The tables stage's reports: each of Guan et al.'s tables per fine-tuned model, and across seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from headlab.files import read_json
from headlab.reporting.report import Report, report_folder, report_settings, write_report
from headlab.study.stages import TABLES, Study


def table_folders(study: Study) -> list[Path]:
    """The folders the tables stage reports: ``tables/<table>/<model>``, and ``tables/<table>`` across seeds when
    the head types mean the same in every seed (``same_types_in_every_seed``)."""
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


def table_report_settings(study: Study) -> Any:
    """The ``report`` section of the tables stage (``study.tables.report`` laid over the study's)."""
    return study.analysis("tables", "eval", None).report


def table_report_folder(study: Study, folder: Path) -> Path:
    """Where the tables stage writes the report of ``folder`` (a table's model, or the table across seeds): its
    settings' folder (``report/`` for the defaults, ``headlab.reporting.report.report_folder``)."""
    return report_folder(folder, *report_settings(table_report_settings(study)))


def write_table_reports(study: Study) -> list[Report]:
    """``report/`` of every table folder (tidy table, plan grid with paired CIs and adjusted p-values, plots)."""
    resampling, correction, formats = report_settings(table_report_settings(study))
    reports = []
    for folder in table_folders(study):
        report = write_report(folder, resampling, correction, formats)
        Console().print(f"report of {report.frame['job'].nunique()} jobs -> {report.folder}", markup=False,
                        soft_wrap=True)
        reports.append(report)
    return reports
