"""A task's metrics as functions of weighted sums of per-example features, for resampling statistics.

Every metric headlab reports but Spearman's is ``finish(w @ F, sum(w))``: ``F`` ``[examples, k]`` holds
per-example features (correct or not; EM; true-positive, false-positive and false-negative
indicators; one-hot labels and predictions; centred scores and their products) and ``w`` weights the
examples: counts for a bootstrap resample, all ones but one zero for a jackknife sample. Thousands
of resamples of many jobs are then one matrix product, and a non-decomposable metric (F1, Matthews,
Pearson) is recomputed on each resample rather than averaged. Spearman's correlation needs the
resampled values themselves (ranks): ``RankMetric``.

The values equal ``headlab.tasks.record_metrics`` (scikit-learn / scipy; checked in the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.stats

Columns = Mapping[str, Any]  # record column -> values (a DataFrame or a dict of arrays)


@dataclass(frozen=True)
class SumMetric:
    """``finish(sums [..., k], count [...]) -> values [...]`` of per-example ``features(columns) -> [n, k]``."""

    name: str
    features: Callable[[Columns], np.ndarray]
    finish: Callable[[np.ndarray, np.ndarray], np.ndarray]
    linear: bool = False  # finish is linear in the sums (a mean): a delta is finish of the difference of sums
    # whether the value of the examples' own sums ``[..., k]`` is defined (None: always); a resample is not asked
    defined: Callable[[np.ndarray], np.ndarray] | None = None

    def observed(self, sums: np.ndarray, count: np.ndarray) -> np.ndarray:
        """``finish`` of the examples' own sums, NaN where the metric is undefined on them (``defined``)."""
        values = self.finish(sums, count)
        return values if self.defined is None else np.where(self.defined(sums), values, np.nan)

    def value(self, columns: Columns) -> float:
        features = self.features(columns)
        return float(self.observed(features.sum(0), np.asarray(float(len(features)))))


@dataclass(frozen=True)
class RankMetric:
    """``statistic(prediction [..., n], label [..., n]) -> [...]`` on resampled values (no sum form)."""

    name: str
    statistic: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def columns(self, columns: Columns) -> tuple[np.ndarray, np.ndarray]:
        return _column(columns, "prediction"), _column(columns, "label")

    def value(self, columns: Columns) -> float:
        return float(self.statistic(*self.columns(columns)))


