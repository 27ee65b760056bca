"""The best head against the best offset (``best_head_test``): its p-value and interval hold although the head is the
best of many, checked against an exact enumeration and by their error rates on heads that know nothing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from headlab.analysis.syntax.best_head_test import best_head_test


def exact_max_t_p(candidates: np.ndarray, chosen: int, baseline: np.ndarray) -> float:
    """Every one of the 2^words sign flips, in float64, one head at a time (the definition, brute force)."""
    d = candidates.astype(float) - baseline.astype(float)[:, None]
    norms = [np.sqrt((d[:, k] ** 2).sum()) for k in range(d.shape[1])]
    t = lambda signs, k: 0.0 if norms[k] == 0 else float((signs * d[:, k]).sum() / norms[k])  # noqa: E731
    observed = t(np.ones(len(d)), chosen)
    flips = [np.array(signs) for signs in itertools.product((-1.0, 1.0), repeat=len(d))]
    return sum(max(t(s, k) for k in range(d.shape[1])) >= observed - 1e-12 for s in flips) / len(flips)


def test_the_p_value_is_the_share_of_sign_flips_whose_best_head_leads_as_far():
    rng = np.random.default_rng(3)
    candidates, baseline = rng.random((11, 5)) < 0.6, rng.random(11) < 0.4
    chosen = int(candidates.mean(0).argmax())
    exact = exact_max_t_p(candidates, chosen, baseline)
    result = best_head_test(candidates, chosen, baseline, resamples=40_000, confidence=0.95, seed=0)
    assert 0.02 < exact < 0.9  # a case where the choice matters
    assert result["p_value"] == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / 40_000) + 1e-4)
    assert result["difference"] == pytest.approx(candidates[:, chosen].mean() - baseline.mean())


def naive_p(head: np.ndarray, baseline: np.ndarray, rng: np.random.Generator, resamples: int) -> float:
    """The one-head paired sign-flip test (as if the head had been named beforehand)."""
    d = head.astype(float) - baseline.astype(float)
    flips = rng.choice([-1.0, 1.0], size=(resamples, len(d)))
    return (1 + ((flips @ d) >= d.sum() - 1e-12).sum()) / (resamples + 1)


def test_heads_that_know_nothing_are_found_at_the_nominal_rate():
    """Forty heads and a baseline, each right on 30 % of 150 words at random: no head is better. Picked as the best
    and tested alone, one is "significant" over a third of the time; allowing for the choice, at most about 5 %. The
    interval covers the true difference, 0, about 95 % of the time."""
    rng = np.random.default_rng(0)
    trials, found, naive_found, covered = 200, 0, 0, 0
    for trial in range(trials):
        candidates, baseline = rng.random((150, 40)) < 0.3, rng.random(150) < 0.3
        chosen = int(candidates.mean(0).argmax())
        result = best_head_test(candidates, chosen, baseline, resamples=400, confidence=0.95, seed=trial)
        found += result["p_value"] < 0.05
        covered += result["ci_low"] <= 0.0 <= result["ci_high"]
        naive_found += naive_p(candidates[:, chosen], baseline, rng, 400) < 0.05
    assert naive_found / trials > 0.25  # the test these numbers replace (38 % here)
    assert found / trials <= 0.09
    assert covered / trials >= 0.9


def test_a_head_that_knows_the_relation_is_found_and_its_lead_covered():
    rng = np.random.default_rng(1)
    candidates, baseline = rng.random((300, 30)) < 0.3, rng.random(300) < 0.3
    candidates[:, 7] = rng.random(300) < 0.8  # truly 50 points ahead
    result = best_head_test(candidates, 7, baseline, resamples=2000, confidence=0.95, seed=0)
    assert result["p_value"] < 0.001 and result["ci_low"] <= 0.5 <= result["ci_high"]
    assert result["ci_low"] > 0.3


def test_no_interval_where_every_word_differs_alike_and_no_test_of_one_word():
    candidates, baseline = np.ones((2, 3), dtype=bool), np.zeros(2, dtype=bool)
    result = best_head_test(candidates, 0, baseline, resamples=100, confidence=0.95, seed=0)
    assert result["difference"] == 1.0 and np.isnan(result["ci_low"]) and np.isnan(result["ci_high"])
    assert result["p_value"] == pytest.approx(exact_max_t_p(candidates, 0, baseline), abs=0.15)
    single = best_head_test(candidates[:1], 0, baseline[:1], resamples=100, confidence=0.95, seed=0)
    assert single["difference"] == 1.0 and np.isnan(single["p_value"]) and np.isnan(single["ci_low"])


def test_the_interval_stays_where_a_difference_of_accuracies_can_lie():
    """Five words and a head worse than the baseline: difference -0.6 +- q se reached -1.6."""
    baseline = np.array([True, True, True, True, False])
    candidates = np.stack([~baseline, np.zeros(5, dtype=bool), baseline], axis=1)
    result = best_head_test(candidates, 0, baseline, resamples=500, confidence=0.95, seed=0)
    assert result["difference"] == pytest.approx(-0.6) and result["ci_low"] == -1.0
    assert -1.0 <= result["ci_low"] <= result["difference"] <= result["ci_high"] <= 1.0


def test_words_are_resampled_by_their_sentence():
    """Each sentence's words doubled, with the sentence as the unit: the same p-value and interval as the words once
    (sums and sizes double together); the p-value equals every flip of the 10 sentences' signs enumerated; and words
    that move together within a sentence get a wider interval by sentence than word by word."""
    rng = np.random.default_rng(4)
    sentences = np.repeat(np.arange(10), rng.integers(1, 4, 10))
    candidates, baseline = rng.random((len(sentences), 4)) < 0.6, rng.random(len(sentences)) < 0.4
    chosen = int(candidates.mean(0).argmax())
    once = best_head_test(candidates, chosen, baseline, 3000, 0.95, 0, sentences)
    twice = best_head_test(np.repeat(candidates, 2, axis=0), chosen, np.repeat(baseline, 2), 3000, 0.95, 0,
                           np.repeat(sentences, 2))
    assert once["units"] == twice["units"] == 10
    assert (twice["p_value"], twice["ci_low"], twice["ci_high"]) == pytest.approx(
        (once["p_value"], once["ci_low"], once["ci_high"]), abs=1e-9)

    d = candidates.astype(float) - baseline.astype(float)[:, None]
    sums = np.stack([d[sentences == s].sum(0) for s in range(10)])  # [sentences, heads]
    norms = np.sqrt((sums ** 2).sum(0))
    t = lambda signs, k: 0.0 if norms[k] == 0 else float((signs * sums[:, k]).sum() / norms[k])  # noqa: E731
    observed = t(np.ones(10), chosen)
    flips = [np.array(s) for s in itertools.product((-1.0, 1.0), repeat=10)]
    exact = sum(max(t(s, k) for k in range(4)) >= observed - 1e-12 for s in flips) / len(flips)
    many = best_head_test(candidates, chosen, baseline, 40_000, 0.95, 0, sentences)["p_value"]
    assert many == pytest.approx(exact, abs=4 * np.sqrt(exact * (1 - exact) / 40_000) + 1e-4)

    together = np.repeat(np.arange(40), 5)  # 40 sentences of 5 words, each sentence right or wrong as a whole
    right = np.repeat(rng.random((40, 3)) < 0.6, 5, axis=0)
    base = np.repeat(rng.random(40) < 0.5, 5)
    by_sentence = best_head_test(right, 0, base, 3000, 0.95, 0, together)
    by_word = best_head_test(right, 0, base, 3000, 0.95, 0)
    assert by_sentence["ci_high"] - by_sentence["ci_low"] > 1.8 * (by_word["ci_high"] - by_word["ci_low"])
