"""The study's findings and caveats on constructed stage files: a test per verdict (holds, does not hold,
inconclusive, not tested), every number against a reference computed here (brute force, scipy, the textbook
formulas), several seeds counted, and each caveat raised exactly when its condition holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from headlab.reporting.report import report_folder
from headlab.reporting.statistics import Resampling
from headlab.study.findings import study_findings
from headlab.study.findings.caveats import ceiling, samples, seeds, type_names
from headlab.study.findings.guan import fine_tuning_finding, stability_finding
from headlab.study.findings.guan_tables import cost_findings, ordering_findings
from headlab.study.findings.heads import clark_findings, importance_pruning, pande_findings, redundant_heads
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import FAILS, HOLDS, INCONCLUSIVE, NOT_TESTED, verdict

RESAMPLING = Resampling(resamples=2000, permutations=2000)


def files_of(folder: Path, models=("seed0",), metric="f1", scale=100.0, **fields) -> StudyFiles:
    return StudyFiles(folder, list(models), metric, "validation", scale, RESAMPLING,
                      {"tables": (RESAMPLING, "holm"), "sweep": (RESAMPLING, "holm")}, **fields)


def job(folder: Path, name: str, result: dict | None = None) -> Path:
    """A finished job ``name`` (``stage/...``) listed in its stage's marker."""
    path = folder / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps({"complete": True, **(result or {})}))
    marker = folder / name.split("/")[0] / "stage.json"
    data = json.loads(marker.read_text()) if marker.is_file() else {"key": {"jobs": {}}}
    data["key"]["jobs"][name] = "hash"
    marker.write_text(json.dumps(data))
    return path


def records(path: Path, f1: np.ndarray) -> None:
    n = len(f1)
    pd.DataFrame({"split": "validation", "example": np.arange(n), "id": [f"q{i}" for i in range(n)],
                  "prediction": [f"answer {i}" for i in range(n)], "exact_match": (f1 == 1).astype(float), "f1": f1,
                  "has_answer": True, "loss": 1 - f1}).to_parquet(path / "records.parquet")


def table2(folder: Path, vertical: np.ndarray, diagonal: np.ndarray, model: str = "seed0",
           baseline: np.ndarray | None = None, controlled: bool = True) -> None:
    """Table 2's baseline, prune_vertical and prune_diagonal; ``controlled``: with 20 random sets of the diagonal
    type's size that cost nothing (the control a Table 2 ordering needs, passed)."""
    for plan, f1 in (("baseline", np.ones_like(vertical) if baseline is None else baseline),
                     ("prune_vertical", vertical), ("prune_diagonal", diagonal)):
        records(job(folder, f"tables/table2/{model}/{plan}", {"metrics": {"validation": {"f1": 100 * f1.mean()}}}),
                f1)
    if controlled:
        random_sets(folder, model, "prune", 7, [np.ones_like(diagonal)] * 20)


def random_sets(folder: Path, model: str, policy: str, size: int, sets: list[np.ndarray],
                counts: dict | None = None) -> None:
    """A controls job: ``sets`` (each set's per-example F1) of ``size`` heads under ``policy``; the model's clusters
    give the diagonal type ``size`` heads (``counts``: all of them)."""
    clusters = folder / "cluster" / model / "clusters.json"
    if not clusters.is_file():
        job(folder, f"cluster/{model}", {"stability": 0.97, "stability_repeats": [0.97] * 20,
                                         "config": {"cluster": {"stability_fits": 10, "stability_split": "heads"}}})
        clusters.write_text(json.dumps({"names": ["diagonal", "vertical"],
                                        "counts": counts or {"diagonal": size, "vertical": 3}}))
    names = [f"random{size}_{d:02d}" for d in range(len(sets))]
    path = job(folder, f"controls/{policy}/{model}", {"sets": {str(size): [{"plan": n} for n in names]}})
    for name, f1 in zip(names, sets):
        (path / name).mkdir(exist_ok=True)
        records(path / name, f1)


def guan_finding(files: StudyFiles, key: str = "guan_table2_diagonal_vs_vertical_prune"):
    """The finding of one of Guan et al.'s Table 2 and 3 claims."""
    return next(f for f in (*ordering_findings(files), *cost_findings(files)) if f.claim.key == key)


@pytest.mark.parametrize(("low", "high", "boundary", "above", "expected"), [
    (0.1, 0.5, 0.0, True, HOLDS), (-0.5, -0.1, 0.0, True, FAILS), (-0.1, 0.5, 0.0, True, INCONCLUSIVE),
    (0.0, 0.5, 0.0, True, INCONCLUSIVE), (0.0, 0.0, 0.0, True, INCONCLUSIVE), (-0.5, -0.1, 0.0, False, HOLDS),
    (9.0, 11.0, 10.0, False, INCONCLUSIVE), (float("nan"), 1.0, 0.0, True, INCONCLUSIVE),
    (1.0, float("inf"), 0.5, True, HOLDS), (0.0, float("inf"), 1.0, True, INCONCLUSIVE)])
def test_the_verdict_rule(low, high, boundary, above, expected):
    assert verdict(low, high, boundary, above) == expected


