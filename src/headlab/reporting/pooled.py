"""One difference of two plans pooled over fine-tuning seeds: a hierarchical bootstrap, not a vote of the seeds.

Each seed is a model fine-tuned from another draw of the training randomness, evaluated on the same kind of
examples; a claim about "the model" is about the population of such seeds. The pooled difference is the mean over
seeds of each seed's paired difference ``metric(a) - metric(b)``. Its interval resamples what was sampled at each
level (Davison and Hinkley 1997, section 3.8; Ren et al. 2010): the seeds with replacement, then, for each seed
drawn, its examples' units (the task's clusters, ``headlab.reporting.sampled_units``) with replacement, afresh each
time a seed is drawn; the percentile interval of the resampled means. Resampling two or three seeds cannot give an
interval wider than their range, so that interval alone covers far less often than it says (a reviewer's simulation:
9 of 40 "significant" pools at 99% where the seeds' mean difference was 0); the interval given is the union of it
and Student's t interval over the seeds' own differences (``seeds - 1`` degrees of freedom, ``across_seeds``), which
carries the seeds' spread at its honest width. Beside it, the heterogeneity: the seeds' own differences and their
standard deviation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from headlab.errors import UserError
from headlab.reporting.metric_sums import Columns, SumMetric, metric_for
from headlab.reporting.sampled_units import sampled_units
from headlab.reporting.statistics import Resampling, across_seeds, check_records


@dataclass(frozen=True)
class Pooled:
    """The mean over seeds of each seed's difference, its interval (the hierarchical bootstrap's and Student's t over
    the seeds, together), and the seeds' spread."""

    value: float
    low: float
    high: float
    seeds: tuple[float, ...]  # each seed's own difference
    between: float  # the seeds' standard deviation (ddof 1)
    confidence: float


def pooled_difference(metric: str, pairs: Sequence[tuple[Columns, Columns]], config: Resampling) -> Pooled:
    """``pairs``: per seed the records of plan ``a`` and plan ``b`` on the same examples; the pooled
    ``metric(a) - metric(b)`` (a metric that is a sum over examples: every metric but Spearman's)."""
    if len(pairs) < 2:
        raise UserError(f"pooling over seeds needs at least 2 seeds; got {len(pairs)}")
    rng = np.random.default_rng(config.seed)
    count = len(pairs)
    draws = config.resamples
    chosen = rng.integers(0, count, (draws, count))  # [draws, seeds drawn]: the outer resample
    inner = np.empty((draws, count))
    observed = []
    for seed, (a, b) in enumerate(pairs):
        n = len(a[next(iter(a.keys()))])
        check_records(metric, [a], b)
        form = metric_for(metric, pd.concat([pd.DataFrame(dict(c)) for c in (a, b)], ignore_index=True))
        if not isinstance(form, SumMetric):
            raise UserError(f"pooling over seeds needs a metric that is a sum over examples; {metric} is not")
        units = sampled_units([a, b], n)
        features = form.features(a), form.features(b)  # [n, k] each
        observed.append(float(form.finish(features[0].sum(0), np.asarray(float(n)))
                              - form.finish(features[1].sum(0), np.asarray(float(n)))))
        where = np.argwhere(chosen == seed)  # [(draw, position)] the places this seed was drawn
        if not len(where):
            continue
        weights = units.weights(rng.integers(0, units.count, (len(where), units.count)))  # [places, n]
        sizes = weights.sum(1)
        deltas = form.finish(weights @ features[0], sizes) - form.finish(weights @ features[1], sizes)
        inner[where[:, 0], where[:, 1]] = deltas
    means = inner.mean(1)  # [draws]
    alpha = (1 - config.confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    seeds = across_seeds(observed, config.confidence)
    low, high = min(low, seeds["ci_low"]), max(high, seeds["ci_high"])  # NaN-free: 2 seeds or more
    return Pooled(seeds["mean"], float(low), float(high), tuple(observed), seeds["std"], config.confidence)
