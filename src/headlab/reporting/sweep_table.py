"""``load_sweep``: every evaluation under a sweep directory as one tidy table, with paired statistics.

One row per job x split x metric. Columns: ``job`` (its folder), ``experiment`` (the sweep's group),
``model``, ``task``, ``main_metric`` (the task's), ``checkpoint`` (weights hash), ``seed`` (the fine-tuning seed
when the checkpoint is a train.py job, else the job's), ``plan``, ``rules`` (readable), ``heads`` (how many heads
the plan changes) and ``changed`` (which: comma-separated head names), ``policy``, ``unit``, ``renormalize``,
``family`` / ``layer`` / ``head`` (plans of a ``sweep_heads`` job), ``split``, ``metric``, ``value``,
``baseline``, ``delta``, ``ci_low``, ``ci_high``,
``p_value``, ``p_adjusted``, ``n`` (examples), ``note`` (why a statistic is missing), ``chance`` (what a model that
learned nothing scores on the baseline's examples, ``headlab.tasks.chance``; NaN where the records cannot say:
a loss, SQuAD without its gold answers).

The statistics (``headlab.reporting.statistics``) pair each job's per-example records with its
baseline's; jobs sharing a baseline (checkpoint, task, split, data settings) share resamples. Every
non-identity plan of a (model, task, checkpoint, split, metric) is one family for the correction.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from headlab.core.head_names import parse_head_name
from headlab.errors import UserError
from headlab.reporting.statistics import DEFAULT_RESAMPLING, Resampling, adjust_p_values, family_level, paired_tests
from headlab.reporting.sweep_jobs import Problem, finished_results
from headlab.tasks.chance import chance_level

STAT_COLUMNS = ["ci_low", "ci_high", "p_value", "p_adjusted"]
# Config keys (dotted prefixes) that may differ between the jobs of one table: the plan, what names the job, the
# sections of other modes, and how a job ran (which does not change its numbers). The task's and the model's settings
# must agree (another data file, another max_length: other examples under the same split's name), but for the splits
# evaluated (each split is its own table) and the checkpoint's path (the weights and config are compared by hash).
FREE_KEYS = ("mask.", "plan.", "plans.", "sweep.", "mode.", "task.eval_splits.", "ckpt_path.", "group.", "logger.",
             "baseline_dir.", "report.", "sweep_dir.", "demo.", "compile.", "importance.",
             "prune_curve.", "features.", "cluster.", "compare.", "allow_random_head.", "data.num_workers.",
             "data.cache_dir.", "trainer.devices.", "trainer.num_nodes.", "trainer.accelerator.", "trainer.strategy.",
             "trainer.enable_progress_bar.")
MODEL_KEY = "model hash (weights and config)"  # compared where both jobs recorded it
HEAD_PLAN = re.compile(r"^L(\d+)(?:H(\d+))?$")


def readable_rules(plan: dict[str, Any]) -> str:
    """``policy heads`` per rule, ``; ``-joined (``keep`` when there are none)."""
    rules = plan.get("rules") or []
    parts = []
    for rule in rules:
        heads = rule["heads"] if isinstance(rule["heads"], str) else ",".join(rule["heads"])
        parts.append(f"{rule['policy']} {heads}")
    return "; ".join(parts) or "keep"


def _training_seed(result: dict[str, Any]) -> int:
    """The seed the checkpoint was fine-tuned with (a train.py job's), else the evaluation's."""
    ckpt = result["checkpoint"].get("ckpt_path")
    if ckpt and (Path(ckpt) / "results.json").is_file():
        try:
            return int(json.loads((Path(ckpt) / "results.json").read_text())["seed"])
        except (OSError, ValueError, KeyError):
            pass
    return int(result["seed"])


def _job_rows(root: Path, path: Path, result: dict[str, Any]) -> list[dict[str, Any]]:
    family = result["config"]["sweep"]["family"] if result["mode"] == "sweep_heads" else ""
    preset = list(result["config"].get("plans") or {})  # a preset's plans, in its order (Guan et al.'s ids)
    match = HEAD_PLAN.match(result["plan_name"]) if family else None
    job = {
        "job": str(path.parent.relative_to(root)), "experiment": result["group"], "model": result["model"],
        "task": result["task"], "main_metric": result["config"].get("task", {}).get("main_metric", ""),
        "checkpoint": result["checkpoint"]["weights_hash"],
        "seed": _training_seed(result), "plan": result["plan_name"], "rules": readable_rules(result["plan"]),
        "heads": len(result["plan"]["policies"]),  # the heads whose policy is not keep
        "changed": ",".join(sorted(result["plan"]["policies"], key=parse_head_name)),  # which heads, L2H2 before L2H10
        "policy": result["policy"], "unit": result["unit"], "renormalize": result["renormalize"],
        "family": family, "layer": int(match[1]) if match else np.nan,
        "head": int(match[2]) if match and match[2] is not None else np.nan,
        "_order": preset.index(result["plan_name"]) if result["plan_name"] in preset else len(preset),
    }
    return [{**job, "split": split, "metric": metric, "value": value, "baseline": result["baseline"][split][metric],
             "delta": result["delta"][split][metric], "n": result["num_examples"][split],
             "units": result["num_examples"][split],  # what the statistics resampled: clusters of examples, if any
             "_records": path.parent / result["records"], "_baseline_records": result["baseline_records"][split]}
            for split, metrics in result["metrics"].items() for metric, value in metrics.items()]


def _flat(config: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(config, dict):
        return {prefix: config}
    return {k: v for key, value in config.items() for k, v in _flat(value, f"{prefix}{key}.").items()} or {prefix: {}}


def _settings(result: dict[str, Any]) -> dict[str, Any]:
    """The dotted config keys of a job that must agree across one table: all but its plan and what runs it."""
    flat = _flat(result["config"])
    if result["checkpoint"].get("model_hash"):  # (results written before it was recorded lack it)
        flat[MODEL_KEY] = result["checkpoint"]["model_hash"]
    return {key.rstrip("."): value for key, value in flat.items() if not key.startswith(FREE_KEYS)}


def _differences(reference: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    keys = reference.keys() | settings.keys()
    if MODEL_KEY not in reference.keys() & settings.keys():
        keys -= {MODEL_KEY}
    return sorted(k for k in keys if reference.get(k) != settings.get(k))


def check_one_configuration(directory: str | Path, results: list[tuple[Path, dict[str, Any]]]) -> None:
    """A ``UserError`` when the jobs of one model, task and checkpoint were run with different settings (say
    ``data.max_eval_examples``) or give one plan name twice: one table, one correction family would mix them."""
    sections: dict[tuple, list[tuple[Path, dict[str, Any]]]] = {}
    for path, result in results:
        sections.setdefault((result["model"], result["task"], result["checkpoint"]["weights_hash"]), []).append(
            (path, result))
    where = lambda path: str(path.parent.relative_to(directory))  # noqa: E731
    for (model, task, _), jobs in sections.items():
        first_path, first = jobs[0]
        reference = _settings(first)
        for path, result in jobs[1:]:
            settings = _settings(result)
            differ = _differences(reference, settings)
            if differ:
                shown = ", ".join(f"{k}={reference.get(k)!r} vs {settings.get(k)!r}" for k in differ[:3])
                raise UserError(f"sweep_dir={str(directory)!r} holds jobs of {model} on {task} run with different "
                                f"settings ({shown}: {where(first_path)} vs {where(path)}); one table would mix them: "
                                f"report each sweep from its own folder (hydra.sweep.dir=...)")
        seen: dict[str, Path] = {}
        for path, result in jobs:
            if result["mode"] == "eval" and seen.setdefault(result["plan_name"], path) is not path:
                raise UserError(f"sweep_dir={str(directory)!r} holds plan {result['plan_name']!r} of {model} on {task} "
                                f"twice ({where(seen[result['plan_name']])} and {where(path)}); one table would keep "
                                f"one of them: report each sweep from its own folder (hydra.sweep.dir=...)")


def natural_key(text: str) -> str:
    """``text`` with its numbers zero-padded, so that text order is number order (``random2`` before ``random10``)."""
    return re.sub(r"\d+", lambda number: number.group().zfill(12), str(text))


def load_sweep(directory: str | Path, *, statistics: bool = True, resampling: Resampling = DEFAULT_RESAMPLING,
               correction: str = "holm", latest_multirun: bool = False) -> pd.DataFrame:
    """The tidy table of every finished evaluation under ``directory`` (see the module docstring).

    ``statistics=False`` skips the CIs and p-values (NaN). The jobs that failed or never ran are in
    ``frame.attrs["problems"]`` (``[{"job", "reason"}]``), never silently dropped. The jobs must share their
    settings but for the plan (``check_one_configuration``); ``latest_multirun``: only the jobs of the multirun
    that last wrote ``directory/multirun.yaml`` (a sweep's own report, beside earlier sweeps in its folder).
    """
    root = Path(directory)
    results, problems = finished_results(root, latest_multirun)
    check_one_configuration(root, results)
    frame = pd.DataFrame([row for path, result in results for row in _job_rows(root, path, result)])
    frame["_job"] = frame["job"].map(natural_key)  # random2 before random10
    frame = frame.sort_values(["model", "task", "checkpoint", "_order", "_job"], kind="stable", ignore_index=True)
    for column in STAT_COLUMNS:
        frame[column] = np.nan
    frame["note"] = ""
    if statistics:
        families = frame[frame["heads"] > 0].groupby(["model", "task", "checkpoint", "split", "metric"]).groups
        frame["_family"] = 1
        for index in families.values():
            frame.loc[index, "_family"] = len(index)
        _add_statistics(frame, resampling)
        frame["p_adjusted"] = np.nan
        for index in families.values():
            frame.loc[index, "p_adjusted"] = _family_adjusted(frame.loc[index], correction)
    frame["chance"] = _chance(frame)
    frame.attrs["problems"] = [p.__dict__ for p in problems]
    frame.attrs["statistics"] = {**resampling.__dict__, "correction": correction} if statistics else None
    return frame.drop(columns=["_records", "_baseline_records", "_order", "_job", "_family"], errors="ignore") \
        .reset_index(drop=True)


def _chance(frame: pd.DataFrame) -> pd.Series:
    """Each row's chance level on its baseline's examples (NaN where the records cannot give it)."""
    chance = pd.Series(np.nan, index=frame.index)
    for (path, split, metric), rows in frame.groupby(["_baseline_records", "split", "metric"]).groups.items():
        try:
            table = pd.read_parquet(path)
        except (OSError, ValueError):
            continue
        found = chance_level(metric, table[table["split"] == split] if "split" in table else table)
        chance[rows] = np.nan if found is None else found[0]
    return chance


def _family_adjusted(rows: pd.DataFrame, correction: str) -> np.ndarray:
    """The adjusted p-values of one family. A plan with a delta but no p-value (its records unreadable, too few
    examples) was still tested: it counts in the family as p = 1 (else the others' adjusted p would shrink) and
    keeps no adjusted p itself; a plan whose metric is undefined (delta NaN) is not a test and is left out."""
    p = rows["p_value"].to_numpy(dtype=np.float64)
    untested = np.isnan(p) & np.isfinite(rows["delta"].to_numpy(dtype=np.float64))
    adjusted = adjust_p_values(np.where(untested, 1.0, p), correction)
    return np.where(untested, np.nan, adjusted)


def _add_statistics(frame: pd.DataFrame, resampling: Resampling) -> None:
    """CI and p-value of every row whose job and baseline records can be read (else a note says why)."""
    cache: dict[str, pd.DataFrame | None] = {}

    def records(path: Path | str, split: str) -> pd.DataFrame | None:
        key = f"{path}::{split}"
        if key not in cache:
            try:
                table = pd.read_parquet(path)
                cache[key] = table[table["split"] == split].reset_index(drop=True) if "split" in table else table
            except (OSError, ValueError):
                cache[key] = None
        return cache[key]

    for (baseline_path, split, metric), rows in frame.groupby(["_baseline_records", "split", "metric"]).groups.items():
        base = records(baseline_path, split)
        if base is None:
            frame.loc[rows, "note"] = f"baseline records missing ({baseline_path}): delta without CI"
            continue
        usable, runs = [], []
        for index in rows:
            run = records(frame.at[index, "_records"], split)
            if run is None:
                frame.at[index, "note"] = "per-example records missing: delta without CI"
            elif len(run) != len(base) or not (run["example"].to_numpy() == base["example"].to_numpy()).all():
                frame.at[index, "note"] = "records list other examples than the baseline's: delta without CI"
            else:
                usable.append(index)
                runs.append(run)
        if not usable:
            continue
        if len(base) < 2:
            frame.loc[usable, "note"] = "fewer than 2 examples: no bootstrap"
            continue
        names = [f"plan {frame.at[i, 'plan']!r} ({frame.at[i, 'job']})" for i in usable]
        for index, result in zip(usable, _family_tests(frame, metric, usable, runs, base, resampling, names)):
            frame.loc[index, ["ci_low", "ci_high", "p_value", "units"]] = [result.ci_low, result.ci_high,
                                                                           result.p_value, result.units]
            if not np.isfinite(result.delta):
                frame.loc[index, ["value", "delta", "p_value"]] = [result.value, np.nan, np.nan]
                why = ("no question of its group among the examples" if metric.startswith(("has_ans_", "no_ans_"))
                       else "constant predictions or labels")
                frame.at[index, "note"] = f"n/a: {metric} is undefined here ({why}), so are its delta and p-value"
            elif not (np.isfinite(result.ci_low) and np.isfinite(result.ci_high)):
                frame.at[index, "note"] = ("no CI: the bootstrap resamples are degenerate (BCa's bias or acceleration "
                                           "is not finite); try report.ci_method=percentile")


def _family_tests(frame: pd.DataFrame, metric: str, usable: list, runs: list, base: pd.DataFrame,
                  resampling: Resampling, names: list[str]) -> list:
    """``paired_tests`` of the rows ``usable``, each at its family's level (``family_level``: simultaneous CIs)."""
    sizes = [int(frame.at[index, "_family"]) for index in usable]
    results: list = [None] * len(usable)
    for size in dict.fromkeys(sizes):
        mine = [i for i, s in enumerate(sizes) if s == size]
        found = paired_tests(metric, [runs[i] for i in mine], base, family_level(resampling, size),
                             [names[i] for i in mine])
        for i, result in zip(mine, found):
            results[i] = result
    return results


def problems_of(frame: pd.DataFrame) -> list[Problem]:
    return [Problem(**p) for p in frame.attrs.get("problems", [])]
