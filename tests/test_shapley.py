"""Shapley values: the exact formula and the permutation estimate against the definition by every order (float64),
coalitions as per-row plans against separate evaluations, and ``mode=shapley`` end to end."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from conftest import assert_one_error_line, run
from test_evaluation import records_of, setup

from headlab.analysis.jobs.plan_evaluator import PlanEvaluator, Variant
from headlab.analysis.shapley.coalitions import CoalitionEvaluator, coalition_plan, first_changed_layer
from headlab.analysis.shapley.values import PermutationEstimate, exact_values


def by_every_order(scores: np.ndarray, k: int) -> np.ndarray:
    """``[k, examples]``: each player's marginal (score with it minus without it, removing in that order from the
    full set) averaged over all k! orders."""
    values = np.zeros((k, scores.shape[1]))
    for order in itertools.permutations(range(k)):
        kept = (1 << k) - 1
        for player in order:
            values[player] += scores[kept] - scores[kept & ~(1 << player)]
            kept &= ~(1 << player)
    return values / math.factorial(k)


@pytest.mark.parametrize("k", [1, 2, 4, 5])
def test_exact_values_equal_the_average_over_every_removal_order(k):
    scores = np.random.default_rng(k).normal(size=(2 ** k, 7))
    values = exact_values(scores)
    np.testing.assert_allclose(values, by_every_order(scores, k), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(values.sum(0), scores[-1] - scores[0], rtol=1e-12, atol=1e-12)  # efficiency
    with pytest.raises(ValueError, match="all 2\\^k coalitions"):
        exact_values(np.zeros((3, 7)))  # 3 is no power of 2


def test_the_permutation_estimate_over_every_order_is_exact_and_truncation_gives_zero():
    k, scores = 3, np.random.default_rng(0).normal(size=(8, 5))
    estimate = PermutationEstimate(k, 5)
    orders = [list(order) for order in itertools.permutations(range(k))]
    pairs = [(order, order[::-1]) for order in orders if order < order[::-1]]  # the 3 antithetic pairs
    for pair in pairs:
        for order in pair:
            chain, kept = [scores[7]], 7
            for player in order:
                kept &= ~(1 << player)
                chain.append(scores[kept])
            estimate.add_chain(order, np.stack(chain))
    np.testing.assert_allclose(estimate.values(), exact_values(scores), rtol=1e-12, atol=1e-12)
    assert estimate.permutations == 6 and len(estimate.pair_values) == 3
    pair_means = np.stack(estimate.pair_values)  # [pairs, players]
    np.testing.assert_allclose(estimate.standard_errors(), pair_means.std(0, ddof=1) / np.sqrt(3), rtol=1e-12)
    truncated = PermutationEstimate(k, 5)
    truncated.add_chain([2, 0, 1], np.stack([scores[7], scores[3]]))  # stopped after removing player 2
    np.testing.assert_allclose(truncated.values()[2], scores[7] - scores[3])
    assert (truncated.values()[[0, 1]] == 0).all() and np.isinf(truncated.standard_errors()).all()


class KnownScores:
    """What ``shapley_run`` reads of ``CoalitionScores``: per coalition (bit i: group i keeps its heads) and split,
    the per-example scores; calling it with coalitions returns them (as the real one does once evaluated)."""

    def __init__(self, table: np.ndarray, score: str):
        self.full, self.score, self.evaluated = len(table) - 1, score, []
        self.known = {c: {"validation": table[c]} for c in range(len(table))}

    def __call__(self, coalitions):
        self.evaluated += list(coalitions)
        return {c: self.known[c] for c in coalitions}


def test_a_chain_stops_at_the_first_coalition_no_better_than_the_floor():
    from headlab.analysis.shapley.shapley_run import _chain

    k = 4
    means = np.array([bin(c).count("1") for c in range(2 ** k)], dtype=float)  # the groups kept
    scores = KnownScores(np.repeat(means[:, None], 3, axis=1), "accuracy")
    assert _chain(scores, [3, 1, 0, 2], 2.0, "validation") == [15, 7, 5]  # 4, 3, then 2 kept: at the floor
    assert _chain(scores, [3, 1, 0, 2], -1.0, "validation") == [15, 7, 5, 4, 0]  # never: the whole chain
    losses = KnownScores(np.repeat(-means[:, None], 3, axis=1), "loss")  # higher is worse
    assert _chain(losses, [0, 1, 2, 3], -3.0, "validation") == [15, 14]  # loss 3 after one removal: the floor


@pytest.mark.parametrize("score, floor, reached", [("accuracy", 4.0, False), ("accuracy", 3.9, True),
                                                   ("loss", -4.0, False), ("loss", -3.9, True)])
def test_a_floor_the_full_model_does_not_beat_is_not_applied(score, floor, reached):
    """With the full model at or below the floor every chain stopped at once: the first group removed took the whole
    marginal, the others read 0 with a standard error of 0. Such a floor is left out, with a warning."""
    from headlab.analysis.shapley.shapley_run import unreachable_floor

    means = np.array([bin(c).count("1") for c in range(16)], dtype=float) * (-1 if score == "loss" else 1)
    scores = KnownScores(np.repeat(means[:, None], 3, axis=1), score)
    why = unreachable_floor(scores, floor, "validation")
    assert (why is None) == reached
    if not reached:
        assert why.startswith(f"shapley.floor={floor:g} is not applied: the full model's {score} on validation")


@pytest.mark.parametrize("k", [3, 4])
def test_intervals_of_whole_number_scores_do_not_move_with_float_rounding(k):
    """0/1 scores: each per-example value is a multiple of 1/k!. BCa counts the resamples that tie with the observed
    mean, so values a few ulps off their grid (as a float weighted sum leaves them) moved the interval. On the grid,
    the interval is scipy's BCa of the whole numbers value * k!, scaled back, whatever the last bits."""
    from types import SimpleNamespace

    import scipy.stats

    from headlab.analysis.shapley.shapley_run import intervals

    rng = np.random.default_rng(k)
    scores = (rng.random((2 ** k, 40)) < np.linspace(0.2, 0.9, 2 ** k)[:, None]).astype(float)
    values = exact_values(scores)  # [k, 40]
    grid = math.factorial(k)
    whole = np.rint(values * grid)
    assert np.abs(whole - values * grid).max() < 1e-9
    options = SimpleNamespace(resamples=999, confidence=0.95)
    reference = scipy.stats.bootstrap((whole,), np.mean, axis=-1, vectorized=True, method="BCa", n_resamples=999,
                                      confidence_level=0.95, random_state=np.random.default_rng(0))
    noisy = values * (1 + rng.choice([-1, 0, 1], size=values.shape) * 4e-16)  # the last bits of another sum order
    for per_example in (values, noisy):
        value, low, high = intervals(per_example, options, 0, grid)
        np.testing.assert_array_equal(value, whole.mean(1) / grid)
        np.testing.assert_array_equal(low, reference.confidence_interval.low / grid)
        np.testing.assert_array_equal(high, reference.confidence_interval.high / grid)
    _, *unsnapped = intervals(noisy, options, 0)  # (the test can tell: off the grid, BCa's tie count moves the ends)
    assert not (np.array_equal(unsnapped[0], reference.confidence_interval.low / grid)
                and np.array_equal(unsnapped[1], reference.confidence_interval.high / grid))


