"""When a verdict is withheld or doubted, on constructed stage files: a baseline at chance (its floor) or at its
maximum (its ceiling) leaves every ablation claim not tested, with the reason and a caveat; a smoke run's claims read
not tested (quick run); a finding against the unablated model prints its table row's interval and p-value; an
interval and a permutation p-value that disagree about 0 make the verdict inconclusive. Chance and the intervals are
recomputed here from their definitions (the official SQuAD scorer, scikit-learn, scipy's bootstrap)."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from sklearn.metrics import f1_score, matthews_corrcoef
from test_findings import files_of, guan_finding, job, records, sweep_report, table2

from headlab.study.findings import finding_lines, study_findings
from headlab.study.findings.caveats import ceiling, floor
from headlab.study.findings.limits import baseline_limits
from headlab.study.findings.verdicts import FAILS, HOLDS, INCONCLUSIVE, NOT_TESTED, checked_verdict
from headlab.tasks.chance import chance_level
from headlab.tasks.metrics import squad_scores

GOLDS = {f"q{i}": ["Paris", "paris "] if i < 10 else [f"Name{i} Smith"] for i in range(40)}


def stable_clusters(folder: Path) -> None:
    """The cluster stage of seed0: all 144 heads stable in every run of the procedure (a claim of the attention, not
    of the score: it holds)."""
    path = job(folder, "cluster/seed0", {"stability": 1.0, "stability_repeats": [1.0] * 20,
                                         "counts": {"a": 134, "b": 10}, "config": {"cluster": {"stability_fits": 10}}})
    (path / "clusters.json").write_text(json.dumps({"named": True, "counts": {"diagonal": 7, "vertical": 3}}))


def brute_force_chance(golds: list[list[str]], metric: str) -> float:
    """100 x the best mean score of one answer given to every question, over every gold answer, every word of one
    and the empty answer, each scored by the official scorer."""
    words = {word for answers in golds for answer in answers for word in answer.split()}
    candidates = {answer for answers in golds for answer in answers} | words | {""}
    column = 0 if metric == "exact_match" else 1
    return 100 * max(np.mean([squad_scores(c, answers)[column] for answers in golds]) for c in candidates)


def bca(values: np.ndarray) -> tuple[float, float]:
    """scipy's BCa interval of the mean (the tables' resamples: 2000, seed 0, batches of 500)."""
    ci = scipy.stats.bootstrap((values,), np.mean, vectorized=True, n_resamples=2000, batch=500, method="BCa",
                               rng=np.random.default_rng(0)).confidence_interval
    return ci.low, ci.high


@pytest.mark.parametrize(("baseline_mean", "at_floor"), [(0.5, True), (0.88, False)])
def test_a_baseline_at_chance_leaves_every_ablation_claim_not_tested(tmp_path, baseline_mean, at_floor):
    """40 questions: 10 answered "Paris", 30 "NameN Smith". Chance F1 is the word "smith" given to every question
    (F1 2/3 on 30 of them: 50), not a whole gold answer ("Paris": 25). A baseline whose CI reaches 50 is at its
    floor: the Table 2 claim is not tested with the reason, stability keeps its verdict, a Floor caveat says so."""
    rng = np.random.default_rng(5)
    base = np.clip(baseline_mean + rng.choice([-0.4, 0.0, 0.4], 40) * (0.25 if not at_floor else 1.0), 0, 1)
    table2(tmp_path, np.clip(base + 0.3, 0, 1), base * 0.2, baseline=base)
    stable_clusters(tmp_path)
    files = files_of(tmp_path, answers=lambda: GOLDS)
    chance = brute_force_chance(list(GOLDS.values()), "f1")
    assert chance == pytest.approx(50.0)
    limit = baseline_limits(files)["seed0"]
    low, high = bca(100 * base)
    assert (limit.value, limit.low, limit.high) == pytest.approx((100 * base.mean(), low, high), abs=1e-9)
    assert limit.chance == pytest.approx(chance) and "'smith'" in limit.chance_is
    assert (low <= chance) == at_floor and high < 100
    found = {f.claim.key: f for f in study_findings(files)}
    diagonal, stability = found["guan_table2_diagonal_vs_vertical_prune"], found["guan_stability"]
    assert stability.verdict == HOLDS
    caveats = floor(files)
    if at_floor:
        assert diagonal.verdict == NOT_TESTED and diagonal.evidence  # its numbers stay, without a verdict
        said = diagonal.counted()
        assert said.startswith(f"not tested: seed0's baseline is at its floor: f1 {100 * base.mean():.2f}")
        assert f"reaches chance {chance:.2f}" in diagonal.counted()
        assert len(caveats) == 1 and caveats[0].startswith("**Floor.** seed0's unablated f1")
        assert diagonal.as_json()["evidence"][0]["verdict"] == NOT_TESTED
    else:
        assert diagonal.verdict == HOLDS and not caveats


@pytest.mark.parametrize(("baseline_mean", "expected"), [(0.5, "floor"), (0.9, "verdict"), (None, "no baseline")])
def test_a_study_without_tables_reads_the_floor_from_the_sweeps_baseline(tmp_path, baseline_mean, expected):
    """No tables stage: the single-head sweep's baseline (the records its head jobs name, kept outside the study in
    the baseline cache) tells whether the model learned its task. At chance, the Michel claim is not tested; above,
    it keeps its verdict; with no baseline anywhere (a sweep job naming none), it is not tested either."""
    study = tmp_path / "study"
    sweep_report(study, [-5.0, -5.0] + [-0.1] * 8, [0.001, 0.001] + [0.6] * 8)  # 8 of 10 heads removable: holds
    head = job(study, "sweep/seed0/L0H0")  # a head's job inside the sweep's folder (not a job of the stage)
    cache = tmp_path / "baselines" / "abc"
    cache.mkdir(parents=True)
    if baseline_mean is not None:
        rng = np.random.default_rng(3)
        base = np.clip(baseline_mean + rng.choice([-0.4, 0.0, 0.4], 40) * 0.25, 0, 1)
        records(cache, base)
        frame = pd.read_parquet(cache / "records.parquet").drop(columns="split")  # the cache holds one split
        frame.to_parquet(cache / "records.parquet")
        (head / "results.json").write_text(json.dumps(
            {"complete": True, "baseline_records": {"validation": str(cache / "records.parquet")}}))
    files = files_of(study, answers=lambda: GOLDS)
    finding = next(f for f in study_findings(files) if f.claim.key == "michel_single_heads")
    if expected == "verdict":
        assert finding.verdict == HOLDS and baseline_limits(files)["seed0"].file == str(cache / "records.parquet")
    elif expected == "floor":
        assert finding.verdict == NOT_TESTED and "seed0's baseline is at its floor" in finding.counted()
        assert str(cache / "records.parquet") in finding.counted()
    else:
        assert finding.verdict == NOT_TESTED and "no baseline of seed0" in finding.counted()


@pytest.mark.parametrize("baseline", ["floor", "ceiling", "none"])
def test_the_fine_tuning_claim_needs_a_model_that_learned(tmp_path, baseline):
    """What fine-tuning changed in the head types says nothing when the fine-tuned model learned nothing: at its
    floor the claim is not tested; at its ceiling (it learned) and without a baseline (nothing says it did not) the
    claim keeps its verdict."""
    path = job(tmp_path, "compare/seed0")  # 16 of 18 later heads changed against 2 of 18 earlier: holds
    changed = {"earlier": 2, "later": 16}
    rows = [{"layer": layer, "head": head, "changed/fine-tuned": head * 3 + layer % 3 < changed[half]}
            for layer in (0, 1, 2, 4, 5, 6) for head in range(6)
            for half in ["earlier" if layer < 3 else "later"]]
    pd.DataFrame(rows).to_csv(path / "heads.csv", index=False)
    if baseline != "none":
        base = np.resize([0.1, 0.5, 0.9, 0.5], 40) if baseline == "floor" else np.ones(40)  # f1 50 = chance
        table2(tmp_path, base, base, baseline=base)
    files = files_of(tmp_path, answers=lambda: GOLDS)
    finding = next(f for f in study_findings(files) if f.claim.key == "guan_finetuning_later_layers")
    if baseline == "floor":
        assert finding.verdict == NOT_TESTED and "seed0's baseline is at its floor" in finding.counted()
        assert "it learned nothing" in finding.counted()
    else:
        assert finding.verdict == HOLDS, finding.counted()


def test_a_baseline_at_its_maximum_leaves_every_ablation_claim_not_tested(tmp_path):
    """Every question answered exactly: the CI is [100, 100], which reaches the maximum. The ablation claims are not
    tested (they held before), the Ceiling caveat says why; a claim of the attention keeps its verdict."""
    rng = np.random.default_rng(1)
    diagonal = rng.uniform(0.2, 0.4, 80)
    table2(tmp_path, np.clip(diagonal + 0.6, 0, 1), diagonal)  # the baseline: F1 1 on every question
    stable_clusters(tmp_path)
    files = files_of(tmp_path, answers=lambda: {f"q{i}": [f"answer {i}"] for i in range(80)})  # chance: 66.67
    found = {f.claim.key: f for f in study_findings(files)}
    tested = found["guan_table2_diagonal_vs_vertical_prune"]
    assert tested.verdict == NOT_TESTED and "seed0's baseline is at its ceiling" in tested.counted()
    assert "f1 100.00 [100.00, 100.00]" in tested.counted() and "reaches the maximum 100" in tested.counted()
    assert found["guan_stability"].verdict == HOLDS
    (caveat,) = ceiling(files)
    assert caveat.startswith("**Ceiling.** seed0's unablated f1 100.00 [100.00, 100.00]")
    assert "every ablation claim of seed0 is not tested" in caveat


def test_one_model_at_its_floor_loses_its_verdict_only(tmp_path):
    """Two seeds: seed1 learned nothing (its baseline at chance), seed0 did: the claim counts seed0's verdict and
    says why seed1 has none, beside its numbers."""
    rng = np.random.default_rng(2)
    for model, base in (("seed0", np.clip(0.88 + rng.normal(0, 0.05, 40), 0, 1)),
                        ("seed1", rng.choice([0.0, 0.5, 1.0], 40))):
        table2(tmp_path, np.clip(base + 0.1, 0, 1), base * 0.2, model=model, baseline=base)
    files = files_of(tmp_path, models=("seed0", "seed1"), answers=lambda: GOLDS)
    finding = next(f for f in study_findings(files) if f.claim.key == "guan_table2_diagonal_vs_vertical_prune")
    assert finding.counted() == "mixed: holds in 1 of 2 seeds, not tested in 1"
    lines = finding_lines(finding)
    assert ": holds (control: prune of the 7 heads of type diagonal" in lines[1]
    assert "seed1's baseline is at its floor" in lines[2]


@pytest.mark.parametrize("seed", range(3))
def test_chance_of_each_metric_is_the_best_constant_answer(seed):
    """Accuracy, GLUE's F1 and Matthews of every constant prediction (scikit-learn), the best of them; SQuAD's
    exact match and F1 by the official scorer over the candidates; a loss has none."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(3, 50, p=[0.5, 0.3, 0.2]) if seed else rng.integers(0, 2, 50)
    records_ = {"label": labels, "prediction": labels}
    constant = [np.full(50, c) for c in range(3)]
    assert chance_level("accuracy", records_)[0] == max(np.mean(labels == c) for c in constant)
    binary = (labels == 1).astype(int)
    expected = max(f1_score(binary, np.full(50, c), zero_division=0.0) for c in (0, 1))
    assert chance_level("f1", {"label": binary})[0] == pytest.approx(expected)
    assert chance_level("matthews", records_)[0] == max(matthews_corrcoef(labels, c) for c in constant) == 0
    assert chance_level("loss", records_) is None
    golds = [list(answers) for answers in itertools.islice(GOLDS.values(), 8 + 4 * seed, 40)]
    squad = {"exact_match": np.zeros(len(golds)), "f1": np.zeros(len(golds))}
    for metric in ("exact_match", "f1"):
        assert chance_level(metric, squad, golds)[0] == pytest.approx(brute_force_chance(golds, metric))
    unanswerable = [[], [""], ["Paris"], ["the Paris"]]  # v2: the empty answer is right on the first two
    assert chance_level("f1", squad, unanswerable, "v2")[0] == pytest.approx(50.0)


