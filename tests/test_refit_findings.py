"""The clustering's randomness in the type claims: the bootstrap fits of the heads' types, the refits stage's plans
of each fit, and each Table 2 claim's spread across the fits, against differences and shares computed here."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from test_findings import files_of, guan_finding, job, records, table2
from test_verdict_limits import classification_records

from headlab.analysis.types.clusters import bootstrap_labels, fit_clusters
from headlab.study.findings.verdicts import HOLDS, INCONCLUSIVE, NOT_TESTED
from headlab.study.refit_plans import refit_plans

HEADS = [f"L{layer}H{head}" for layer in range(2) for head in range(6)]  # 12 heads


def labelling(diagonal: list[str], vertical: list[str]) -> dict[str, str]:
    """Every head dense, but ``diagonal`` and ``vertical``; L1H5 dense_vertical."""
    labels = {head: "dense" for head in HEADS}
    labels |= {head: "diagonal" for head in diagonal} | {head: "vertical" for head in vertical}
    return labels | {"L1H5": "dense_vertical"}


def folder_of(plan: str, heads: list[str]) -> str:
    """A refit job's folder: the plan, then the first 10 hex digits of the SHA-1 of its heads in head order."""
    ordered = [head for head in HEADS if head in heads]
    return f"{plan}-{hashlib.sha1(','.join(ordered).encode()).hexdigest()[:10]}"


def clusters_file(folder, fits: list[dict[str, str]], model: str = "seed0") -> None:
    job(folder, f"cluster/{model}", {"stability": 0.97, "stability_repeats": [0.97] * 20,
                                     "config": {"cluster": {"stability_fits": 10, "stability_split": "heads"}}})
    main = labelling(["L0H0", "L0H1", "L0H2", "L0H3", "L0H4", "L0H5", "L1H0"], ["L1H1", "L1H2", "L1H3"])
    counts = {name: list(main.values()).count(name) for name in ("dense", "diagonal", "dense_vertical", "vertical")}
    (folder / "cluster" / model / "clusters.json").write_text(json.dumps(
        {"names": ["dense", "diagonal", "dense_vertical", "vertical"], "named": True, "labels": main,
         "counts": counts, "refits": fits}))


def test_the_bootstrap_fits_keep_separated_heads_and_move_a_head_between_two_types():
    """Two tight groups of heads keep their labels in every fit, aligned to the full fit's; a head half-way between
    them is labelled either way across fits; the fits are the seed's (the same twice)."""
    rng = np.random.default_rng(0)
    sequences = 40
    centres = np.zeros((9, 21))
    centres[:4, 0], centres[4:8, 5], centres[8, [0, 5]] = 1.0, 1.0, 0.5
    per_sequence = centres + rng.normal(0, 0.05, (sequences, 9, 21))  # [sequences, heads, 21]
    reference = fit_clusters(per_sequence.mean(0), 2).labels
    fitted = bootstrap_labels(per_sequence, reference, 2, seed=3, fits=30)
    assert fitted.shape == (30, 9)
    assert (fitted[:, :8] == reference[:8]).all()
    assert set(fitted[:, 8]) == {0, 1}
    assert (bootstrap_labels(per_sequence, reference, 2, seed=3, fits=30) == fitted).all()
    assert bootstrap_labels(per_sequence, reference, 2, fits=0).shape == (0, 9)


def test_each_fit_names_its_heads_and_fits_that_agree_share_a_job():
    fits = [labelling(["L0H0"], ["L1H1"]), labelling(["L0H0"], ["L1H2"]), labelling([], ["L1H1"])]
    plans = refit_plans({"names": ["dense", "diagonal", "dense_vertical", "vertical"], "refits": fits})
    assert plans[0]["prune_diagonal"].folder == plans[1]["prune_diagonal"].folder == folder_of("prune_diagonal",
                                                                                              ["L0H0"])
    assert plans[0]["prune_vertical"].folder != plans[1]["prune_vertical"].folder
    assert plans[1]["uniform_vertical"].rules == {"rules": [{"heads": "L1H2", "policy": "uniform"}]}
    assert "prune_diagonal" not in plans[2] and plans[2]["prune_dense"].heads == tuple(
        h for h in HEADS if h not in ("L1H1", "L1H5"))
    assert refit_plans({"names": ["cluster0", "cluster1", "cluster2", "cluster3"], "refits": fits}) == []


