"""``headlab.head_table``: one row per head joining everything headlab knows about it.

Sources (each optional, each a job directory or its file): a ``mode=features`` job (``dist_*``, ``clark_*``,
``sieve_*``, ``role_*``), a ``mode=cluster`` job (``cluster``), a ``mode=importance`` job (``importance`` and
``importance_<estimator>``, raw), and ``mode=sweep_heads`` jobs of single-head ablations (``delta_<policy>_<metric>``,
the measured change of each metric with the head ablated alone; ``_<split>`` is added when a sweep has several
splits), and a ``mode=syntax`` job (``syntax_<relation>``: the head's accuracy on the relation, the better direction;
``sieve_<role>`` / ``role_<role>``: Pande et al.'s syntactic sieve scores and roles). Every source must describe
one model and checkpoint of one shape (a job of other weights, or under a plan, is refused: its columns would be of
other heads than the rest). With ``model`` / ``task`` columns, tables of several models concatenate, so "do
vertical heads matter more on SQuAD than on MRPC?" is one groupby.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from headlab.core.head_names import head_name
from headlab.errors import UserError
from headlab.files import read_json


def _file(source: str | Path, name: str, what: str) -> Path:
    path = Path(source)
    path = path / name if path.is_dir() else path
    if not path.is_file():
        raise UserError(f"{what} {str(source)!r}: no {name} there; give the job directory of {what}")
    return path


def _results_of(source: str | Path, kind: str) -> dict[str, Any]:
    """The ``results.json`` of a ``mode=KIND`` job (a ``UserError`` naming what ``source`` is instead)."""
    data = read_json(_file(source, "results.json", f"a mode={kind} job"), f"{kind} results")
    found = data.get("kind") if isinstance(data, dict) else None
    if found == kind and "shape" not in data:
        raise UserError(f"{kind}={str(source)!r} was written by an older headlab (its results.json has no shape): "
                        f"delete it and run that mode={kind} job again")
    if found != kind:
        raise UserError(f"{kind}={str(source)!r} is {f'a mode={found} job' if found else 'not a headlab job'}, not "
                        f"a mode={kind} job")
    return data


def _grid(values: Any, what: str, shape: tuple[int, int]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.shape != shape:
        raise UserError(f"{what} has shape {list(array.shape)}; the other sources are for {shape[0]}x{shape[1]} heads")
    return array.reshape(-1)


def check_sources(features: str | Path | None = None, clusters: str | Path | None = None,
                  importance: str | Path | None = None, sweeps: Iterable[str | Path] = (),
                  syntax: str | Path | None = None, label: str | None = None) -> None:
    """What ``head_table`` reads first, checked without reading a table: each source is the job it should be."""
    for source, kind in ((features, "features"), (syntax, "syntax")):
        if source is not None:
            _results_of(source, kind)
    for source, name, kind in ((clusters, "clusters.json", "cluster"), (importance, "importance.json", "importance")):
        if source is not None:
            _file(source, name, f"a mode={kind} job")
    for sweep in sweeps:
        _file(sweep, "results.json", "a mode=sweep_heads job")


def head_table(features: str | Path | None = None, clusters: str | Path | None = None,
               importance: str | Path | None = None, sweeps: Iterable[str | Path] = (),
               syntax: str | Path | None = None, label: str | None = None) -> pd.DataFrame:
    """One row per head: ``layer``, ``head``, ``name``, ``model``, ``task``, ``label`` and a column per quantity of
    the given sources (module docstring). At least one source is needed."""
    columns: dict[str, np.ndarray | list] = {}
    shape, identity, weights = None, {}, WeightsOf()
    if features is not None:
        summary = _results_of(features, "features")
        weights.add("features", features, summary)
        frame = pd.read_parquet(_file(features, "heads.parquet", "a mode=features job"))
        shape, identity = tuple(summary["shape"]), {"model": summary["model"], "task": summary["task"]}
        columns |= {c: frame[c].to_numpy() for c in frame.columns if c not in ("layer", "head", "name")}
    if clusters is not None:
        data = read_json(_file(clusters, "clusters.json", "a mode=cluster job"), "clusters")
        if not isinstance(data, dict) or not {"labels", "shape", "model", "task"} <= set(data):
            raise UserError(f"clusters {str(clusters)!r} is not a clusters file of a mode=cluster job")
        weights.add("clusters", clusters, data)
        shape = shape or tuple(data["shape"])
        identity = identity or {"model": data["model"], "task": data["task"]}
        names = [head_name(layer, head) for layer in range(shape[0]) for head in range(shape[1])]
        if set(data["labels"]) != set(names):
            raise UserError(f"clusters {str(clusters)!r} label other heads than the {shape[0]}x{shape[1]} of the "
                            "other sources")
        columns["cluster"] = [data["labels"][name] for name in names]
    if importance is not None:
        data = read_json(_file(importance, "importance.json", "a mode=importance job"), "importance")
        if not isinstance(data, dict) or "importance" not in data:
            raise UserError(f"importance {str(importance)!r} is not the importance.json of a mode=importance job")
        weights.add("importance", importance, data, plan=data.get("settings", {}).get("pruned_by_mask") or None)
        values = np.asarray(data["importance"], dtype=float)
        shape = shape or values.shape
        identity = identity or {"model": data.get("model"), "task": data.get("task")}
        columns["importance"] = _grid(values, "importance", shape)
        for estimator, scores in data.get("raw", {}).items():
            columns[f"importance_{estimator}"] = _grid(scores, f"importance estimator {estimator}", shape)
    for sweep in sweeps:
        data = read_json(_file(sweep, "results.json", "a mode=sweep_heads job"), "sweep_heads results")
        if data.get("kind") != "sweep_heads" or data.get("family") != "single_head":
            raise UserError(f"sweep {str(sweep)!r} is not a mode=sweep_heads job of the single_head family")
        weights.add("sweep", sweep, data)
        identity = identity or {"model": data.get("model"), "task": data.get("task")}
        for split, tables in data["tables"].items():
            for metric, table in tables.items():
                shape = shape or np.asarray(table["delta"]).shape
                suffix = f"_{split}" if len(data["tables"]) > 1 else ""
                columns[f"delta_{data['policy']}_{metric}{suffix}"] = _grid(table["delta"], f"sweep {sweep}", shape)
    if syntax is not None:
        summary = _results_of(syntax, "syntax")
        weights.add("syntax", syntax, summary, plan=summary.get("plan"))
        shape = shape or tuple(summary["shape"])
        identity = identity or {"model": summary["model"], "task": Path(summary["treebank"]).name}
        columns |= _syntax_columns(syntax, shape)
    if shape is None:
        raise UserError("head_table needs at least one source: features, clusters, importance, sweeps or syntax")
    layers, heads = shape
    table = pd.DataFrame({"layer": np.repeat(np.arange(layers), heads), "head": np.tile(np.arange(heads), layers),
                          "name": [head_name(layer, head) for layer in range(layers) for head in range(heads)],
                          "model": identity.get("model"), "task": identity.get("task"), "label": label})
    return pd.concat([table, pd.DataFrame(columns)], axis=1)


class WeightsOf:
    """The model and weights each source describes; a ``UserError`` when they differ, or one ran under a plan."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, Any]]] = []

    def add(self, what: str, source: str | Path, data: dict[str, Any], plan: Any = None) -> None:
        if plan:
            raise UserError(f"{what}={str(source)!r} ran under a plan: its per-head numbers are of the model with "
                            "heads changed; give jobs of the whole model (without mask / plan)")
        checkpoint = (data.get("checkpoint") or {}).get("path")
        weights = (data.get("model"), None if checkpoint is None else str(Path(checkpoint).resolve()))
        for earlier, theirs in self.seen:
            if theirs != weights:
                raise UserError(f"{what}={str(source)!r} is of {_describe(weights)}, but {earlier} is of "
                                f"{_describe(theirs)}: a row would join two models' heads; give sources of one "
                                "model and checkpoint (a table per model concatenates)")
        self.seen.append((f"{what}={str(source)!r}", weights))