@pytest.mark.parametrize(("task", "policy", "per_forward"), [
    ("demo_pairs", "prune", 3), ("demo_qa", "mean", 2), ("demo_pairs", "resample", 4), ("demo_pairs", "uniform", 0)])
def test_coalitions_as_per_row_plans_equal_separate_evaluations(task, policy, per_forward, tmp_path):
    """Coalitions of three groups (two spanning layers, one inside layer 2): rows of several coalitions share a
    forward that starts at their lowest changed layer; every record equals a plain evaluation of the plan."""
    from headlab.analysis.jobs.substitutes import JobSubstitutes

    cfg, data, model, trainer = setup(task, tmp_path)
    cfg.mask.reference_examples, cfg.mask.resamples, cfg.baseline_dir = 24, 2, str(tmp_path / "baselines")
    substitutes = None
    if policy in ("mean", "resample"):
        substitutes = JobSubstitutes(cfg, cfg.model, data, resample=policy == "resample")
        substitutes.model_key = "tiny"
    groups = [[(0, 1), (1, 1), (2, 1)], [(1, 0), (1, 3), (2, 0)], [(2, 2), (2, 3)]]
    variants = [Variant(f"S{kept}", coalition_plan(groups, kept, policy, (3, 4))) for kept in range(8)]
    assert variants[7].plan.is_identity and first_changed_layer(variants[4].plan) == 0
    assert first_changed_layer(variants[3].plan) == 2  # only the third group removed: layers 0-1 are reused
    separate = records_of(trainer, data, PlanEvaluator(model, cfg.task, variants, data.eval_examples, substitutes))
    base = np.array([r["loss"] for r in separate[("S7", "validation")]])
    # with the full model, and without it (its records cached): then the unablated forward stops at the highest start
    for chosen in (variants, variants[:3] + variants[4:7]):
        together = records_of(trainer, data, CoalitionEvaluator(model, cfg.task, chosen, data.eval_examples,
                                                                per_forward, substitutes))
        assert set(together) == {(v.name, "validation") for v in chosen}
        for key, rows in together.items():
            losses = [r["loss"] for r in separate[key]]
            np.testing.assert_allclose([r["loss"] for r in rows], losses, rtol=2e-6, atol=1e-7)
            assert [r["prediction"] for r in rows] == [r["prediction"] for r in separate[key]]
            if key[0] != "S7":
                assert np.abs(np.array(losses) - base).max() > 3e-6, key  # past the tolerance: the test can fail


