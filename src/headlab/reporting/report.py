"""A sweep's report on disk: the tidy table, the seeds' table layouts, plots, seeds, and what is missing.

``write_report(sweep_dir, settings)`` writes into ``sweep_dir/report/`` (``report_folder``: with settings other than
the defaults, ``report-<the settings that differ>/``, e.g. ``report-confidence-0.5+correction-none/``, so that a
report with other statistics never overwrites another's, a study's tables included):

==========================================  =====================================================
``table.csv``, ``table.parquet``             the tidy table (``load_sweep``), every job x split x metric
``problems.csv``                             jobs that failed, were killed or never ran
``plans_<split>.md`` / ``.tex``              plan grids in Guan et al.'s Table 2/3 layout
``bars_<split>_<metric>.png``                each plan's delta with its CI
``curve_<split>_<metric>.png``               the metric against the number of heads ablated (nested plans)
``heads_<sweep>_<split>.md`` / ``.tex``      a head sweep as layers x heads of the main metric's delta
``heatmap_<sweep>_<split>_<metric>.png``     the same as a heatmap, significant cells marked
``seeds.csv`` / ``.md``                      mean, sd and t-CI over fine-tuning seeds (when several)
``report.json``                              the statistics' settings, counts and the files above
==========================================  =====================================================

Jobs of several models, tasks or checkpoints in one directory get one set of files each, prefixed
``<task>_<model>_<checkpoint>_``.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from headlab.files import plain_text, short_name, write_frame_atomic, write_json_atomic, write_text_atomic
from headlab.reporting import layouts, plots
from headlab.reporting.statistics import DEFAULT_RESAMPLING, Resampling, across_seeds
from headlab.reporting.sweep_table import load_sweep

SEED_KEYS = ["model", "task", "experiment", "plan", "rules", "policy", "unit", "renormalize", "split", "metric"]


@dataclass
class Report:
    """What ``write_report`` produced: the tidy table, the files, printable tables, the problems."""

    frame: pd.DataFrame
    folder: Path
    files: list[Path] = field(default_factory=list)
    printed: list[str] = field(default_factory=list)  # markdown tables, for the console
    images: dict[str, Path] = field(default_factory=dict)  # W&B key -> PNG
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # W&B key -> table
    legend: str = ""  # how a plan grid's cells read (layouts.plan_legend)

    def summary(self) -> str:
        """``report of N jobs -> FOLDER``: the line a report job ends with."""
        jobs = self.frame["job"].nunique()
        return f"report of {jobs} job{'s' if jobs != 1 else ''} -> {self.folder}"


def _slug(text: str) -> str:
    """``text`` as part of a file name: safe characters, at most 100 bytes (long sweep folders get a hash)."""
    return short_name(re.sub(r"[^A-Za-z0-9=+-]+", "_", text).strip("_"), 100)


DEFAULT_CORRECTION, DEFAULT_FORMATS = "holm", ("png",)


def report_folder(sweep_dir: str | Path, resampling: Resampling = DEFAULT_RESAMPLING,
                  correction: str = DEFAULT_CORRECTION, formats: tuple[str, ...] = DEFAULT_FORMATS) -> Path:
    """``sweep_dir/report`` for the default settings, else ``sweep_dir/report-<key-value+...>`` of the settings
    (as ``report.*`` keys) that differ from them: one folder per settings, a name that pastes into an override."""
    ours = {"resamples": resampling.resamples, "permutations": resampling.permutations,
            "confidence": resampling.confidence, "ci_method": resampling.method, "seed": resampling.seed,
            "ci": resampling.intervals, "correction": correction, "formats": "+".join(formats)}
    defaults = {"resamples": DEFAULT_RESAMPLING.resamples, "permutations": DEFAULT_RESAMPLING.permutations,
                "confidence": DEFAULT_RESAMPLING.confidence, "ci_method": DEFAULT_RESAMPLING.method,
                "seed": DEFAULT_RESAMPLING.seed, "ci": DEFAULT_RESAMPLING.intervals,
                "correction": DEFAULT_CORRECTION, "formats": "+".join(DEFAULT_FORMATS)}
    differ = ",".join(f"{key}={value}" for key, value in ours.items() if value != defaults[key])
    return Path(sweep_dir) / (f"report-{plain_text(differ)}" if differ else "report")


def write_report(sweep_dir: str | Path, resampling: Resampling = DEFAULT_RESAMPLING,
                 correction: str = DEFAULT_CORRECTION, formats: tuple[str, ...] = DEFAULT_FORMATS,
                 latest_multirun: bool = False) -> Report:
    """Collect ``sweep_dir`` and write its report (module docstring) into ``report_folder``; returns what was written.
    ``latest_multirun``: of the jobs of the multirun that last wrote the folder's ``multirun.yaml`` only."""
    frame = load_sweep(sweep_dir, resampling=resampling, correction=correction, latest_multirun=latest_multirun)
    report = Report(frame, report_folder(sweep_dir, resampling, correction, formats),
                    legend=layouts.plan_legend(resampling.confidence, correction, resampling.intervals))
    report.folder.mkdir(parents=True, exist_ok=True)
    for name in ("table.csv", "table.parquet"):
        report.files.append(write_frame_atomic(frame, report.folder / name))
    report.tables["table"] = frame
    problems = pd.DataFrame(frame.attrs["problems"], columns=["job", "reason"])
    report.files.append(write_frame_atomic(problems, report.folder / "problems.csv"))
    sections = list(frame.groupby(["task", "model", "checkpoint"], sort=False))
    for (task, model, checkpoint), section in sections:
        prefix = f"{task}_{model}_{checkpoint[:8]}_" if len(sections) > 1 else ""
        _section(report, section.reset_index(drop=True), prefix, f"{model} on {task}", formats)
    _seeds(report, frame)
    summary = {"sweep_dir": str(sweep_dir), "jobs": int(frame["job"].nunique()), "rows": len(frame),
               "statistics": frame.attrs["statistics"], "problems": frame.attrs["problems"],
               "files": [str(p.relative_to(report.folder)) for p in report.files]}
    earlier = _files_of_earlier_report(report.folder / "report.json")
    write_json_atomic(report.folder / "report.json", summary)
    for stale in earlier - set(summary["files"]):  # a figure the data no longer gives (a curve) does not stay
        (report.folder / stale).unlink(missing_ok=True)
    return report