@pytest.mark.parametrize(("shift", "expected"), [(0.6, HOLDS), (-0.6, FAILS), (0.0, INCONCLUSIVE)])
def test_a_table2_claim_is_the_paired_difference_of_two_plans(tmp_path, shift, expected):
    """prune_vertical - prune_diagonal on the same examples: the delta and its BCa CI equal scipy's paired bootstrap
    of mean(a) - mean(b) with the same seed and batch; the verdict follows the CI."""
    rng = np.random.default_rng(1)
    diagonal = rng.uniform(0.2, 0.4, 80)
    vertical = np.clip(diagonal + shift + rng.normal(0, 0.05, 80), 0, 1) if shift else diagonal[rng.permutation(80)]
    table2(tmp_path, vertical, diagonal)
    files = files_of(tmp_path)
    finding = guan_finding(files)
    (evidence,) = finding.evidence
    reference = scipy.stats.bootstrap((vertical, diagonal), lambda a, b, axis: a.mean(axis) - b.mean(axis),
                                      paired=True, vectorized=True, n_resamples=2000, batch=500, method="BCa",
                                      random_state=np.random.default_rng(0))
    assert evidence.values["value"] == pytest.approx(100 * (vertical.mean() - diagonal.mean()), abs=1e-9)
    assert evidence.values["low"] == pytest.approx(100 * reference.confidence_interval.low, abs=1e-9)
    assert evidence.values["high"] == pytest.approx(100 * reference.confidence_interval.high, abs=1e-9)
    assert evidence.verdict == finding.verdict == expected
    assert "tables/table2/seed0/{prune_vertical,prune_diagonal}/records.parquet" in evidence.file


@pytest.mark.parametrize("draws", [20, 18])
def test_a_type_must_cost_more_than_random_sets_of_its_size(tmp_path, draws):
    """An ordering that holds stays inconclusive unless the removed type costs more than as many random heads: its
    percentile and rank p against a count by hand; on the controls' examples only (the tables' first 40 of 80)."""
    rng = np.random.default_rng(5)
    diagonal = rng.uniform(0.2, 0.4, 80)
    table2(tmp_path, np.clip(diagonal + 0.5, 0, 1), diagonal, controlled=False)
    finding = guan_finding(files_of(tmp_path))
    assert finding.verdict == INCONCLUSIVE and "controls stage did not run" in finding.evidence[0].note
    # the random sets: every one costs less than the type (a higher F1), on the first 40 examples
    cheap = [np.clip(diagonal[:40] + rng.uniform(0.05, 0.3), 0, 1) for _ in range(draws)]
    random_sets(tmp_path, "seed0", "prune", 7, cheap)
    (evidence,) = guan_finding(files_of(tmp_path)).evidence
    control = evidence.values["control"]
    assert control["value"] == pytest.approx(100 * diagonal[:40].mean()) and control["examples"] == 40
    assert control["percentile"] == 100.0 and control["p_value"] == pytest.approx(1 / (draws + 1))
    assert evidence.verdict == (HOLDS if draws >= 19 else INCONCLUSIVE)  # 1/19 > 0.05: 18 sets cannot decide
    # half of them cost more than the type: the 50th percentile, p = (1 + 10) / 21, not shown to matter
    mixed = [np.clip(diagonal[:40] + (0.1 if d % 2 else -0.1), 0, 1) for d in range(20)]
    random_sets(tmp_path, "seed0", "prune", 7, mixed)
    (evidence,) = guan_finding(files_of(tmp_path)).evidence
    assert evidence.values["control"]["percentile"] == 50.0
    assert evidence.values["control"]["p_value"] == pytest.approx(11 / 21)
    assert evidence.verdict == INCONCLUSIVE and "not shown to matter" in evidence.note
    assert "at the 50th percentile of the costs of 20 random sets of 7 heads (" in evidence.note


def test_a_type_that_beats_its_random_sets_on_one_example_only_is_not_shown_to_matter(tmp_path):
    """Every random set scores above the type (rank p 1/21) but only on one of the 40 examples: the excess,
    (type - the sets' mean) / baseline, equals the means' by hand and its paired bootstrap CI reaches 0."""
    rng = np.random.default_rng(6)
    diagonal = rng.uniform(0.2, 0.4, 80)
    table2(tmp_path, np.clip(diagonal + 0.5, 0, 1), diagonal, controlled=False)
    sets = []
    for d in range(20):
        one = diagonal[:40].copy()
        one[0] += 0.1 + 0.01 * d
        sets.append(one)
    random_sets(tmp_path, "seed0", "prune", 7, sets)
    (evidence,) = guan_finding(files_of(tmp_path)).evidence
    control = evidence.values["control"]
    assert control["p_value"] == pytest.approx(1 / 21)
    expected = (diagonal[:40].mean() - np.mean([one.mean() for one in sets])) / 1.0  # the baseline scores 1
    assert control["excess"]["value"] == pytest.approx(expected, abs=1e-12)
    assert control["excess"]["high"] == pytest.approx(0.0, abs=1e-12) and control["excess"]["low"] < 0
    assert evidence.verdict == INCONCLUSIVE and "reaches 0: it may not carry over to other examples" in evidence.note


def test_a_plan_the_clusters_lack_is_not_tested_and_a_missing_stage_says_so(tmp_path):
    files = files_of(tmp_path)
    assert guan_finding(files).verdict == NOT_TESTED
    assert "no table2 jobs" in guan_finding(files).counted()
    job(tmp_path, "tables/table2/seed0/prune_cluster0")
    assert "not Guan et al.'s four types" in guan_finding(files_of(tmp_path)).counted()
    everything = study_findings(files_of(tmp_path / "empty"))
    assert len(everything) >= 15 and {f.verdict for f in everything} == {NOT_TESTED}


