"""The sieve roles (Pande et al. 2021) of the runs ``mode=compare`` compares, head by head.

A run's roles are those of its ``mode=features`` job (local, delimiter, block, ...: ``sieve_roles.csv`` beside its
features) and, with ``compare.syntax`` (one ``mode=syntax`` job per run, in the runs' order), the syntactic ones
(syntactic, nsubj, obj, amod, advmod). A syntax job must have scored the same model and checkpoint as its run's
features, without a plan: a swapped order would otherwise pass for a change made by fine-tuning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console

from headlab.errors import UserError
from headlab.files import read_json

# what makes two jobs' roles comparable: the same sentences (their content, whatever file held them) and test
SYNTAX_SETTINGS = ("sentences", "sieve", "sieve_direction", "sieve_tau", "sieve_alpha", "sieve_correction")
FEATURES_SETTINGS = ("sieve_tau", "sieve_alpha", "sieve_correction")


def read_syntax_jobs(syntax: list[str] | None, runs: list[dict[str, Any]]) -> list[Path] | None:
    """The ``mode=syntax`` job directory of each run, checked against it (``UserError`` otherwise)."""
    if syntax is None:
        return None
    if len(syntax) != len(runs):
        raise UserError(f"compare.syntax has {len(syntax)} mode=syntax jobs for {len(runs)} compare.runs; give one "
                        "per run, in the same order (or null)")
    jobs = []
    for source, run in zip(syntax, runs):
        path = Path(source)
        results = path / "results.json"
        data = read_json(results, "syntax results") if results.is_file() else None
        if not isinstance(data, dict) or data.get("kind") != "syntax" or not data.get("complete"):
            raise UserError(f"compare.syntax entry {source!r} is not a finished mode=syntax job directory")
        if list(data.get("shape", [])) != list(run["shape"]):
            raise UserError(f"compare.syntax entry {source!r} scored a {data.get('shape')} model, but run "
                            f"{run['name']!r} has {run['shape']} heads")
        if data.get("plan") is not None:
            raise UserError(f"compare.syntax entry {source!r} ran under a plan; compare the models as they are "
                            "(a mode=syntax job without mask / plan)")
        if not _same_checkpoint(data, run):
            raise UserError(f"compare.syntax entry {source!r} scored {_describe(data)}, but run {run['name']!r} "
                            f"clustered {_describe(run)}; give the syntax jobs in the order of compare.runs")
        jobs.append((path, data))
    digests = all(data.get("sentences") for _, data in jobs)  # jobs of an older headlab: their file and count
    scored = lambda data: data["sentences"] if digests else f"{data.get('treebank')}, {data.get('num_sentences')}"  # noqa: E731
    differs = _difference([(run["name"], data.get("config", {}).get("syntax", {}) | {"sentences": scored(data)})
                           for run, (_, data) in zip(runs, jobs)], SYNTAX_SETTINGS)
    if differs:  # roles of other sentences, or of another test, do not compare
        raise UserError(f"the compare.syntax jobs differ in {differs}: their roles are not comparable; run them with "
                        "the same settings")
    return [path for path, _ in jobs]


def features_alike(runs: list[dict[str, Any]]) -> bool:
    """Whether the runs' features jobs (those still there) tested their sieve roles alike; a note when not."""
    found = []
    for run in runs:
        path = Path(run.get("features") or "") / "results.json"
        if run.get("features") and path.is_file():
            found.append((run["name"], read_json(path, "features results").get("config", {}).get("features", {})))
    differs = _difference(found, FEATURES_SETTINGS)
    if differs:  # the types still compare; the roles do not
        Console().print(f"note: the runs' features jobs differ in {differs}: their sieve roles are left out of "
                        "roles.csv", markup=False, soft_wrap=True)
    return differs is None


def _difference(settings: list[tuple[str, dict[str, Any]]], keys: tuple[str, ...]) -> str | None:
    """The first key whose value differs between the runs' jobs, with each run's value (None: all alike)."""
    for key in keys:
        if len({json.dumps(values.get(key)) for _, values in settings}) > 1:
            return f"{key} ({', '.join(f'{name}: {values.get(key)!r}' for name, values in settings)})"
    return None


def _same_checkpoint(syntax: dict[str, Any], run: dict[str, Any]) -> bool:
    ours, theirs = syntax.get("checkpoint") or {}, run.get("checkpoint") or {}
    if syntax.get("model") != run.get("model") or ours.get("kind") != theirs.get("kind"):
        return False
    if None not in (syntax.get("architecture"), run.get("architecture")) and \
            syntax["architecture"] != run["architecture"]:
        return False
    paths = ours.get("path"), theirs.get("path")
    return paths[0] == paths[1] or (None not in paths and Path(paths[0]).resolve() == Path(paths[1]).resolve())


def _describe(job: dict[str, Any]) -> str:
    checkpoint = job.get("checkpoint") or {}
    built = f" {job['architecture']}" if job.get("architecture") else ""
    return f"{job.get('model')}{built} ({checkpoint.get('path') or 'pre-trained weights'})"


def head_roles(run: dict[str, Any], syntax: Path | None, features: bool = True) -> pd.DataFrame:
    """``[heads, roles]`` booleans indexed by head name: the run's features roles (unless not ``features``) and its
    syntax job's roles."""
    sources = [Path(run["features"]) / "sieve_roles.csv"] if features and run.get("features") else []
    sources += [syntax / "sieve_roles.csv"] if syntax is not None else []
    frames = [pd.read_csv(path) for path in sources if path.is_file()]
    if not frames:
        return pd.DataFrame(index=pd.Index(list(run["labels"]), name="name"))
    frame = pd.concat(frames)
    roles = frame.pivot(index="name", columns="sieve", values="role")[list(dict.fromkeys(frame["sieve"]))]
    if set(roles.index) != set(run["labels"]) or roles.isna().any(axis=None):
        raise UserError(f"the sieve roles of run {run['name']!r} ({', '.join(str(p) for p in sources)}) do not "
                        f"cover its {len(run['labels'])} heads once each: rerun those jobs")
    return roles.astype(bool).loc[list(run["labels"])]


def role_tables(runs: list[dict[str, Any]], syntax: list[Path] | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per role (those every run has): heads with it in each run, and kept / gained / lost from the first run; and
    the per-head ``role_<role>/<run>`` columns."""
    features = features_alike(runs)
    roles = {run["name"]: head_roles(run, None if syntax is None else syntax[i], features)
             for i, run in enumerate(runs)}
    shared = [role for role in next(iter(roles.values())).columns if all(role in r.columns for r in roles.values())]
    partial = sorted({role for r in roles.values() for role in r.columns} - set(shared))
    if partial:  # e.g. a features job run without the sieve family, or one whose folder is gone
        Console().print(f"note: roles {', '.join(partial)} are not in every run's jobs: left out of roles.csv",
                        markup=False, soft_wrap=True)
    first, *others = roles
    rows, columns = [], {}
    for role in shared:
        has = {name: table[role].to_numpy() for name, table in roles.items()}
        row = {"role": role, **{name: int(has[name].sum()) for name in roles}}
        for other in others:
            row |= {f"kept/{other}": int((has[first] & has[other]).sum()),
                    f"gained/{other}": int((~has[first] & has[other]).sum()),
                    f"lost/{other}": int((has[first] & ~has[other]).sum())}
        rows.append(row)
        columns |= {f"role_{role}/{name}": has[name] for name in roles}
    table = pd.DataFrame(rows) if rows else pd.DataFrame(columns=["role", *roles])
    return table, pd.DataFrame(columns)
