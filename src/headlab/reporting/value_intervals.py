"""One run's metric with its bootstrap interval, and a change as a share of a baseline's headroom: the resampling of
``headlab.reporting.statistics`` (the same resamples for the same seed, by the records' units of sampling) applied to
a statistic of one or more record sets of the same examples."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from headlab.errors import UserError
from headlab.reporting.metric_sums import Columns, RankMetric, SumMetric, metric_for
from headlab.reporting.sampled_units import SampledUnits, sampled_units
from headlab.reporting.statistics import (
    DEFAULT_RESAMPLING,
    Resampling,
    check_records,
    confidence_intervals,
    record_count,
)


class _Values:
    """``combine`` of ``metric`` on one or more record sets of the same examples (``[..., sets] -> [...]``; default:
    the one set's value), on resamples and jackknife samples by ``units``: what ``confidence_intervals`` reads."""

    def __init__(self, metric: SumMetric | RankMetric, sets: Sequence[Columns], units: SampledUnits,
                 combine: Callable[[np.ndarray], np.ndarray] = lambda values: values[..., 0]):
        self.metric, self.units, self.combine = metric, units, combine
        if isinstance(metric, SumMetric):
            self.features = [metric.features(records) for records in sets]  # each [size, k]
        else:
            self.features = [np.stack(metric.columns(records)) for records in sets]  # each [2, size]
        self.size, self.n = units.size, units.count

    def _finish(self, sums: list[np.ndarray], count: np.ndarray) -> np.ndarray:
        return self.combine(np.stack([self.metric.finish(part, count) for part in sums], axis=-1))

    def _ranked(self, index: np.ndarray) -> np.ndarray:
        return self.combine(np.stack([self.metric.statistic(*f[:, index]) for f in self.features], axis=-1))

    def observed(self) -> np.ndarray:
        if isinstance(self.metric, RankMetric):
            return np.array([self._ranked(np.arange(self.size))], dtype=np.float64)
        count = np.array([float(self.size)])
        return self.combine(np.stack([self.metric.observed(f.sum(0)[None], count) for f in self.features], axis=-1))

    def resampled(self, index: np.ndarray) -> np.ndarray:
        weights = self.units.weights(index)  # [batch, size]
        if isinstance(self.metric, RankMetric):
            if self.units.groups is None:
                return self._ranked(index)[:, None]
            return np.array([self._ranked(np.repeat(np.arange(self.size), w.astype(np.int64))) for w in weights])[
                :, None]
        return self._finish([weights @ f for f in self.features], weights.sum(1))[:, None]

    def jackknife(self) -> np.ndarray:
        if isinstance(self.metric, RankMetric):
            every = np.arange(self.size)
            return np.array([self._ranked(np.setdiff1d(every, members)) for members in self.units.members()])[
                :, None]
        left_out = [f.sum(0) - self.units.sums(f) for f in self.features]  # each [n, k]
        return self._finish(left_out, self.size - self.units.sizes)[:, None]


def _interval_of(values: _Values, config: Resampling) -> tuple[float, float, float]:
    observed = values.observed()
    if not np.isfinite(observed).all():
        return float(observed[0]), float("nan"), float("nan")
    low, high = confidence_intervals(values, observed, config)[0]
    return float(observed[0]), float(low), float(high)


def metric_value(metric: str, records: Columns) -> float:
    """``metric`` of ``records`` (the value ``value_interval`` gives, without the interval)."""
    units = sampled_units([records], record_count(records))
    return float(_Values(metric_for(metric, pd.DataFrame(dict(records))), [records], units).observed()[0])


def value_interval(metric: str, records: Columns, config: Resampling = DEFAULT_RESAMPLING
                   ) -> tuple[float, float, float]:
    """``(value, low, high)``: ``metric`` on ``records`` with its bootstrap CI over the examples (their clusters,
    ``headlab.reporting.sampled_units``), drawn as the paired deltas' (the same resamples for the same seed,
    ``config.method``): a baseline's own interval."""
    n = record_count(records)
    units = sampled_units([records], n)
    if units.count < 2:
        raise UserError(f"a bootstrap needs at least 2 examples; the records have {units.count}")
    return _interval_of(_Values(metric_for(metric, pd.DataFrame(dict(records))), [records], units), config)


def headroom_interval(metric: str, ablated: Columns, baseline: Columns, chance: float,
                      config: Resampling = DEFAULT_RESAMPLING) -> tuple[float, float, float]:
    """``(value, low, high)`` of ``(metric(ablated) - metric(baseline)) / (metric(baseline) - chance)``: the change
    as a share of the baseline's headroom above chance (-1: down to chance), with its paired bootstrap CI (both
    sides resampled alike, by their units; ``chance`` held fixed)."""
    n, size = record_count(baseline), record_count(ablated)
    if size != n:
        raise UserError(f"paired statistics need the same examples on both sides: {size} vs {n} records")
    check_records(metric, [ablated], baseline)
    units = sampled_units([baseline, ablated], n)
    if units.count < 2:
        raise UserError(f"a paired bootstrap needs at least 2 examples; the records have {units.count}")

    def share(values: np.ndarray) -> np.ndarray:  # [..., 2]: ablated, baseline
        with np.errstate(divide="ignore", invalid="ignore"):
            return (values[..., 0] - values[..., 1]) / (values[..., 1] - chance)

    everything = pd.concat([pd.DataFrame(dict(c)) for c in (ablated, baseline)], ignore_index=True)
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample at chance: an infinite share, not a warning
        return _interval_of(_Values(metric_for(metric, everything), [ablated, baseline], units, share), config)


def area_difference_interval(metric: str, baseline: Columns, ours: Sequence[Columns],
                             others: Sequence[Sequence[Columns]], config: Resampling = DEFAULT_RESAMPLING
                             ) -> tuple[float, float, float]:
    """``(value, low, high)`` of a prune curve's area against random orders': the mean over steps of
    ``metric(ours[s]) / metric(baseline)`` minus the same mean of each of ``others`` (random orders, each a list of
    steps as long as ``ours``), averaged over them, with its paired bootstrap CI (every set resampled alike, by the
    records' units)."""
    n, steps = record_count(baseline), len(ours)
    if any(len(order) != steps for order in others) or not steps or not others:
        raise UserError(f"an area difference needs every random order at the curve's {steps} steps")
    sets = [baseline, *ours, *(s for order in others for s in order)]
    check_records(metric, sets[1:], baseline)
    units = sampled_units(sets, n)
    if units.count < 2:
        raise UserError(f"a paired bootstrap needs at least 2 examples; the records have {units.count}")

    def difference(values: np.ndarray) -> np.ndarray:  # [..., 1 + steps + orders * steps]
        base = values[..., :1]
        mine = (values[..., 1 : 1 + steps] / base).mean(-1)
        theirs = (values[..., 1 + steps :] / base).reshape(*values.shape[:-1], len(others), steps).mean((-1, -2))
        return mine - theirs

    everything = pd.concat([pd.DataFrame(dict(c)) for c in sets], ignore_index=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _interval_of(_Values(metric_for(metric, everything), sets, units, difference), config)