def test_a_job_left_out_of_its_stages_last_run_is_not_read(tmp_path):
    """seed1's tables are in the folder but not in the stage's marker (an earlier run): only seed0 counts."""
    rng = np.random.default_rng(2)
    diagonal = rng.uniform(0.0, 0.3, 60)
    table2(tmp_path, diagonal + 0.5, diagonal)
    marker = json.loads((tmp_path / "tables/stage.json").read_text())
    table2(tmp_path, diagonal - 0.5 * diagonal, diagonal, model="seed1")
    (tmp_path / "tables/stage.json").write_text(json.dumps(marker))
    files = files_of(tmp_path, models=("seed0", "seed1"))
    finding = guan_finding(files)
    assert [e.model for e in finding.evidence] == ["seed0"] and finding.verdict == HOLDS


def test_several_seeds_are_pooled_and_counted(tmp_path):
    rng = np.random.default_rng(3)
    diagonal = rng.uniform(0.2, 0.4, 60)
    table2(tmp_path, diagonal + 0.5, diagonal, "seed0")
    table2(tmp_path, diagonal + 0.4, diagonal, "seed1")
    table2(tmp_path, diagonal - 0.2, diagonal, "seed2")
    files = files_of(tmp_path, models=("seed0", "seed1", "seed2"))
    finding = guan_finding(files)
    assert [e.verdict for e in finding.evidence] == [HOLDS, HOLDS, FAILS, INCONCLUSIVE]  # the seeds, then pooled
    assert finding.verdict == INCONCLUSIVE  # the seeds pooled decide, not their votes
    assert finding.counted() == "inconclusive (pooled over 3 seeds; each: holds in 2, does not hold in 1)"
    assert finding.pooled.values["seeds"] == pytest.approx([50.0, 40.0, -20.0])
    table2(tmp_path, diagonal - 0.3, diagonal, "seed0")
    table2(tmp_path, diagonal - 0.3, diagonal, "seed1")
    assert guan_finding(files).counted() == "does not hold (pooled over 3 seeds; each: does not hold in 3)"


def wilson(count: int, n: int, z: float = scipy.stats.norm.ppf(0.975)) -> tuple[float, float]:
    p = count / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n +
                                                                                         z * z / (4 * n * n))
    return centre - half, centre + half


def stability_job(folder: Path, stability: float, repeats: list[float], named: bool = True,
                  model: str = "pretrained") -> None:
    path = job(folder, f"cluster/{model}", {"stability": stability, "stability_repeats": repeats,
                                            "counts": {"a": 134, "b": 10},
                                            "config": {"cluster": {"stability_fits": 10, "stability_split": "heads"}}})
    (path / "clusters.json").write_text(json.dumps({"named": named}))


@pytest.mark.parametrize(("stability", "spread", "expected"), [(0.97, 0.01, HOLDS), (0.90, 0.01, FAILS),
                                                               (0.95, 0.03, INCONCLUSIVE)])
def test_stability_is_the_range_of_the_procedure_repeated_against_table_1(tmp_path, stability, spread, expected):
    """21 runs of Guan et al.'s procedure (the stage's and 20 repeats): the interval is their central 95% (numpy's
    quantiles, recomputed here), the boundary 0.94, the low end of Table 1."""
    repeats = list(stability + spread * np.linspace(-1, 1, 20))
    stability_job(tmp_path, stability, repeats)
    (evidence,) = stability_finding(files_of(tmp_path)).evidence
    low, high = np.quantile([stability, *repeats], [0.025, 0.975])
    assert (evidence.values["low"], evidence.values["high"]) == pytest.approx((low, high), abs=1e-12)
    assert evidence.verdict == expected and evidence.values["runs"] == 21


def test_table_1_holds_under_the_stability_rule_and_single_runs_get_none(tmp_path):
    """Guan et al.'s own Table 1 (95.98, 96.26, 95.98, 94.37%), each read as a run without spread, holds; one run of
    the procedure gets no verdict, with the reason; numbered clusters keep theirs (unstable clusters are how the
    claim fails), with a note."""
    from headlab.study.findings.guan import STABLE

    assert all(verdict(value, value, STABLE) == HOLDS for value in (0.9598, 0.9626, 0.9598, 0.9437))
    stability_job(tmp_path, 0.5, [0.5] * 20, named=False)
    stability_job(tmp_path, 0.99, [], model="seed0")
    found = stability_finding(files_of(tmp_path))
    unnamed, single = found.evidence
    assert unnamed.verdict == FAILS and single.verdict == NOT_TESTED
    assert "did not separate into Guan et al.'s types" in unnamed.note and "cluster.stability_repeats" in single.note


def newcombe(a: int, n: int, b: int, m: int) -> tuple[float, float]:
    """Newcombe's hybrid score interval for p1 - p2 (his method 10), from Wilson's intervals."""
    (l1, u1), (l2, u2), d = wilson(a, n), wilson(b, m), a / n - b / m
    return d - math.sqrt((a / n - l1) ** 2 + (u2 - b / m) ** 2), d + math.sqrt((u1 - a / n) ** 2 + (b / m - l2) ** 2)


