"""``ablate.py mode=report sweep_dir=DIR``: a sweep's tidy table, paired statistics, tables and plots.

Also run by ``ReportOnMultirunEnd`` (``headlab.cli.hydra_glue``) when a multirun of ``mode=eval`` or
``mode=sweep_heads`` ends and ``report.auto=true``. The files go to ``DIR/report/``
(``headlab.reporting.report``); with ``logger=wandb`` the tables (``wandb.Table``) and plots
(images) are logged to a run of ``job_type=report`` in the sweep's group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf
from rich.console import Console

from headlab.analysis.evaluation.checks import head_sources
from headlab.files import config_hash, write_frame_atomic
from headlab.reporting.head_table import head_table
from headlab.reporting.report import Report, report_settings, write_report
from headlab.training.tracking import build_logger, log_artifacts, tracked_job


def run(cfg: Any, output_dir: str | Path | None = None) -> Report | None:
    """Report ``cfg.sweep_dir`` with the settings of ``cfg.report``; print the tables and any missing jobs.
    With ``report.heads``, first the per-head table of those sources (``heads.parquet`` / .csv in ``output_dir``)."""
    if cfg.report.get("heads"):
        write_head_table(cfg, Path(output_dir or "."))
    if cfg.sweep_dir is None:
        return None
    resampling, correction, formats = report_settings(cfg.report)
    report = write_report(cfg.sweep_dir, resampling, correction, formats, cfg.get("latest_multirun", False))
    console = Console()
    for text in report.printed:
        console.print(text, markup=False, soft_wrap=True)
    for problem in report.frame.attrs["problems"]:
        console.print(f"missing: {problem['job']}: {problem['reason']}", markup=False, soft_wrap=True)
    with tracked_job():
        log_report(cfg, report)
    console.print(report.summary(), markup=False, soft_wrap=True)
    return report


def write_head_table(cfg: Any, output_dir: Path) -> pd.DataFrame:
    """``headlab.head_table`` of every ``report.heads`` entry, concatenated (one row per head and entry)."""
    tables = []
    for entry in cfg.report.heads:
        tables.append(head_table(**head_sources(entry)))
    table = pd.concat(tables, ignore_index=True)
    write_frame_atomic(table, output_dir / "heads.parquet")
    write_frame_atomic(table, output_dir / "heads.csv")
    Console().print(f"per-head table: {len(table)} rows, {len(table.columns)} columns -> "
                    f"{output_dir / 'heads.parquet'}", markup=False, soft_wrap=True)
    if cfg.logger is not None and cfg.logger.get("_target_"):
        logger = build_logger(cfg.logger, run_id=config_hash({"heads": OmegaConf.to_container(cfg.report.heads)}),
                              run_name="head-table")
        log_artifacts(logger, {"heads": table})
        if logger is not None:
            logger.finalize("success")
    return table


def log_report(cfg: Any, report: Report) -> None:
    """The report's tables and images to the configured logger's run (W&B: ``job_type=report``, the sweep's group)."""
    if cfg.logger is None or cfg.logger.get("_target_") is None or "WandbLogger" not in cfg.logger._target_:
        return
    group = str(report.frame["experiment"].iloc[0])
    logger_cfg = OmegaConf.merge(cfg.logger, {"group": group, "job_type": "report", "save_dir": str(report.folder)})
    run_id = config_hash({"report": str(Path(cfg.sweep_dir).resolve()), "rows": len(report.frame)})
    logger = build_logger(logger_cfg, run_id=run_id, run_name=f"report-{group}-{run_id[:6]}")
    log_artifacts(logger, {key: table.astype(str) if key != "table" else table for key, table in report.tables.items()},
                  report.images)
    logger.finalize("success")