def _column(columns: Columns, name: str) -> np.ndarray:
    return np.asarray(columns[name], dtype=np.float64)


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (scikit-learn's zero_division=0)."""
    safe = np.where(denominator == 0, 1.0, denominator)
    return np.where(denominator == 0, 0.0, numerator / safe)


def mean_metric(name: str, values: Callable[[Columns], np.ndarray], scale: float = 1.0) -> SumMetric:
    """``scale`` x the mean of a per-example value."""
    return SumMetric(name, lambda c: values(c)[:, None], lambda s, n: scale * s[..., 0] / n, linear=True)


def subset_mean_metric(name: str, values: Callable[[Columns], np.ndarray], subset: Callable[[Columns], np.ndarray],
                       scale: float = 1.0) -> SumMetric:
    """``scale`` x the mean of a per-example value over a subset of the examples: undefined (NaN) when the examples
    have none of it, as SQuAD v2's NoAns scores of answerable questions only (the official script leaves them out); a
    resample that draws none of the subset scores 0 there, on both sides of a delta (rare: the chance is
    ``(1 - share)^n``)."""
    return SumMetric(name, lambda c: np.stack([values(c) * subset(c), subset(c)], axis=1),
                     lambda s, n: scale * _ratio(s[..., 0], s[..., 1]), defined=lambda s: s[..., 1] > 0)


def _binary_f1_features(columns: Columns) -> np.ndarray:
    label, prediction = _column(columns, "label") == 1, _column(columns, "prediction") == 1
    return np.stack([label & prediction, ~label & prediction, label & ~prediction], axis=1).astype(np.float64)


def _binary_f1(sums: np.ndarray, count: np.ndarray) -> np.ndarray:
    tp, fp, fn = sums[..., 0], sums[..., 1], sums[..., 2]
    return _ratio(2 * tp, 2 * tp + fp + fn)


def matthews_metric(num_classes: int) -> SumMetric:
    """Matthews correlation (multiclass, as scikit-learn): from the true and predicted class counts and the
    number correct: (c s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t)), 0 when a factor is 0."""

    def features(columns: Columns) -> np.ndarray:
        label, prediction = (_column(columns, name).astype(np.int64) for name in ("label", "prediction"))
        eye = np.eye(num_classes)
        return np.concatenate([eye[label], eye[prediction], (label == prediction)[:, None]], axis=1)

    def finish(sums: np.ndarray, count: np.ndarray) -> np.ndarray:
        true, predicted, correct = sums[..., :num_classes], sums[..., num_classes:-1], sums[..., -1]
        covariance = correct * count - (true * predicted).sum(-1)
        denominator = (count**2 - (predicted**2).sum(-1)) * (count**2 - (true**2).sum(-1))
        return _ratio(covariance, np.sqrt(denominator))

    return SumMetric("matthews", features, finish)


def _pearson_features(columns: Columns) -> np.ndarray:
    x, y = _column(columns, "prediction"), _column(columns, "label")
    centre = y.mean()  # the same shift for every run of these examples (labels are shared): sums stay accurate
    x, y = x - centre, y - centre
    return np.stack([x, y, x * x, y * y, x * y], axis=1)


def _pearson(sums: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Pearson's r from the sums; NaN (as scipy) when either side is constant. A variance below the rounding of its
    own sums (``count * sxx`` to ~``count`` ulps) counts as 0: constant predictions gave 1e-9, not NaN."""
    sx, sy, sxx, syy, sxy = np.moveaxis(sums, -1, 0)
    floor = 8 * np.finfo(np.float64).eps * np.maximum(count, 1.0)
    var_x, var_y = count * sxx - sx**2, count * syy - sy**2
    var_x = np.where(var_x <= floor * count * sxx, 0.0, var_x)
    var_y = np.where(var_y <= floor * count * syy, 0.0, var_y)
    with np.errstate(invalid="ignore", divide="ignore"):  # constant values: NaN, as scipy
        return np.where((var_x > 0) & (var_y > 0), (count * sxy - sx * sy) / np.sqrt(var_x * var_y), np.nan)


def _spearman(prediction: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Spearman's rho along the last axis: Pearson's r of the ranks (ties get their mean rank, as scipy)."""
    x, y = (scipy.stats.rankdata(v, axis=-1) for v in (prediction, label))
    x, y = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (x * y).sum(-1) / np.sqrt((x * x).sum(-1) * (y * y).sum(-1))


def columns_read(name: str, columns: Columns) -> tuple[str, ...]:
    """The record columns metric ``name`` reads (checked to be finite before any statistic)."""
    if name in ("loss", "logit_diff"):
        return (name,)
    if "exact_match" in columns and name.endswith(("exact_match", "f1")):
        score = "exact_match" if name.endswith("exact_match") else "f1"
        return (score, "has_answer") if name.startswith(("has_ans_", "no_ans_")) else (score,)
    return ("label", "prediction")


def metric_for(name: str, columns: Columns) -> SumMetric | RankMetric:
    """The resampling form of metric ``name`` for records with these ``columns``.

    SQuAD records (an ``exact_match`` column) score 100 x means; ``f1`` there is the mean token F1,
    elsewhere the binary F1 of class 1.
    """
    qa = "exact_match" in columns
    has = lambda c: _column(c, "has_answer")  # noqa: E731
    metrics: dict[str, Callable[[], SumMetric | RankMetric]] = {
        "loss": lambda: mean_metric("loss", lambda c: _column(c, "loss")),
        "logit_diff": lambda: mean_metric("logit_diff", lambda c: _column(c, "logit_diff")),  # activation patching
        "accuracy": lambda: mean_metric("accuracy", lambda c: (_column(c, "label") == _column(c, "prediction"))
                                        .astype(np.float64)),
        "f1": lambda: (mean_metric("f1", lambda c: _column(c, "f1"), 100.0) if qa
                       else SumMetric("f1", _binary_f1_features, _binary_f1)),
        "matthews": lambda: matthews_metric(int(max(_column(columns, "label").max(),
                                                    _column(columns, "prediction").max())) + 1),
        "pearson": lambda: SumMetric("pearson", _pearson_features, _pearson),
        "spearman": lambda: RankMetric("spearman", _spearman),
        "exact_match": lambda: mean_metric("exact_match", lambda c: _column(c, "exact_match"), 100.0),
    }
    for prefix, subset in (("has_ans_", has), ("no_ans_", lambda c: 1.0 - has(c))):
        for score in ("exact_match", "f1"):
            metrics[prefix + score] = lambda p=prefix, s=score, u=subset: subset_mean_metric(
                p + s, lambda c: _column(c, s), u, 100.0)
    if name not in metrics:
        raise ValueError(f"no resampling form for metric {name!r}; known: {', '.join(sorted(metrics))}")
    return metrics[name]()