def test_a_smoke_runs_claims_read_not_tested_quick_run(tmp_path):
    """study=quick (study.smoke=true): every claim, tested or not, reads not tested (quick run); the numbers stay."""
    rng = np.random.default_rng(1)
    diagonal = rng.uniform(0.2, 0.4, 80)
    table2(tmp_path, np.clip(diagonal + 0.6, 0, 1), diagonal, baseline=np.full(80, 0.8))
    stable_clusters(tmp_path)
    found = study_findings(files_of(tmp_path, smoke=True))
    assert {f.verdict for f in found} == {NOT_TESTED}
    assert all(f.counted().startswith("not tested (quick run") for f in found)
    tested = next(f for f in found if f.claim.key == "guan_table2_diagonal_vs_vertical_prune")
    assert tested.counted() == "not tested (quick run)"
    assert "prune_vertical - prune_diagonal" in tested.evidence[0].numbers
    assert next(f for f in found if f.claim.key == "clark_relations").counted() == (
        "not tested (quick run; the syntax stage did not score the pre-trained model)")


def classification_records(path: Path, label: np.ndarray, prediction: np.ndarray, cluster: np.ndarray) -> None:
    pd.DataFrame({"split": "validation", "example": np.arange(len(label)), "id": [f"e{i}" for i in range(len(label))],
                  "label": label, "prediction": prediction, "loss": 0.5, "cluster": cluster}).to_parquet(
        path / "records.parquet")