def _files_of_earlier_report(path: Path) -> set[str]:
    """The files an earlier report in this folder wrote (its ``report.json``), names without folders only."""
    try:
        files = json.loads(path.read_text()).get("files", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {name for name in files if isinstance(name, str) and Path(name).name == name}


def _section(report: Report, frame: pd.DataFrame, prefix: str, title: str, formats: tuple[str, ...]) -> None:
    main = [m for m in dict.fromkeys(frame["main_metric"]) if m in set(frame["metric"])]
    metrics = list(dict.fromkeys([*main, *(m for m in frame["metric"] if m != "loss")])) or ["loss"]  # main first
    if "loss" not in metrics and "loss" in set(frame["metric"]) and at_chance(frame, main):
        metrics.append("loss")  # plans that tie at chance in the metric still differ in how sure they are
    for split in dict.fromkeys(frame["split"]):
        planned = frame["family"].isin(["", "random"])  # plans by name (random head sets too), not by head
        grid_rows = frame[(frame["split"] == split) & planned]
        if len(grid_rows):
            _plan_grid(report, grid_rows, split, metrics, f"{prefix}", f"{title}, {split}", formats)
        sweeps = frame[(frame["split"] == split) & ~planned]
        for sweep, rows in sweeps.groupby(sweeps["job"].map(lambda job: str(Path(job).parent)), sort=False):
            first = rows.iloc[0]
            name = f"{prefix}{_slug(sweep) or _slug(first['family'] + '_' + first['policy'])}_{split}"
            grid = layouts.head_grid(rows, split, metrics[0])
            which = f"{first['family']} {first['policy']}" + ("" if sweep == "." else f", {sweep}")
            _tables(report, grid, f"heads_{name}", f"{title}, {split}: {metrics[0]} delta per head ({which})",
                    index=True)
            for metric in metrics:
                delta, significant = layouts.head_matrix(rows, split, metric)
                label = f"{title}: {first['family']} {first['policy']}"
                paths = plots.head_heatmap(delta, significant, metric, label,
                                           report.folder / f"heatmap_{name}_{metric}", formats)
                _images(report, paths)


def _plan_grid(report, rows, split, metrics, prefix, title, formats) -> None:
    grid = layouts.plan_grid(rows, split, metrics)
    _tables(report, grid, f"{prefix}plans_{split}", f"{title}: {report.legend}")
    for metric in metrics:
        mine = rows[(rows["metric"] == metric) & (rows["heads"] > 0)]
        if len(mine):
            _images(report, plots.plan_bars(mine, metric, f"{title}: {metric}",
                                            report.folder / f"{prefix}bars_{split}_{metric}", formats,
                                            chance_delta(mine)))
        nested = mine[mine["policy"].isin([p for p, plans in mine.groupby("policy") if is_dose_series(plans)])]
        if len(nested):  # a curve only where each plan adds heads to the last: a dose and its response
            _images(report, plots.heads_curve(nested, metric, f"{title}: {metric}",
                                              report.folder / f"{prefix}curve_{split}_{metric}", formats))


def at_chance(frame: pd.DataFrame, metrics: list[str]) -> bool:
    """Whether some plan scores at or below chance in one of ``metrics`` (``load_sweep``'s ``chance``)."""
    rows = frame[frame["metric"].isin(metrics) & (frame["heads"] > 0)]
    return "chance" in rows and bool((rows["value"] <= rows["chance"]).any())


def chance_delta(rows: pd.DataFrame) -> float | None:
    """Chance minus the baseline on the rows' baseline examples (``load_sweep``'s ``chance``; None where unknown)."""
    chance = rows["chance"].iloc[0] if "chance" in rows else np.nan
    return None if not np.isfinite(chance) else float(chance - rows["baseline"].iloc[0])


def is_dose_series(plans: pd.DataFrame) -> bool:
    """Three or more plans of one policy whose changed heads are nested (each plan's heads include the smaller
    plans'): heads pruned by importance, say. Plans of unrelated head types (Guan et al.'s Table 2) are not a
    series: a line through them would show a dose-response where there is none."""
    sets = sorted({frozenset(filter(None, changed.split(","))) for changed in plans["changed"]}, key=len)
    return len({len(s) for s in sets}) == len(sets) >= 3 and all(a < b for a, b in itertools.pairwise(sets))


def _tables(report: Report, table: pd.DataFrame, name: str, caption: str, index: bool = False) -> None:
    markdown = layouts.to_markdown(table, index=index)
    report.files.append(write_text_atomic(report.folder / f"{name}.md", f"{caption}\n\n{markdown}"))  # what it shows
    report.files.append(write_text_atomic(report.folder / f"{name}.tex", layouts.to_latex(table, caption, index=index)))
    report.printed.append(f"{caption}\n{markdown}")
    report.tables[name] = table.reset_index() if index else table


def _images(report: Report, paths: list[Path]) -> None:
    report.files.extend(paths)
    report.images |= {p.stem: p for p in paths if p.suffix == ".png"}


def _seeds(report: Report, frame: pd.DataFrame) -> None:
    """Mean, sd and t-CI of each value and delta over the checkpoints (seeds) of one configuration."""
    rows = []
    for key, group in frame.groupby(SEED_KEYS, sort=False):
        if group["checkpoint"].nunique() < 2:
            continue
        if not np.isfinite(group[["value", "delta"]].to_numpy()).all():  # a seed's metric is undefined (n/a)
            rows.append({**dict(zip(SEED_KEYS, key)), "seeds": len(group),
                         "note": "n/a: the metric is undefined for some seed; no mean over the others"})
            continue
        value, delta = across_seeds(group["value"]), across_seeds(group["delta"])
        rows.append({**dict(zip(SEED_KEYS, key)), "seeds": value["seeds"],
                     **{f"value_{k}": v for k, v in value.items() if k != "seeds"},
                     **{f"delta_{k}": v for k, v in delta.items() if k != "seeds"}, "note": ""})
    if rows:
        seeds = pd.DataFrame(rows)
        report.files.append(write_frame_atomic(seeds, report.folder / "seeds.csv"))
        readable = layouts.to_markdown(layouts.seeds_grid(seeds, SEED_KEYS))
        report.files.append(write_text_atomic(report.folder / "seeds.md", readable))
        report.tables["seeds"] = seeds
        report.printed.append(f"Across fine-tuning seeds: mean (delta mean [95% t-CI])\n{readable}")


def report_settings(options: Any) -> tuple[Resampling, str, tuple[str, ...]]:
    """(resampling, correction, formats) from a ``report`` config section."""
    resampling = Resampling(options.resamples, options.permutations, options.confidence, options.ci_method,
                            options.seed, intervals=options.get("ci", "per_comparison"))
    return resampling, options.correction, tuple(options.formats)
