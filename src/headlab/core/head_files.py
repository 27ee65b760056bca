"""Clusters and importance files (DESIGN.md section 5): what ``cluster:NAME`` and ``top:K`` selectors read, checked
against the model they are applied to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headlab.core.head_names import head_index, head_name, parse_head_name
from headlab.errors import UserError
from headlab.files import read_json


def load_clusters(source: str | Path | Mapping[str, Any], num_layers: int | None = None,
                  num_heads: int | None = None) -> dict[str, str]:
    """Head -> label mapping (heads named ``L{layer}H{head}``) from a clusters file (DESIGN.md section 5) or an
    in-memory mapping.

    Accepts ``{"labels": {"L0H0": "dense", ...}, "shape": [layers, heads], ...}`` or the bare ``{"L0H0": "dense"}``.
    Given the model's ``num_layers`` and ``num_heads``, every head must be in range and a file's ``shape`` (mode=cluster
    writes it: the file then labels every head) must be the model's. Two spellings of one head (``L00H0``) are an error.
    """
    data = _read_json(source, "clusters")
    if isinstance(data, Mapping) and "kind" in data and "labels" not in data:  # another job file (constants, ...)
        raise UserError(f"clusters {_describe(source)} is a file of kind {data['kind']!r}, not a clusters file (a "
                        "{\"labels\": {\"L0H0\": \"dense\"}} mapping, as mode=cluster and mode=gates write)")
    labels = data.get("labels", data) if isinstance(data, Mapping) else None
    if not isinstance(labels, Mapping) or not labels:
        raise UserError(
            f"clusters {_describe(source)} must be a JSON object with a non-empty 'labels' mapping "
            "like {\"labels\": {\"L0H0\": \"dense\"}}"
        )
    named: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for head, label in labels.items():
        canonical = head_name(*parse_head_name(head))
        if canonical in spelled:
            raise UserError(f"clusters {_describe(source)} labels head {canonical} twice ({spelled[canonical]!r} and "
                            f"{head!r}); keep one")
        if not isinstance(label, str) or not label.strip():  # "" would name no type: cluster: selects nothing by it
            raise UserError(f"cluster label of {head} in {_describe(source)} must be a non-empty string (a type "
                            f"name), got {label!r}")
        spelled[canonical], named[canonical] = head, label
    shape = data.get("shape") if "labels" in data else None
    if shape is not None:
        check_clusters_shape(named, shape, _describe(source))
    if num_layers is not None:
        if shape is not None and list(shape) != [num_layers, num_heads]:
            raise UserError(f"clusters {_describe(source)} are of a model with {shape[0]} layers x {shape[1]} heads; "
                            f"this model has {num_layers} x {num_heads}")
        for head in named:
            head_index(head, num_layers, num_heads)
    return named


def check_clusters_shape(labels: Mapping[str, str], shape: Any, described: str) -> None:
    """``shape`` is ``[layers, heads]`` and ``labels`` name exactly its heads (a file written by mode=cluster)."""
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(n, int) and n > 0 for n in shape)):
        raise UserError(f"clusters {described} has shape {shape!r}; expected [layers, heads]")
    expected = {head_name(l, h) for l in range(shape[0]) for h in range(shape[1])}
    missing, extra = sorted(expected - set(labels)), sorted(set(labels) - expected)
    if missing or extra:
        more = ", ..." if len(missing) > 4 else ""
        problem = (f"no label for {len(missing)} of its heads ({', '.join(missing[:4])}{more})" if missing
                   else f"heads outside it ({', '.join(extra[:4])})")
        raise UserError(f"clusters {described} is of a {shape[0]} x {shape[1]} model but has {problem}; a clusters "
                        "file labels every head")


def load_importance(source: str | Path | Mapping[str, Any] | Sequence, num_layers: int, num_heads: int,
                    estimator: str | None = None) -> np.ndarray:
    """``[num_layers, num_heads]`` float array from an importance file or an in-memory value.

    Accepts ``{"importance": [[...per head...] per layer], "estimators": {NAME: [[...]]}, ...}``, the bare
    nested list, or an array; ``estimator`` picks one of ``estimators`` (None: ``importance``).
    """
    data = _read_json(source, "importance")
    values = data.get("importance") if isinstance(data, Mapping) else data
    if estimator is not None:
        estimators = data.get("estimators", {}) if isinstance(data, Mapping) else {}
        if estimator not in estimators:
            raise UserError(f"importance estimator {estimator!r} is not in {_describe(source)}; it has: "
                            f"{', '.join(estimators) or 'none (only importance)'}")
        values = estimators[estimator]
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise UserError(f"importance {_describe(source)} is not a numeric [layers][heads] table: {error}") from None
    if array.shape != (num_layers, num_heads):
        raise UserError(
            f"importance {_describe(source)} has shape {list(array.shape)}; "
            f"the model needs [{num_layers}, {num_heads}] (layers x heads)"
        )
    if not np.isfinite(array).all():
        raise UserError(f"importance {_describe(source)} contains NaN or infinite values")
    return array


def _read_json(source, what):
    return read_json(source, what) if isinstance(source, (str, Path)) else source


def _describe(source) -> str:
    return f"file {str(source)!r}" if isinstance(source, (str, Path)) else "mapping"
