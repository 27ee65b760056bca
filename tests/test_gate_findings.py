"""The gates stage's findings (Voita et al., Nam et al., Li & Janson) on constructed stage files: each verdict where
its rule says, and the L0 claim's interval recomputed from the records at Bonferroni's level over the penalties that
prune more than half of the heads."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from test_findings import files_of, job

from headlab.reporting.statistics import PairedResult
from headlab.study.findings import study_findings
from headlab.study.findings.gates import (
    holm_floor,
    irrelevant_removable,
    most_heads_pruned,
    no_loss,
    optimal_below_mean,
)
from headlab.study.findings.verdicts import FAILS, HOLDS, INCONCLUSIVE, NOT_TESTED

N = 40  # examples


def qa_records(f1: np.ndarray, penalty: float) -> pd.DataFrame:
    """A SQuAD job's records of one penalty (NaN: the baseline): per-question F1 in [0, 1] (``f1``: in points), the
    answer another wherever the F1 is not the baseline's 80."""
    return pd.DataFrame({"split": "validation", "example": np.arange(N), "id": [f"q{i}" for i in range(N)],
                         "prediction": [f"answer {i}" + ("" if f1[i] == 80 else f" ({f1[i]})") for i in range(N)],
                         "exact_match": (f1 == 100).astype(float),
                         "f1": f1 / 100, "has_answer": True, "loss": 1 - f1 / 100, "penalty": penalty})


def l0_job(folder, pruned: dict[float, tuple[int, np.ndarray]]):
    """gates/l0/seed0 with a row per penalty (heads pruned of 12, its per-example f1) and the records."""
    path = job(folder, "gates/l0/seed0", {"kind": "gates", "method": "l0"})
    rows, records = [], [qa_records(np.full(N, 80.0), np.nan)]
    for penalty, (count, f1) in pruned.items():
        rows.append({"lambda": penalty, "heads_kept": 12 - count, "heads_pruned": count, "split": "validation",
                     "f1": f1.mean(), "baseline": 80.0, "delta": f1.mean() - 80.0})
        records.append(qa_records(f1, penalty))
    pd.DataFrame(rows).to_csv(path / "gates.csv", index=False)
    pd.concat(records, ignore_index=True).to_parquet(path / "records.parquet")


@pytest.mark.parametrize(("cost", "expected"), [(0.0, HOLDS), (-30.0, FAILS)])
def test_most_heads_pruned_at_a_small_cost(tmp_path, cost, expected):
    """7 of 12 heads pruned at lambda 0.1 with f1 moved by ``cost`` on average, +-0.2 around it; 4 pruned at 0.01
    does not count (not more than half)."""
    wobble = np.where(np.arange(N) % 2 == 0, 0.2, -0.2)
    l0_job(tmp_path, {0.01: (4, np.full(N, 80.0)), 0.1: (7, 80.0 + cost + wobble)})
    finding = most_heads_pruned(files_of(tmp_path))
    evidence, = finding.evidence
    assert evidence.verdict == expected and evidence.values["lambda"] == 0.1
    assert evidence.values["value"] == pytest.approx(cost) and evidence.values["boundary"] == -1.0


def test_a_loss_only_far_past_half_the_heads_is_no_refutation(tmp_path):
    """The grid jumps from 4 heads pruned (lambda 0.01) to 10 of 12 (0.1) at a loss: pruning 7 was never tried, so
    the claim is inconclusive and the note names the penalty to add (their geometric mean)."""
    l0_job(tmp_path, {0.01: (4, np.full(N, 80.0)), 0.1: (10, np.full(N, 50.0) + np.arange(N) % 2)})
    evidence, = most_heads_pruned(files_of(tmp_path)).evidence
    assert evidence.verdict == INCONCLUSIVE and evidence.values["high"] < -1.0
    assert "between 0.01 and 0.1 (e.g. 0.0316)" in evidence.note


