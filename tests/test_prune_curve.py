"""ablate.py mode=prune_curve on a tiny_random checkpoint: each step prunes the heads the importance of the
current mask ranks lowest, random orders at the same counts, the final mask reproduced by mode=eval, resuming."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import run

from headlab.analysis.importance.prune_curve import lowest_heads, random_heads

CURVE = ("mode=prune_curve", "prune_curve.step=0.25", "prune_curve.min_heads_per_layer=1", "prune_curve.stop_below=1",
         "prune_curve.random_seeds=[3,4]", "prune_curve.timing_rounds=2", "importance.max_examples=30")


def bottom(scores, pruned, count):
    """The ``count`` lowest heads of ``scores`` ([3, 4]) not in ``pruned``, never a layer's last head, by hand."""
    left = {layer: 4 - sum(name.startswith(f"L{layer}H") for name in pruned) for layer in range(3)}
    chosen = []
    for flat in np.argsort(np.ravel(scores), kind="stable"):
        name = f"L{flat // 4}H{flat % 4}"
        if name not in pruned and left[flat // 4] > 1 and len(chosen) < count:
            chosen.append(name)
            left[flat // 4] -= 1
    return chosen


def importance_under(root, tmp_path, name, pruned):
    """The example importance of mode=importance run on its own, under a mask pruning ``pruned``."""
    mask = ["mask=prune", f"mask.heads=[{','.join(pruned)}]"] if pruned else []
    run("ablate.py", "mode=importance", *mask, f"ckpt_path={root / 'train'}", "importance.max_examples=30",
        "importance.key_types=false", "importance.policies=[]", f"hydra.run.dir={tmp_path / name}", cwd_tmp=root)
    return np.array(json.loads((tmp_path / name / "importance.json").read_text())["importance"])


def test_prune_curve_follows_recomputed_importance_and_its_final_mask_reproduces(trained, tmp_path):
    root, _ = trained
    out = tmp_path / "curve"
    args = (*CURVE, f"ckpt_path={root / 'train'}", f"hydra.run.dir={out}", "logger=wandb")  # W&B offline
    printed = run("ablate.py", *args, cwd_tmp=root).stdout
    results = json.loads((out / "results.json").read_text())
    log = next((out / "wandb").glob("offline-run-*/*.wandb")).read_bytes()
    assert b"prune_curve.table.json" in log  # the curve's table, whose seed column is empty for the importance rows
    steps = results["steps"]
    assert [s["heads_pruned"] for s in steps] == [3, 6, 9] and results["settings"]["per_step"] == 3
    assert results["settings"]["stopped"] == "no head left to prune"  # every layer is down to its last head
    assert "stopped: no head left to prune" in printed

    # every step prunes the lowest heads of the importance recomputed under the previous step's mask
    pruned = []
    for step in steps:
        scores = importance_under(root, tmp_path, f"importance{step['step']}", pruned)
        np.testing.assert_allclose(json.loads((out / "steps.json").read_text())["steps"][step["step"] - 1]["scores"],
                                   scores, rtol=1e-9, atol=1e-12)
        assert step["new"] == bottom(scores, pruned, 3)
        pruned = pruned + step["new"]
        assert step["pruned"] == pruned
    assert {name[:2] for name in set(f"L{i}H{j}" for i in range(3) for j in range(4)) - set(pruned)} == {
        "L0", "L1", "L2"}

    table = pd.read_csv(out / "prune_curve.csv")
    assert len(table) == 3 * 4 and set(table["order"]) == {"importance", "random"}
    assert list(table[table["order"] == "importance"]["heads_pruned"]) == [0, 3, 6, 9]
    assert "step 1 of at most 3: 3/12 heads pruned" in printed and "step 3 of at most 3: 9/12" in printed
    assert sorted(table["seed"].dropna().unique()) == [3, 4]
    assert (table[table["heads_pruned"] == 0]["accuracy"] == results["baseline"]["validation"]["accuracy"]).all()
    assert (out / "prune_curve.png").stat().st_size > 5000

    # a random point is the metric of those random heads under mode=eval
    heads = results["random"]["4"][1]["pruned"]
    assert heads == random_heads(4, (3, 4), 6, 1) and len(heads) == 6
    evaluated = tmp_path / "random_eval"
    run("ablate.py", "mode=eval", "mask=prune", f"mask.heads=[{','.join(heads)}]", f"ckpt_path={root / 'train'}",
        f"hydra.run.dir={evaluated}", cwd_tmp=root)
    measured = json.loads((evaluated / "results.json").read_text())["metrics"]["validation"]
    assert measured == results["random"]["4"][1]["metrics"]["validation"]

    # the final mask reproduces its metric under mode=eval, given as the printed override
    final = json.loads((out / "final_mask.json").read_text())
    assert final["rules"] == [{"heads": pruned, "policy": "prune"}] and final["heads_pruned"] == 9
    override = final["eval_override"].strip("'")
    assert f"evaluate it: python ablate.py mode=eval ... {final['eval_override']}" in printed
    evaluated = tmp_path / "final_eval"
    run("ablate.py", "mode=eval", override, f"ckpt_path={root / 'train'}", f"hydra.run.dir={evaluated}", cwd_tmp=root)
    result = json.loads((evaluated / "results.json").read_text())
    assert set(result["plan"]["policies"]) == set(pruned)
    assert result["metrics"]["validation"] == final["metrics"]["validation"] == steps[-1]["metrics"]["validation"]
    timing = final["timing"]
    assert timing["examples"] == 40 and len(timing["seconds"]["full"]) == 2 and timing["speedup"] > 0

    # every curve's per-example records: each set's metric is the curve's, the random point's those of mode=eval
    records = pd.read_parquet(out / "records.parquet")
    assert len(records) == 40 * (1 + 3 + 2 * 3)  # the baseline, 3 importance steps, 2 random orders of 3 steps
    for (order, seed, step), part in records.groupby(["order", "seed", "step"], dropna=False):
        row = table[(table["order"] == ("importance" if order == "baseline" else order)) & (table["step"] == step)
                    & (table["seed"].isna() if pd.isna(seed) else table["seed"] == seed)]
        assert (part["label"] == part["prediction"]).mean() == pytest.approx(row["accuracy"].iloc[0], abs=1e-12)
    mine = records[(records["order"] == "random") & (records["seed"] == 4) & (records["step"] == 2)]
    assert list(mine["loss"]) == pytest.approx(list(pd.read_parquet(tmp_path / "random_eval/records.parquet")["loss"]),
                                               abs=1e-6)

    # a rerun is skipped; a job killed after step 1 resumes there and ends the same
    assert "already done" in run("ablate.py", *args, cwd_tmp=root).stdout
    progress = json.loads((out / "steps.json").read_text())
    (out / "results.json").unlink()
    (out / "steps.json").write_text(json.dumps({**progress, "steps": progress["steps"][:1], "stopped": None}))
    (out / "steps/step1.parquet").unlink()  # a step saved without its records (an older job): evaluated again
    assert "resuming after step 1" in run("ablate.py", *args, cwd_tmp=root).stdout
    again = json.loads((out / "results.json").read_text())
    assert again["steps"] == results["steps"] and again["random"] == results["random"]
    pd.testing.assert_frame_equal(pd.read_parquet(out / "records.parquet"), records)


def test_lowest_heads_skip_pruned_heads_and_keep_the_layer_floor():
    scores = np.array([[0.5, 0.1, 0.9], [0.0, 0.2, 0.3]])
    assert lowest_heads(scores, [], 2, 0) == ["L1H0", "L0H1"]
    assert lowest_heads(scores, ["L1H0"], 3, 0) == ["L0H1", "L1H1", "L1H2"]
    assert lowest_heads(scores, ["L1H0"], 3, 1) == ["L0H1", "L1H1", "L0H0"]  # L1 keeps its last head
    assert lowest_heads(scores, ["L0H1", "L1H0", "L1H1"], 5, 1) == ["L0H0"]  # all that may still go
    assert lowest_heads(np.zeros((2, 2)), [], 3, 0) == ["L0H0", "L0H1", "L1H0"]  # ties: layer, then head
    order = random_heads(7, (2, 3), 6, 0)
    assert sorted(order) == sorted(f"L{i}H{j}" for i in range(2) for j in range(3))
    assert random_heads(7, (2, 3), 2, 0) == order[:2] and random_heads(8, (2, 3), 6, 0) != order


@pytest.mark.parametrize("shape", [(3, 4), (6, 12), (2, 5)])
def test_most_steps_counts_the_steps_until_no_head_may_go(shape):
    """Against the curve's own loop run to its end on random scores (no threshold)."""
    from headlab.analysis.importance.prune_curve import most_steps

    rng = np.random.default_rng(0)
    for step in (0.05, 0.1, 0.25, 0.3, 1.0):
        for floor in range(shape[1] + 2):
            per_step, pruned, steps = max(1, round(step * shape[0] * shape[1])), [], 0
            while new := lowest_heads(rng.random(shape), pruned, per_step, floor):
                pruned, steps = pruned + new, steps + 1
            assert most_steps(*shape, step, floor) == steps, (step, floor)


def test_a_baseline_of_zero_or_less_sets_no_threshold_and_no_fraction():
    """An untrained head's F1 of 0 (or a negative correlation): a fraction of it means nothing (it crashed with a
    ZeroDivisionError, and a negative baseline stopped the curve at once): every step runs, fractions are NaN."""
    from types import SimpleNamespace

    from headlab.analysis.importance.prune_curve import PruneCurve, relative

    assert relative(0.5, 2.0) == 0.25 and np.isnan(relative(0.5, 0.0)) and np.isnan(relative(0.1, -0.2))
    curve = PruneCurve.__new__(PruneCurve)
    curve.options, curve.split, curve.metric = SimpleNamespace(stop_below=0.9), "validation", "f1"
    for base, threshold in ((50.0, 45.0), (0.0, float("-inf")), (-0.2, float("-inf"))):
        curve.baseline = {"validation": {"f1": base}}
        assert curve.threshold == threshold


def test_a_prune_curve_of_mean_heads_orders_by_their_estimate_and_its_mask_reproduces(trained, tmp_path):
    """Heads leave under mean (``prune_curve.policy``), ranked by the full model's estimate of that policy; each
    step's metric is mode=eval's of its mean mask, and the final mask is given with its policy."""
    root, _ = trained
    out = tmp_path / "mean_curve"
    reference = ["mask.reference=train", "mask.reference_examples=30"]
    args = (*CURVE, "prune_curve.policy=mean", "prune_curve.estimator=estimate_mean", "prune_curve.recompute=false",
            *reference, f"ckpt_path={root / 'train'}", f"hydra.run.dir={out}")
    printed = run("ablate.py", *args, cwd_tmp=root).stdout
    results = json.loads((out / "results.json").read_text())
    run("ablate.py", "mode=importance", f"ckpt_path={root / 'train'}", "importance.max_examples=30",
        "importance.key_types=false", "importance.policies=[mean]", *reference,
        f"hydra.run.dir={tmp_path / 'estimate'}", cwd_tmp=root)
    estimate = np.array(json.loads((tmp_path / "estimate/importance.json").read_text())["estimators"]["estimate_mean"])
    pruned = []
    for step in results["steps"]:
        assert step["new"] == bottom(estimate, pruned, 3)
        pruned += step["new"]
    assert results["settings"]["policy"] == "mean"
    final = json.loads((out / "final_mask.json").read_text())
    assert final["rules"] == [{"heads": pruned, "policy": "mean"}] and final["timing"] is None  # no weights removed
    evaluated = tmp_path / "final_eval"
    run("ablate.py", "mode=eval", final["eval_override"].strip("'"), *reference, f"ckpt_path={root / 'train'}",
        f"hydra.run.dir={evaluated}", cwd_tmp=root)
    result = json.loads((evaluated / "results.json").read_text())
    assert set(result["plan"]["policies"].values()) == {"mean"}
    assert result["metrics"]["validation"] == final["metrics"]["validation"]
    assert "policy: mean" in printed


def test_a_resample_curve_rescoring_under_its_mask_is_refused(trained):
    from conftest import assert_one_error_line

    root, _ = trained
    result = run("ablate.py", *CURVE, "prune_curve.policy=resample", f"ckpt_path={root / 'train'}", cwd_tmp=root,
                 check=False)
    assert_one_error_line(result, "prune_curve.policy=resample: rescoring the heads under the mask at every step would "
                                  "need a forward per draw; set prune_curve.recompute=false")


def test_the_reports_speed_up_says_when_the_rounds_cannot_tell():
    """One timing round printed "0.62x faster"; rounds on both sides of 1x are no measured change."""
    from headlab.study.report_heads import speed_text

    def timing(full, pruned):
        ratios = sorted(a / b for a, b in zip(full, pruned))
        return {"seconds": {"full": full, "pruned": pruned}, "speedup": ratios[len(ratios) // 2], "rounds": len(full)}

    assert speed_text(timing([1.0], [1.6])) == "0.62x the full model's (one timing round: noise, not a measurement)"
    assert speed_text(timing([1.0, 1.0, 1.0], [0.8, 1.1, 0.9])) == "no measured change (1.11x; 3 rounds 0.91-1.25x)"
    assert speed_text(timing([2.0, 2.0, 2.0], [1.0, 0.8, 1.25])) == "2.00x faster (3 rounds 1.60-2.50x)"
    assert speed_text({}) == ""
