"""When a verdict is withheld or doubted, on constructed stage files: a baseline at chance (its floor) or at its
maximum (its ceiling) leaves every ablation claim not tested, with the reason and a caveat; a smoke run's claims read
not tested (quick run); a finding against the unablated model prints its table row's interval and p-value; an
interval and a permutation p-value that disagree about 0 make the verdict inconclusive. Chance and the intervals are
recomputed here from their definitions (the official SQuAD scorer, scikit-learn, scipy's bootstrap)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from sklearn.metrics import f1_score, matthews_corrcoef
from test_findings import RESAMPLING, files_of, job, records, sweep_report, table2

from headlab.reporting.report import report_folder, write_report
from headlab.study.findings import finding_lines, study_findings
from headlab.study.findings.caveats import ceiling, floor
from headlab.study.findings.chance import chance_level
from headlab.study.findings.guan import plan_claims, plan_finding
from headlab.study.findings.limits import baseline_limits
from headlab.study.findings.verdicts import HOLDS, INCONCLUSIVE, NOT_TESTED, checked_verdict
from headlab.tasks.metrics import squad_scores

GOLDS = {f"q{i}": ["Paris", "paris "] if i < 10 else [f"Name{i} Smith"] for i in range(40)}


def claim(files, key: str):
    return next(spec for spec in plan_claims(files) if spec[0].key == key)


def stable_clusters(folder: Path) -> None:
    """The cluster stage of seed0: all 144 heads stable (a claim of the attention, not of the score: it holds)."""
    job(folder, "cluster/seed0", {"stability": 1.0, "counts": {"a": 134, "b": 10},
                                  "config": {"cluster": {"stability_fits": 10}}})


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
    assert lines[1].endswith(": holds") and "seed1's baseline is at its floor" in lines[2]


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


def eval_job(folder: Path, name: str, f1: np.ndarray, base: np.ndarray, baseline_records: Path | None) -> Path:
    """An ``ablate.py mode=eval`` job as the tables stage writes it (results.json and records.parquet)."""
    plan = name.rsplit("/", 1)[1]
    policies = {} if plan == "baseline" else {f"L0H{len(plan) % 4}": plan.split("_")[0]}
    path = job(folder, name)
    records(path, f1)
    metrics = {"f1": 100 * f1.mean(), "exact_match": 100 * (f1 == 1).mean()}
    before = {"f1": 100 * base.mean(), "exact_match": 100 * (base == 1).mean()}
    (path / "results.json").write_text(json.dumps({
        "kind": "eval", "complete": True, "mode": "eval", "group": "study", "model": "m", "task": "demo_qa",
        "checkpoint": {"weights_hash": "w"}, "seed": 0, "plan_name": plan,
        "plan": {"rules": [{"heads": "L0", "policy": "prune"}] if policies else [], "policies": policies},
        "policy": "prune" if policies else "keep", "unit": "sentence", "renormalize": False,
        "metrics": {"validation": metrics}, "baseline": {"validation": before},
        "delta": {"validation": {k: metrics[k] - before[k] for k in metrics}}, "num_examples": {"validation": len(f1)},
        "records": "records.parquet", "baseline_records": {"validation": str(baseline_records or path /
                                                                             "records.parquet")},
        "config": {"mode": "eval", "task": {"main_metric": "f1"}, "data": {"max_eval_examples": 24}}}))
    return path


def test_a_finding_against_the_baseline_prints_its_table_rows_interval_and_p(tmp_path):
    """Table 2 of 24 questions, each plan changing one to three of them (token F1s off any grid, as the quick study's):
    the finding "prune_vertical - baseline" prints the interval of its row of the plan grid and the row's p-value
    (they printed +0.00 and +0.56 as their lows for the same comparison)."""
    rng = np.random.default_rng(0)
    base = np.where(rng.random(24) < 0.5, 0.0, rng.choice([1 / 7, 2 / 9, 0.4, 2 / 3, 1.0], 24))
    base_path = eval_job(tmp_path, "tables/table2/seed0/baseline", base, base, None) / "records.parquet"
    for plan in ("prune_vertical", "prune_diagonal", "prune_dense", "uniform_dense", "uniform_vertical"):
        f1 = base.copy()
        changed = rng.choice(24, rng.integers(1, 4), replace=False)
        f1[changed] = rng.choice([0.0, 1 / 7, 2 / 9, 2 / 3, 1.0], len(changed))
        eval_job(tmp_path, f"tables/table2/seed0/{plan}", f1, base, base_path)
    report = write_report(tmp_path / "tables/table2/seed0", RESAMPLING, "holm").folder
    assert report == report_folder(tmp_path / "tables/table2/seed0", RESAMPLING, "holm")
    files = files_of(tmp_path)
    for key, plan in (("guan_table2_vertical_prune_cheap", "prune_vertical"),
                      ("guan_table2_dense_uniform_cheap", "uniform_dense")):
        (evidence,) = plan_finding(files, *claim(files, key)).evidence
        row = pd.read_parquet(report / "table.parquet").query("plan == @plan and metric == 'f1'").iloc[0]
        assert [evidence.values[k] for k in ("value", "low", "high", "p_value")] == [
            row["delta"], row["ci_low"], row["ci_high"], row["p_value"]]
        cell = re.search(rf"\| {plan} .*?\((\S+ \[[^]]+\])\)", (report / "plans_validation.md").read_text()).group(1)
        assert f"{plan} - baseline: {cell} (95% CI; p {row['p_value']:.3g}, adjusted {row['p_adjusted']:.3g};" \
               in evidence.numbers
        assert evidence.file == str((report / "table.csv").relative_to(tmp_path))


@pytest.mark.parametrize(("low", "high", "p", "expected", "why"), [
    (0.56, 5.54, 0.46, INCONCLUSIVE, "the 95% CI excludes 0 while the permutation p = 0.46 is not below 0.05"),
    (-0.5, 5.54, 0.01, INCONCLUSIVE, "the 95% CI contains 0 while the permutation p = 0.01 is below 0.05"),
    (0.56, 5.54, 0.01, HOLDS, ""),
    (-0.5, 5.54, 0.46, HOLDS, ""),  # no difference either way: above -1.5 all the same
    (-9.0, -2.0, 0.3, INCONCLUSIVE, "excludes 0 while the permutation p = 0.3 is not below 0.05")])
def test_an_interval_and_a_p_value_that_disagree_about_0_are_inconclusive(tmp_path, low, high, p, expected, why):
    """"Pruning the vertical heads costs less than 1.5 points" from its row of Table 2 (written here): the CI alone
    would decide, but where it and the permutation p disagree about a difference from 0 the verdict is inconclusive,
    with the reason (the quick study's +1.67 [+0.56, +5.54] at p = 0.46 held)."""
    for plan in ("baseline", "prune_vertical"):
        records(job(tmp_path, f"tables/table2/seed0/{plan}"), np.full(24, 0.5))  # equal: recomputed, they'd hold
    report = report_folder(tmp_path / "tables/table2/seed0", RESAMPLING, "holm")
    report.mkdir(parents=True)
    pd.DataFrame({"plan": ["baseline", "prune_vertical"], "split": "validation", "metric": "f1", "heads": [0, 4],
                  "delta": [0.0, 1.67], "ci_low": [np.nan, low], "ci_high": [np.nan, high], "p_value": [np.nan, p],
                  "p_adjusted": [np.nan, p], "n": 24, "note": ""}).to_csv(report / "table.csv", index=False)
    files = files_of(tmp_path)
    finding = plan_finding(files, *claim(files, "guan_table2_vertical_prune_cheap"))
    (evidence,) = finding.evidence
    assert finding.verdict == expected and why in evidence.note and (evidence.note == "") == (not why)
    assert checked_verdict(low, high, -1.5, p, 0.95) == (expected, evidence.note)
    assert why in "\n".join(finding_lines(finding))
