"""The learned measures of a ``mode=gates`` job as per-head scores, higher for a head the task needs more: what the
importance stage's agreement table sets beside the gradient estimators (``importance.learned``).

==========================  ==========================================================================================
``l0_gates``                L0: the sum over the job's penalties of the head's deterministic gate (a head kept open
                            at larger penalties scores higher: the order in which the penalties close the heads)
``chg_facilitation``        CHG: G- (mean over fits), the gate the task keeps when pushed toward removal
``chg_interference``        CHG: 1 - G+, how far the task closes the gate when pushed toward retention (higher: the
                            head hurts more; its sign is the opposite of importance)
``optimal_gap``             optimal ablation: the loss increase of replacing the head alone by its constant, on the
                            job's first eval split
==========================  ==========================================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from headlab.errors import UserError
from headlab.files import read_json

MEASURES = {"l0": ("gates.json",), "chg": ("chg.json",), "optimal": ("optimal.json",)}


def gates_job(source: str | Path) -> tuple[Path, dict[str, Any]]:
    """A finished ``mode=gates`` job's folder and its ``results.json``; a ``UserError`` naming ``source`` if not."""
    folder = Path(source)
    results = folder / "results.json"
    record = read_json(results, "mode=gates results") if results.is_file() else None
    if not isinstance(record, dict) or record.get("kind") != "gates" or not record.get("complete"):
        raise UserError(f"importance.learned entry {str(source)!r} is not a finished mode=gates job directory")
    return folder, record


def learned_scores(source: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(the job's record, {measure: [layers, heads]})`` of a ``mode=gates`` job (module docstring)."""
    folder, record = gates_job(source)
    method = record["method"]
    data = read_json(folder / MEASURES[method][0], f"mode=gates {method} file")
    if method == "l0":
        gates = np.array([fit["gates"] for fit in data["fits"]], dtype=float)  # [penalties, layers, heads]
        return data, {"l0_gates": gates.sum(0)}
    if method == "chg":
        retain, remove = np.array(data["g_retain"], dtype=float), np.array(data["g_remove"], dtype=float)
        return data, {"chg_facilitation": remove, "chg_interference": 1.0 - retain}
    heads = [row for row in data["heads"] if row["split"] == data["heads"][0]["split"]]
    layers = 1 + max(int(row["head"][1:].split("H")[0]) for row in heads)
    return data, {"optimal_gap": np.array([row["optimal_gap"] for row in heads], dtype=float).reshape(layers, -1)}