@pytest.mark.parametrize(("later", "earlier", "expected"), [(16, 2, HOLDS), (2, 16, FAILS), (8, 6, INCONCLUSIVE)])
def test_fine_tuning_compares_the_later_half_of_the_layers_with_the_earlier(tmp_path, later, earlier, expected):
    """7 layers x 6 heads: layers 4-6 against 0-2 (the middle layer 3 left out, its heads all changed)."""
    path = job(tmp_path, "compare/seed0")
    order = {"earlier": 0, "later": 0}
    rows = []
    for layer in range(7):
        for head in range(6):
            half = "earlier" if layer < 3 else "later" if layer > 3 else None
            changed = half is None or order[half] < {"earlier": earlier, "later": later}[half]
            order[half or "earlier"] += half is not None
            rows.append({"layer": layer, "head": head, "changed/fine-tuned": changed})
    pd.DataFrame(rows).to_csv(path / "heads.csv", index=False)
    (evidence,) = fine_tuning_finding(files_of(tmp_path)).evidence
    low, high = newcombe(later, 18, earlier, 18)
    assert evidence.values["value"] == pytest.approx(later / 18 - earlier / 18)
    assert (evidence.values["low"], evidence.values["high"]) == pytest.approx((low, high), abs=1e-9)
    assert evidence.verdict == expected and "layers 4-6" in evidence.numbers


def test_a_change_of_type_between_numbered_clusters_is_not_tested(tmp_path):
    """cluster0 of the pre-trained model's fit is not cluster0 (or dense) of the fine-tuned one's: mode=compare
    leaves the change empty, and the claim is not tested, rather than every head 'changed'."""
    from headlab.analysis.types.compare_run import comparison_tables

    heads = [f"L{layer}H{head}" for layer in range(4) for head in range(3)]
    pre = {h: f"cluster{i % 4}" for i, h in enumerate(heads)}
    tuned = {h: ["dense", "diagonal", "vertical", "dense_vertical"][i % 4] for i, h in enumerate(heads)}
    runs = [{"name": "pre-trained", "labels": pre, "named": False, "counts_per_layer": {}, "shape": [4, 3]},
            {"name": "fine-tuned", "labels": tuned, "named": True, "counts_per_layer": {}, "shape": [4, 3]}]
    table = comparison_tables(runs)["heads"]
    assert table["changed/fine-tuned"].isna().all()
    runs[0] |= {"labels": {h: tuned[h] if i % 3 else "dense" for i, h in enumerate(heads)}, "named": True}
    changed = comparison_tables(runs)["heads"]["changed/fine-tuned"]
    assert changed.tolist() == [bool(i % 3) is False and tuned[h] != "dense" for i, h in enumerate(heads)]
    path = job(tmp_path, "compare/seed0")
    table.to_csv(path / "heads.csv", index=False)
    found = fine_tuning_finding(files_of(tmp_path))
    assert found.verdict == NOT_TESTED and "numbered clusters of two fits are not the same types" in found.reason


def syntax_csv(folder: Path, rows: list[tuple[str, float, float, float, float]]) -> None:
    path = job(folder, "syntax/pretrained")
    pd.DataFrame([{"relation": relation, "count": 100, "head": "L1H1", "direction": "dep->head", "accuracy": 0.5,
                   "baseline_offset": 1, "baseline_accuracy": 0.5 - d, "difference": d, "ci_low": lo, "ci_high": hi,
                   "p_value": p, "p_adjusted": p} for relation, d, lo, hi, p in rows]).to_csv(path / "syntax.csv",
                                                                                             index=False)


@pytest.mark.parametrize(("rows", "relations", "overall"), [
    ([("all", 0.02, 0.01, 0.03, 0.001), ("obj", 0.3, 0.2, 0.4, 0.001)], HOLDS, HOLDS),
    ([("all", 0.2, 0.15, 0.25, 0.001), ("obj", -0.3, -0.4, -0.2, 0.001)], FAILS, FAILS),
    ([("all", 0.1, 0.05, 0.15, 0.001), ("obj", 0.1, -0.05, 0.2, 0.3)], INCONCLUSIVE, INCONCLUSIVE)])
def test_clarks_claims(tmp_path, rows, relations, overall):
    syntax_csv(tmp_path, rows)
    found = clark_findings(files_of(tmp_path))
    assert [f.verdict for f in found] == [relations, overall]


def sweep_report(folder: Path, low: list[float], high: list[float], n: int = 200) -> Path:
    """The sweep's report: a head per row with its CI of the f1 delta (points)."""
    path = job(folder, "sweep/seed0")
    report = report_folder(path, RESAMPLING, "holm")
    report.mkdir()
    low, high = np.array(low), np.array(high)
    pd.DataFrame({"split": "validation", "metric": "f1", "delta": (low + high) / 2, "ci_low": low, "ci_high": high,
                  "p_adjusted": 0.5, "n": n}).to_csv(report / "table.csv", index=False)
    return report


@pytest.mark.parametrize(("removable", "costly", "expected"), [(6, 0, HOLDS), (5, 0, INCONCLUSIVE),
                                                               (2, 5, FAILS), (3, 4, INCONCLUSIVE)])
def test_michels_single_heads_are_an_equivalence_claim(tmp_path, removable, costly, expected):
    """10 heads at margin 1 point: removable when the CI lies above -1, costly when below; more than half removable
    holds, half or more costly fails, anything between is inconclusive."""
    lows = [-0.5] * removable + [-4.0] * costly + [-1.5] * (10 - removable - costly)
    highs = [0.5] * removable + [-2.0] * costly + [0.5] * (10 - removable - costly)
    sweep_report(tmp_path, lows, highs)
    (evidence,) = redundant_heads(files_of(tmp_path)).evidence
    assert (evidence.values["removable"], evidence.values["costly"]) == (removable, costly)
    assert evidence.verdict == expected