def shapley_job(root, name, *overrides, check=True):
    result = run("ablate.py", "mode=shapley", f"ckpt_path={root / 'train'}", f"hydra.run.dir={root / name}",
                 *overrides, cwd_tmp=root, check=check)
    return result, (json.loads((root / name / "results.json").read_text()) if check else None)


@pytest.mark.slow
def test_shapley_over_types_equals_the_formula_on_separate_eval_jobs(trained):
    """Two head types: the values from the job equal phi_i = (v(i) - v(none) + v(both) - v(other)) / 2 on the
    per-example scores of separate mode=eval jobs, their intervals hold them, and they add up to full minus empty."""
    root, _ = trained
    clusters = root / "two_types.json"
    labels = {f"L{layer}H{head}": "low" if layer < 2 else "high" for layer in range(3) for head in range(4)}
    clusters.write_text(json.dumps({"labels": labels, "shape": [3, 4]}))
    _, result = shapley_job(root, "shapley_types", f"mask.clusters={clusters}", "shapley.score=loss")
    assert result["players"] == ["high", "low"] and result["method"] == "exact"
    scores = {}
    for name, heads in (("none", "all"), ("high", "L0-1"), ("low", "L2")):  # the type kept, the heads removed
        run("ablate.py", "mode=eval", f"ckpt_path={root / 'train'}", "mask=prune", f"mask.heads={heads}",
            f"hydra.run.dir={root / ('eval_' + name)}", cwd_tmp=root)
        scores[name] = pd.read_parquet(root / f"eval_{name}/records.parquet").sort_values("example")["loss"].mean()
    full = result["splits"]["validation"]["full"]
    values = {row["group"]: row for row in result["values"]}
    for me, other in (("high", "low"), ("low", "high")):
        expected = (scores[me] - scores["none"] + full - scores[other]) / 2
        assert values[me]["value"] == pytest.approx(expected, rel=1e-9)
        assert values[me]["ci_low"] <= values[me]["value"] <= values[me]["ci_high"]
    assert result["splits"]["validation"]["empty"] == pytest.approx(scores["none"], rel=1e-12)
    assert abs(result["splits"]["validation"]["efficiency_gap"]) < 1e-12
    assert (root / "shapley_types/shapley_validation.png").is_file()
    table = pd.read_csv(root / "shapley_types/shapley.csv")
    assert list(table["group"]) == ["high", "low"]
    coalitions = pd.read_csv(root / "shapley_types/coalitions.csv").set_index("removed")["score"]
    assert list(coalitions.index) == ["none", "high", "low", "high,low"]
    # scores[name]: the eval job that keeps the type ``name`` (removes the other)
    assert coalitions["high"] == pytest.approx(scores["low"], rel=1e-12) and coalitions["none"] == full
    per_example = pd.read_parquet(root / "shapley_types/coalitions.parquet")
    assert per_example[per_example["removed"] == "low"]["score"].mean() == pytest.approx(scores["high"], rel=1e-12)


