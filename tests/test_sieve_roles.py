"""Sieve roles (Pande et al. 2021) against a t-test and corrections written here from their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
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


def test_offset_means_are_each_offsets_mean_over_the_sentences_word_pairs():
    import torch

    from headlab.analysis.syntax.sieves import offset_means

    rng = np.random.default_rng(4)
    scores = torch.tensor(rng.uniform(0, 5, (2, 3, 7, 7)), dtype=torch.float64)  # [batch, heads, d, h]
    words = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)  # [CLS] w w w ... [SEP]
    found = offset_means(scores, words).numpy()
    for b in range(2):
        slots = [i for i in range(7) if words[b, i]]
        for head in range(3):
            for d in slots:
                for h in slots:
                    if d == h:
                        continue
                    same = [scores[b, head, i, j].item() for i in slots for j in slots if i != j and j - i == h - d]
                    assert found[b, head, d, h] == pytest.approx(np.mean(same), rel=1e-12), (b, head, d, h)


def test_a_roles_own_arcs_are_left_out_of_their_offset_baseline():
    """With the arcs left out, each offset's mean is over the other pairs at that offset (NaN where none is left);
    the excess of a role is the mean over its arcs with a baseline, by brute force; a head that attends only along
    one arc, alone at its offset but for one other pair, keeps its whole score."""
    import torch

    from headlab.analysis.syntax.sieves import beyond_offset, offset_means

    rng = np.random.default_rng(5)
    scores = torch.tensor(rng.uniform(0, 5, (1, 2, 6, 6)), dtype=torch.float64)  # [batch, heads, d, h]
    words = torch.tensor([[0, 1, 1, 1, 1, 0]], dtype=torch.bool)  # words in slots 1..4
    arcs = torch.zeros(1, 6, 6, dtype=torch.bool)
    arcs[0, 1, 2] = arcs[0, 3, 2] = arcs[0, 1, 4] = True  # offsets +1, -1, +3 (the only pair at +3)
    found = offset_means(scores, words, arcs).numpy()
    slots = [1, 2, 3, 4]
    excess = {head: [] for head in range(2)}
    for d, h in [(1, 2), (3, 2), (1, 4)]:
        for head in range(2):
            same = [scores[0, head, i, j].item() for i in slots for j in slots
                    if i != j and j - i == h - d and not arcs[0, i, j]]
            if not same:
                assert math.isnan(found[0, head, d, h])
                continue
            assert found[0, head, d, h] == pytest.approx(np.mean(same), rel=1e-12)
            excess[head].append(scores[0, head, d, h].item() - np.mean(same))
    np.testing.assert_allclose(beyond_offset(scores, words, arcs)[0].numpy(),
                               [np.mean(excess[0]), np.mean(excess[1])], rtol=1e-12)
    along = torch.zeros(1, 1, 6, 6, dtype=torch.float64)
    along[0, 0, 1, 2] = 4.0  # only along the arc 1 -> 2; the other pairs at +1 (2 -> 3, 3 -> 4) score 0
    one = torch.zeros_like(arcs)
    one[0, 1, 2] = True
    assert beyond_offset(along, words, one).item() == 4.0  # with the arc in its own baseline: 4 - 4 / 3


def test_a_head_that_attends_by_position_alone_has_nothing_beyond_its_offset():
    """One sentence, its gold tree; head 0 attends to the next word only (a positional head: every arc at offset +1
    scores as every other pair at +1), head 1 to each word's gold head. Both attend along arcs far above uniform;
    the offset control leaves the positional head 0 and the syntactic one well above."""
    import torch

    from headlab.analysis.syntax.sieves import dependency_pairs, mean_over_pairs, offset_means, pande_pair_scores

    gold = [0, 2, 0, 2, 3, 4, 4, 2]  # slot 1..7: each word's head (0: ROOT); slot 0 [CLS], slot 8 [SEP]
    slots = len(gold) + 1
    heads = torch.tensor([[*gold, 0]])  # [1, slots]
    words = torch.tensor([[0] + [1] * (len(gold) - 1) + [0]], dtype=torch.bool)  # slots 1..7 are words
    attention = torch.zeros(1, 2, slots, slots, dtype=torch.float64)
    for i in range(1, len(gold)):
        attention[0, 0, i, i + 1] = 1.0  # the next slot ([SEP] after the last word)
        attention[0, 1, i, gold[i] if gold[i] else i] = 1.0  # the gold head (the root: itself)
    attention[0, :, 0, 0] = attention[0, :, len(gold), len(gold)] = 1.0
    pairs = dependency_pairs(heads, [["x"] * (len(gold) - 1)], words)["syntactic"]
    pieces = torch.ones(1, slots)
    scores = pande_pair_scores(attention, pieces, torch.tensor([float(slots)]), "l2r")
    plain = mean_over_pairs(scores, pairs)[0]
    beyond = mean_over_pairs(scores - offset_means(scores, words), pairs)[0]
    assert (plain > 1.0).all()  # both above uniform on the arcs
    assert beyond[0].item() == 0.0 and beyond[1].item() > 1.0


def test_the_offset_control_is_a_one_sided_t_test_above_the_roles_bar_corrected_as_the_roles():
    """The excess beyond the offset pattern must clear tau - 1 (uniform attention's excess is 0, a role's bar tau
    is tau - 1 above uniform's 1): a head 1.5 beyond its offset pattern does not, one 3.5 beyond it does."""
    from headlab.analysis.types.sieve_roles import with_offset_control

    rng = np.random.default_rng(6)
    sieve = {"syntactic": rng.normal(4.0, 1.0, (30, 2, 3)), "nsubj": rng.normal(4.0, 1.0, (30, 2, 3))}
    beyond = {name: rng.normal(0.0, 1.0, (30, 2, 3)) for name in sieve}
    beyond["syntactic"][:, 0, 1] += 3.5  # one head far beyond its offset pattern
    beyond["nsubj"][:, 1, 2] += 1.5  # one barely
    table = with_offset_control(sieve_roles(sieve), beyond, tau=3.0)
    expected = np.array([one_sided_p(beyond[row.sieve][:, row.layer, row.head], 2.0) for row in table.itertuples()])
    np.testing.assert_allclose(table["p_offset"], expected, rtol=1e-10)
    np.testing.assert_allclose(table["p_offset_adjusted"], holm(expected), rtol=1e-10)
    held = table[table["beyond_offset"]]
    assert list(zip(held["sieve"], held["layer"], held["head"])) == [("syntactic", 0, 1)]
    assert table["role"].all()  # every head above tau: the roles themselves are unchanged
