"""``ablate.py mode=report sweep_dir=DIR``: a sweep's tidy table, paired statistics, tables and plots.

Also run by ``ReportOnMultirunEnd`` (``headlab.cli.hydra_glue``) when a multirun of ``mode=eval`` or
``mode=sweep_heads`` ends and ``report.auto=true``. The files go to ``DIR/report/``
(``headlab.reporting.report``); with ``logger=wandb`` the tables (``wandb.Table``) and plots
(images) are logged to a run of ``job_type=report`` in the sweep's group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console

from headlab.files import config_hash
from headlab.reporting.report import Report, report_settings, write_report
from headlab.training.tracking import build_logger, finish_tracking


def run_report(cfg: Any, output_dir: str | Path | None = None) -> Report:
    """Report ``cfg.sweep_dir`` with the settings of ``cfg.report``; print the tables and any missing jobs."""
    resampling, correction, formats = report_settings(cfg.report)
    report = write_report(cfg.sweep_dir, resampling, correction, formats)
    console = Console()
    for text in report.printed:
        console.print(text, markup=False, soft_wrap=True)
    for problem in report.frame.attrs["problems"]:
        console.print(f"missing: {problem['job']}: {problem['reason']}", markup=False, soft_wrap=True)
    failed = True
    try:
        log_report(cfg, report)
        failed = False
    finally:
        finish_tracking(failed)
    console.print(f"report of {report.frame['job'].nunique()} jobs -> {report.folder}", markup=False, soft_wrap=True)
    return report


def log_report(cfg: Any, report: Report) -> None:
    """The report's tables and images to the configured logger's run (W&B: ``job_type=report``, the sweep's group)."""
    if cfg.logger is None or cfg.logger.get("_target_") is None or "WandbLogger" not in cfg.logger._target_:
        return
    group = str(report.frame["experiment"].iloc[0])
    logger_cfg = OmegaConf.merge(cfg.logger, {"group": group, "job_type": "report", "save_dir": str(report.folder)})
    run_id = config_hash({"report": str(Path(cfg.sweep_dir).resolve()), "rows": len(report.frame)})
    logger = build_logger(logger_cfg, run_id=run_id, run_name=f"report-{group}-{run_id[:6]}")
    for key, table in report.tables.items():
        logger.log_table(key=key, dataframe=table.astype(str) if key != "table" else table)
    for key, path in report.images.items():
        logger.log_image(key=key, images=[str(path)])
    logger.finalize("success")