@pytest.mark.slow
def test_sampled_shapley_resumes_its_chains_and_keeps_efficiency(trained):
    root, _ = trained
    overrides = ["shapley.over=heads", "shapley.target_se=1e-9", "shapley.max_permutations=4", "shapley.score=loss"]
    _, first = shapley_job(root, "shapley_heads", *overrides)
    assert first["method"] == "permutations" and first["splits"]["validation"]["permutations"] == 4
    assert abs(first["splits"]["validation"]["efficiency_gap"]) < 1e-12  # untruncated chains telescope
    assert first["coalitions_evaluated"] > 12
    progress = root / "shapley_heads/progress.npz"
    with np.load(progress) as data:
        saved = dict(data)
    first_pair = {int(c) for name in ("chain_0_0", "chain_0_1") for c in saved[name]}
    distinct = {int(name.split("_")[1], 16) for name in saved if name.startswith("scores_")}
    assert first["coalitions_evaluated"] == len(distinct) - 1  # every coalition it scored but the full model
    # as if killed after its last chain, with every saved score doubled: the values double iff all came back
    np.savez(progress, **{n: v * 2 if n.startswith("scores_") else v for n, v in saved.items()})
    (root / "shapley_heads/results.json").unlink()
    _, again = shapley_job(root, "shapley_heads", *overrides)
    assert [r["value"] for r in again["values"]] == [2 * r["value"] for r in first["values"]]
    assert again["coalitions_evaluated"] == first["coalitions_evaluated"]  # it once said 0: those of this run only
    # as if killed after its first pair of chains: the second is evaluated; everything as the uninterrupted job's
    kept = {n: v for n, v in saved.items() if not n.startswith(("order_1", "chain_1_", "scores_"))
            or (n.startswith("scores_") and int(n.split("_")[1], 16) in first_pair)}
    np.savez(progress, **kept | {"pairs": np.array(1)})
    (root / "shapley_heads/results.json").unlink()
    _, resumed = shapley_job(root, "shapley_heads", *overrides)
    columns = ["group", "value", "ci_low", "ci_high", "se"]
    assert [[r[c] for c in columns] for r in resumed["values"]] == [[r[c] for c in columns] for r in first["values"]]
    assert resumed["coalitions_evaluated"] == first["coalitions_evaluated"]  # it once said those after the kill
    _, never = shapley_job(root, "shapley_high_floor", *overrides, "shapley.floor=10")  # a loss never that high
    assert [r["value"] for r in never["values"]] == [r["value"] for r in first["values"]]
    # every loss is above 0: each chain would stop at once, crediting its first removal with everything (it did)
    ignored, unreached = shapley_job(root, "shapley_floor", *overrides, "shapley.floor=0")
    assert "warning: shapley.floor=0 is not applied: the full model's loss on validation" in ignored.stdout
    assert [r["value"] for r in unreached["values"]] == [r["value"] for r in first["values"]]
    assert unreached["splits"]["validation"]["floor_applied"] is None


