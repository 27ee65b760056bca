"""Sieve roles (Pande et al. 2021) against a t-test and corrections written here from their definitions."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from headlab.analysis.types.sieve_roles import role_matrix, sieve_roles


def one_sided_p(scores, tau):
    """H0: mean <= tau. t = (mean - tau) / (s / sqrt(n)) with the sample standard deviation; p = P(T_{n-1} > t)."""
    scores = scores[np.isfinite(scores)]
    n = len(scores)
    mean = scores.sum() / n
    sd = math.sqrt(((scores - mean) ** 2).sum() / (n - 1))
    t = (mean - tau) / (sd / math.sqrt(n))
    return stats.t.sf(t, n - 1)


def holm(p):
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, (len(p) - rank) * p[index])
        adjusted[index] = min(1.0, running)
    return adjusted


def benjamini_hochberg(p):
    m = len(p)
    order = np.argsort(p)[::-1]
    adjusted = np.empty_like(p)
    running = 1.0
    for rank, index in zip(range(m, 0, -1), order):
        running = min(running, p[index] * m / rank)
        adjusted[index] = running
    return adjusted


def planted(rng, sequences=30):
    """[sequences, 2 layers, 3 heads] scores: L0H1 and L1H2 near 5 (a role at tau 3), the others near 1."""
    scores = rng.normal(1.0, 0.5, size=(sequences, 2, 3))
    scores[:, 0, 1] = rng.normal(5.0, 1.0, size=sequences)
    scores[:, 1, 2] = rng.normal(3.3, 1.0, size=sequences)  # just above tau: the correction may matter
    scores[::4, 1, 0] = np.nan  # sequences without a score
    return scores


def test_roles_equal_a_hand_written_one_sided_t_test_with_holm_and_bh():
    rng = np.random.default_rng(0)
    sieve = {"local": planted(rng), "block": planted(rng)}
    for correction, adjust in (("holm", holm), ("bh", benjamini_hochberg), ("none", lambda p: p)):
        table = sieve_roles(sieve, tau=3.0, alpha=0.05, correction=correction)
        expected_p = np.array([one_sided_p(sieve[row.sieve][:, row.layer, row.head], 3.0)
                               for row in table.itertuples()])
        np.testing.assert_allclose(table["p"], expected_p, rtol=1e-10)
        np.testing.assert_allclose(table["p_adjusted"], adjust(expected_p), rtol=1e-10)
        np.testing.assert_array_equal(table["role"], adjust(expected_p) < 0.05)
        means = [np.nanmean(sieve[row.sieve][:, row.layer, row.head]) for row in table.itertuples()]
        np.testing.assert_allclose(table["mean"], means, rtol=1e-12)
    assert table.loc[(table["name"] == "L1H0"), "sequences"].tolist() == [22, 22]
    strong = sieve_roles(sieve)
    assert set(strong.loc[strong["role"], "name"]) >= {"L0H1"}
    assert not strong.loc[strong["name"].isin(["L0H0", "L0H2", "L1H0", "L1H1"]), "role"].any()


def test_the_multi_label_table_has_one_row_per_head_and_a_column_per_sieve():
    sieve = {"local": planted(np.random.default_rng(1)), "delimiter": np.full((5, 2, 3), 1.0)}
    table = role_matrix(sieve_roles(sieve))
    assert list(table.columns) == ["layer", "head", "name", "local", "delimiter"]
    assert len(table) == 6 and table.loc[table["name"] == "L0H1", "local"].item()
    assert not table["delimiter"].any()  # constant scores at 1: no spread, no role