def test_a_plan_that_changed_no_score_is_no_proof_of_no_loss(tmp_path):
    """Every example's f1 unchanged: a zero-width interval at 0 shows no loss on these 40 examples only; up to 8.8
    points (a share 1 - 0.025^(1/40) of them losing everything) stay consistent with none of 40 having changed."""
    l0_job(tmp_path, {0.1: (8, np.full(N, 80.0))})
    evidence, = most_heads_pruned(files_of(tmp_path)).evidence
    assert evidence.verdict == INCONCLUSIVE and evidence.values["low"] == pytest.approx(-8.81, abs=1e-2)
    assert "0 of 40 units changed a prediction" in evidence.numbers


@pytest.mark.parametrize(("units", "expected"), [(40, INCONCLUSIVE), (10_000, HOLDS)])
def test_a_zero_width_interval_is_bounded_as_clopper_pearson_bounds_no_change(units, expected):
    """No unit of ``units`` changed: the lower end is the loss if the one-sided 97.5% Clopper-Pearson upper bound on
    the share of changed units (scipy's exact binomial interval of 0 of ``units``) each lost the whole scale."""
    test = PairedResult("f1", 80.0, 80.0, 0.0, 0.0, 0.0, 1.0, units, units)
    outcome, low = no_loss(test, 0, 0.95, margin=1.0, scale=100.0)
    share = scipy.stats.binomtest(0, units).proportion_ci(confidence_level=0.95, method="exact").high
    assert low == pytest.approx(-100.0 * share, rel=1e-9) and outcome == expected


def test_a_few_changed_examples_are_bounded_as_none_changed_are(tmp_path):
    """One of 40 answers changed, losing 1 point: the bootstrap's interval is narrow (about [-0.1, 0]) but 1 change
    in 40 is consistent with up to 12.9% of them changing (Clopper-Pearson, 97.5% one-sided: scipy's exact interval
    of 1 in 40): the lower end takes the further 10.4% losing everything, as with none changed it takes 8.8%."""
    f1 = np.full(N, 80.0)
    f1[3] = 79.0
    l0_job(tmp_path, {0.1: (8, f1)})
    evidence, = most_heads_pruned(files_of(tmp_path)).evidence
    share = scipy.stats.binomtest(1, N).proportion_ci(confidence_level=0.95, method="exact").high
    assert evidence.verdict == INCONCLUSIVE and "1 of 40 units changed a prediction" in evidence.numbers
    assert evidence.values["low"] == pytest.approx(-1 / N - 100 * (share - 1 / N), rel=1e-9)


def test_most_heads_pruned_is_inconclusive_when_the_interval_reaches_the_margin(tmp_path):
    """f1 lower by 0.5 on average but spread: the interval (simultaneous over two penalties) reaches below -1."""
    spread = np.where(np.arange(N) % 2 == 0, 20.0, -21.0)
    l0_job(tmp_path, {0.1: (7, 80.0 + spread), 0.3: (9, 80.0 + spread)})
    evidence, = most_heads_pruned(files_of(tmp_path)).evidence
    assert evidence.verdict == INCONCLUSIVE and evidence.values["low"] < -1.0 < evidence.values["high"]
    assert "2 penalties prune more than half" in evidence.numbers


def test_most_heads_pruned_is_not_tested_when_no_penalty_prunes_half(tmp_path):
    l0_job(tmp_path, {0.01: (2, np.full(N, 80.0)), 0.1: (6, np.full(N, 80.0))})
    evidence, = most_heads_pruned(files_of(tmp_path)).evidence
    assert evidence.verdict == NOT_TESTED and "gates.lambdas" in evidence.note


