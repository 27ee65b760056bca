"""Paired statistics against scipy.stats called directly (same seed), brute-force references, and statsmodels."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from omegaconf import OmegaConf
from sklearn.metrics import f1_score, matthews_corrcoef

from headlab.errors import UserError
from headlab.reporting.metric_sums import metric_for
from headlab.reporting.statistics import Resampling, across_seeds, adjust_p_values, paired_ci, paired_tests
from headlab.tasks.record_metrics import metrics_from_records


def classification(n: int, flip: float, seed: int = 0, classes: int = 2) -> tuple[dict, dict]:
    """Baseline right 80% of the time; the ablated run changes a ``flip`` share of its predictions."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, classes, n)
    base = np.where(rng.random(n) < 0.8, label, rng.integers(0, classes, n))
    ablated = np.where(rng.random(n) < flip, rng.integers(0, classes, n), base)
    loss = rng.exponential(1.0, n)
    return ({"label": label, "prediction": ablated, "loss": loss + flip},
            {"label": label, "prediction": base, "loss": loss})


def regression(n: int, seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    label = rng.uniform(0, 5, n).round(1)  # ties, as STS-B's
    base = label + rng.normal(0, 0.8, n)
    return ({"label": label, "prediction": base + rng.normal(0, 1.0, n), "loss": rng.random(n)},
            {"label": label, "prediction": base, "loss": rng.random(n)})


def scipy_ci(metric, ablated, baseline, columns, method, resamples, seed, batch, lattice=False):
    """scipy.stats.bootstrap, paired over examples, with the metric recomputed from scratch per resample.
    ``lattice``: the metric is a mean of 0/1 values; its delta is taken exactly, from the two counts (the difference
    of two rounded means ties with the observed delta by chance, and BCa counts ties)."""
    data = tuple(np.asarray(side[c]) for side in (ablated, baseline) for c in columns)
    k = len(columns)

    def statistic(*cols):
        if lattice:
            n = len(cols[0])
            return (round(metric(*cols[:k]) * n) - round(metric(*cols[k:]) * n)) / n
        return metric(*cols[:k]) - metric(*cols[k:])

    result = scipy.stats.bootstrap(data, statistic, paired=True, vectorized=False, n_resamples=resamples,
                                   method=method, batch=batch, rng=np.random.default_rng(seed))
    return result.confidence_interval


@pytest.mark.parametrize("method", ["percentile", "basic", "bca"])
@pytest.mark.parametrize(("name", "columns", "reference", "data"), [
    ("accuracy", ["label", "prediction"], lambda y, p: np.mean(y == p), classification(150, 0.3)),
    ("matthews", ["label", "prediction"], matthews_corrcoef, classification(150, 0.3, classes=3)),
    ("f1", ["label", "prediction"], lambda y, p: f1_score(y, p, zero_division=0.0), classification(150, 0.3)),
    ("pearson", ["prediction", "label"], lambda x, y: scipy.stats.pearsonr(x, y).statistic, regression(120)),
    ("spearman", ["prediction", "label"], lambda x, y: scipy.stats.spearmanr(x, y).statistic, regression(60)),
])
def test_bootstrap_ci_equals_scipy_with_the_metric_recomputed_per_resample(name, columns, reference, data, method):
    ablated, baseline = data
    resamples = 400
    mine = paired_ci(ablated, baseline, name, resamples=resamples, method=method, seed=7, permutations=50)
    low, high = scipy_ci(reference, ablated, baseline, columns, method, resamples, seed=7, batch=500,
                         lattice=name == "accuracy")
    assert mine.delta == pytest.approx(reference(*[ablated[c] for c in columns])
                                       - reference(*[baseline[c] for c in columns]), abs=1e-12)
    assert (mine.ci_low, mine.ci_high) == pytest.approx((low, high), rel=1e-9, abs=1e-12)
    assert mine.ci_low <= mine.delta <= mine.ci_high and mine.ci_low < mine.ci_high


def test_ci_agrees_with_scipy_per_batch_and_across_runs_of_a_sweep():
    ablated, baseline = classification(300, 0.2)
    other, _ = classification(300, 0.5)
    other["label"] = baseline["label"]
    config = Resampling(resamples=1000, permutations=100, method="percentile", seed=3, batch=250)
    both = paired_tests("accuracy", [ablated, other], baseline, config)
    for run, result in zip((ablated, other), both):
        low, high = scipy_ci(lambda y, p: np.mean(y == p), run, baseline, ["label", "prediction"], "percentile",
                             1000, 3, batch=250)
        assert (result.ci_low, result.ci_high) == pytest.approx((low, high), rel=1e-12)


def test_ci_brackets_the_delta_and_narrows_as_examples_grow():
    widths = []
    for n in (100, 400, 1600):
        ablated, baseline = classification(n, 0.3, seed=n)
        result = paired_ci(ablated, baseline, "accuracy", resamples=2000, permutations=100)
        assert result.ci_low < result.delta < result.ci_high
        widths.append(result.ci_high - result.ci_low)
    assert widths[0] > 1.5 * widths[1] > 2.25 * widths[2]  # about 1/sqrt(n): halves per 4x examples


@pytest.mark.parametrize(("name", "columns", "reference", "data"), [
    ("accuracy", ["label", "prediction"], lambda y, p, axis=-1: np.mean(y == p, axis=axis), classification(10, 0.6)),
    ("loss", ["loss"], lambda x, axis=-1: np.mean(x, axis=axis), classification(11, 0.3)),
])
def test_exact_permutation_p_equals_scipy(name, columns, reference, data):
    """n <= 12: every one of the 2^n swaps, as scipy's exact test."""
    ablated, baseline = data
    mine = paired_ci(ablated, baseline, name, resamples=50, permutations=5000)
    k = len(columns)
    # scipy's "samples" type swaps each example's pair of values: pass what the statistic swaps
    if k == 1:
        result = scipy.stats.permutation_test((np.asarray(ablated[columns[0]]), np.asarray(baseline[columns[0]])),
                                              lambda a, b, axis: reference(a, axis=axis) - reference(b, axis=axis),
                                              permutation_type="samples", vectorized=True, n_resamples=np.inf)
    else:  # accuracy: the per-example correctness is what gets swapped
        correct = lambda side: (side["label"] == side["prediction"]).astype(float)  # noqa: E731
        result = scipy.stats.permutation_test((correct(ablated), correct(baseline)),
                                              lambda a, b, axis: a.mean(axis) - b.mean(axis),
                                              permutation_type="samples", vectorized=True, n_resamples=np.inf)
    assert mine.p_value == pytest.approx(result.pvalue, abs=1e-12)


def test_random_permutation_p_agrees_with_scipy_within_monte_carlo_error():
    ablated, baseline = regression(200, seed=4)
    ablated["prediction"] = baseline["prediction"] + np.random.default_rng(5).normal(0.03, 0.2, 200)
    mine = paired_ci(ablated, baseline, "loss", resamples=50, permutations=20000, seed=1)
    reference = scipy.stats.permutation_test((ablated["loss"], baseline["loss"]),
                                             lambda a, b, axis: a.mean(axis) - b.mean(axis),
                                             permutation_type="samples", vectorized=True, n_resamples=20000,
                                             rng=np.random.default_rng(2))
    assert 0.02 < reference.pvalue < 0.98  # a p-value where the comparison means something
    tail = reference.pvalue / 2  # p = 2 x a tail share; two independent estimates of it differ by ~ 2 sqrt(2) sd
    assert abs(mine.p_value - reference.pvalue) < 4 * 2 * np.sqrt(2 * tail * (1 - tail) / 20000)


def test_resampling_forms_equal_the_task_metrics():
    ablated, _ = classification(97, 0.3, classes=3)
    task = OmegaConf.create({"type": "classification", "metrics": ["accuracy", "matthews"]})
    expected = metrics_from_records(ablated, task)
    for name in ("accuracy", "matthews", "loss"):
        assert metric_for(name, ablated).value(ablated) == pytest.approx(expected[name], abs=1e-12)
    binary, _ = classification(97, 0.3)
    assert metric_for("f1", binary).value(binary) == pytest.approx(f1_score(binary["label"], binary["prediction"]))
    rows, _ = regression(80)
    task = OmegaConf.create({"type": "regression", "metrics": ["pearson", "spearman"]})
    expected = metrics_from_records(rows, task)
    for name in ("pearson", "spearman"):
        assert metric_for(name, rows).value(rows) == pytest.approx(expected[name], abs=1e-12)
    rng = np.random.default_rng(0)
    qa = {"exact_match": rng.integers(0, 2, 50).astype(float), "f1": rng.random(50), "has_answer": rng.random(50) < 0.5,
          "loss": rng.random(50), "prediction": ["x"] * 50}
    task = OmegaConf.create({"type": "extractive_qa", "metrics": ["exact_match", "f1"], "version": "v2"})
    expected = metrics_from_records(qa, task)
    for name in ("exact_match", "f1", "has_ans_f1", "no_ans_exact_match"):
        assert metric_for(name, qa).value(qa) == pytest.approx(expected[name], abs=1e-12)


def test_no_change_gives_a_zero_interval_and_p_one():
    _, baseline = classification(50, 0.0)
    result = paired_ci(dict(baseline), baseline, "accuracy", resamples=200, permutations=200)
    assert (result.delta, result.ci_low, result.ci_high, result.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_holm_and_bh_equal_brute_force():
    p = [0.01, 0.04, 0.03, 0.20, float("nan"), 0.005]
    given = np.array([x for x in p if not np.isnan(x)])
    order = np.argsort(given)
    m = len(given)
    holm = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):  # step-down: (m - rank) p, made monotone
        running = max(running, min(1.0, (m - rank) * given[i]))
        holm[i] = running
    bh = np.empty(m)
    running = 1.0
    for rank, i in reversed(list(enumerate(order))):  # step-up: m p / (rank + 1), monotone from the top
        running = min(running, m * given[i] / (rank + 1))
        bh[i] = running
    for correction, expected in (("holm", holm), ("bh", bh)):
        out = adjust_p_values(p, correction)
        assert np.isnan(out[4])
        np.testing.assert_allclose(np.delete(out, 4), expected, rtol=1e-12)
    np.testing.assert_array_equal(adjust_p_values(p, "none")[[0, 5]], [0.01, 0.005])


def test_across_seeds_is_the_student_t_interval():
    values = [80.1, 81.5, 79.2, 80.8]
    out = across_seeds(values)
    mean, sd = np.mean(values), np.std(values, ddof=1)
    half = scipy.stats.t.ppf(0.975, 3) * sd / 2
    assert out["mean"] == pytest.approx(mean) and out["std"] == pytest.approx(sd)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((mean - half, mean + half))


def test_bad_statistics_input():
    a, b = classification(1, 0.5)
    with pytest.raises(UserError, match="at least 2 examples"):
        paired_ci(a, b, "accuracy")
    a, b = classification(5, 0.5)
    with pytest.raises(UserError, match="same examples"):
        paired_ci({k: v[:4] for k, v in a.items()}, b, "accuracy")
    with pytest.raises(UserError, match="CI method 'normal'"):
        paired_ci(a, b, "accuracy", method="normal")
    with pytest.raises(UserError, match="correction 'bonferroni'"):
        adjust_p_values([0.1], "bonferroni")


@pytest.mark.parametrize("seed", range(12))
def test_bca_on_exact_match_equals_scipy_on_the_lattice(seed):
    """n = 60 SQuAD records: EM deltas lie on a grid of 100/60; resamples that tie with the observed delta must tie
    exactly (they fell on either side by rounding, moving one interval in three by a grid step)."""
    rng = np.random.default_rng(seed)
    base = (rng.random(60) < 0.6).astype(float)
    ablated = np.where(rng.random(60) < 0.25, 1.0 - base, base)
    mine = paired_ci({"exact_match": ablated, "f1": ablated}, {"exact_match": base, "f1": base}, "exact_match",
                     resamples=2000, permutations=100, seed=seed)
    low, high = scipy_ci(np.mean, {"em": ablated}, {"em": base}, ["em"], "bca", 2000, seed, batch=500, lattice=True)
    assert (mine.ci_low, mine.ci_high) == pytest.approx((100 * low, 100 * high), rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_a_deltas_interval_is_the_same_alone_and_beside_other_plans(seed):
    """24 SQuAD questions, 1 to 3 of them changed by each of 8 plans (token F1s off any grid): many resamples tie with
    the observed delta, and their sums, taken beside other plans in one matrix product, differed from it in the last
    bits; BCa's bias correction counted them on either side, so a plan's CI moved by points with the plans of its
    table (the study's finding printed +0.00 where its table printed +0.56 for the same comparison)."""
    rng = np.random.default_rng(seed)
    base = np.where(rng.random(24) < 0.5, 0.0, rng.choice([1 / 7, 2 / 9, 0.4, 2 / 3, 1.0], 24))
    runs = []
    for _ in range(8):
        f1 = base.copy()
        changed = rng.choice(24, rng.integers(1, 4), replace=False)
        f1[changed] = rng.choice([0.0, 1 / 7, 2 / 9, 2 / 3, 1.0], len(changed))
        runs.append({"f1": f1, "exact_match": (f1 == 1).astype(float)})
    baseline = {"f1": base, "exact_match": (base == 1).astype(float)}
    config = Resampling(2000, 2000)
    together = paired_tests("f1", runs, baseline, config)
    for run, beside in zip(runs, together):
        alone = paired_tests("f1", [run], baseline, config)[0]
        assert (alone.ci_low, alone.ci_high, alone.p_value) == pytest.approx(
            (beside.ci_low, beside.ci_high, beside.p_value), abs=1e-9, nan_ok=True)


@pytest.mark.parametrize("seed", range(5))
def test_corrections_equal_statsmodels_with_ties_and_nan(seed):
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(seed)
    p = rng.choice([0.001, 0.01, 0.02, 0.04, 0.3, 0.9, 1.0], 25) * rng.choice([1.0, 0.5], 25)  # ties
    p[rng.choice(25, 3, replace=False)] = np.nan
    present = ~np.isnan(p)
    for correction, method in (("holm", "holm"), ("bh", "fdr_bh")):
        out = adjust_p_values(p, correction)
        assert np.isnan(out[~present]).all()
        np.testing.assert_allclose(out[present], multipletests(p[present], method=method)[1], rtol=1e-14, atol=0)


@pytest.mark.parametrize(("metric", "column", "value"), [("accuracy", "prediction", np.nan),
                                                         ("matthews", "prediction", np.nan),
                                                         ("loss", "loss", np.inf), ("pearson", "label", np.nan)])
def test_a_non_finite_record_names_the_plan_and_the_example(metric, column, value):
    ablated, baseline = classification(40, 0.3, classes=3)
    ablated = {**ablated, "example": np.arange(100, 140), column: ablated[column].astype(float)}
    ablated[column][17] = value
    with pytest.raises(UserError, match=rf"records of plan 'L0H1' hold {value} in '{column}' at example 117"):
        paired_tests(metric, [ablated], baseline, Resampling(50, 50), names=["plan 'L0H1'"])


def test_labels_must_match_between_the_sides():
    ablated, baseline = classification(40, 0.3)
    ablated = {**ablated, "label": ablated["label"].copy()}
    ablated["label"][5] = 1 - ablated["label"][5]
    expected = rf"give example 5 the label {ablated['label'][5]:g} where the baseline has {baseline['label'][5]:g}"
    with pytest.raises(UserError, match=expected):
        paired_tests("accuracy", [ablated], baseline, Resampling(50, 50))
    # records in another row order (a DataFrame's index no longer 0..n-1): positions are paired, and named
    frame = pd.DataFrame(ablated).iloc[::-1]
    first = int(np.flatnonzero(frame["label"].to_numpy() != np.asarray(baseline["label"]))[0])
    expected = rf"give example {first} the label {frame['label'].iloc[first]:g} where the baseline has " \
               rf"{baseline['label'][first]:g}"
    with pytest.raises(UserError, match=expected):
        paired_tests("accuracy", [frame], baseline, Resampling(50, 50))


def test_pearson_of_constant_predictions_is_undefined_not_significant():
    """Sums of constant values rounded to a variance of ~1e-15: r came out 1.07e-9, with p = 0.0002."""
    ablated, baseline = regression(80)
    constant = {**ablated, "prediction": np.full(80, 2.7)}
    assert np.isnan(scipy.stats.pearsonr(constant["prediction"], constant["label"]).statistic)
    result = paired_tests("pearson", [constant, ablated], baseline, Resampling(200, 200))
    assert np.isnan(result[0].value) and np.isnan(result[0].delta) and np.isnan(result[0].p_value)
    assert np.isfinite(result[1].delta) and np.isfinite(result[1].p_value)
    assert np.isnan(adjust_p_values([result[0].p_value, 0.01])[0])


@pytest.mark.parametrize("values", [[], [80.0, np.nan, 81.0], [80.0, np.inf]])
def test_across_seeds_refuses_missing_values(values):
    with pytest.raises(UserError, match="one finite value per seed"):
        across_seeds(values)


@pytest.mark.parametrize("method", ["percentile", "basic", "bca"])
def test_a_run_equal_to_its_baseline_beside_other_runs_has_no_delta_at_all(method):
    """Records equal to the baseline's, in a table with other runs: delta exactly 0, CI exactly [0, 0], p 1, for
    fractional scores (SQuAD F1, its HasAns subset) too. Sums of the run and of the baseline taken by different
    reductions (one strided beside the other runs, one contiguous; a matrix product's columns) differed in the last
    bits: the table read -0.00 [-0.00, -0.00], a CI strictly below 0 for a run that changed nothing."""
    rng = np.random.default_rng(0)
    for n in rng.integers(40, 200, 20):
        f1 = rng.uniform(0, 1, n) * rng.integers(0, 2, n)
        base = {"example": np.arange(n), "f1": f1, "exact_match": (f1 > 0.9).astype(float),
                "has_answer": rng.random(n) < 0.6}
        other = {**base, "f1": np.clip(f1 + rng.normal(0, 0.2, n), 0, 1)}
        for metric in ("f1", "has_ans_f1"):
            result = paired_tests(metric, [other, dict(base), other], base,
                                  Resampling(resamples=500, permutations=200, method=method))[1]
            assert (result.delta, result.ci_low, result.ci_high, result.p_value) == (0.0, 0.0, 0.0, 1.0)
