"""The jobs of a sweep directory: finished results, and the jobs that failed, were killed or never ran.

A Hydra job directory has ``.hydra/overrides.yaml`` from the moment it starts; it is finished when
its ``results.json`` is complete. A ``mode=sweep_heads`` job's plans are ``PLAN/results.json`` in
its directory. The jobs that never started are found from the sweep's ``multirun.yaml``: its sweep
parameters are expanded as Hydra's basic sweeper does, and each job's overrides looked for.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from headlab.errors import UserError

# what an evaluation's results.json holds (ablate.py mode=eval, and each plan of mode=sweep_heads)
EVAL_KEYS = ("mode", "group", "model", "task", "checkpoint", "seed", "plan_name", "plan", "policy", "unit",
             "renormalize", "metrics", "baseline", "delta", "num_examples", "records", "baseline_records", "config")
NO_RESULTS = ("demo", "report")  # ablate.py modes whose jobs write no results.json (demo.json; the report's files)


@dataclass(frozen=True)
class Problem:
    """A job the report cannot use: where, and why."""

    job: str
    reason: str


def _mode(job: Path) -> str | None:
    """The ``mode`` of an ``ablate.py`` job directory (None for train.py jobs or an unreadable config)."""
    try:
        config = OmegaConf.load(job / ".hydra/config.yaml")
    except (OSError, yaml.YAMLError):
        return None
    return config.get("mode") if isinstance(config, DictConfig) else None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _per_split(value: Any, entry) -> bool:
    """``value`` is ``{split: x}`` with ``entry(x)`` true for every split."""
    return isinstance(value, dict) and all(isinstance(split, str) and entry(x) for split, x in value.items())


def _malformed(data: dict[str, Any]) -> str | None:
    """The first field of an evaluation's results.json whose type is not what ablate.py writes (a file edited by
    hand or by another tool), else None."""
    scores = lambda metrics: isinstance(metrics, dict) and all(map(_number, metrics.values()))  # noqa: E731
    checks = {
        **{key: _per_split(data[key], scores) for key in ("metrics", "baseline", "delta")},
        "num_examples": _per_split(data["num_examples"], lambda n: isinstance(n, int) and not isinstance(n, bool)),
        "baseline_records": _per_split(data["baseline_records"], lambda path: isinstance(path, str)),
        "records": isinstance(data["records"], str), "config": isinstance(data["config"], dict),
        "checkpoint": isinstance(data["checkpoint"], dict) and "weights_hash" in data["checkpoint"],
        "plan": isinstance(data["plan"], dict) and isinstance(data["plan"].get("policies"), dict),
    }
    if all(checks.values()):  # the same splits everywhere, each with the same metrics
        metrics = data["metrics"]
        checks["splits"] = all(set(data[key]) == set(metrics)
                               for key in ("baseline", "delta", "num_examples", "baseline_records"))
        checks["metrics of each split"] = checks["splits"] and all(
            set(data[key][split]) == set(metrics[split]) for key in ("baseline", "delta") for split in metrics)
    return next((key for key, good in checks.items() if not good), None)


def collect_results(directory: str | Path, latest_multirun: bool = False
                    ) -> tuple[list[tuple[Path, dict[str, Any]]], list[Problem]]:
    """``[(results path, results)]`` of every finished evaluation under ``directory`` (the plans of head
    sweeps included) and the problems: job directories without complete results, jobs never run.
    ``latest_multirun``: only the jobs of the multirun that wrote ``directory/multirun.yaml`` last (the jobs of
    an earlier sweep into the same directory are left out)."""
    root = Path(directory)
    if not root.is_dir():
        raise UserError(f"sweep_dir={str(directory)!r} is not a directory")
    expected = set(expected_jobs(root) or ()) if latest_multirun else None
    overrides = functools.cache(_overrides_of)  # a head sweep's plans share their job's overrides: read them once
    results, problems = [], []
    for path in sorted(root.rglob("results.json")):
        if expected is not None and overrides(_job_of(path, root)) not in expected:
            continue
        data = _read(path)
        if data is None or not data.get("complete"):
            problems.append(Problem(str(path.parent.relative_to(root)), "results.json unreadable or incomplete"))
        elif data.get("kind") == "eval":
            lacking = [key for key in EVAL_KEYS if key not in data]
            malformed = None if lacking else _malformed(data)
            if lacking or malformed:
                why = f"no {', '.join(lacking[:3])}" if lacking else f"its {malformed} is not what ablate.py writes"
                problems.append(Problem(str(path.parent.relative_to(root)), "results.json is not one of ablate.py's "
                                        f"evaluations ({why})"))
            else:
                results.append((path, data))
    for job in sorted(p.parent.parent for p in root.rglob(".hydra/overrides.yaml")):
        if expected is not None and overrides(job) not in expected:
            continue
        if not (job / "results.json").is_file() and _mode(job) not in NO_RESULTS:
            problems.append(Problem(str(job.relative_to(root)) if job != root else ".",
                                    "no results.json: the job failed or was killed (rerun the sweep to finish it)"))
    problems.extend(Problem(job, "never ran (rerun the sweep to run it)") for job in never_started(root))
    return results, problems


def finished_results(directory: str | Path, latest_multirun: bool = False
                     ) -> tuple[list[tuple[Path, dict[str, Any]]], list[Problem]]:
    """``collect_results``, a ``UserError`` when no job finished (``mode=report`` checks it before pandas loads)."""
    results, problems = collect_results(directory, latest_multirun)
    if not results:
        listed = "; ".join(f"{p.job}: {p.reason}" for p in problems[:5])
        others = sorted({str(data.get("kind") or data.get("mode") or "train.py") for data in map(
            _read, Path(directory).rglob("results.json")) if data and data.get("kind") not in ("eval", "sweep_heads")})
        raise UserError(f"sweep_dir={str(directory)!r} holds no finished evaluation (results.json of ablate.py "
                        f"mode=eval or sweep_heads)" + (f"; found {listed}" if listed else "")
                        + (f"; it holds other jobs' results ({', '.join(others)}), which mode=report does not read"
                           if others else ""))
    return results, problems


def _job_of(path: Path, root: Path) -> Path:
    """The Hydra job directory holding ``path`` (a head sweep's plans lie one level below theirs)."""
    for folder in path.parents:
        if (folder / ".hydra/overrides.yaml").is_file() or folder == root:
            return folder
    return root


def _overrides_of(job: Path) -> frozenset | None:
    try:
        return frozenset(OmegaConf.load(job / ".hydra/overrides.yaml"))
    except (OSError, yaml.YAMLError):
        return None


def expected_jobs(root: Path) -> list[frozenset] | None:
    """The override sets of the jobs of the multirun that wrote ``root/multirun.yaml`` (its sweep parameters
    expanded as Hydra's basic sweeper does); None without a readable one."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    multirun = root / "multirun.yaml"
    if not multirun.is_file():
        return None
    config = OmegaConf.load(multirun)
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += list(OmegaConf.select(config, "hydra.overrides.task") or [])
    try:
        overrides = OverridesParser.create().parse_overrides(arguments)
        return [frozenset(job) for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
    except Exception:
        return None


def never_started(root: Path) -> list[str]:
    """The override lists (``a=1,b=2``) of the sweep's jobs that have no directory, from ``multirun.yaml``."""
    found = {frozenset(OmegaConf.load(p)) for p in root.rglob(".hydra/overrides.yaml")}
    return [",".join(sorted(job)) for job in expected_jobs(root) or () if job not in found]
