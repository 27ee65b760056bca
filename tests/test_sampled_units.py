"""Resampling by the unit that was sampled: clusters of examples (a question's two pairs) drawn, swapped and left
out together; checked against the undoubled data and against a brute-force cluster bootstrap written here."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from sklearn.metrics import f1_score

from headlab.errors import UserError
from headlab.reporting.statistics import Resampling, paired_tests
from headlab.reporting.value_intervals import headroom_interval, value_interval

CONFIG = Resampling(resamples=2000, permutations=2000, method="bca", seed=3)


def pairs(n: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Baseline and ablated records of ``n`` binary examples."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n)
    base = np.where(rng.random(n) < 0.8, label, 1 - label)
    ablated = np.where(rng.random(n) < 0.7, label, 1 - label)
    score = rng.normal(size=n)
    frame = lambda p, s: pd.DataFrame({"label": label, "prediction": p, "loss": s})  # noqa: E731
    return frame(ablated, score + rng.normal(0.3, 1, n)), frame(base, score)


def doubled(records: pd.DataFrame) -> pd.DataFrame:
    """Each row twice, the copies one cluster (named by the row's own number)."""
    twice = pd.concat([records, records]).sort_index(kind="stable").reset_index(drop=True)
    return twice.assign(cluster=[f"q{i // 2}" for i in range(len(twice))])


@pytest.mark.parametrize("metric", ["accuracy", "f1", "loss", "spearman"])
@pytest.mark.parametrize("method", ["bca", "percentile"])
def test_a_cluster_bootstrap_of_duplicated_rows_gives_the_interval_of_the_undoubled_data(metric, method):
    """Every row doubled, each pair one cluster: the delta, its CI (BCa's jackknife leaves a cluster out) and its
    permutation p equal those of the rows once, and without the cluster column the CI is narrower (the copies
    counted as independent)."""
    config = Resampling(resamples=600 if metric == "spearman" else 2000, permutations=1000, method=method, seed=3)
    ablated, base = pairs(60, 0)
    once = paired_tests(metric, [ablated], base, config)[0]
    twice = paired_tests(metric, [doubled(ablated)], doubled(base), config)[0]
    assert twice.n == 120 and once.n == 60
    assert (twice.delta, twice.ci_low, twice.ci_high, twice.p_value) == pytest.approx(
        (once.delta, once.ci_low, once.ci_high, once.p_value), abs=1e-9)
    rows = paired_tests(metric, [doubled(ablated).drop(columns="cluster")], doubled(base).drop(columns="cluster"),
                        config)[0]
    assert rows.ci_high - rows.ci_low < 0.85 * (once.ci_high - once.ci_low)
    value = value_interval(metric, doubled(base), config) if metric != "spearman" else None
    if value is not None:
        assert value == pytest.approx(value_interval(metric, base, config), abs=1e-9)


def test_the_cluster_bootstrap_equals_a_brute_force_one():
    """Clusters of 1-4 examples, binary F1 (not a mean): the percentile CI equals drawing the clusters with the same
    stream and recomputing scikit-learn's F1 on each resample; the permutation p equals the exact enumeration of
    the 2^clusters swaps."""
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 5, 11)
    n = int(sizes.sum())
    cluster = np.repeat(np.arange(11), sizes)
    label = rng.integers(0, 2, n)
    base = np.where(rng.random(n) < 0.85, label, 1 - label)
    ablated = np.where(rng.random(n) < 0.6, label, 1 - label)
    names = [f"c{c}" for c in cluster]
    frame = lambda p: pd.DataFrame({"label": label, "prediction": p, "cluster": names})  # noqa: E731
    config = Resampling(resamples=1000, permutations=4096, method="percentile", seed=7, batch=250)
    result = paired_tests("f1", [frame(ablated)], frame(base), config)[0]

    draws = np.random.default_rng(7)
    deltas = []
    for _ in range(4):
        for row in draws.integers(0, 11, (250, 11)):
            index = np.concatenate([np.flatnonzero(cluster == c) for c in row])
            deltas.append(f1_score(label[index], ablated[index], zero_division=0)
                          - f1_score(label[index], base[index], zero_division=0))
    low, high = np.quantile(deltas, [0.025, 0.975])
    assert (result.ci_low, result.ci_high) == pytest.approx((low, high), abs=1e-12)

    observed = f1_score(label, ablated) - f1_score(label, base)
    null = []
    for swaps in itertools.product([False, True], repeat=11):
        swapped = np.array(swaps)[cluster]
        a, b = np.where(swapped, base, ablated), np.where(swapped, ablated, base)
        null.append(f1_score(label, a, zero_division=0) - f1_score(label, b, zero_division=0))
    null = np.array(null)
    eps = 1e-12
    p = 2 * min((null <= observed + eps).mean(), (null >= observed - eps).mean())
    assert result.p_value == pytest.approx(min(p, 1.0), abs=1e-12)