def test_tiny_losses_on_few_examples_are_inconclusive_and_on_many_hold(tmp_path):
    """Every head costs 0.2 points on average; with 100 examples each CI (a t interval, as the sweep's bootstrap
    would give) reaches below -1 point: Michel's claim is inconclusive, with the examples that would decide it;
    with 100 times as many it holds. A head costing 2 points with p > 0.05 (its CI across 0) is not removable."""
    rng = np.random.default_rng(0)

    def heads(n: int) -> tuple[list[float], list[float]]:
        lows, highs = [], []
        for _ in range(12):
            delta = 100 * (rng.random(n) < 0.012).astype(float) * -1 + 100 * (rng.random(n) < 0.01)
            half = 1.96 * delta.std(ddof=1) / np.sqrt(n)
            lows.append(delta.mean() - half)
            highs.append(delta.mean() + half)
        return lows, highs

    sweep_report(tmp_path / "few", *heads(100), n=100)
    (few,) = redundant_heads(files_of(tmp_path / "few")).evidence
    assert few.verdict == INCONCLUSIVE and few.values["removable"] <= 6
    assert "would be shown removable at about" in few.note and few.values["needed"] > 100
    sweep_report(tmp_path / "many", *heads(10_000), n=10_000)
    (many,) = redundant_heads(files_of(tmp_path / "many")).evidence
    assert many.verdict == HOLDS and many.values["removable"] == 12
    sweep_report(tmp_path / "costly", [-5.0] * 10, [1.0] * 10)  # -2 [-5, +1]: p > 0.05, not shown removable
    (costly,) = redundant_heads(files_of(tmp_path / "costly")).evidence
    assert costly.values["removable"] == 0 and costly.verdict == INCONCLUSIVE


@pytest.mark.parametrize(("examples", "expected"), [(80, INCONCLUSIVE), (2000, HOLDS)])
def test_a_head_that_changed_nothing_is_removable_only_with_enough_examples(tmp_path, examples, expected):
    """10 heads none of whose examples changed (zero-width intervals [0, 0], points of F1): no proof of no loss by
    itself; the loss still consistent with no change among n units at 95%, 100 (1 - 0.025^(1/n)), is 4.5 points at
    80 examples (above the margin of 1: undecided) and 0.18 at 2000 (removable)."""
    sweep_report(tmp_path, [0.0] * 10, [0.0] * 10, n=examples)
    (evidence,) = redundant_heads(files_of(tmp_path)).evidence
    bound = 100 * (1 - 0.025 ** (1 / examples))
    assert (bound > 1) == (expected == INCONCLUSIVE) and f"bounded by {bound:.3g}" in evidence.numbers
    assert evidence.verdict == expected


def prune_curve(folder: Path, importance: float, levels: list[float], split: str | None = None, n: int = 60,
                noise: float | None = 0.05) -> dict:
    """``prune_curve.csv`` (3 steps, each curve at its level) and, for the pruned split, ``records.parquet``: per
    example F1 around each level (sd ``noise``; None: 0 or 1, 1 with the level's probability), the baseline F1 1.
    Returns the records' F1 arrays by (order, seed, step)."""
    rows, f1s, rng = [], {}, np.random.default_rng(11)
    for name, seed, level in (("importance", None, importance), *(("random", s, v) for s, v in enumerate(levels))):
        rows += [{"order": name, "seed": seed, "step": s, "relative": 1.0 if s == 0 else level,
                  **({"split": split} if split else {})} for s in range(4)]
        f1s |= {(name, seed, s): (rng.random(n) < level).astype(float) if noise is None else
                np.clip(level + rng.normal(0, noise, n), 0, 1) for s in range(1, 4)}
    path = folder / "prune_curve/seed0"
    frame = pd.read_csv(path / "prune_curve.csv") if (path / "prune_curve.csv").is_file() else pd.DataFrame()
    pd.concat([frame, pd.DataFrame(rows)]).to_csv(path / "prune_curve.csv", index=False)
    if split in (None, "validation"):
        f1s[("baseline", None, 0)] = np.ones(n)
        parts = []
        for (order, seed, step), f1 in f1s.items():
            records(path, f1)
            parts.append(pd.read_parquet(path / "records.parquet").assign(order=order, seed=seed, step=step))
        pd.concat(parts).astype({"seed": "Int64"}).to_parquet(path / "records.parquet")
    return f1s


@pytest.mark.parametrize(("importance", "orders", "expected"), [
    (0.95, 19, HOLDS), (0.95, 2, INCONCLUSIVE), (0.95, 18, INCONCLUSIVE), (0.1, 19, FAILS), (0.5, 19, INCONCLUSIVE)])
def test_the_prune_curve_is_ranked_among_its_random_orders(tmp_path, importance, orders, expected):
    """The rank p-value (1 + #{random >= importance}) / (R + 1), an exact Monte Carlo test: above all of 19 orders
    is p = 1/20, which decides at 0.05; with 18 or 2 orders no rank can, and the note says how many are needed. Below
    all of 19 does not hold; in the middle of them is inconclusive."""
    job(tmp_path, "prune_curve/seed0")
    levels = list(np.linspace(0.3, 0.7, orders))
    prune_curve(tmp_path, importance, levels)
    (evidence,) = importance_pruning(files_of(tmp_path)).evidence
    above = (1 + sum(level >= importance for level in levels)) / (orders + 1)
    assert evidence.values["p_value"] == pytest.approx(above) and evidence.values["random_orders"] == orders
    assert evidence.verdict == expected
    if orders < 19:
        assert "orders are needed" in evidence.note


