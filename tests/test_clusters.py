"""Head types by clustering distance features: naming, stability, label alignment, on planted clusters."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from sklearn.exceptions import ConvergenceWarning

from headlab.analysis.types.cluster_run import stability_note
from headlab.analysis.types.clusters import TYPE_NAMES, align, fit_clusters, name_clusters, stability
from headlab.errors import UserError
from headlab.reporting import head_plots


def profile(kind: str) -> np.ndarray:
    """A 21-bin distance profile of Guan et al.'s type (order: self, windows 0..15, cls, sep, comma, period)."""
    p = np.full(21, 0.01)
    if kind == "dense":
        p[3:17] += 0.06  # long-range windows
    elif kind == "diagonal":
        p[0:3] += np.array([0.1, 0.4, 0.15])  # self and the nearest windows
        p[17:19] += 0.08
    elif kind == "dense_vertical":
        p[3:17] += 0.03
        p[17:19] += 0.2
    elif kind == "vertical":
        p[17:19] += 0.45
    return p / p.sum()


def planted(rng, heads_per_type=(9, 7, 11, 5), sequences=40, noise=0.003):
    """(per-sequence features [sequences, heads, 21], true names per head), heads of the types interleaved."""
    kinds = [kind for kind, count in zip(TYPE_NAMES, heads_per_type) for _ in range(count)]
    order = rng.permutation(len(kinds))
    kinds = [kinds[i] for i in order]
    base = np.array([profile(kind) for kind in kinds])
    per_sequence = np.clip(base + rng.normal(0, noise, size=(sequences, *base.shape)), 0, None)
    return per_sequence / per_sequence.sum(-1, keepdims=True), kinds


@pytest.mark.parametrize("method", ["kmeans", "gmm"])
def test_planted_types_are_found_and_named(method):
    per_sequence, kinds = planted(np.random.default_rng(0))
    clustering = fit_clusters(per_sequence.mean(0), k=4, method=method, seed=0)
    assert clustering.named
    assert clustering.label_names() == kinds
    assert sorted(clustering.names) == sorted(TYPE_NAMES)


def test_other_k_or_unmatched_profiles_are_numbered():
    per_sequence, _ = planted(np.random.default_rng(1))
    three = fit_clusters(per_sequence.mean(0), k=3)
    assert (three.named, three.names) == (False, ["cluster0", "cluster1", "cluster2"])
    local = np.array([profile("diagonal")] * 4)
    local[:, 1] += np.array([0.0, 0.1, 0.2, 0.3])  # four shades of one type: no dense, no vertical
    assert name_clusters(local) is None
    centroids = np.array([profile(kind) for kind in ("vertical", "dense", "diagonal", "dense_vertical")])
    assert name_clusters(centroids) == ["vertical", "dense", "diagonal", "dense_vertical"]


def test_labels_do_not_depend_on_the_heads_order_of_cluster_ids():
    per_sequence, _ = planted(np.random.default_rng(2))
    labels = fit_clusters(per_sequence.mean(0), k=4).labels
    assert labels[0] == 0 and set(labels.tolist()) == {0, 1, 2, 3}
    first = [labels.tolist().index(c) for c in range(4)]
    assert first == sorted(first)  # numbered by first appearance


def test_stability_is_one_on_well_separated_clusters_and_reproducible():
    per_sequence, _ = planted(np.random.default_rng(3))
    for split in ("sequences", "heads"):
        share, fits = stability(per_sequence, k=4, seed=0, fits=5, split=split)
        assert share == 1.0 and fits.shape == (5, 32)
    noisy, _ = planted(np.random.default_rng(4), noise=0.08, sequences=6)
    first, again = stability(noisy, k=4, seed=7, fits=6), stability(noisy, k=4, seed=7, fits=6)
    assert first[0] == again[0] and np.array_equal(first[1], again[1])
    assert first[0] < 1.0  # overlapping clusters: some heads change type between halves
    by_hand = np.mean([len(set(first[1][:, h])) == 1 for h in range(32)])
    assert first[0] == pytest.approx(by_hand)


def test_a_note_says_when_the_types_are_less_stable_than_asked():
    assert stability_note(0.94, 0.9) is None and stability_note(0.9, 0.9) is None and stability_note(0.2, None) is None
    note = stability_note(0.736, 0.9)
    assert note.startswith("note: stability 73.6% is below cluster.min_stability=0.9") and "\n" not in note


def test_align_undoes_a_permutation_of_labels():
    reference = np.array([0, 0, 1, 2, 2, 3, 1, 3])
    permuted = np.array([2, 0, 3, 1])[reference]
    np.testing.assert_array_equal(align(permuted, reference, 4), reference)