def test_a_cost_is_a_share_of_the_headroom_with_its_paired_bootstrap(tmp_path):
    """Row 5 on accuracy (chance: the majority class, 0.55): (plan - baseline) / (baseline - chance), its BCa CI equal
    to scipy's paired bootstrap of that ratio (each example its own cluster: the same resamples), against the paper's
    bound -1.5 / 82.85; the same records with a question of two pairs per cluster give a wider interval."""
    rng = np.random.default_rng(4)
    label = (rng.random(200) < 0.55).astype(int)
    base = np.where(rng.random(200) < 0.85, label, 1 - label)
    plan = np.where(rng.random(200) < 0.97, base, 1 - base)
    for name, prediction in (("baseline", base), ("prune_vertical", plan)):
        classification_records(job(tmp_path, f"tables/table2/seed0/{name}"), label, prediction, np.arange(200))
    files = files_of(tmp_path, metric="accuracy", scale=1.0)
    (evidence,) = guan_finding(files, "guan_table2_vertical_prune_cheap").evidence
    chance = max(label.mean(), 1 - label.mean())

    def share(a, b, y, axis=-1):
        return ((a == y).mean(axis) - (b == y).mean(axis)) / ((b == y).mean(axis) - chance)

    reference = scipy.stats.bootstrap((plan, base, label), share, paired=True, vectorized=True, n_resamples=2000,
                                      batch=500, method="BCa", rng=np.random.default_rng(0)).confidence_interval
    assert evidence.values["value"] == pytest.approx(share(plan, base, label), abs=1e-12)
    assert (evidence.values["low"], evidence.values["high"]) == pytest.approx((reference.low, reference.high),
                                                                              abs=1e-9)
    assert evidence.values["boundary"] == pytest.approx(-1.5 / 82.85)
    assert evidence.values["paper"] == pytest.approx((81.42 - 82.85) / 82.85)
    expected = HOLDS if reference.low > -1.5 / 82.85 else INCONCLUSIVE if reference.high > -1.5 / 82.85 else FAILS
    assert evidence.verdict == expected
    for name, prediction in (("baseline", base), ("prune_vertical", plan)):
        classification_records(tmp_path / f"tables/table2/seed0/{name}", label, prediction, np.arange(200) // 2)
    (pairs,) = guan_finding(files_of(tmp_path, metric="accuracy", scale=1.0),
                            "guan_table2_vertical_prune_cheap").evidence
    assert pairs.values["units"] == 100 and pairs.values["value"] == evidence.values["value"]


def test_the_papers_own_tables_hold_their_claims():
    """Each Table 2 and 3 claim applied to the paper's own numbers: every ordering is in the paper's direction (its
    rows cited in the claim's source) and each cost lies within the paper's bound (1.43 of 82.85 EM under 1.5; 8.17
    under 10), on exact match and on F1."""
    from headlab.study.findings.guan_tables import PAPER, ROWS, orderings, paper_bound

    for column in (0, 1):
        for o in orderings():
            assert PAPER[o.kept][column] > PAPER[o.removed][column], o.claim.key
            assert f"rows {ROWS[o.removed]} vs {ROWS[o.kept]}: EM {PAPER[o.removed][0]:.2f} vs " \
                   f"{PAPER[o.kept][0]:.2f}" in o.claim.source
        for plan in ("prune_vertical", "uniform_dense"):
            bound, own = paper_bound(plan, "f1" if column else "accuracy")
            assert own == pytest.approx((PAPER[plan][column] - PAPER["baseline"][column]) / PAPER["baseline"][column])
            assert own > bound
    assert paper_bound("prune_vertical", "accuracy")[1] == pytest.approx(-0.01726, abs=1e-5)
    assert paper_bound("uniform_dense", "exact_match")[1] == pytest.approx(-0.09861, abs=1e-5)


@pytest.mark.parametrize(("low", "high", "p", "permutations", "expected", "why"), [
    (0.56, 5.54, 0.46, 2000, INCONCLUSIVE, "the CI excludes 0 while the permutation p = 0.46 is not below 0.05"),
    (-0.5, 5.54, 0.01, 2000, INCONCLUSIVE, ""),  # the CI alone leaves it open
    (0.56, 5.54, 0.001, 2000, HOLDS, ""),
    (-9.0, -2.0, 0.001, 2000, FAILS, ""),
    (0.0031, 5.54, 0.0488, 2000, INCONCLUSIVE, "within 3 Monte Carlo standard errors"),
    (0.0031, 5.54, 0.0488, 0, HOLDS, ""),  # an exact test has no Monte Carlo error
    (0.0031, 5.54, 0.0488, 100_000, INCONCLUSIVE, "within 3 Monte Carlo standard errors"),
    (0.0031, 5.54, 0.0488, 1_000_000, HOLDS, "")])
def test_a_verdict_needs_its_interval_and_p_value_to_agree_beyond_monte_carlo_noise(low, high, p, permutations,
                                                                                  expected, why):
    """The CI decides unless it and the permutation p disagree about 0, or p lies within 3 Monte Carlo standard
    errors (sqrt(p (1 - p) / B)) of alpha: the dense_vertical_uniform claim's p = 0.0488 at 2000 permutations (SE
    0.0048) or 100,000 (SE 0.0007) decides nothing; at 1,000,000 (SE 0.0002) or exact it does."""
    found, note = checked_verdict(low, high, 0.0, p, 0.05, permutations)
    assert found == expected and why in note and (note == "") == (not why)
    if "Monte Carlo" in why:
        assert f"({math.sqrt(p * (1 - p) / permutations):.2g}, {permutations} permutations)" in note


def test_a_holm_adjusted_p_scales_its_monte_carlo_error():
    """A raw p of 0.02 Holm-adjusted to 0.04 (x 2): its error doubles, so 0.04 at 2000 permutations (SE 2 x 0.0031)
    is within 3 errors of 0.05."""
    assert checked_verdict(0.1, 1.0, 0.0, 0.04, 0.05, 2000, raw_p=0.02)[0] == INCONCLUSIVE
    assert checked_verdict(0.1, 1.0, 0.0, 0.02, 0.05, 2000, raw_p=0.01)[0] == HOLDS


@pytest.mark.parametrize(("prediction", "marked"), [("constant", True), ("varied", False)])
def test_a_collapsed_plan_is_marked_in_the_claims_that_rest_on_it(tmp_path, prediction, marked):
    """prune_dense predicting one class for every example (the default study's 0.5000): the dense-vs-diagonal claim
    says the plan is collapsed, and study.json lists it; a plan whose predictions vary is not marked."""
    rng = np.random.default_rng(1)
    label = rng.integers(0, 2, 120)
    diagonal = np.where(rng.random(120) < 0.6, label, 1 - label)
    dense = np.ones(120, int) if prediction == "constant" else np.where(rng.random(120) < 0.5, label, 1 - label)
    for name, values in (("prune_diagonal", diagonal), ("prune_dense", dense)):
        classification_records(job(tmp_path, f"tables/table2/seed0/{name}"), label, values, np.arange(120))
    (evidence,) = guan_finding(files_of(tmp_path, metric="accuracy", scale=1.0),
                               "guan_table2_diagonal_vs_dense_prune").evidence
    assert ("prune_dense is collapsed: it predicts 1 for every one of its 120 examples" in evidence.note) == marked
    assert evidence.values["collapsed"] == (["prune_dense"] if marked else [])


def test_an_inconclusive_ordering_says_what_would_decide_it(tmp_path):
    """A difference of +4 points with a CI of half-width about 8: the note gives the half-width and the examples at
    which an interval of that shape around +4 would clear 0 (n x (half / 4)^2), and study.json holds both."""
    rng = np.random.default_rng(2)
    diagonal = rng.uniform(0.2, 0.8, 60)
    vertical = np.clip(diagonal + rng.normal(0.04, 0.3, 60), 0, 1)
    table2(tmp_path, vertical, diagonal)
    (evidence,) = guan_finding(files_of(tmp_path)).evidence
    assert evidence.verdict == INCONCLUSIVE
    half = (evidence.values["high"] - evidence.values["low"]) / 2
    needed = math.ceil(60 * (half / abs(evidence.values["value"])) ** 2)
    assert evidence.values["half_width"] == pytest.approx(half) and evidence.values["needed"] == needed
    assert f"half-width {half:.2f}; an effect of this size would be decided at about {needed:,} examples (this run: " \
           "60)" in evidence.note


@pytest.mark.parametrize(("examples", "expected"), [(40, INCONCLUSIVE), (4000, HOLDS)])
def test_a_cost_of_a_plan_that_changed_nothing_holds_only_with_enough_examples(tmp_path, examples, expected):
    """prune_vertical predicting exactly what the baseline predicts: a zero-width bootstrap interval, which proves
    nothing at 40 examples (the Clopper-Pearson bound of 40 unchanged units at 95%, its table's only bounded cost,
    1 - 0.025^(1/40) = 8.8% of accuracy, is far past the paper's bound as a share of the headroom), and holds at
    4000 (0.09%)."""
    rng = np.random.default_rng(5)
    label = (rng.random(examples) < 0.5).astype(int)
    base = np.where(rng.random(examples) < 0.85, label, 1 - label)
    for name in ("baseline", "prune_vertical"):
        classification_records(job(tmp_path, f"tables/table2/seed0/{name}"), label, base, np.arange(examples))
    (evidence,) = guan_finding(files_of(tmp_path, metric="accuracy", scale=1.0),
                               "guan_table2_vertical_prune_cheap").evidence
    headroom = (base == label).mean() - max(label.mean(), 1 - label.mean())
    bound = (1 - 0.025 ** (1 / examples)) / headroom
    assert evidence.values["high"] == 0.0 and evidence.values["low"] == pytest.approx(-bound)
    assert evidence.verdict == expected
