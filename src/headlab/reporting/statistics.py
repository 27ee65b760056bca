"""Paired statistics of ablation deltas over examples: bootstrap CIs, permutation p-values, corrections.

One baseline and several ablated runs (the plans of a sweep) scored on the same examples. For each
run, the delta = metric(ablated) - metric(baseline), with

- a paired bootstrap CI: resample the examples (the same resample for both sides), recompute the
  metric on each; ``percentile``, ``basic`` or ``bca`` (default) as ``scipy.stats.bootstrap``, whose
  index stream is reproduced exactly (``numpy.random.default_rng(seed).integers(0, n, (batch, n))``
  per batch), so the intervals equal scipy's for the same seed and batch (tested), but that a resample
  tying with the observed delta up to rounding counts as a tie (``ties``): a delta's CI is then the same
  alone and beside other plans;
- a paired permutation p-value: swap each example's ablated and baseline records with probability
  1/2 (all 2^n swaps when that is at most ``permutations``), two-sided, counted as
  ``scipy.stats.permutation_test(permutation_type="samples")`` does (tested against it).

The runs of a sweep share resamples: one matrix product per batch serves every run
(``headlab.reporting.metric_sums``), which is what makes a 72-plan report cheap (BENCHMARKS.md).
Where the examples were drawn in clusters (the records' ``cluster`` column, ``headlab.reporting.sampled_units``), the
bootstrap draws whole clusters, BCa's jackknife leaves a cluster out and the permutation test swaps whole clusters.
``headlab.reporting.value_intervals``: one run's metric with its own bootstrap CI, drawn the same way.
Corrections across plans: Holm or Benjamini-Hochberg (as ``statsmodels.stats.multitest``, in numpy).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import scipy.stats
from scipy.special import ndtr, ndtri

from headlab.errors import UserError
from headlab.reporting.metric_sums import Columns, RankMetric, SumMetric, columns_read, metric_for
from headlab.reporting.sampled_units import SampledUnits, sampled_units
from headlab.reporting.settings import CI_KINDS, CI_METHODS, CORRECTIONS


@dataclass(frozen=True)
class Resampling:
    """How the statistics resample: recorded with every report."""

    resamples: int = 10_000  # bootstrap resamples
    permutations: int = 10_000  # random swaps for the permutation test (exact when 2^n is at most this)
    confidence: float = 0.95
    method: str = "bca"
    seed: int = 0
    batch: int = 500  # resamples per matrix product (memory: batch x examples float64)
    intervals: str = "per_comparison"  # or "simultaneous": a family of m deltas gets 1 - (1 - confidence) / m each

    def __post_init__(self):
        if self.method not in CI_METHODS:
            raise UserError(f"CI method {self.method!r} is not one of {', '.join(CI_METHODS)}")
        if self.intervals not in CI_KINDS:
            raise UserError(f"report.ci={self.intervals!r} is not one of {', '.join(CI_KINDS)}")
        if not 0 < self.confidence < 1:
            raise UserError(f"confidence must be between 0 and 1, got {self.confidence}")
        for name in ("resamples", "permutations", "batch"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be a positive integer, got {getattr(self, name)}")


DEFAULT_RESAMPLING = Resampling()
TIES = 1e-9  # a resampled value within this share of the scores' size of the observed one ties with it (``ties``)


@dataclass(frozen=True)
class PairedResult:
    """One delta with its CI and p-value (``ci_low``/``ci_high``/``p_value`` NaN when not computed)."""

    metric: str
    value: float
    baseline: float
    delta: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    units: int = 0  # what was resampled: the examples' clusters (``n`` when each example is its own)


class _Deltas:
    """``delta(weights or swaps)`` of every run at once: ``[batch, runs]``; resampled by ``units`` (``n`` of them:
    the examples, or the clusters of examples that were drawn together)."""

    def __init__(self, metric: SumMetric | RankMetric, runs: Sequence[Columns], baseline: Columns,
                 units: SampledUnits | None = None):
        self.metric, self.runs = metric, len(runs)
        if isinstance(metric, SumMetric):
            self.base = metric.features(baseline)  # [n, k]
            self.features = np.stack([metric.features(run) for run in runs], axis=1)  # [n, runs, k]
            # [n, runs * k]: each run's features minus the baseline's, per example: a mean's delta sums them (0 where
            # nothing changed, exact on a lattice: a resample that ties with the observed delta ties exactly)
            self.differences = (self.features - self.base[:, None, :]).reshape(len(self.base), -1)
        else:
            self.base = np.stack(metric.columns(baseline))  # [2, n]: prediction, label
            self.features = np.stack([np.stack(metric.columns(run)) for run in runs])  # [runs, 2, n]
        self.size = self.base.shape[-1] if isinstance(metric, RankMetric) else len(self.base)  # examples
        self.units = units or SampledUnits(self.size)
        self.n = self.units.count  # what a resample draws

    def observed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ablated values [runs], baseline value [], deltas [runs])."""
        if isinstance(self.metric, RankMetric):
            ablated, base = self.metric.statistic(*np.moveaxis(self.features, 1, 0)), self.metric.statistic(*self.base)
            return ablated, base, ablated - base
        count, k = np.asarray(float(self.size)), self.base.shape[1]
        sums = self._columns().sum(0)  # one reduction: a run equal to the baseline has its very sums
        runs, base_sums = sums[:-k].reshape(self.runs, k), sums[-k:]
        ablated, base = self.metric.observed(runs, count), self.metric.observed(base_sums, count)
        deltas = self.metric.finish(self.differences.sum(0).reshape(self.runs, k), count) if self.metric.linear \
            else self._delta(runs, base_sums, count)
        return ablated, base, np.where(np.isnan(ablated) | np.isnan(base), np.nan, deltas)  # undefined: no delta

    def _columns(self) -> np.ndarray:
        """``[n, runs * k + k]``: every run's features, then the baseline's."""
        return np.concatenate([self.features.reshape(self.size, -1), self.base], axis=1)

    def _delta(self, runs: np.ndarray, base: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Deltas of a metric that is not a mean from sums ``runs`` ``[..., runs, k]`` and ``base`` ``[..., k]``."""
        return self.metric.finish(runs, count[..., None]) - self.metric.finish(base, count)[..., None]

    def resampled(self, index: np.ndarray) -> np.ndarray:
        """Deltas of bootstrap resamples ``index`` ``[batch, n]`` (unit indices): ``[batch, runs]``."""
        if isinstance(self.metric, RankMetric):
            if self.units.groups is not None:  # resamples of different sizes: one at a time
                return np.stack([self._ranked(np.repeat(np.arange(self.size), w.astype(np.int64)))
                                 for w in self.units.weights(index)])
            return self._ranked(index)
        weights = self.units.weights(index)  # [batch, size]
        return self._weighted(weights, weights.sum(1))

    def _ranked(self, index: np.ndarray) -> np.ndarray:
        """A rank metric's deltas on example indices ``index`` ``[..., m]``: ``[..., runs]``."""
        base = self.metric.statistic(*self.base[:, index])  # [...]
        runs = self.metric.statistic(*np.moveaxis(self.features[:, :, index], 1, 0))  # [runs, ...]
        return np.moveaxis(runs, 0, -1) - base[..., None]

    def _weighted(self, weights: np.ndarray, count: np.ndarray) -> np.ndarray:
        k = self.base.shape[1]
        if self.metric.linear:
            return self.metric.finish((weights @ self.differences).reshape(-1, self.runs, k), count[:, None])
        sums = weights @ self._columns()
        return self._delta(sums[:, :-k].reshape(len(weights), self.runs, k), sums[:, -k:], count)

    def jackknife(self) -> np.ndarray:
        """Deltas with each unit left out in turn: ``[n, runs]``."""
        if isinstance(self.metric, RankMetric):
            every = np.arange(self.size)
            return np.stack([self._ranked(np.setdiff1d(every, members)) for members in self.units.members()])
        k, count = self.base.shape[1], self.size - self.units.sizes  # [n]
        if self.metric.linear:  # the sums of the differences without each unit
            left_out = self.differences.sum(0) - self.units.sums(self.differences)  # [n, runs * k]
            return self.metric.finish(left_out.reshape(self.n, self.runs, k), count[:, None])
        total = self._columns()
        left_out = total.sum(0) - self.units.sums(total)  # [n, runs * k + k]
        return self._delta(left_out[:, :-k].reshape(self.n, self.runs, k), left_out[:, -k:], count)

    def swapped(self, swaps: np.ndarray) -> np.ndarray:
        """Deltas with the units where ``swaps`` ``[batch, n]`` is True swapped between the sides:
        ``[batch, runs]``."""
        swaps = self.units.examples(swaps)  # [batch, size]
        if isinstance(self.metric, RankMetric):
            out = []
            for run in self.features:  # [2, n]
                ablated = np.where(swaps[None], self.base[:, None], run[:, None])  # [2, batch, n]
                baseline = np.where(swaps[None], run[:, None], self.base[:, None])
                out.append(self.metric.statistic(*ablated) - self.metric.statistic(*baseline))
            return np.stack(out, axis=1)
        k, count = self.base.shape[1], np.full(len(swaps), float(self.size))
        moved = -(swaps.astype(np.float64) @ self.differences).reshape(len(swaps), self.runs, k)  # base - run
        if self.metric.linear:  # sum(run - base) + 2 moved, in one exact step on a lattice
            return self.metric.finish(self.differences.sum(0).reshape(self.runs, k) + 2 * moved, count[:, None])
        runs = self.metric.finish(self.features.sum(0) + moved, count[:, None])
        return runs - self.metric.finish(self.base.sum(0) - moved, count[:, None])


def family_level(config: Resampling, size: int) -> Resampling:
    """The settings for one delta of a family of ``size``: Bonferroni's level ``1 - (1 - confidence) / size`` when the
    intervals are simultaneous (then every interval of the family covers at once with probability at least
    ``confidence``: the family-wise question the Holm- or Bonferroni-adjusted p-values answer), else ``config``."""
    if config.intervals != "simultaneous" or size <= 1:
        return config
    return replace(config, confidence=1 - (1 - config.confidence) / size)


def bootstrap_distribution(deltas: _Deltas, config: Resampling) -> np.ndarray:
    """``[runs, resamples]``, drawn as ``scipy.stats.bootstrap(paired=True, batch=config.batch)`` draws."""
    rng = np.random.default_rng(config.seed)
    out = []
    for start in range(0, config.resamples, config.batch):
        size = min(config.batch, config.resamples - start)
        out.append(deltas.resampled(rng.integers(0, deltas.n, (size, deltas.n))))
    return np.concatenate(out).T


def ties(observed: np.ndarray, theta: np.ndarray, magnitude: np.ndarray | None = None) -> np.ndarray:
    """``[runs, 1]``: how far a resampled value may lie from the observed one and still tie with it. A resample that
    draws each changed example once equals the observed delta, but its sums, taken over other weights (or beside
    other runs in one matrix product), can differ in the last bits; BCa's bias correction counts the resamples below
    the observed value, so those bits moved a row's CI with the plans beside it (+0.56 alone, +0.00 in its table).
    ``TIES`` of the scores' ``magnitude`` (the values compared; else the largest delta): rounding, far below any
    difference of scores that matters."""
    scale = np.fmax(np.abs(observed), np.fmax.reduce(np.abs(theta), axis=1, initial=0.0))  # NaN: undefined
    if magnitude is not None:
        scale = np.fmax(scale, magnitude)
    return (TIES * scale)[:, None]


def confidence_intervals(deltas: _Deltas, observed: np.ndarray, config: Resampling,
                         magnitude: np.ndarray | None = None) -> np.ndarray:
    """``[runs, 2]`` (low, high) of each run's delta, as ``scipy.stats.bootstrap`` computes them (but for ties within
    the rounding of sums of ``magnitude``, ``ties``)."""
    theta = bootstrap_distribution(deltas, config)  # [runs, resamples]
    alpha = (1 - config.confidence) / 2
    gamma = ties(observed, theta, magnitude)
    degenerate = (np.abs(theta - theta[:, :1]) <= gamma).all(1)  # no variation: the interval is the point
    if config.method == "bca":
        below = ((theta < observed[:, None] - gamma).sum(1) + (theta <= observed[:, None] + gamma).sum(1)) \
            / (2 * theta.shape[1])
        z0 = ndtri(below)
        jack = deltas.jackknife().T  # [runs, n]
        u = (deltas.n - 1) * (jack.mean(1, keepdims=True) - jack)
        with np.errstate(invalid="ignore", divide="ignore"):
            a = (u**3).sum(1) / deltas.n**3 / 6 / ((u**2).sum(1) / deltas.n**2) ** 1.5
            z = ndtri(alpha)
            levels = np.stack([ndtr(z0 + (z0 + q) / (1 - a * (z0 + q))) for q in (z, -z)], axis=1)  # [runs, 2]
        out = np.full((len(theta), 2), np.nan)
        for run, level in enumerate(levels):
            if np.isfinite(level).all():
                out[run] = np.quantile(theta[run], level)
    else:
        out = np.quantile(theta, [alpha, 1 - alpha], axis=1).T
        if config.method == "basic":
            out = 2 * observed[:, None] - out[:, ::-1]
    out[degenerate] = observed[degenerate, None]  # not the last bits of sums taken beside other runs (``ties``)
    return out


def permutation_p_values(deltas: _Deltas, observed: np.ndarray, config: Resampling) -> np.ndarray:
    """Two-sided p ``[runs]`` of swapping each example's sides, counted as ``scipy.stats.permutation_test``."""
    exact = deltas.n < 63 and 2**deltas.n <= config.permutations
    rng = np.random.default_rng(config.seed)
    null = []
    if exact:
        every = np.array(list(itertools.product([False, True], repeat=deltas.n)))
        for start in range(0, len(every), config.batch):
            null.append(deltas.swapped(every[start : start + config.batch]))
    else:
        for start in range(0, config.permutations, config.batch):
            size = min(config.batch, config.permutations - start)
            null.append(deltas.swapped(rng.random((size, deltas.n)) < 0.5))
    null = np.concatenate(null)  # [permutations, runs]
    gamma = np.abs(np.finfo(np.float64).eps * 100 * observed)
    adjustment = 0 if exact else 1
    less = ((null <= observed + gamma).sum(0) + adjustment) / (len(null) + adjustment)
    greater = ((null >= observed - gamma).sum(0) + adjustment) / (len(null) + adjustment)
    return np.clip(2 * np.minimum(less, greater), 0.0, 1.0)


def check_records(metric: str, runs: Sequence[Columns], baseline: Columns, names: Sequence[str] | None = None) -> None:
    """A ``UserError`` naming the plan and the example when a record ``metric`` reads is NaN or infinite, or when a
    run's labels are not the baseline's (the same examples must carry the same gold labels on both sides)."""
    names = list(names or [f"run {i}" for i in range(len(runs))])
    read = columns_read(metric, baseline)
    for name, records in (*zip(names, runs), ("the baseline", baseline)):
        for column in read:
            if column not in records:
                raise UserError(f"the records of {name} have no {column!r} column, which {metric} needs")
            values = np.asarray(records[column], dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(values))
            if len(bad):
                raise UserError(f"the records of {name} hold {values[bad[0]]} in {column!r} at example "
                                f"{_example(records, bad[0])} ({len(bad)} non-finite in all): the run produced no "
                                "usable score there; evaluate it again")
    if "label" in read:
        labels = np.asarray(baseline["label"], dtype=np.float64)
        for name, records in zip(names, runs):
            theirs = np.asarray(records["label"], dtype=np.float64)  # by position, as the statistics pair them
            differ = np.flatnonzero(theirs != labels)
            if len(differ):
                raise UserError(f"the records of {name} give example {_example(records, differ[0])} the label "
                                f"{theirs[differ[0]]:g} where the baseline has {labels[differ[0]]:g} "
                                f"({len(differ)} labels differ): these are not the same examples")


def _example(records: Columns, position: int) -> object:
    """The id of the example at ``position`` (its ``example`` column when there is one)."""
    return np.asarray(records["example"])[position] if "example" in records else position


def record_count(records: Columns) -> int:
    return len(records[next(iter(records.keys()))]) if len(records) else 0


def paired_tests(metric: str, runs: Sequence[Columns], baseline: Columns, config: Resampling = DEFAULT_RESAMPLING,
                 names: Sequence[str] | None = None) -> list[PairedResult]:
    """Each run's delta against ``baseline`` on ``metric``, with CI and p-value; the runs' records and the
    baseline's list the same examples in the same order (``check_records``; ``names``: the runs', for its errors).
    Where the metric is undefined (Pearson's r of constant predictions) the delta and p-value are NaN."""
    n = record_count(baseline)
    if n < 2:
        raise UserError(f"a paired bootstrap needs at least 2 examples; the records have {n}")
    for run in runs:
        size = record_count(run)
        if size != n:
            raise UserError(f"paired statistics need the same examples on both sides: {size} vs {n} records")
    check_records(metric, runs, baseline, names)
    units = sampled_units([baseline, *runs], n)
    if units.count < 2:
        raise UserError(f"a paired bootstrap needs at least 2 clusters of examples; the records have {units.count}")
    everything = pd.concat([pd.DataFrame(dict(c)) for c in (*runs, baseline)], ignore_index=True)
    deltas = _Deltas(metric_for(metric, everything), runs, baseline, units)
    ablated, base, observed = deltas.observed()
    undefined = ~np.isfinite(observed)  # the metric is undefined on a side (Pearson's r of constant predictions)
    magnitude = np.fmax(np.abs(ablated), np.abs(base))
    ci = np.where(undefined[:, None], np.nan, confidence_intervals(deltas, observed, config, magnitude))
    p = np.where(undefined, np.nan, permutation_p_values(deltas, observed, config))
    return [PairedResult(metric, float(a), float(base), float(d), float(lo), float(hi), float(q), n, units.count)
            for a, d, (lo, hi), q in zip(ablated, observed, ci, p)]


def paired_ci(ablated: Columns, baseline: Columns, metric: str = "accuracy", *, resamples: int = 10_000,
              permutations: int = 10_000, confidence: float = 0.95, method: str = "bca", seed: int = 0
              ) -> PairedResult:
    """The delta metric(ablated) - metric(baseline) with a paired bootstrap CI and a permutation p-value.

    ``ablated`` / ``baseline``: per-example records of the same examples in the same order (the
    ``records.parquet`` of ``ablate.py`` jobs, as DataFrames or dicts of columns). ``metric``: a
    task metric (accuracy, f1, matthews, pearson, spearman, exact_match, loss, ...).
    """
    config = Resampling(resamples, permutations, confidence, method, seed)
    return paired_tests(metric, [ablated], baseline, config)[0]


def adjust_p_values(p_values: Sequence[float], correction: str = "holm") -> np.ndarray:
    """Adjusted p-values across a family of plans (NaN stays NaN and is not counted): ``holm``, ``bh`` or ``none``.

    As ``statsmodels.stats.multitest.multipletests`` (``holm`` / ``fdr_bh``; tested against it), in numpy:
    statsmodels runs ``gc.collect()`` on every call, about 0.2 s, once per plan family of a report.
    """
    if correction not in CORRECTIONS:
        raise UserError(f"correction {correction!r} is not one of {', '.join(CORRECTIONS)}")
    p = np.asarray(p_values, dtype=np.float64)
    out = p.copy()
    present = np.flatnonzero(~np.isnan(p))
    if not CORRECTIONS[correction] or not len(present):
        return out
    order = present[np.argsort(p[present], kind="stable")]
    ranked, m = p[order], len(order)
    if correction == "holm":  # step down: max over the first i of (m - j) p_(j)
        adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * ranked))
    else:  # Benjamini-Hochberg, step up: min over j >= i of m p_(j) / j
        adjusted = np.minimum(1.0, np.minimum.accumulate((ranked / (np.arange(1, m + 1) / m))[::-1])[::-1])
    out[order] = adjusted
    return out


def across_seeds(values: Sequence[float], confidence: float = 0.95) -> dict[str, float]:
    """Mean, standard deviation and Student-t CI of one quantity over fine-tuning seeds (a ``UserError`` for no value
    or a NaN or infinite one: a mean over the others would pass for all seeds')."""
    x = np.asarray(values, dtype=np.float64)
    if not len(x) or not np.isfinite(x).all():
        raise UserError(f"across_seeds needs one finite value per seed; got {x.tolist()}")
    mean = float(x.mean())
    if len(x) < 2:
        return {"mean": mean, "std": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "seeds": len(x)}
    std = float(x.std(ddof=1))
    if std == 0:  # every seed gave the same value (scipy's interval is NaN for a zero scale)
        return {"mean": mean, "std": 0.0, "ci_low": mean, "ci_high": mean, "seeds": len(x)}
    low, high = scipy.stats.t.interval(confidence, len(x) - 1, loc=mean, scale=std / np.sqrt(len(x)))
    return {"mean": mean, "std": std, "ci_low": float(low), "ci_high": float(high), "seeds": len(x)}