def test_k_must_fit_the_heads():
    with pytest.raises(UserError, match="cluster.k=13: the model has 12 heads"):
        fit_clusters(np.random.default_rng(0).random((12, 21)), k=13)


def silhouette_by_definition(points: np.ndarray, labels: np.ndarray) -> float:
    """Rousseeuw (1987): s(i) = (b - a) / max(a, b), a the mean distance to the rest of i's cluster, b the least
    mean distance to another cluster; 0 for a head alone in its cluster. Brute force in float64."""
    scores = []
    for i, point in enumerate(points):
        distances = np.sqrt(((points.astype(np.float64) - point) ** 2).sum(1))
        own = (labels == labels[i]) & (np.arange(len(points)) != i)
        if not own.any():
            scores.append(0.0)
            continue
        a = distances[own].mean()
        b = min(distances[labels == other].mean() for other in set(labels.tolist()) - {labels[i]})
        scores.append((b - a) / max(a, b))
    return float(np.mean(scores))


@pytest.mark.parametrize("k", [2, 3, 4, 6])
def test_silhouette_equals_its_definition_and_is_highest_at_the_planted_k(k):
    per_sequence, _ = planted(np.random.default_rng(3))
    points = per_sequence.mean(0)
    clustering = fit_clusters(points, k=k)
    assert clustering.silhouette == pytest.approx(silhouette_by_definition(points, clustering.labels), abs=1e-12)
    if k != 4:
        assert clustering.silhouette < fit_clusters(points, k=4).silhouette
    with pytest.warns(ConvergenceWarning):  # identical heads: one cluster, no silhouette
        one = fit_clusters(np.repeat(points[:1], 5, axis=0), k=2)
    assert one.silhouette is None


def test_each_head_type_keeps_its_colour_and_place_in_every_figure(tmp_path):
    """Figures of different jobs are compared side by side: a type's colour must not depend on which came first."""
    first = head_plots._colours(["vertical", "dense", "diagonal"])[1]
    second = head_plots._colours(["dense_vertical", "diagonal", "dense", "vertical"])[1]
    assert all(first[kind] == second[kind] for kind in first)
    assert len(set(second.values())) == 4
    assert len(set(head_plots._colours(["cluster0", "cluster1"])[1].values())) == 2  # other names: a colour map
    counts = pd.DataFrame({"layer": [0, 1], "vertical": [1, 2], "dense": [3, 2], "model": "a"})
    paths = head_plots.types_per_layer(counts, "types", tmp_path / "types", ("png",))
    assert paths[0].is_file()


def best_partners(reference: list[str], other: list[str]) -> dict[str, str]:
    """Brute force: the one-to-one pairing of ``other``'s clusters with ``reference``'s that shares the most heads
    (checked to be the only best one), without the pairs that share none."""
    mine, theirs = sorted(set(other)), sorted(set(reference))
    shared = {(m, t): sum(a == t and b == m for a, b in zip(reference, other)) for m in mine for t in theirs}
    if len(mine) <= len(theirs):
        pairings = [dict(zip(mine, chosen)) for chosen in itertools.permutations(theirs, len(mine))]
    else:
        pairings = [dict(zip(chosen, theirs)) for chosen in itertools.permutations(mine, len(theirs))]
    totals = [sum(shared[pair] for pair in pairing.items()) for pairing in pairings]
    assert totals.count(max(totals)) == 1
    best = pairings[totals.index(max(totals))]
    return {m: t for m, t in best.items() if shared[m, t] > 0}


def test_compared_runs_colour_the_clusters_they_share_alike_whatever_their_numbers():
    """cluster0 of one run and cluster0 of another are unrelated: colours follow the heads, not the names."""
    rng = np.random.default_rng(0)
    first = [f"cluster{i}" for i in rng.integers(0, 4, 72)]
    renamed = {"cluster0": "cluster2", "cluster1": "cluster3", "cluster2": "cluster0", "cluster3": "cluster1"}
    second = [renamed[label] for label in first]
    second[:5] = ["cluster1"] * 5  # a few heads change type
    colours = head_plots.matched_colours({"a": first, "b": second})
    partners = best_partners(first, second)
    assert partners == {v: k for k, v in renamed.items()}
    assert all(colours["b"][label] == colours["a"][partners[label]] for label in set(second))
    assert len(set(colours["a"].values())) == 4

    named = [["dense", "diagonal", "dense_vertical", "vertical"][int(label[-1])] for label in first]
    planted = {"dense": "cluster3", "diagonal": "cluster0", "dense_vertical": "cluster4", "vertical": "cluster1"}
    third = [planted[kind] for kind in named]
    third[:12] = ["cluster2"] * 12  # five unnamed clusters against four types: one has no partner
    colours = head_plots.matched_colours({"named": named, "k=5": third})
    partners = best_partners(named, third)
    assert colours["named"] == {kind: to_rgba(head_plots.TYPE_COLOURS[kind]) for kind in set(named)}
    assert all(colours["k=5"][label] == colours["named"][partners[label]] for label in partners)
    unmatched = set(third) - set(partners)
    assert len(unmatched) == 1 and colours["k=5"][unmatched.pop()] not in colours["named"].values()
    assert head_plots.matched_colours({"a": ["dense", "vertical"], "b": ["vertical", "vertical"]}) == {
        "a": {"dense": "tab:blue", "vertical": "tab:cyan"}, "b": {"vertical": "tab:cyan"}}