def _describe(weights: tuple[Any, Any]) -> str:
    model, checkpoint = weights
    return f"model {model} with " + ("its own weights" if checkpoint is None else f"the weights {checkpoint}")


def _syntax_columns(syntax: str | Path, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """A mode=syntax job's per-head columns: accuracy per relation (the better direction), sieve scores and roles."""
    heads = pd.DataFrame(read_json(_file(syntax, "syntax.json", "a mode=syntax job"), "syntax")["heads"])
    best = heads.groupby(["relation", "layer", "head"], sort=False)["accuracy"].max()  # NaN: a head a plan changed
    columns = {f"syntax_{relation}": _grid(best[relation].unstack().sort_index().sort_index(axis=1).to_numpy(),
                                           f"syntax {syntax}", shape)
               for relation in dict.fromkeys(heads["relation"])}
    roles = pd.read_csv(_file(syntax, "sieve_roles.csv", "a mode=syntax job"))
    for sieve, rows in roles.groupby("sieve", sort=False):
        rows = rows.sort_values(["layer", "head"])
        columns[f"sieve_{sieve}"] = _grid(rows["mean"].to_numpy().reshape(shape), f"syntax {syntax}", shape)
        columns[f"role_{sieve}"] = rows["role"].to_numpy().astype(bool)
    return columns