def chg_job(folder, irrelevant: int, change: tuple[float, float] | None, fits: int = 2, unstable: int = 0):
    """gates/chg/seed0: ``irrelevant`` of 12 heads irrelevant (``unstable`` of them not in every fit), one
    interfering, the rest facilitating; ``change`` the prune_irrelevant plan's f1 change per example (the mean
    plus and minus a spread, alternately), in its records beside the baseline's."""
    path = job(folder, "gates/chg/seed0", {"kind": "gates", "method": "chg"})
    counts = {"facilitating": 12 - irrelevant - 1, "interfering": 1, "irrelevant": irrelevant, "inconsistent": 0}
    classes = ["irrelevant"] * irrelevant + ["interfering"] + ["facilitating"] * (11 - irrelevant)
    stable = [i >= unstable for i in range(12)]
    pd.DataFrame({"head": [f"L0H{i}" for i in range(12)], "class": classes, "stable": stable}).to_csv(
        path / "heads.csv", index=False)
    pruned = [] if change is None else [{"plan": "prune_irrelevant", "split": "validation", "delta": 99.0,
                                         "ci_low": 99.0, "ci_high": 99.0}]  # the job's own CI is not read
    (path / "chg.json").write_text(json.dumps({"classes": counts, "stability": float(np.mean(stable)),
                                               "fits": [{}] * fits, "pruned": pruned}))
    if change is not None:
        mean, spread = change
        f1 = 80.0 + mean + np.where(np.arange(N) % 2 == 0, spread, -spread)
        records = pd.concat([qa_records(np.full(N, 80.0), np.nan), qa_records(f1, np.nan)], ignore_index=True)
        records["plan"] = [None] * N + ["prune_irrelevant"] * N
        records.drop(columns=["penalty"]).to_parquet(path / "records.parquet")


NO_LOSS = (-0.2, 0.3)  # f1 change per example -0.2 +- 0.3: CI about [-0.3, -0.1]
LOSS = (-5.0, 1.0)


@pytest.mark.parametrize(("change", "expected"), [(NO_LOSS, HOLDS), (LOSS, FAILS), ((-0.5, 3.0), INCONCLUSIVE)])
def test_irrelevant_heads_removable_at_no_cost(tmp_path, change, expected):
    """The interval recomputed from the records at the study's settings (the job's chg.json says +99)."""
    chg_job(tmp_path, 6, change)
    evidence, = irrelevant_removable(files_of(tmp_path)).evidence
    assert evidence.verdict == expected and evidence.values["value"] == pytest.approx(change[0])
    assert evidence.values["low"] < change[0] < evidence.values["high"]
    assert "6 of 12 heads irrelevant" in evidence.numbers and "100.0% of the heads" in evidence.numbers


def test_a_chg_job_without_records_is_not_tested(tmp_path):
    chg_job(tmp_path, 6, NO_LOSS)
    (tmp_path / "gates/chg/seed0/records.parquet").unlink()
    evidence, = irrelevant_removable(files_of(tmp_path)).evidence
    assert evidence.verdict == NOT_TESTED and "run it again" in evidence.note


@pytest.mark.parametrize(("irrelevant", "fits", "unstable", "why"), [
    (1, 2, 0, "only 1 of 12 heads"),  # fewer than a tenth of the heads: no more than a single-head removal
    (6, 1, 0, "one fit"),  # whether the class comes out again is not measured
    (6, 2, 2, "only 67% of the irrelevant heads")])  # 4 of 6 irrelevant in every fit: below 80%
def test_no_loss_of_a_class_too_small_or_unstable_is_inconclusive(tmp_path, irrelevant, fits, unstable, why):
    chg_job(tmp_path, irrelevant, NO_LOSS, fits, unstable)
    evidence, = irrelevant_removable(files_of(tmp_path)).evidence
    assert evidence.verdict == INCONCLUSIVE and why in evidence.note
    chg_job(tmp_path, irrelevant, LOSS, fits, unstable)  # a loss is a loss whatever the class's size, but only of a
    expected = FAILS if fits > 1 and not unstable else INCONCLUSIVE  # class that comes out again over the fits
    assert irrelevant_removable(files_of(tmp_path)).evidence[0].verdict == expected