def test_the_headroom_share_and_its_interval_equal_a_brute_force_bootstrap():
    """(ablated - baseline) / (baseline - chance) on accuracy, by question clusters of two: the point and the
    percentile CI recomputed here."""
    ablated, base = pairs(80, 2)
    ablated, base = ablated.assign(cluster=np.arange(80) // 2), base.assign(cluster=np.arange(80) // 2)
    config = Resampling(resamples=1000, method="percentile", seed=1, batch=500)
    value, low, high = headroom_interval("accuracy", ablated, base, 0.5, config)
    correct = lambda frame, index: (frame["label"].to_numpy()[index] == frame["prediction"].to_numpy()[index]).mean()  # noqa: E731
    every = np.arange(80)
    assert value == pytest.approx((correct(ablated, every) - correct(base, every)) / (correct(base, every) - 0.5))
    draws, shares = np.random.default_rng(1), []
    for _ in range(2):
        for row in draws.integers(0, 40, (500, 40)):
            index = np.concatenate([[2 * c, 2 * c + 1] for c in row])
            shares.append((correct(ablated, index) - correct(base, index)) / (correct(base, index) - 0.5))
    assert (low, high) == pytest.approx(tuple(np.quantile(shares, [0.025, 0.975])), abs=1e-12)


def test_records_that_group_their_examples_differently_are_refused():
    ablated, base = pairs(10, 4)
    with pytest.raises(UserError, match="different clusters"):
        paired_tests("accuracy", [ablated.assign(cluster=np.arange(10) // 2)], base.assign(cluster=np.arange(10) % 2),
                     CONFIG)
    with pytest.raises(UserError, match="at least 2 clusters"):
        paired_tests("accuracy", [ablated.assign(cluster="one")], base.assign(cluster="one"), CONFIG)
    # one side without the column: the other's clusters are the examples' units
    one = paired_tests("accuracy", [ablated.assign(cluster=np.arange(10) // 2)], base, CONFIG)[0]
    both = paired_tests("accuracy", [ablated.assign(cluster=np.arange(10) // 2)],
                        base.assign(cluster=np.arange(10) // 2), CONFIG)[0]
    assert (one.ci_low, one.ci_high, one.p_value) == (both.ci_low, both.ci_high, both.p_value)


def test_seeds_pooled_by_a_hierarchical_bootstrap_equal_a_brute_force_one():
    """Three seeds of 30 pairs in clusters of two: the pooled difference is the mean of the seeds' own, and its
    interval the percentile interval of resampling the seeds, then each drawn seed's clusters afresh (the same
    stream, written out here with explicit indices)."""
    from headlab.reporting.pooled import pooled_difference

    rng = np.random.default_rng(8)
    pairs = []
    for shift in (0.2, 0.1, 0.3):
        label = rng.integers(0, 2, 30)
        a = np.where(rng.random(30) < 0.6 + shift, label, 1 - label)
        b = np.where(rng.random(30) < 0.6, label, 1 - label)
        frame = lambda p: pd.DataFrame({"label": label, "prediction": p, "cluster": np.arange(30) // 2})  # noqa
        pairs.append((frame(a), frame(b)))
    config = Resampling(resamples=500, seed=4)
    found = pooled_difference("accuracy", pairs, config)
    own = [(x["label"] == x["prediction"]).mean() - (y["label"] == y["prediction"]).mean() for x, y in pairs]
    assert found.seeds == pytest.approx(own) and found.value == pytest.approx(np.mean(own))
    assert found.between == pytest.approx(np.std(own, ddof=1))

    draws = np.random.default_rng(4)
    chosen = draws.integers(0, 3, (500, 3))
    inner = np.empty((500, 3))
    for seed, (x, y) in enumerate(pairs):
        places = np.argwhere(chosen == seed)
        for (draw, position), row in zip(places, draws.integers(0, 15, (len(places), 15))):
            index = np.concatenate([[2 * c, 2 * c + 1] for c in row])
            right = lambda f: (f["label"].to_numpy()[index] == f["prediction"].to_numpy()[index]).mean()  # noqa
            inner[draw, position] = right(x) - right(y)
    low, high = np.quantile(inner.mean(1), [0.025, 0.975])
    t_low, t_high = scipy.stats.t.interval(0.95, 2, loc=np.mean(own), scale=np.std(own, ddof=1) / np.sqrt(3))
    assert (found.low, found.high) == pytest.approx((min(low, t_low), max(high, t_high)), abs=1e-12)


def test_two_seeds_whose_mean_difference_is_0_are_rarely_pooled_into_a_verdict():
    """Seeds that differ from each other (their own differences +-0.05 around 0) on 400 clusters each: the pooled
    99% interval excludes 0 in at most 1 of 40 draws (the bootstrap of 2 seeds alone did in 9 of 40)."""
    from headlab.reporting.pooled import pooled_difference

    rng = np.random.default_rng(0)
    decided = 0
    for _ in range(40):
        pairs = []
        for _ in range(2):
            shift = rng.normal(0, 0.05)
            label = rng.integers(0, 2, 400)
            a = np.where(rng.random(400) < 0.7 + shift, label, 1 - label)
            b = np.where(rng.random(400) < 0.7, label, 1 - label)
            pairs.append(tuple(pd.DataFrame({"label": label, "prediction": p}) for p in (a, b)))
        found = pooled_difference("accuracy", pairs, Resampling(resamples=400, confidence=0.99, seed=1))
        decided += found.low > 0 or found.high < 0
    assert decided <= 1


def test_a_data_file_row_without_its_cluster_is_refused(tmp_path):
    """task.cluster_field names a column a row leaves empty: one line naming the row, before anything runs (those
    rows would otherwise all share the cluster 'None')."""
    from headlab.tasks.local_files import check_text_file

    path = tmp_path / "pairs.jsonl"
    path.write_text('{"question": "q1", "sentence": "s", "label": 0}\n{"question": "", "sentence": "t", "label": 1}\n')
    check_text_file(path, "t", ["question", "sentence"], "label", None)
    with pytest.raises(UserError, match=r"row 2 has no value in 'question'"):
        check_text_file(path, "t", ["sentence"], "label", "question")
