"""A task's metrics recomputed from per-example records, on all examples or any subset.

Evaluation under plans (``ablate.py mode=eval``) writes one record per example and split
(``headlab.analysis.jobs.plan_evaluator``); its ``results.json`` metrics are these functions of the
records, and the statistics of a report recompute them on resamples. The columns:

==================  ================================================================
classification      ``label``, ``prediction`` (class ids), ``loss``
regression          ``label``, ``prediction`` (the predicted score), ``loss``
extractive_qa       ``exact_match``, ``f1`` (each in [0, 1], the max over gold answers),
                    ``has_answer`` (v2: HasAns / NoAns), ``loss``
==================  ================================================================

The GLUE metrics are scikit-learn's and scipy's (as the GLUE scripts compute them); SQuAD's are
100 x the mean of the per-question scores (as the official scripts); ``loss`` is the mean loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.stats
from sklearn.metrics import f1_score, matthews_corrcoef

# Columns each task type's records carry besides ``example``, ``id`` and ``loss``.
RECORD_COLUMNS = {
    "classification": ("label", "prediction"),
    "regression": ("label", "prediction"),
    "extractive_qa": ("prediction", "exact_match", "f1", "has_answer"),
}


def _classification(records: Mapping[str, Any], names) -> dict[str, float]:
    label, prediction = np.asarray(records["label"]), np.asarray(records["prediction"])
    scores = {
        "accuracy": lambda: float(np.mean(label == prediction)),
        "f1": lambda: float(f1_score(label, prediction, pos_label=1, average="binary", zero_division=0.0)),
        "matthews": lambda: float(matthews_corrcoef(label, prediction)),
    }
    return {name: scores[name]() for name in names}


def _regression(records: Mapping[str, Any], names) -> dict[str, float]:
    label = np.asarray(records["label"], dtype=np.float64)
    prediction = np.asarray(records["prediction"], dtype=np.float64)
    scores = {
        "pearson": lambda: float(scipy.stats.pearsonr(prediction, label).statistic),
        "spearman": lambda: float(scipy.stats.spearmanr(prediction, label).statistic),
    }
    return {name: scores[name]() for name in names}


def _squad(records: Mapping[str, Any], names, version: str) -> dict[str, float]:
    exact, f1 = (np.asarray(records[column], dtype=np.float64) for column in ("exact_match", "f1"))
    percent = lambda values: float(100.0 * values.mean()) if len(values) else math.nan  # noqa: E731  (no question)
    scores = {"exact_match": percent(exact), "f1": percent(f1)}
    scores = {name: scores[name] for name in names}
    if version == "v2":
        has = np.asarray(records["has_answer"], dtype=bool)
        scores |= {"has_ans_exact_match": percent(exact[has]), "has_ans_f1": percent(f1[has]),
                   "no_ans_exact_match": percent(exact[~has]), "no_ans_f1": percent(f1[~has])}
    return scores


def metrics_from_records(records: Mapping[str, Any], task: Any) -> dict[str, float]:
    """``{metric: value}`` of ``task`` (its ``metrics``, v2's HasAns/NoAns, and ``loss``) from record columns.

    ``records`` maps column names to sequences (a ``pandas.DataFrame`` or a dict of lists).
    """
    if task.type == "extractive_qa":
        values = _squad(records, task.metrics, task.get("version", "v1"))
    elif task.type == "regression":
        values = _regression(records, task.metrics)
    else:
        values = _classification(records, task.metrics)
    return {**values, "loss": float(np.mean(np.asarray(records["loss"], dtype=np.float64)))}