def test_no_irrelevant_head_is_not_tested(tmp_path):
    chg_job(tmp_path, 0, None)
    evidence, = irrelevant_removable(files_of(tmp_path)).evidence
    assert evidence.verdict == NOT_TESTED and evidence.note == "no head was called irrelevant"


@pytest.mark.parametrize(("difference", "p", "high", "expected"), [
    ([-0.1, -0.2, -0.05], [0.001, 0.001, 0.01], [-0.01] * 3, HOLDS),
    ([-0.1, 0.2, -0.05], [0.001, 0.001, 0.01], [-0.01, 0.3, -0.01], FAILS),  # a constant costing more than its mean
    ([-0.1, 0.0, -0.05], [0.001, 1.0, 0.01], [-0.01, 0.01, -0.01], HOLDS),  # one undecided: 2 of 3 below
    ([-0.1, 0.0, 0.0], [0.001, 1.0, 1.0], [-0.01, 0.01, 0.01], INCONCLUSIVE),  # 1 of 3 below
    ([-0.1, -0.2, -0.05], [0.001, 0.001, 0.01], [-0.01, 0.02, 0.02], INCONCLUSIVE)])  # CIs disagreeing with p
def test_optimal_gap_below_the_mean_gap(tmp_path, difference, p, high, expected):
    """Holm over the three heads (p_value is the raw one: Holm makes the 0.01 / 3 one 0.01 < 0.05); a head counts
    only when its CI agrees."""
    path = job(tmp_path, "gates/optimal/seed0", {"kind": "gates", "method": "optimal"})
    low = np.array(difference) - 0.05
    pd.DataFrame({"head": ["L0H0", "L0H1", "L0H2"], "split": "validation", "difference": difference,
                  "ci_low": np.where(np.array(difference) > 0, 0.1, low), "ci_high": high,
                  "p_value": np.array(p) / 3, "p_adjusted": 1.0}).to_csv(path / "heads.csv", index=False)
    evidence, = optimal_below_mean(files_of(tmp_path)).evidence
    assert evidence.verdict == expected


def test_the_study_lists_them_only_when_the_gates_stage_ran(tmp_path):
    assert not any(f.claim.key.startswith(("voita", "chg", "li_janson")) for f in study_findings(files_of(tmp_path)))
    chg_job(tmp_path, 6, NO_LOSS)
    keys = [f.claim.key for f in study_findings(files_of(tmp_path))]
    assert {"voita_most_heads_pruned", "chg_irrelevant_removable", "li_janson_optimal_below_mean"} <= set(keys)


def optimal_job(folder, heads: int, p_value, ci_low=-0.2, ci_high=-0.05, split="validation"):
    path = job(folder, "gates/optimal/seed0", {"kind": "gates", "method": "optimal"})
    pd.DataFrame({"head": [f"L0H{i}" for i in range(heads)], "split": split, "difference": -0.1,
                  "ci_low": ci_low, "ci_high": ci_high, "p_value": p_value}).to_csv(path / "heads.csv", index=False)


def test_too_few_permutations_for_holm_decide_no_head(tmp_path):
    """Every head at the least p 2000 permutations give (2 / 2001): Holm over 12 heads makes it 0.012, with a Monte
    Carlo standard error sqrt(q (1 - q) / 2000) x 12 = 0.0038: three of them still below 0.05. Over 40 heads it is
    0.040 + 3 x 0.0126: no head can be decided, and the note gives the count at which one could."""
    floor = 2 / 2001
    for heads, expected in ((12, HOLDS), (40, INCONCLUSIVE)):
        optimal_job(tmp_path, heads, floor)
        evidence, = optimal_below_mean(files_of(tmp_path)).evidence
        assert evidence.verdict == expected, heads
        error = np.sqrt(floor * (1 - floor) / 2000) * heads
        assert (heads * floor + 3 * error < 0.05) == (expected == HOLDS)
    assert "give at least 4995" in evidence.note
    assert holm_floor(40, 4995) < 0.05 <= holm_floor(40, 4945)