def test_the_prune_curves_area_difference_gets_a_paired_bootstrap_ci(tmp_path):
    """The area difference (importance's mean share of the baseline over the steps minus the random orders' mean) and
    its BCa CI equal scipy's paired bootstrap of the same statistic; above every random order on these examples but
    with a CI that reaches 0 (few, noisy examples), the finding is inconclusive, with the reason."""
    job(tmp_path, "prune_curve/seed0")
    levels = list(np.linspace(0.3, 0.7, 19))
    f1s = prune_curve(tmp_path, 0.95, levels)
    (evidence,) = importance_pruning(files_of(tmp_path)).evidence
    keys = [("baseline", None, 0), *(("importance", None, s) for s in range(1, 4)),
            *(("random", r, s) for r in range(19) for s in range(1, 4))]

    def difference(*columns, axis):
        means = np.stack([c.mean(axis) for c in columns], -1)  # [..., sets]
        shares = means[..., 1:] / means[..., :1]
        return shares[..., :3].mean(-1) - shares[..., 3:].reshape(*shares.shape[:-1], 19, 3).mean((-1, -2))

    reference = scipy.stats.bootstrap([f1s[k] for k in keys], difference, paired=True, vectorized=True,
                                      n_resamples=2000, batch=500, method="BCa", rng=np.random.default_rng(0))
    value = difference(*[f1s[k] for k in keys], axis=-1)
    assert evidence.values["value"] == pytest.approx(value, abs=1e-12)
    assert (evidence.values["low"], evidence.values["high"]) == pytest.approx(
        (reference.confidence_interval.low, reference.confidence_interval.high), abs=1e-9)
    assert evidence.verdict == HOLDS and evidence.values["low"] > 0
    # above every order again, on 6 noisy examples: the rank decides, the CI reaches 0
    (tmp_path / "prune_curve/seed0/prune_curve.csv").unlink()
    prune_curve(tmp_path, 0.45, list(np.linspace(0.3, 0.44, 19)), n=6, noise=None)
    (evidence,) = importance_pruning(files_of(tmp_path)).evidence
    assert evidence.values["p_value"] == pytest.approx(1 / 20) and evidence.values["low"] < 0
    assert evidence.verdict == INCONCLUSIVE and "the area difference's CI reaches 0" in evidence.note


def test_the_prune_curve_reads_the_split_it_pruned_by(tmp_path):
    """Two evaluated splits in prune_curve.csv: the finding reads the one the curve was pruned by (its settings),
    not their mean (importance 0.95 on validation above 20 random orders: holds; on heldout 0.1: would fail)."""
    job(tmp_path, "prune_curve/seed0", {"settings": {"split": "validation"}})
    prune_curve(tmp_path, 0.1, list(np.linspace(0.3, 0.7, 20)), "heldout")
    prune_curve(tmp_path, 0.95, list(np.linspace(0.3, 0.7, 20)), "validation")
    (evidence,) = importance_pruning(files_of(tmp_path)).evidence
    assert evidence.values["p_value"] == pytest.approx(1 / 21)
    assert evidence.verdict == HOLDS and "importance 0.9500" in evidence.numbers


def sieve_roles(folder: Path, stage: str, model: str, roles: dict[str, list[bool]], layers: int = 4,
                uncorrected: set[int] = frozenset(), positional: set[int] | None = None) -> None:
    """``sieve_roles.csv``: a head with a role has p 0.001; one in ``uncorrected`` p 0.01 without the role (below
    0.05 alone, not after the correction across heads); the others p 0.5. ``positional``: the syntax stage's offset
    control, the heads whose roles their offset pattern explains (p_offset 0.5, the others' 0.001)."""
    path = job(folder, f"{stage}/{model}")
    heads = len(next(iter(roles.values())))
    rows = [{"layer": i // (heads // layers), "head": i % (heads // layers), "name": f"h{i}", "sieve": sieve,
             "role": flags[i], "p": 0.001 if flags[i] else 0.01 if i in uncorrected and sieve != "local" else 0.5,
             **({} if positional is None else {"p_offset": 0.5 if i in positional else 0.001,
                                               "beyond_offset": i not in positional})}
            for sieve, flags in roles.items() for i in range(heads)]
    pd.DataFrame(rows).to_csv(path / "sieve_roles.csv", index=False)


@pytest.mark.parametrize(("local", "syntactic", "expected_overlap", "expected_layers"), [
    ({i for i in range(40) if i % 4 == 0}, {0, 4, 8, 10, 12, 16, 20, 24, 28, 30, 32, 36}, HOLDS, HOLDS),  # 3 a layer
    ({i for i in range(40) if i % 4 == 0}, {0, 4, 8, 12, 16, 20, 24, 28, 32, 36}, HOLDS, FAILS),  # layers 1, 3: 2
    (set(range(20)), set(range(20, 40)), FAILS, FAILS),  # none local; layers 0-1 have none
    ({i for i in range(40) if i % 4 == 0}, {0, 4, 1, 2, 3, 5, 6, 7}, INCONCLUSIVE, FAILS)])  # 2 of 8 as by chance
def test_pandes_claims(tmp_path, local, syntactic, expected_overlap, expected_layers):
    """40 heads in 4 layers of 10: the local heads (features stage) and the syntactic ones (syntax stage, any of its
    sieves); the 2 x 2 table counted here; at least ceil(10 / 4) = 3 syntactic heads in every layer (a tenth of 4
    layers allows no exception)."""
    local_flags, syntactic_flags = [i in local for i in range(40)], [i in syntactic for i in range(40)]
    sieve_roles(tmp_path, "features", "pretrained", {"local": local_flags, "delimiter": [False] * 40})
    sieve_roles(tmp_path, "syntax", "pretrained", {"syntactic": [False] * 40, "nsubj": syntactic_flags})
    overlap, layers = pande_findings(files_of(tmp_path, models=()))
    table = [[len(local & syntactic), len(local - syntactic)],
             [len(syntactic - local), 40 - len(local | syntactic)]]
    assert overlap.evidence[0].values["table"] == table
    assert overlap.verdict == expected_overlap and layers.verdict == expected_layers