def refit_records(folder, fit: dict[str, str], vertical: np.ndarray, diagonal: np.ndarray) -> None:
    for plan, kind, f1 in (("prune_vertical", "vertical", vertical), ("prune_diagonal", "diagonal", diagonal)):
        heads = [head for head, label in fit.items() if label == kind]
        if heads:
            records(job(folder, f"refits/seed0/{folder_of(plan, heads)}"), f1)


def test_an_ordering_states_its_spread_across_the_fits_and_needs_half_of_them(tmp_path):
    """prune_vertical - prune_diagonal under each of 4 fits: the differences equal the records' means; the claim
    holds under the main fit; with 2 of the 4 fits holding it holds, with 1 it rests on one labelling."""
    rng = np.random.default_rng(7)
    diagonal = rng.uniform(0.2, 0.4, 80)
    table2(tmp_path, np.clip(diagonal + 0.5, 0, 1), diagonal)
    fits = [labelling(["L0H0", "L0H1"], ["L1H1"]), labelling(["L0H0"], ["L1H2"]), labelling(["L0H2"], ["L1H2", "L1H3"]),
            labelling([], ["L1H4"])]  # the last fit has no diagonal heads
    clusters_file(tmp_path, fits)
    costly = [np.clip(diagonal + 0.5, 0, 1), np.clip(diagonal + 0.4, 0, 1), diagonal[rng.permutation(80)]]
    for fit, vertical in zip(fits, costly):
        refit_records(tmp_path, fit, vertical, diagonal)
    refit_records(tmp_path, fits[3], diagonal, diagonal)
    (evidence,) = guan_finding(files_of(tmp_path)).evidence
    spread = evidence.values["refits"]
    expected = [100 * (vertical.mean() - diagonal.mean()) for vertical in costly]
    assert spread["values"][:3] == pytest.approx(expected, abs=1e-9) and math.isnan(spread["values"][3])
    assert spread["verdicts"] == [HOLDS, HOLDS, INCONCLUSIVE, NOT_TESTED] and spread["holds"] == 2
    assert evidence.verdict == HOLDS
    assert (f"under 4 bootstrap fits of the clusters: holds in 2, the estimate {min(expected):+.2f} to "
            f"{max(expected):+.2f}") in evidence.note
    refit_records(tmp_path, fits[1], diagonal[rng.permutation(80)], diagonal)  # the second fit now shows nothing
    (evidence,) = guan_finding(files_of(tmp_path)).evidence
    assert evidence.values["refits"]["holds"] == 1 and evidence.verdict == INCONCLUSIVE
    assert "under only 1 of 4 bootstrap fits: it rests on one labelling of the heads" in evidence.note


def test_a_cost_states_its_spread_across_the_fits(tmp_path):
    """Row 5's share of the headroom under each fit, against the refits stage's own baseline: equal to the share
    computed from the predictions here."""
    rng = np.random.default_rng(4)
    label = (rng.random(200) < 0.55).astype(int)
    base = np.where(rng.random(200) < 0.85, label, 1 - label)
    for name in ("baseline", "prune_vertical"):
        classification_records(job(tmp_path, f"tables/table2/seed0/{name}"), label, base, np.arange(200))
    fits = [labelling(["L0H0"], ["L1H1"]), labelling(["L0H0"], ["L1H1", "L1H2"])]
    clusters_file(tmp_path, fits)
    classification_records(job(tmp_path, "refits/seed0/baseline"), label, base, np.arange(200))
    plans = [np.where(rng.random(200) < 0.99, base, 1 - base), np.where(rng.random(200) < 0.7, base, 1 - base)]
    for fit, prediction in zip(fits, plans):
        heads = [head for head, kind in fit.items() if kind == "vertical"]
        classification_records(job(tmp_path, f"refits/seed0/{folder_of('prune_vertical', heads)}"), label,
                               prediction, np.arange(200))
    files = files_of(tmp_path, metric="accuracy", scale=1.0)
    (evidence,) = guan_finding(files, "guan_table2_vertical_prune_cheap").evidence
    chance = max(label.mean(), 1 - label.mean())
    shares = [((p == label).mean() - (base == label).mean()) / ((base == label).mean() - chance) for p in plans]
    assert evidence.values["refits"]["values"] == pytest.approx(shares, abs=1e-12)
    assert evidence.values["refits"]["verdicts"][1] != HOLDS  # a loss of 30% of the examples' answers