def alike(rng, heads=12, sequences=200):
    """Heads of one profile (a tiny DeBERTa's: short 0.228, long 0.738, special 0.034), each group of three leaning by
    2e-4 of attention toward one type's bins (so that the naming rule matches), under each sequence's own variation
    (shared by the heads, as sequence lengths are) and a little of each head's: [sequences, heads, 21]."""
    base = np.concatenate([np.full(3, 0.228 / 3), np.full(14, 0.738 / 14), np.full(4, 0.034 / 4)])
    lean = {"dense": [(slice(3, 17), 2e-4)], "diagonal": [(slice(0, 3), 2e-4)], "vertical": [(slice(17, 21), 2e-4)],
            "dense_vertical": [(slice(17, 21), 1e-4), (slice(3, 17), 1e-4)]}
    rows = []
    for kind in np.repeat(TYPE_NAMES, heads // 4):
        row = base.copy()
        for part, amount in lean[kind]:
            row[part] += amount / len(row[part])
        rows.append(row / row.sum())
    shared = rng.normal(0, 0.003, size=(sequences, 1, 21))
    per_sequence = np.clip(np.array(rows) + shared + rng.normal(0, 0.0001, size=(sequences, heads, 21)), 0, None)
    return per_sequence / per_sequence.sum(-1, keepdims=True)


def separation_by_hand(features: np.ndarray, reference: np.ndarray, fitted: np.ndarray, k: int = 4) -> float:
    """The smallest |c_i - c_j| / (t * sqrt(s_i^2 + s_j^2)) over pairs, from the labels of fits on halves of the heads
    (whose centroids are the full features' means over each fit's labels), in loops."""
    import scipy.stats

    centroids = [features[reference == c].mean(0) for c in range(k)]
    spread = [np.mean([np.sum((features[labels == c].mean(0) - centroids[c]) ** 2) for labels in fitted])
              for c in range(k)]
    t = scipy.stats.t.ppf(0.975, len(fitted))
    return min(np.linalg.norm(centroids[i] - centroids[j]) / (t * np.sqrt(spread[i] + spread[j]))
               for i, j in itertools.combinations(range(k), 2))


@pytest.mark.parametrize("split", ["sequences", "heads"])
def test_heads_alike_keep_numbered_clusters_and_distinct_types_keep_their_names(split):
    """A tiny DeBERTa's four centroids printed one profile and were still named dense_vertical / vertical / dense /
    diagonal: names need centroids further apart than their spread across the stability fits (``distinct``)."""
    from headlab.analysis.types.clusters import distinct, profiles, refits, separation

    same = alike(np.random.default_rng(0))
    full = fit_clusters(same.mean(0), k=4)
    assert full.named and sorted(full.names) == sorted(TYPE_NAMES)  # the profile rule alone names them
    assert np.ptp(profiles(full.centroids), axis=0).max() < 1e-3  # one profile to 3 decimals
    labels, centroids = refits(same, full.labels, k=4, seed=0, fits=10, split=split)
    if split == "heads":  # each fit's centroids are the full features' means over its labels: checkable by hand
        assert separation(full.centroids, centroids) == pytest.approx(
            separation_by_hand(same.mean(0), full.labels, labels), rel=1e-9)
    kept = distinct(full, centroids)
    assert (kept.named, kept.names, kept.profile_names) == (False, ["cluster0", "cluster1", "cluster2", "cluster3"],
                                                          full.names)  # what the rule said, on record
    assert kept.separation < 1 and np.array_equal(kept.labels, full.labels)

    per_sequence, kinds = planted(np.random.default_rng(5))
    clustering = fit_clusters(per_sequence.mean(0), k=4)
    _, centroids = refits(per_sequence, clustering.labels, k=4, seed=0, fits=10, split=split)
    named = distinct(clustering, centroids)
    assert named.named and named.label_names() == kinds and named.separation > 1
    by_hand = distinct(fit_clusters(same.mean(0), k=4, names=list(TYPE_NAMES)), refits(same, full.labels)[1])
    assert by_hand.named and by_hand.names == list(TYPE_NAMES)  # names given by hand stay
