"""How well gradient estimators predict measured single-head ablations (``mode=sweep_heads`` results).

Per policy swept, each estimator's per-head scores are compared with the measured deltas of the same
checkpoint: Spearman and Kendall rank correlation (scipy.stats) and the overlap of the k heads each ranks
highest, against the loss change (what the estimates predict) and against the main metric's drop.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats

from headlab.errors import UserError
from headlab.files import read_json
from headlab.reporting.layouts import to_markdown

UNDEFINED = ("n/a: one side is the same for every head (the measured change, when no single head changes it on these "
             "examples, or the scores), so there is no order to correlate with")


def read_head_sweep(path: str | Path, weights_hash: str) -> dict[str, Any]:
    """A ``mode=sweep_heads`` job's ``results.json`` (a file or its job directory) of single-head ablations
    of the checkpoint with ``weights_hash``."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    if not path.is_file():
        raise UserError(f"importance.sweep={str(path)!r}: no such results file (a mode=sweep_heads job directory)")
    sweep = read_json(path, "sweep_heads results")
    if sweep.get("kind") != "sweep_heads" or sweep.get("family") != "single_head" or not sweep.get("complete"):
        raise UserError(f"importance.sweep={str(path)!r} is not a complete mode=sweep_heads result of the "
                        "single_head family")
    if sweep["checkpoint"]["weights_hash"] != weights_hash:
        raise UserError(f"importance.sweep={str(path)!r} measured other weights ({sweep['checkpoint']['weights_hash']}"
                        f"); this checkpoint's are {weights_hash}")
    return sweep


def normalisation_label(layer: bool, global_: bool) -> str:
    """The name of the normalisation of ``importance.json``'s granularities (``raw`` when none)."""
    parts = [part for part, on in (("layer L2", layer), ("global min-max", global_)) if on]
    return "normalised: " + ", then ".join(parts) if parts else "raw"


def top_k_overlap(scores: np.ndarray, measured: np.ndarray, k: int) -> float:
    """Share of the k highest-scoring heads that are among the k with the highest measured values (of equal values,
    the earlier head in L0H0, L0H1, ... order counts as higher)."""
    k = min(k, scores.size)
    top = lambda values: set(np.argsort(-values.reshape(-1), kind="stable")[:k])  # noqa: E731
    return len(top(scores) & top(measured)) / k


def agreement_table(estimators: dict[str, np.ndarray], sweep: dict[str, Any], main_metric: str,
                    k: int, scores: str = "raw") -> pd.DataFrame:
    """One row per estimator and target: correlations and top-k overlap with the sweep's measured deltas.

    Targets: ``loss`` (the loss increase) and the main metric's drop (minus its delta), on the sweep's first
    split. ``estimate_<policy>`` estimators are compared with the sweep of that policy only. ``scores`` names the
    estimators' normalisation (a per-layer normalisation changes the order of heads across layers, and so the
    correlations).
    """
    policy = sweep["policy"]
    split, tables = next(iter(sweep["tables"].items()))
    targets = {"loss increase": np.array(tables["loss"]["delta"], dtype=float),
               f"{main_metric} drop": -np.array(tables[main_metric]["delta"], dtype=float)}
    rows = []
    for name, values in estimators.items():
        if name.startswith("estimate_") and name != f"estimate_{policy}":
            continue
        for target, measured in targets.items():
            x, y = np.asarray(values, dtype=float).reshape(-1), measured.reshape(-1)
            with warnings.catch_warnings():  # a constant input (e.g. no head changed the accuracy) gives NaN
                warnings.simplefilter("ignore", scipy.stats.ConstantInputWarning)
                spearman, kendall = scipy.stats.spearmanr(x, y).statistic, scipy.stats.kendalltau(x, y).statistic
            rows.append({"policy": policy, "split": split, "estimator": name, "scores": scores, "target": target,
                         "spearman": spearman, "kendall": kendall,
                         f"top{k}_overlap": top_k_overlap(x, y, k), "heads": x.size})
    return pd.DataFrame(rows)


def agreement_markdown(table: pd.DataFrame, digits: int) -> str:
    """The agreement table as markdown, an undefined correlation as ``n/a`` and a line that says why."""
    shown = table.round(digits).astype(object).where(table.notna(), "n/a").astype(str)
    text = to_markdown(shown)
    return text + "\n" + UNDEFINED + "\n" if table[["spearman", "kendall"]].isna().any(axis=None) else text
