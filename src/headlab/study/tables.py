"""The tables stage's reports: each of Guan et al.'s tables per fine-tuned model, and across seeds."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from headlab.reporting.report import Report, report_settings, write_report
from headlab.study.stages import TABLES, Study


def table_folders(study: Study) -> list[Path]:
    """The folders the tables stage reports: ``tables/<table>/<model>``, and ``tables/<table>`` across seeds."""
    folders = []
    for table in TABLES:
        root = study.stage_dir("tables") / table
        folders += [root / name for name, _ in study.models]
        if len(study.models) > 1:
            folders.append(root)
    return folders


def write_table_reports(study: Study) -> list[Report]:
    """``report/`` of every table folder (tidy table, plan grid with paired CIs and adjusted p-values, plots)."""
    resampling, correction, formats = report_settings(study.cfg.report)
    reports = []
    for folder in table_folders(study):
        report = write_report(folder, resampling, correction, formats)
        Console().print(f"report of {report.frame['job'].nunique()} jobs -> {report.folder}", markup=False,
                        soft_wrap=True)
        reports.append(report)
    return reports
