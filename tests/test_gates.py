"""ablate.py mode=gates on a tiny_random checkpoint: a fit per penalty, its gates by Louizos et al.'s formulas, its
plan file evaluated again by mode=eval to the same records, W&B curves, and a fit killed mid-way resuming to the
uninterrupted gates."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from conftest import COMMON, ROOT, assert_one_error_line, run, wandb_log

GATES = ("mode=gates", "gates.max_examples=64", "data.batch_size=16", "gates.lr=0.3", "gates.checkpoint_every=5")


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_each_penalty_s_gates_and_plan_reproduce_in_mode_eval(trained, tmp_path):
    root, _ = trained
    out, checkpoint = tmp_path / "gates", f"ckpt_path={root / 'train'}"
    printed = run("ablate.py", *GATES, "gates.max_steps=30", "gates.lambdas=[0,0.5]", checkpoint,
                  f"hydra.run.dir={out}", "logger=wandb", cwd_tmp=root).stdout
    data = json.loads((out / "gates.json").read_text())
    table = pd.read_csv(out / "gates.csv")
    assert [fit["lambda"] for fit in data["fits"]] == [0, 0.5] and data["method"] == "l0"
    for fit in data["fits"]:
        log_alpha = np.array(fit["log_alpha"])
        saved = json.loads((out / "fits" / f"lambda_{fit['lambda']:g}" / "fit.json").read_text())
        assert saved["parameters"] == fit["log_alpha"] and saved["steps"] == fit["steps"] == 30
        assert not (out / "fits" / f"lambda_{fit['lambda']:g}" / "checkpoints").exists()  # finished: gone
        gates = np.clip(sigmoid(log_alpha) * 1.2 - 0.1, 0.0, 1.0)  # Louizos et al.: the test-time gate
        np.testing.assert_allclose(fit["gates"], gates, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(fit["open_probability"], sigmoid(log_alpha - 2 / 3 * np.log(0.1 / 1.1)),
                                   rtol=1e-12)
        assert fit["closed"] == [f"L{layer}H{head}" for layer, head in zip(*np.nonzero(gates == 0))]
        assert fit["heads_kept"] == 12 - len(fit["closed"])
        row = table[table["lambda"] == fit["lambda"]].iloc[0]
        assert row["heads_pruned"] == len(fit["closed"])
        assert row["delta"] == row["accuracy"] - row["baseline"] and row["ci_low"] <= row["delta"] <= row["ci_high"]
    free, penalised = data["fits"]
    assert len(penalised["closed"]) > len(free["closed"])  # the penalty closes heads the loss alone keeps

    # the penalty's plan file, as the printed command gives it to mode=eval: the same records, the same baseline
    plan = out / penalised["plan"]
    assert (f"python ablate.py mode=eval model=tiny_random task=demo_pairs data.max_eval_examples=40 "
            f"ckpt_path={root / 'train'} mask=prune mask.heads=cluster:closed mask.clusters={plan}") in printed
    labels = json.loads(plan.read_text())["labels"]
    assert sorted(h for h, state in labels.items() if state == "closed") == sorted(penalised["closed"])
    evaluated = tmp_path / "eval"
    run("ablate.py", "mode=eval", "mask=prune", "mask.heads=cluster:closed", f"mask.clusters={plan}", checkpoint,
        f"hydra.run.dir={evaluated}", cwd_tmp=root)
    result = json.loads((evaluated / "results.json").read_text())
    row = table[table["lambda"] == 0.5].iloc[0]
    assert result["metrics"]["validation"]["accuracy"] == row["accuracy"]
    assert result["metrics"]["validation"]["loss"] == row["loss"]
    assert result["baseline"]["validation"]["accuracy"] == row["baseline"]
    records = pd.read_parquet(out / "records.parquet")
    mine = records[records["penalty"] == 0.5].drop(columns=["penalty", "split"], errors="ignore")
    theirs = pd.read_parquet(evaluated / "records.parquet").drop(columns=["split"])
    pd.testing.assert_frame_equal(mine.sort_values("id").reset_index(drop=True)[theirs.columns],
                                  theirs.sort_values("id").reset_index(drop=True))

    log = wandb_log(out)  # the objective and open-gate curves of each fit, the table
    assert b"gates/lambda_0.5/expected_open" in log and b"gates/lambda_0/objective" in log
    assert b"gates.table.json" in log
    # the statistics' settings count: the job runs again, its finished fits are taken as they are
    stamps = {path: path.stat().st_mtime_ns for path in out.glob("fits/*/fit.json")}
    run("ablate.py", *GATES, "gates.max_steps=30", "gates.lambdas=[0,0.5]", checkpoint, "report.resamples=3000",
        f"hydra.run.dir={out}", "logger=none", cwd_tmp=root)
    assert json.loads((out / "results.json").read_text())["config"]["report"]["resamples"] == 3000
    assert {path: path.stat().st_mtime_ns for path in out.glob("fits/*/fit.json")} == stamps and len(stamps) == 2
    # a finished fit edited by hand is no fit's: another penalty beside it reruns the job, and the edited one refits
    edited = out / "fits/lambda_0/fit.json"
    record = json.loads(edited.read_text())
    record["parameters"][0][1] = 5.0
    edited.write_text(json.dumps(record))
    printed = run("ablate.py", *GATES, "gates.max_steps=30", "gates.lambdas=[0,0.7]", checkpoint,
                  f"hydra.run.dir={out}", "logger=none", cwd_tmp=root).stdout
    assert f"note: {edited} is not the file its fit wrote" in printed
    assert sorted(path.name for path in out.glob("heads_lambda_*.json")) == ["heads_lambda_0.7.json",
                                                                            "heads_lambda_0.json"]  # 0.5's went
    assert json.loads(edited.read_text())["parameters"] == data["fits"][0]["log_alpha"]  # the fit's own again


def test_a_gate_fit_killed_mid_way_resumes_to_the_uninterrupted_gates(trained, tmp_path):
    root, _ = trained
    settings = (*GATES, "gates.max_steps=60", "gates.lambdas=[0.05]", f"ckpt_path={root / 'train'}", "logger=none")
    run("ablate.py", *settings, f"hydra.run.dir={tmp_path / 'whole'}", cwd_tmp=root)
    killed = tmp_path / "killed"
    command = [sys.executable, str(ROOT / "ablate.py"), *COMMON, f"data.cache_dir={root / 'cache'}",
               f"baseline_dir={root / 'baselines'}", *settings, f"hydra.run.dir={killed}"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = killed / "fits/lambda_0.05/checkpoints/last.ckpt"
    while not last.exists() and process.poll() is None:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "results.json").exists() and not (killed / "fits/lambda_0.05/fit.json").read_text().count(
        '"complete": true')
    printed = run("ablate.py", *settings, f"hydra.run.dir={killed}", cwd_tmp=root).stdout
    assert "resuming the gate fit" in printed
    whole, resumed = (json.loads((folder / "gates.json").read_text())["fits"][0]["log_alpha"]
                      for folder in (tmp_path / "whole", killed))
    assert resumed == whole


@pytest.mark.parametrize(("record", "expected"), [
    ({"model": "tiny_random", "checkpoint": {"trained_by": "0123abcd"}},
     "learned on the weights of train.py job 0123abcd; ckpt_path="),
    ({"model": "minilm", "checkpoint": {}}, "is a job of model minilm; this job's model is tiny_random"),
    ({"model": "tiny_random", "checkpoint": {}, "twice": True}, "names two gates.method=l0 jobs")])
def test_learned_measures_of_other_weights_are_refused_before_the_model_loads(trained, tmp_path, record, expected):
    """importance.learned naming a gates job of another train.py job (by its hash) or another model, or two jobs of
    one method: one error line, before any data is read (the weights' own hashes are compared again after they
    load)."""
    root, _ = trained
    twice = record.pop("twice", False)  # a second L0 job beside it: their measures would share a name
    jobs = [tmp_path / "gates_other", tmp_path / "gates_second"][:1 + twice]
    for other in jobs:
        other.mkdir()
        (other / "results.json").write_text(json.dumps({"kind": "gates", "complete": True, "method": "l0", **record}))
    learned = ",".join(map(str, jobs))
    result = run("ablate.py", "mode=importance", f"importance.sweep={tmp_path}", f"importance.learned=[{learned}]",
                 f"ckpt_path={root / 'train'}", f"hydra.run.dir={tmp_path / 'out'}", cwd_tmp=tmp_path, check=False)
    assert_one_error_line(result, expected)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "out").exists()


def test_a_model_at_chance_is_warned_about_before_the_fits(tmp_path):
    """Two steps of fine-tuning leave the tiny model at chance (accuracy 0.5 on demo_pairs' balanced validation): the
    gates job says so before it fits."""
    run("train.py", "data.batch_size=16", "data.max_train_examples=64", "trainer.max_steps=2",
        f"hydra.run.dir={tmp_path / 'train'}", cwd_tmp=tmp_path)
    chance = run("ablate.py", *GATES, "gates.lambdas=[0.1]", "gates.max_steps=1", f"ckpt_path={tmp_path / 'train'}",
                 f"hydra.run.dir={tmp_path / 'gates'}", cwd_tmp=tmp_path)
    output = chance.stdout + chance.stderr
    assert "the model scores accuracy 0.5 on validation, no better than chance (0.5)" in output
    assert output.index("no better than chance") < output.index("gate fit 1 of 1")


def test_causal_head_gating_classes_stability_and_plans(trained, tmp_path):
    """gates.method=chg: two fits of three stages; every head's class from its G+ and G- (the sigmoid of each stage's
    logits, averaged over the fits) by Nam et al.'s rule, the stability by hand, a class's plan file in mode=eval."""
    root, _ = trained
    out, checkpoint = tmp_path / "chg", f"ckpt_path={root / 'train'}"
    run("ablate.py", *GATES, "gates.method=chg", "gates.max_steps=10", "gates.chg_fits=2", checkpoint,
        f"hydra.run.dir={out}", cwd_tmp=root)
    heads = pd.read_csv(out / "heads.csv")
    gates = {(k, stage): sigmoid(np.array(json.loads((out / f"fits/fit{k}/{stage}/fit.json").read_text())[
        "parameters"])) for k in range(2) for stage in ("free", "retain", "remove")}
    start = json.loads((out / "fits/fit1/retain/fit.json").read_text())
    assert start["steps"] == 10 and start["settings"]["chg_lambda"] == 0.1
    assert json.loads((out / "fits/fit1/remove/fit.json").read_text())["settings"]["chg_lambda"] == -0.1

    def classes(plus, minus):
        return np.where((plus >= 0.5) & (minus >= 0.5), "facilitating", np.where(
            (plus < 0.5) & (minus < 0.5), "interfering", np.where(plus >= 0.5, "irrelevant", "inconsistent")))

    plus = (gates[(0, "retain")] + gates[(1, "retain")]) / 2
    minus = (gates[(0, "remove")] + gates[(1, "remove")]) / 2
    np.testing.assert_allclose(heads["g_retain"], plus.ravel(), rtol=1e-12)
    np.testing.assert_allclose(heads["g_remove"], minus.ravel(), rtol=1e-12)
    assert list(heads["class"]) == list(classes(plus, minus).ravel())
    stable = ((classes(gates[(0, "retain")], gates[(0, "remove")]) == classes(plus, minus)) &
              (classes(gates[(1, "retain")], gates[(1, "remove")]) == classes(plus, minus)))
    record = json.loads((out / "chg.json").read_text())
    assert record["stability"] == stable.mean() and list(heads["stable"]) == list(stable.ravel())
    assert (plus >= minus).mean() > 0.5  # pushed toward 1, the gates end above where pushed toward 0

    table = pd.read_csv(out / "chg.csv")
    row = table.iloc[0]
    name = row["plan"].removeprefix("prune_")
    records = pd.read_parquet(out / "records.parquet")  # what the study's finding recomputes its CI from
    assert list(records["plan"].drop_duplicates().fillna("baseline")) == ["baseline", *table["plan"]]
    assert records[records["plan"] == row["plan"]]["loss"].mean() == pytest.approx(row["loss"], rel=1e-9)
    evaluated = tmp_path / "eval"
    run("ablate.py", "mode=eval", "mask=prune", f"mask.heads=cluster:{name}", f"mask.clusters={out / 'heads_chg.json'}",
        checkpoint, f"hydra.run.dir={evaluated}", cwd_tmp=root)
    result = json.loads((evaluated / "results.json").read_text())["metrics"]["validation"]
    # float32 sums of the same examples (the job ran the classes' plans in one pass): equal to ~1e-9
    assert result["loss"] == pytest.approx(row["loss"], rel=1e-6) and row["heads"] == (heads["class"] == name).sum()


def test_the_study_s_gates_stage_feeds_the_importance_agreement_and_the_report(trained, tmp_path):
    """study.stages with gates (not a default stage): a job per method, the robustness stage's optimal ablation with
    its constants, their learned measures in the importance stage's agreement with the sweep, a section of study.md,
    the three claims among the findings."""
    root, _ = trained
    folder = tmp_path / "study"
    run("ablate.py", "study=quick", f"study.checkpoint={root / 'train'}",
        "study.stages=[features,cluster,sweep,robustness,gates,importance,report]", f"hydra.run.dir={folder}",
        cwd_tmp=root)
    # optimal beside prune, mean and resample: each head's loss change the gates job's optimal gap (the same 24)
    robust = json.loads((folder / "robustness/sweep_optimal/checkpoint/results.json").read_text())
    assert robust["config"]["mask"]["constants"] == str(folder / "gates/optimal/checkpoint/constants.json")
    gaps = pd.read_csv(folder / "gates/optimal/checkpoint/heads.csv").set_index("head")["optimal_gap"]
    swept = np.array(robust["tables"]["validation"]["loss"]["delta"])  # [layers, heads]
    np.testing.assert_allclose(swept, gaps.to_numpy().reshape(swept.shape), atol=1e-6)
    assert (folder / "robustness/shapley_optimal/checkpoint/shapley.csv").is_file()
    for method in ("l0", "chg", "optimal"):
        assert json.loads((folder / f"gates/{method}/checkpoint/results.json").read_text())["method"] == method
    agreement = pd.read_csv(folder / "importance/checkpoint/agreement.csv")
    assert {"l0_gates", "chg_facilitation", "chg_interference", "optimal_gap"} <= set(agreement["estimator"])
    row = agreement[(agreement["estimator"] == "l0_gates") & (agreement["target"] == "loss increase")].iloc[0]
    sweep = json.loads((folder / "sweep/checkpoint/results.json").read_text())
    measured = np.array(sweep["tables"]["validation"]["loss"]["delta"])
    fits = json.loads((folder / "gates/l0/checkpoint/gates.json").read_text())["fits"]
    order = np.array([fit["gates"] for fit in fits]).sum(0)  # how long each head stays open over the penalties
    assert row["scores"] == "learned"
    assert row["spearman"] == scipy.stats.spearmanr(order.ravel(), measured.ravel()).statistic
    text = (folder / "study.md").read_text()
    assert "## Learned gates, causal head gating, optimal ablation" in text
    assert "under prune, mean, resample and optimal ablation" in text and "| Shapley, optimal " in text
    assert "(gates/chg/checkpoint/chg_heads.png)" in text and "Li & Janson 2024, optimal ablation" in text
    findings = json.loads((folder / "study.json").read_text())["findings"]
    assert {"voita_most_heads_pruned", "chg_irrelevant_removable", "li_janson_optimal_below_mean"} <= set(findings)


@pytest.mark.slow
def test_two_processes_fit_what_one_process_fits_with_their_rows(trained, tmp_path):
    """trainer=ddp, 2 gloo processes of batch 4 each: every step's 8 rows shared out as the sampler deals them, the
    step's L0 noise the same on both, the gradients averaged: the gates of one process of batch 8, to float
    rounding (one process of batch 4 ends 0.44 away: measured), and the pruned model's records of one process."""
    root, _ = trained
    overrides = ("mode=gates", "gates.lambdas=[0]", "gates.max_examples=32", "gates.lr=0.05", "gates.max_steps=6",
                 "data.max_eval_examples=24", "report.resamples=200", "report.permutations=200",
                 f"ckpt_path={root / 'train'}")
    run("ablate.py", *overrides, "data.batch_size=8", f"hydra.run.dir={tmp_path / 'one'}", cwd_tmp=root)
    run("ablate.py", *overrides, "data.batch_size=4", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
        "trainer.precision=32-true", f"hydra.run.dir={tmp_path / 'two'}", f"baseline_dir={tmp_path / 'baselines'}",
        cwd_tmp=root)
    one, two = (np.array(json.loads((tmp_path / name / "fits/lambda_0/fit.json").read_text())["parameters"])
                for name in ("one", "two"))
    assert np.abs(one).max() > 0.2  # the gates moved
    np.testing.assert_allclose(two, one, rtol=0, atol=1e-6)
    records = [pd.read_parquet(tmp_path / name / "records.parquet") for name in ("one", "two")]
    assert len(records[0]) == 48 and list(records[1]["example"]) == list(records[0]["example"])
    np.testing.assert_allclose(records[1]["loss"], records[0]["loss"], rtol=0, atol=1e-6)