@pytest.mark.slow
def test_shapley_on_albert_runs_without_a_cached_baseline(tmp_path):
    """ALBERT's depths share modules: a first job (no baseline cached) computes the full model in its own pass; it
    once asked for a layer list there and failed. Its scores equal those of a job run after mode=eval cached the
    baseline, and its full model's equal that eval job's records."""
    args = ["model=tiny_albert", "allow_random_head=true", "data.max_eval_examples=24"]
    shapley = ["mode=shapley", "shapley.over=layers", "shapley.score=loss", *args]
    fresh, cached = tmp_path / "fresh", tmp_path / "cached"
    run("ablate.py", *shapley, f"hydra.run.dir={fresh / 'job'}", cwd_tmp=fresh)
    run("ablate.py", "mode=eval", "mask=prune", "mask.heads=L0H0", *args, f"hydra.run.dir={cached / 'eval'}",
        cwd_tmp=cached)
    cached_baselines = list((cached / "baselines").glob("*/records.parquet"))  # the eval job's
    assert len(cached_baselines) == 1
    run("ablate.py", *shapley, f"hydra.run.dir={cached / 'job'}", cwd_tmp=cached)
    first, second = (json.loads((folder / "job/results.json").read_text()) for folder in (fresh, cached))
    assert first["players"] == ["L0", "L1", "L2"] and first["method"] == "exact"
    np.testing.assert_allclose([r["value"] for r in first["values"]], [r["value"] for r in second["values"]],
                               rtol=1e-9, atol=1e-12)
    assert abs(first["splits"]["validation"]["efficiency_gap"]) < 1e-12
    scores = {folder: pd.read_parquet(folder / "job/coalitions.parquet").sort_values(["removed", "example"])
              for folder in (fresh, cached)}
    pd.testing.assert_frame_equal(scores[fresh].reset_index(drop=True), scores[cached].reset_index(drop=True),
                                  rtol=1e-6)
    full = scores[fresh][scores[fresh]["removed"] == "none"]["score"].to_numpy()
    baseline = pd.read_parquet(cached_baselines[0]).sort_values("example")["loss"].to_numpy()
    assert len(full) == len(baseline) == 24
    np.testing.assert_allclose(full, baseline, rtol=1e-6)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["shapley.over=types"], "shapley.over=types needs the head types: mask.clusters=PATH"),
    (["shapley.over=layers", "shapley.score=matthews"],
     "shapley.score='matthews' is not a per-example score of task demo_pairs (classification)"),
    (["shapley.over=layers", "shapley.target_se=inf"], "shapley.target_se=inf must be a number > 0"),
    (["shapley.over=layers", "shapley.target_se=0.1", "shapley.floor=nan"], "shapley.floor=nan must be a finite"),
    (["mask=prune", "mask.heads=L0"], "mode=shapley builds its own plans"),
    (["shapley.over=layers", "shapley.policy=drop_intra"], "shapley.policy='drop_intra' is not allowed"),
    (["model=minilm", "ckpt_path=null", "allow_random_head=true", "shapley.over=heads"],
     "shapley.over=heads: 72 groups are more than the 12 whose 2^k coalitions are evaluated exactly; set "
     "shapley.target_se=SE"),
    (["mask.clusters=OTHER"], "was computed on model other_model; this job's model is tiny_random"),
    (["mask.clusters=NONE_TYPE"], "the head type 'none' cannot name a Shapley player"),
    (["mask.clusters=EMPTY_TYPE"], "must be a non-empty string (a type name), got ''"),  # refused for every mode
    (["mask.clusters=BLANK_TYPE"], "must be a non-empty string (a type name), got ' '"),
    (["shapley.over=heads", "shapley.target_se=0.1", "shapley.max_permutations=3"],  # ran 4: "at most" was not
     "shapley.max_permutations=3 must be even: orders are drawn in antithetic pairs"),
])
def test_bad_shapley_settings_fail_before_the_weights_load(trained, overrides, expected):
    root, _ = trained
    other = root / "other_clusters.json"
    other.write_text(json.dumps({"labels": {f"L{l}H{h}": "a" for l in range(3) for h in range(4)}, "shape": [3, 4],
                                 "model": "other_model"}))
    files = {"OTHER": other}
    for placeholder, label in (("NONE_TYPE", "none"), ("EMPTY_TYPE", ""), ("BLANK_TYPE", " ")):
        files[placeholder] = root / f"{placeholder.lower()}.json"  # hand-written: some heads, one type so named
        files[placeholder].write_text(json.dumps({"L0H0": label, "L1H0": "dense"}))
    overrides = [f"mask.clusters={files[o.split('=')[1]]}" if o.startswith("mask.clusters=") else o for o in overrides]
    result, _ = shapley_job(root, "bad", *overrides, check=False)
    assert_one_error_line(result, expected)