def test_a_head_above_the_mean_within_monte_carlo_error_of_alpha_decides_nothing(tmp_path):
    """Two heads clearly below, one above 0 at an adjusted p of 0.045: 3 Monte Carlo errors (0.014 with 2000
    permutations) reach 0.05, so it may or may not be a counterexample: inconclusive, not "does not hold"."""
    optimal_job(tmp_path, 3, [1e-4, 1e-4, 0.045], ci_low=[-0.2, -0.2, 0.01], ci_high=[-0.05, -0.05, 0.2])
    evidence, = optimal_below_mean(files_of(tmp_path)).evidence
    assert evidence.verdict == INCONCLUSIVE and "Monte Carlo" in evidence.note and evidence.values["above"] == 0
    optimal_job(tmp_path, 3, [1e-4, 1e-4, 0.02], ci_low=[-0.2, -0.2, 0.01], ci_high=[-0.05, -0.05, 0.2])
    assert optimal_below_mean(files_of(tmp_path)).evidence[0].verdict == FAILS  # 0.02 + 3 x 0.0094 < 0.05


def test_a_job_of_another_split_is_not_tested(tmp_path):
    """Files whose rows are all of another split than the study's first eval split: not tested, no crash."""
    optimal_job(tmp_path, 3, 1e-4, split="test")
    l0_job(tmp_path, {0.1: (8, np.full(N, 80.0))})
    table = pd.read_csv(tmp_path / "gates/l0/seed0/gates.csv").assign(split="test")
    table.to_csv(tmp_path / "gates/l0/seed0/gates.csv", index=False)
    for finding in (optimal_below_mean, most_heads_pruned):
        evidence, = finding(files_of(tmp_path)).evidence
        assert evidence.verdict == NOT_TESTED and "no validation examples" in evidence.note


def test_a_study_of_the_gates_stage_alone_reads_its_baseline_from_the_gates_jobs(tmp_path):
    """No tables or sweep: the floor check reads the baseline rows of the L0 job's records (penalty empty), the
    baseline's f1 80 on 40 examples, not the pruned rows' 50; none of them: 'no baseline' (then no verdict)."""
    from headlab.study.findings.limits import baseline_limits, limit_reasons

    assert "no baseline of seed0" in limit_reasons(files_of(tmp_path))["seed0"]
    l0_job(tmp_path, {0.1: (8, np.full(N, 50.0))})
    limit = baseline_limits(files_of(tmp_path))["seed0"]
    assert limit.value == pytest.approx(80.0) and limit.examples == N and limit.file == "gates/l0/seed0/records.parquet"
    assert limit_reasons(files_of(tmp_path)) == {}


def test_a_head_whose_holm_p_is_another_heads_takes_that_heads_monte_carlo_error(tmp_path):
    """10 heads, 10,000 permutations: Holm makes every adjusted p 0.04, set by the first head (raw 0.004 x 10), whose
    Monte Carlo error (x 10) reaches 0.05. The last head (raw 0.035, its CI above 0) has a small error of its own, but
    Holm rejects it only if it rejects the first: it is as undecided as that one, so no "does not hold"."""
    from headlab.reporting.statistics import Resampling

    optimal_job(tmp_path, 10, [0.004] + [0.0044] * 8 + [0.035], ci_low=[-0.2] * 9 + [0.01],
                ci_high=[-0.05] * 9 + [0.2])
    files = files_of(tmp_path)
    files.reports["gates"] = (Resampling(resamples=2000, permutations=10_000), "holm")
    evidence, = optimal_below_mean(files).evidence
    assert evidence.verdict == INCONCLUSIVE and evidence.values["above"] == 0 and evidence.values["near_alpha"] == 10