def test_a_role_its_offset_pattern_explains_is_no_syntactic_role(tmp_path):
    """The syntactic heads of the first case above, but those in layers 1 and 3 attend by position alone (the syntax
    stage's offset control): they count as syntactic in neither claim, so layers 1 and 3 fall short and the
    overlap table loses them."""
    local = {i for i in range(40) if i % 4 == 0}
    syntactic = {0, 4, 8, 10, 12, 16, 20, 24, 28, 30, 32, 36}
    positional = {i for i in syntactic if i // 10 in (1, 3)}
    sieve_roles(tmp_path, "features", "pretrained", {"local": [i in local for i in range(40)]})
    sieve_roles(tmp_path, "syntax", "pretrained", {"syntactic": [i in syntactic for i in range(40)]},
                positional=positional)
    overlap, layers = pande_findings(files_of(tmp_path, models=()))
    counted = syntactic - positional
    assert overlap.evidence[0].values["table"] == [[len(local & counted), len(local - counted)],
                                                   [len(counted - local), 40 - len(local | counted)]]
    assert layers.verdict == FAILS and layers.evidence[0].values["per_layer"] == [3, 0, 3, 0]
    assert layers.evidence[0].values["uncorrected"] == 2  # without the correction, still beyond no offset


def test_a_layer_count_that_depends_on_the_correction_is_inconclusive(tmp_path):
    """Layers 1 and 3 have 2 syntactic heads after the correction across heads, a third one each without it: the
    count holds uncorrected and fails corrected, so the claim is inconclusive, and says why."""
    syntactic = {0, 4, 8, 12, 16, 20, 24, 28, 32, 36}
    sieve_roles(tmp_path, "syntax", "pretrained", {"syntactic": [False] * 40, "nsubj": [i in syntactic for i in
                                                                                         range(40)]},
                uncorrected={10, 30})
    _, layers = pande_findings(files_of(tmp_path, models=()))
    (evidence,) = layers.evidence
    assert evidence.verdict == INCONCLUSIVE and (evidence.values["value"], evidence.values["uncorrected"]) == (2, 0)
    assert "depends on the correction" in evidence.note


def test_caveats_are_raised_exactly_when_their_condition_holds(tmp_path):
    baseline = job(tmp_path, "tables/table2/seed0/baseline", {"metrics": {"validation": {"f1": 96.0}}})
    assert baseline.is_dir()
    files = files_of(tmp_path)
    assert ceiling(files) and "96" in ceiling(files)[0]
    job(tmp_path, "tables/table2/seed0/baseline", {"metrics": {"validation": {"f1": 94.9}}})
    assert not ceiling(files)
    assert not ceiling(files_of(tmp_path, metric="loss"))

    assert seeds(files, "python ablate.py") and "'study.seeds=[0,1,2]'" in seeds(files, "python ablate.py")[0]
    assert not seeds(files_of(tmp_path, models=("seed0", "seed1")), "python ablate.py")

    report = report_folder(tmp_path / "tables/table2/seed0", RESAMPLING, "holm")
    report.mkdir(parents=True)
    pd.DataFrame({"n": [24, 24]}).to_csv(report / "table.csv", index=False)
    assert "24 examples per CI (fewer than 30" in samples(files)[0]
    pd.DataFrame({"n": [360]}).to_csv(report / "table.csv", index=False)
    assert "fewer than 30" not in samples(files)[0]

    clusters = job(tmp_path, "cluster/seed0")
    profiles = {"dense": {"short": 0.2, "long": 0.6, "special": 0.2},
                "diagonal": {"short": 0.6, "long": 0.1, "special": 0.3},
                "dense_vertical": {"short": 0.3, "long": 0.3, "special": 0.4},
                "vertical": {"short": 0.1, "long": 0.1, "special": 0.8}}
    (clusters / "clusters.json").write_text(json.dumps({"named": True, "profiles": profiles}))
    assert not type_names(files)
    profiles["dense_vertical"]["long"] = 0.12  # long-range attention barely above diagonal's: a poor dense_vertical
    (clusters / "clusters.json").write_text(json.dumps({"named": True, "profiles": profiles}))
    assert "dense_vertical by 0.020" in type_names(files)[0]


def test_clusters_that_did_not_separate_into_types_get_a_caveat_and_no_table_claim(tmp_path):
    """Numbered clusters of the profile rule's four types but too close together, or of profiles that do not match:
    a Head types caveat per model saying why; the Table 2 claims are not tested on them."""
    files = files_of(tmp_path)
    clusters = job(tmp_path, "cluster/seed0")
    numbered = {"named": False, "named_by_hand": False, "names": ["cluster0", "cluster1", "cluster2", "cluster3"]}
    (clusters / "clusters.json").write_text(json.dumps({**numbered, "separation": 0.164, "profile_names": [
        "vertical", "dense", "diagonal", "dense_vertical"]}))
    line, = type_names(files)
    assert line.startswith("**Head types.** seed0's heads did not separate into Guan et al.'s types")
    assert "separation 0.16, named above 1" in line and "`cluster/seed0/clusters.json`" in line
    assert "cluster0..cluster3" in line and "not tested" in line
    (clusters / "clusters.json").write_text(json.dumps({**numbered, "separation": 3.2, "profile_names": None}))
    assert "profiles do not match dense / diagonal / dense_vertical / vertical" in type_names(files)[0]
    (clusters / "clusters.json").write_text(json.dumps({**numbered, "named": True, "named_by_hand": True}))
    assert not type_names(files)  # names given by hand are the researcher's
    job(tmp_path, "tables/table2/seed0/prune_cluster0")  # the tables stage ran the numbered clusters' plans
    finding = guan_finding(files, "guan_table2_diagonal_vs_dense_prune")
    assert finding.verdict == NOT_TESTED and "not Guan et al.'s four types" in finding.reason


def test_a_claim_about_a_type_whose_centroid_contradicts_the_papers_description_is_not_tested(tmp_path):
    """The profile rule names dense_vertical without asking that it attends to long range more than diagonal heads do
    (Guan et al.: "large values at long range windows and special tokens"): below that, a claim about dense_vertical
    heads would be about other heads, and is not tested on that model; the other types' claims keep their verdicts."""
    rng = np.random.default_rng(2)
    dense = rng.uniform(0.5, 0.7, 60)
    for plan, f1 in (("baseline", np.ones(60)), ("uniform_dense", dense), ("uniform_dense_vertical", dense - 0.3),
                     ("prune_vertical", dense), ("prune_diagonal", dense - 0.3)):
        records(job(tmp_path, f"tables/table2/seed0/{plan}", {"metrics": {"validation": {"f1": 100 * f1.mean()}}}),
                f1)
    counts = {"dense": 4, "diagonal": 7, "dense_vertical": 5, "vertical": 3}
    random_sets(tmp_path, "seed0", "uniform", 5, [np.ones(60)] * 20, counts)
    random_sets(tmp_path, "seed0", "prune", 7, [np.ones(60)] * 20, counts)
    clusters = job(tmp_path, "cluster/seed0")
    profiles = {"dense": {"short": 0.2, "long": 0.6, "special": 0.2},
                "diagonal": {"short": 0.6, "long": 0.1, "special": 0.3},
                "dense_vertical": {"short": 0.3, "long": 0.3, "special": 0.4},
                "vertical": {"short": 0.1, "long": 0.1, "special": 0.8}}
    files = files_of(tmp_path)
    uniform, diagonal = "guan_table2_dense_vertical_uniform", "guan_table2_diagonal_vs_vertical_prune"
    for long, expected in ((0.3, HOLDS), (0.12, HOLDS), (0.07, NOT_TESTED)):  # diagonal's long share is 0.1
        profiles["dense_vertical"]["long"] = long
        (clusters / "clusters.json").write_text(json.dumps({"named": True, "profiles": profiles, "counts": counts}))
        (evidence,) = guan_finding(files, uniform).evidence
        assert evidence.verdict == expected and evidence.values["value"] == pytest.approx(30.0)  # numbers kept
        assert guan_finding(files, diagonal).verdict == HOLDS
        caveat = type_names(files)
        assert ("not tested" in caveat[0]) == (expected == NOT_TESTED) if caveat else long == 0.3
    assert "dense_vertical by -0.030 falls short of Guan et al.'s description" in evidence.note
    assert "`cluster/seed0/clusters.json`" in evidence.note
    (clusters / "clusters.json").write_text(json.dumps({"named": True, "named_by_hand": True, "profiles": profiles,
                                                         "counts": counts}))
    assert guan_finding(files, uniform).verdict == HOLDS  # names given by hand are the researcher's


def test_every_claim_is_in_the_claims_table_once(tmp_path):
    """Each study.json key of the findings matches exactly one row of the claims table (its ``[_renormalized]`` and
    ``{a,b}`` spelled out), and every row names at least one claim."""
    import itertools
    import re

    from headlab.study.findings.claims_table import ROWS

    def keys(cell: str) -> set[str]:
        pattern = cell.strip("`")
        parts = re.split(r"(\[[^]]*\]|\{[^}]*\})", pattern)
        choices = [[p[1:-1], ""] if p.startswith("[") else p[1:-1].split(",") if p.startswith("{") else [p]
                   for p in parts]
        return {"".join(c) for c in itertools.product(*choices)}

    from headlab.study.findings.gates import gates_findings

    rows = [keys(row[0]) for row in ROWS]
    found = [f.claim.key for f in study_findings(files_of(tmp_path))]
    found += [f.claim.key for f in gates_findings(files_of(tmp_path))]  # when the gates stage ran
    assert all(sum(key in row for row in rows) == 1 for key in found), [k for k in found if
                                                                       sum(k in row for row in rows) != 1]
    assert all(row & set(found) for row in rows)


def test_the_reports_verdict_rule_is_the_documented_one():
    from headlab.study.findings.verdicts import RULE

    assert RULE in (Path(__file__).parents[1] / "docs/study.md").read_text()


def test_the_sweeps_spearman_of_a_constant_method_is_nan_without_a_warning():
    """scipy's ConstantInputWarning reached the terminal of a smoke study (every head's change 0 under one method)."""
    import warnings

    from headlab.study.report_robustness import spearman

    varied, other = pd.Series([0.1, -0.2, 0.3, 0.0]), pd.Series([0.2, -0.1, 0.5, 0.1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(spearman(varied, pd.Series([0.0] * 4)))
        assert spearman(varied, other) == pytest.approx(scipy.stats.spearmanr(varied, other).statistic, abs=1e-15)


def test_percentiles_read_as_ordinals():
    """The controls printed "the 92th percentile"."""
    from headlab.study.findings.controls import ordinal

    assert [ordinal(v) for v in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 92, 101, 111, 112, 99.6)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "92nd", "101st", "111th", "112th",
        "100th"]
