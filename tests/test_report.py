"""mode=report end to end over real tiny_random sweeps: the tidy table, statistics recomputed from the records
with scipy directly, the seeds' layouts, plots, W&B, missing jobs, several tasks in one directory, the API."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
import scipy.stats
from conftest import run
from sklearn.metrics import f1_score

import headlab
from headlab.reporting import layouts
from headlab.reporting.statistics import Resampling

COLUMNS = ["job", "experiment", "model", "task", "checkpoint", "seed", "plan", "rules", "policy", "unit",
           "renormalize", "split", "metric", "value", "baseline", "delta", "ci_low", "ci_high", "p_value",
           "p_adjusted", "n"]
FAST = ["report.resamples=400", "report.permutations=400"]
REPORT = "report-resamples-400+permutations-400"  # the report folder of these settings


def holm(p):
    order, m, out, running = np.argsort(p), len(p), np.empty(len(p)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def test_a_multirun_ends_with_its_report_and_the_statistics_equal_scipy(trained, tmp_path):
    root, train_result = trained
    sweep = tmp_path / "sweep"
    out = run("ablate.py", "-m", "mode=eval", "mask=prune", "mask.heads=L0,L1H0,L2", f"ckpt_path={root / 'train'}",
              f"hydra.sweep.dir={sweep}", *FAST, cwd_tmp=root)
    assert "| plan " in out.stdout and "prune_" not in out.stdout and "prune L1H0" in out.stdout  # the grid
    table = pd.read_parquet(sweep / REPORT / "table.parquet")
    assert set(COLUMNS) <= set(table.columns)
    assert len(table) == 3 * 3  # jobs x (accuracy, f1, loss) on the one eval split
    assert (table["seed"] == train_result["seed"]).all() and (table["heads"] == [4] * 3 + [1] * 3 + [4] * 3).all()
    assert pd.read_csv(sweep / REPORT / "table.csv").shape == table.shape

    # Each CI from scipy.stats.bootstrap on the job's and the baseline's records (same seed and batch).
    job = sweep / "eval" / table.loc[table["rules"] == "prune L1H0", "job"].iloc[0].removeprefix("eval/")
    mine = pd.read_parquet(job / "records.parquet")
    result = headlab.load_sweep(sweep, resampling=Resampling(400, 400))
    base_path = json.loads((job / "results.json").read_text())["baseline_records"]["validation"]
    base = pd.read_parquet(base_path)
    for metric, statistic in (("accuracy", lambda y, p: np.mean(y == p)), ("f1", f1_score)):
        reference = scipy.stats.bootstrap(
            (mine["label"], mine["prediction"], base["label"], base["prediction"]),
            lambda y1, p1, y0, p0, s=statistic: s(y1, p1) - s(y0, p0), paired=True, vectorized=False,
            n_resamples=400, batch=500, method="bca", rng=np.random.default_rng(0)).confidence_interval
        row = table[(table["rules"] == "prune L1H0") & (table["metric"] == metric)].iloc[0]
        if np.isfinite(reference.low):
            assert np.allclose([row["ci_low"], row["ci_high"]], [reference.low, reference.high], atol=1e-12)
        expected = statistic(mine["label"], mine["prediction"]) - statistic(base["label"], base["prediction"])
        assert abs(row["delta"] - expected) < 1e-12
    for metric in ("accuracy", "f1", "loss"):
        rows = table[table["metric"] == metric]
        np.testing.assert_allclose(rows["p_adjusted"], holm(rows["p_value"].to_numpy()))
    pd.testing.assert_frame_equal(result, table, check_dtype=False)
    # chance on the baseline's examples: the majority class's share; F1 of all 1; a loss has none
    share = float(np.mean(base["label"] == 1))
    chance = table.groupby("metric")["chance"].agg(["min", "max"])
    assert chance.loc["accuracy", "min"] == chance.loc["accuracy", "max"] == max(share, 1 - share)
    assert chance.loc["f1", "max"] == pytest.approx(2 * share / (1 + share))
    assert np.isnan(chance.loc["loss", "max"])

    # report.ci=simultaneous: each of the 3 plans' intervals at Bonferroni's level 1 - 0.05 / 3, as scipy computes it.
    # A plan whose resampled deltas never vary (scipy: NaN) has the point as its interval.
    joint = headlab.load_sweep(sweep, resampling=Resampling(400, 400, intervals="simultaneous"))
    compared = 0
    for rules in joint["rules"].unique():
        records = pd.read_parquet(sweep / "eval" / joint.loc[joint["rules"] == rules, "job"].iloc[0].removeprefix(
            "eval/") / "records.parquet")
        for metric, statistic in (("accuracy", lambda y1, p1, l1, y0, p0, l0: np.mean(y1 == p1) - np.mean(y0 == p0)),
                                  ("loss", lambda y1, p1, l1, y0, p0, l0: np.mean(l1) - np.mean(l0))):
            reference = scipy.stats.bootstrap(
                (records["label"], records["prediction"], records["loss"], base["label"], base["prediction"],
                 base["loss"]), statistic, paired=True, vectorized=False, n_resamples=400, batch=500, method="bca",
                confidence_level=1 - 0.05 / 3, rng=np.random.default_rng(0)).confidence_interval
            row = joint[(joint["rules"] == rules) & (joint["metric"] == metric)].iloc[0]
            if np.isfinite(reference.low):
                assert np.allclose([row["ci_low"], row["ci_high"]], [reference.low, reference.high], atol=1e-12)
                compared += 1
            else:
                assert row["ci_low"] == row["ci_high"] == row["delta"]
            assert row["ci_high"] - row["ci_low"] >= table.loc[row.name, "ci_high"] - table.loc[row.name, "ci_low"]
    assert compared >= 1
    np.testing.assert_array_equal(joint["p_adjusted"], table["p_adjusted"])  # the stars do not change

    # The seeds' layout and plots.
    caption, grid = (sweep / REPORT / "plans_validation.md").read_text().split("\n\n")  # what it shows, the table
    assert caption.startswith("tiny_random on demo_pairs, validation: value (delta [95% CI])")
    assert grid.count("\n") == 2 + 3 and "✗" in grid and "accuracy" in grid
    assert "\\begin{table}" in (sweep / REPORT / "plans_validation.tex").read_text()
    for name in ("bars_validation_accuracy.png", "bars_validation_f1.png"):
        assert (sweep / REPORT / name).stat().st_size > 5000

    # Missing pieces are listed, not dropped: a killed job, a job that never ran, lost records.
    jobs = sorted((sweep / "eval").iterdir())
    (jobs[0] / "results.json").unlink()
    shutil.rmtree(jobs[1])
    (jobs[2] / "records.parquet").unlink()
    run("ablate.py", "mode=demo", f"hydra.run.dir={sweep / 'demo'}",  # modes that write no results.json are no
        cwd_tmp=root)
    again = run("ablate.py", "mode=report", f"sweep_dir={sweep}", *FAST, f"hydra.run.dir={sweep / 'r'}",  # problem
                "report.confidence=0.9", "report.correction=bh", cwd_tmp=root)
    assert "value (delta [90% CI]); * / ** Benjamini-Hochberg-adjusted p < 0.05 / 0.01" in again.stdout
    assert "failed or was killed" in again.stdout and "never ran" in again.stdout
    assert "mask.heads=L1H0" in again.stdout  # the job that never ran, by its overrides
    other = sweep / "report-resamples-400+permutations-400+confidence-0.9+correction-bh"  # its settings' own folder
    problems = pd.read_csv(other / "problems.csv")
    assert len(problems) == 2
    table = pd.read_parquet(other / "table.parquet")
    assert len(table) == 3 and table["ci_low"].isna().all()
    assert table["note"].str.contains("records missing").all()


def test_a_head_sweep_report_has_its_heatmap_and_a_wandb_report_run(trained, tmp_path):
    root, _ = trained
    run("ablate.py", "mode=sweep_heads", "mask.policy=uniform", f"ckpt_path={root / 'train'}",
        f"hydra.run.dir={tmp_path / 'heads'}", cwd_tmp=root)
    run("ablate.py", "mode=report", f"sweep_dir={tmp_path / 'heads'}", "logger=wandb", *FAST,
        f"hydra.run.dir={tmp_path / 'r'}", cwd_tmp=root)
    report = tmp_path / "heads" / REPORT
    caption, grid = (report / "heads_single_head_uniform_validation.md").read_text().split("\n\n")
    assert caption == "tiny_random on demo_pairs, validation: accuracy delta per head (single_head uniform)"
    assert grid.count("\n") == 2 + 3 and "H3" in grid  # 3 layers x 4 heads
    assert (report / "heatmap_single_head_uniform_validation_accuracy.png").stat().st_size > 5000
    table = pd.read_parquet(report / "table.parquet")
    assert len(table) == 12 * 3 and set(table["layer"]) == {0, 1, 2} and set(table["head"]) == {0, 1, 2, 3}
    runs = list((report / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    log = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"report" in log and b"heatmap_single_head_uniform_validation_accuracy" in log


def test_jobs_of_two_tasks_in_one_directory_are_reported_separately(trained, tmp_path):
    root, _ = trained
    run("ablate.py", "mode=eval", "mask=prune", "mask.heads=L0", f"ckpt_path={root / 'train'}",
        f"hydra.run.dir={tmp_path / 'mixed/pairs'}", cwd_tmp=root)
    run("ablate.py", "mode=eval", "task=demo_qa", "task.max_length=64", "task.doc_stride=16", "mask=prune",
        "mask.heads=L0", "allow_random_head=true", f"hydra.run.dir={tmp_path / 'mixed/qa'}", cwd_tmp=root)
    run("ablate.py", "mode=report", f"sweep_dir={tmp_path / 'mixed'}", *FAST, f"hydra.run.dir={tmp_path / 'r'}",
        cwd_tmp=root)
    names = {p.name for p in (tmp_path / "mixed" / REPORT).iterdir()}
    assert any(n.startswith("demo_pairs_tiny_random_") and n.endswith("plans_validation.md") for n in names)
    assert any(n.startswith("demo_qa_tiny_random_") and n.endswith("plans_validation.md") for n in names)
    table = pd.read_parquet(tmp_path / "mixed" / REPORT / "table.parquet")
    assert set(table["task"]) == {"demo_pairs", "demo_qa"} and table["ci_low"].notna().all()
    qa = next((tmp_path / "mixed" / REPORT).glob("demo_qa_*plans_validation.md")).read_text()
    pairs = next((tmp_path / "mixed" / REPORT).glob("demo_pairs_*plans_validation.md")).read_text()
    header = qa.split("\n\n")[1].splitlines()[0]
    assert header.index("| f1") < header.index("| exact_match")  # SQuAD's main metric leads
    for task, metric, text, percent in (("demo_qa", "exact_match", qa, True), ("demo_qa", "f1", qa, True),
                                        ("demo_pairs", "f1", pairs, False)):
        values = table.loc[(table["task"] == task) & (table["metric"] == metric), "value"]
        smallest = values[values > 0].min()  # SQuAD's 2 decimals, [0, 1] scores' 4, or 2 significant digits
        digits = max(2 if percent else 4, 1 - int(np.floor(np.log10(smallest))) if smallest > 0 else 0)
        assert f"| {values.iloc[0]:.{digits}f} (" in text, (metric, text)


def test_two_fine_tuning_seeds_aggregate_and_plots_come_as_pdf_on_request(trained, tmp_path):
    root, _ = trained
    run("train.py", "data.batch_size=16", "data.max_train_examples=400", "trainer.max_steps=25",
        "trainer.val_check_interval=25", "optim.lr=2e-3", "seed=1", f"hydra.run.dir={tmp_path / 'train1'}",
        cwd_tmp=root)
    for name, checkpoint in (("seed0", root / "train"), ("seed1", tmp_path / "train1")):
        run("ablate.py", "mode=eval", "mask=prune", "mask.heads=L0", f"ckpt_path={checkpoint}",
            f"hydra.run.dir={tmp_path / 'seeds' / name}", cwd_tmp=root)
    run("ablate.py", "mode=report", f"sweep_dir={tmp_path / 'seeds'}", "report.formats=[png,pdf]", *FAST,
        f"hydra.run.dir={tmp_path / 'r'}", cwd_tmp=root)
    report = tmp_path / "seeds/report-resamples-400+permutations-400+formats-png+pdf"
    table = pd.read_parquet(report / "table.parquet")
    assert table["checkpoint"].nunique() == 2
    seeds = pd.read_csv(report / "seeds.csv")
    assert len(seeds) == 3 and (seeds["seeds"] == 2).all()  # accuracy, f1, loss
    for _, row in seeds.iterrows():
        deltas = table.loc[table["metric"] == row["metric"], "delta"].to_numpy()
        mean, sd = deltas.mean(), abs(deltas[0] - deltas[1]) / np.sqrt(2)  # sd of two values
        half = scipy.stats.t.ppf(0.975, 1) * sd / np.sqrt(2)
        assert np.allclose([row["delta_mean"], row["delta_std"], row["delta_ci_low"], row["delta_ci_high"]],
                           [mean, sd, mean - half, mean + half], atol=1e-12, equal_nan=True)
    readable = (report / "seeds.md").read_text()  # one row per plan, a metric per column, constant keys left out
    accuracy = seeds[seeds["metric"] == "accuracy"].iloc[0]
    cell = (f"{accuracy['value_mean']:.4f} ({accuracy['delta_mean']:+.4f} [{accuracy['delta_ci_low']:+.4f}, "
            f"{accuracy['delta_ci_high']:+.4f}])")
    header = readable.splitlines()[0]
    assert cell in readable and "| plan" in header and "| accuracy" in header and "demo_pairs" not in readable
    pdfs = list(report.glob("*.pdf"))
    assert pdfs and all(p.read_bytes().startswith(b"%PDF") and p.stat().st_size > 1000 for p in pdfs)
    # a figure per seed and metric (accuracy, f1), and the loss's where a plan scores at or below chance in the main
    # metric (accuracy): there it cannot tell plans apart, the loss still can
    at_chance = {checkpoint: bool(((rows["value"] <= rows["chance"]) & (rows["metric"] == "accuracy")).any())
                 for checkpoint, rows in table.groupby("checkpoint")}
    assert {p.stem for p in pdfs} == {p.stem for p in report.glob("*bars_*.png")}
    assert len(pdfs) == sum(3 if chance else 2 for chance in at_chance.values())
    assert sum(at_chance.values()) == len([p for p in pdfs if p.stem.endswith("_loss")])


@pytest.mark.parametrize(("values", "percent", "shown"), [([87.14, 41.0], True, ["87.14", "41.00"]),  # SQuAD's
                                                           ([0.0, 1.2], True, ["0.00", "1.20"]),  # EM 0, F1 1.2
                                                           ([0.8125, 0.5], False, ["0.8125", "0.5000"]),
                                                           ([5.21, 0.0049], False, ["5.2100", "0.0049"]),  # a loss
                                                           ([0.0, 0.3], False, ["0.0000", "0.3000"])])
def test_tables_keep_two_significant_digits_of_the_smallest_value(values, percent, shown):
    digits = layouts.decimals_for(pd.Series(values), percent)
    assert [f"{v:.{digits}f}" for v in values] == shown


def test_only_squad_scores_count_as_percent():
    squad = pd.DataFrame({"metric": ["exact_match", "f1", "loss", "has_ans_f1"]})
    glue = pd.DataFrame({"metric": ["accuracy", "f1", "loss"]})
    assert [layouts.in_percent(squad, m) for m in squad["metric"]] == [True, True, False, True]
    assert [layouts.in_percent(glue, m) for m in glue["metric"]] == [False, False, False]


def test_a_sweep_reports_its_own_jobs_and_a_folder_of_two_configurations_is_refused(trained, tmp_path):
    """Two sweeps into one folder that differ in data.max_eval_examples: each end-of-sweep report covers its own
    jobs; mode=report over both refuses to merge them (one plan per name, Holm within one configuration)."""
    from conftest import assert_one_error_line

    root, _ = trained
    sweep = tmp_path / "sweep"
    common = ["-m", "mode=eval", "mask=prune", f"ckpt_path={root / 'train'}", f"hydra.sweep.dir={sweep}", *FAST]
    run("ablate.py", *common, "mask.heads=L0,L1H0", cwd_tmp=root)
    run("ablate.py", *common, "mask.heads=L0,L2", "data.max_eval_examples=30", cwd_tmp=root)
    table = pd.read_parquet(sweep / REPORT / "table.parquet")  # the second sweep's report: its two jobs only
    assert sorted(table["rules"].unique()) == ["prune L0", "prune L2"] and (table["n"] == 30).all()
    assert len(table) == 2 * 3 and table["job"].str.contains("max_eval_examples-30").all()
    refused = run("ablate.py", "mode=report", f"sweep_dir={sweep}", *FAST, f"hydra.run.dir={tmp_path / 'r'}",
                  cwd_tmp=root, check=False)
    assert_one_error_line(refused, "data.max_eval_examples=30 vs 40")


def test_two_presets_swept_into_one_folder_keep_their_jobs_apart(trained, tmp_path):
    root, _ = trained
    sweep = tmp_path / "sweep"
    run("ablate.py", "-m", "experiment=single_head,single_head_uniform", "sweep.family=layer",
        f"ckpt_path={root / 'train'}", f"hydra.sweep.dir={sweep}", *FAST, cwd_tmp=root)
    jobs = sorted(p.parent for p in sweep.glob("sweep_heads/*/results.json"))
    assert [json.loads((job / "results.json").read_text())["config"]["mask"]["policy"] for job in jobs] == [
        "prune", "uniform"]
    assert [job.name.split("+")[1] for job in jobs] == ["experiment-single_head", "experiment-single_head_uniform"]
    run("ablate.py", "mode=report", f"sweep_dir={sweep}", *FAST, f"hydra.run.dir={tmp_path / 'r'}", cwd_tmp=root)
    table = pd.read_parquet(sweep / REPORT / "table.parquet")
    assert sorted(table.groupby("policy")["plan"].nunique().items()) == [("prune", 3), ("uniform", 3)]


def test_squad_v2_scores_of_a_group_without_questions_show_n_a(tmp_path):
    """Every evaluated question answerable: NoAns scores are undefined (the official script leaves them out). The
    rows keep NaN and say why (they read +0.00 [+0.00, +0.00], p = 1); HasAns rows are the plain means."""
    from headlab.reporting.records import write_records

    rng = np.random.default_rng(3)
    f1 = {"baseline": rng.uniform(0.3, 1.0, 50), "prune_L0": rng.uniform(0.0, 0.8, 50)}

    def rows(name):
        return [{"example": i, "id": f"q{i}", "split": "validation", "prediction": "x", "exact_match": float(v > 0.9),
                 "f1": v, "has_answer": True, "loss": 1 - v} for i, v in enumerate(f1[name])]

    base_records = write_records(tmp_path / "baseline.parquet", rows("baseline"))
    job = tmp_path / "sweep/prune_L0"
    write_records(job / "records.parquet", rows("prune_L0"))
    metrics = {name: {"f1": 100 * v.mean(), "exact_match": 100 * (v > 0.9).mean(), "has_ans_f1": 100 * v.mean(),
                      "no_ans_f1": float("nan")} for name, v in f1.items()}
    (job / "results.json").write_text(json.dumps({
        "kind": "eval", "complete": True, "mode": "eval", "group": "adhoc", "model": "m", "task": "squad_v2",
        "checkpoint": {"weights_hash": "w"}, "seed": 0, "plan_name": "prune_L0",
        "plan": {"rules": [{"heads": "L0", "policy": "prune"}], "policies": {"L0H0": "prune"}},
        "policy": "prune", "unit": "sentence", "renormalize": False,
        "metrics": {"validation": metrics["prune_L0"]}, "baseline": {"validation": metrics["baseline"]},
        "delta": {"validation": {k: metrics["prune_L0"][k] - metrics["baseline"][k] for k in metrics["baseline"]}},
        "num_examples": {"validation": 50}, "records": "records.parquet",
        "baseline_records": {"validation": str(base_records)},
        "config": {"mode": "eval", "data": {"max_eval_examples": None}}}))
    table = headlab.load_sweep(tmp_path / "sweep", resampling=Resampling(400, 400)).set_index("metric")
    assert np.isnan(table.loc["no_ans_f1", ["value", "delta", "p_value"]].astype(float)).all()
    assert table.loc["no_ans_f1", "note"].startswith("n/a: no_ans_f1 is undefined here (no question of its group")
    assert table.loc["has_ans_f1", "delta"] == pytest.approx(100 * (f1["prune_L0"].mean() - f1["baseline"].mean()))
    assert table.loc["has_ans_f1", "value"] == pytest.approx(100 * f1["prune_L0"].mean())


@pytest.mark.parametrize("field, value", [
    ("metrics", {"validation": "oops"}), ("num_examples", {"validation": "50"}), ("baseline", {}),
    ("delta", {"validation": {"f1": 0.1}}), ("plan", "prune L0"), ("checkpoint", {}), ("records", None)])
def test_a_results_file_with_a_field_of_another_type_is_a_problem_not_a_traceback(tmp_path, field, value):
    """A results.json edited by hand that parses and has every key: listed in problems.csv (was AttributeError)."""
    from headlab.reporting.sweep_jobs import collect_results

    metrics = {"accuracy": 0.5, "loss": 0.7}
    result = {"kind": "eval", "complete": True, "mode": "eval", "group": "adhoc", "model": "m", "task": "t",
              "checkpoint": {"weights_hash": "w"}, "seed": 0, "plan_name": "prune_L0",
              "plan": {"rules": [{"heads": "L0", "policy": "prune"}], "policies": {"L0H0": "prune"}},
              "policy": "prune", "unit": "sentence", "renormalize": False, "metrics": {"validation": metrics},
              "baseline": {"validation": metrics}, "delta": {"validation": {"accuracy": 0.0, "loss": 0.0}},
              "num_examples": {"validation": 50}, "records": "records.parquet",
              "baseline_records": {"validation": "baseline.parquet"}, "config": {"mode": "eval"}}
    (tmp_path / "job").mkdir()
    (tmp_path / "job/results.json").write_text(json.dumps(result))
    assert len(collect_results(tmp_path)[0]) == 1
    (tmp_path / "job/results.json").write_text(json.dumps({**result, field: value}))
    results, problems = collect_results(tmp_path)
    assert not results and problems[0].job == "job"
    assert problems[0].reason.startswith("results.json is not one of ablate.py's evaluations (its ")


def test_one_plan_name_twice_in_a_folder_is_refused(tmp_path):
    from headlab.errors import UserError
    from headlab.reporting.sweep_table import check_one_configuration

    def job(name, clusters):
        return {"mode": "eval", "model": "m", "task": "t", "checkpoint": {"weights_hash": "w"}, "plan_name": name,
                "config": {"mode": "eval", "mask": {"clusters": clusters}, "data": {"max_eval_examples": 40}}}

    a, b = tmp_path / "a/results.json", tmp_path / "b/results.json"
    check_one_configuration(tmp_path, [(a, job("prune_dense", "x.json")), (b, job("prune_vertical", "x.json"))])
    with pytest.raises(UserError, match="plan 'prune_dense' of m on t twice"):  # the same preset, other clusters
        check_one_configuration(tmp_path, [(a, job("prune_dense", "x.json")), (b, job("prune_dense", "y.json"))])


@pytest.mark.parametrize("change, expected", [
    ({"task": {"data_files": {"validation": "train.jsonl"}}}, "task.data_files.validation='validation.jsonl' vs "
                                                               "'train.jsonl'"),
    ({"task": {"max_length": 24}}, "task.max_length=128 vs 24"),
    ({"model": {"config": {"hidden_act": "relu"}}}, "model.config.hidden_act"),
    ({"model_hash": "other"}, "model hash (weights and config)='m1' vs 'other'"),
])
def test_jobs_of_one_task_name_on_other_data_or_another_model_config_are_refused(tmp_path, change, expected):
    """A job evaluated on another validation file (or other max_length) under the same task and split name went into
    the same table and Holm family with its own baseline (task.* keys were exempt); so did a model whose config
    differs from the same weights'. The splits evaluated may differ (each split is its own table)."""
    from headlab.errors import UserError
    from headlab.reporting.sweep_table import check_one_configuration

    def job(name, change=None):
        change = change or {}
        config = {"mode": "eval", "data": {"max_eval_examples": 40},
                  "task": {"name": "t", "data_files": {"validation": "validation.jsonl"}, "max_length": 128,
                           "eval_splits": ["validation"], **change.get("task", {})},
                  "model": {"name": "m", "name_or_path": "/m", **change.get("model", {})}}
        return {"mode": "eval", "model": "m", "task": "t", "plan_name": name, "config": config,
                "checkpoint": {"weights_hash": "w", "model_hash": change.get("model_hash", "m1")}}

    a, b = tmp_path / "a/results.json", tmp_path / "b/results.json"
    check_one_configuration(tmp_path, [(a, job("prune_L0")), (b, job("prune_L1"))])
    splits = job("prune_L1", {"task": {"eval_splits": ["validation", "test"]}})
    check_one_configuration(tmp_path, [(a, job("prune_L0")), (b, splits)])
    older = job("prune_L1")  # written before the model hash was recorded: compared by its config alone
    del older["checkpoint"]["model_hash"]
    check_one_configuration(tmp_path, [(a, job("prune_L0")), (b, older)])
    with pytest.raises(UserError, match=re.escape(expected)):
        check_one_configuration(tmp_path, [(a, job("prune_L0")), (b, job("prune_L1", change))])


def test_an_undefined_metric_shows_n_a_and_is_never_starred(tmp_path):
    """Constant predictions: Pearson's r is undefined (scipy: NaN). The row keeps NaN with a note, its p-value is
    NaN and out of the Holm family, and the plan grid shows n/a (it showed a delta of -0.73, p = 0.0002, starred)."""
    from headlab.reporting.records import write_records

    rng = np.random.default_rng(0)
    label = rng.uniform(0, 5, 60).round(1)
    predictions = {"baseline": label + rng.normal(0, 0.5, 60), "constant": np.full(60, 2.5),
                   "noisy": label + rng.normal(0, 3.0, 60)}
    base_records = write_records(tmp_path / "baseline.parquet", [
        {"example": i, "split": "validation", "label": y, "prediction": p}
        for i, (y, p) in enumerate(zip(label, predictions["baseline"]))])
    r = {name: float(np.corrcoef(p, label)[0, 1]) if name != "constant" else float("nan")
         for name, p in predictions.items()}
    for name in ("constant", "noisy"):
        job = tmp_path / "sweep" / name
        write_records(job / "records.parquet", [{"example": i, "split": "validation", "label": y, "prediction": p}
                                                for i, (y, p) in enumerate(zip(label, predictions[name]))])
        (job / "results.json").write_text(json.dumps({
            "kind": "eval", "complete": True, "mode": "eval", "group": "adhoc", "model": "m", "task": "stsb",
            "checkpoint": {"weights_hash": "w"}, "seed": 0, "plan_name": name,
            "plan": {"rules": [{"heads": "L0", "policy": "prune"}], "policies": {"L0H0": "prune"}},
            "policy": "prune", "unit": "sentence", "renormalize": False,
            "metrics": {"validation": {"pearson": r[name]}}, "baseline": {"validation": {"pearson": r["baseline"]}},
            "delta": {"validation": {"pearson": r[name] - r["baseline"]}}, "num_examples": {"validation": 60},
            "records": "records.parquet", "baseline_records": {"validation": str(base_records)},
            "config": {"mode": "eval", "data": {"max_eval_examples": None}}}))
    table = headlab.load_sweep(tmp_path / "sweep", resampling=Resampling(400, 400)).set_index("plan")
    assert np.isnan(table.loc["constant", ["value", "delta", "p_value", "p_adjusted"]].astype(float)).all()
    assert table.loc["constant", "note"].startswith("n/a: pearson is undefined")
    assert table.loc["noisy", "p_adjusted"] == table.loc["noisy", "p_value"]  # a family of one: Holm leaves it
    grid = layouts.plan_grid(table.reset_index(), "validation", ["pearson"]).to_string()
    assert "n/a" in grid and "*" not in grid.split("n/a")[0].splitlines()[-1]


def test_a_plan_whose_records_are_unreadable_still_counts_in_its_holm_family(tmp_path):
    """Three plans tested, one job's records truncated: its delta stays (without CI or p) and the other two are
    adjusted as one of three (they were adjusted as one of two: smaller p than the full sweep's)."""
    from headlab.reporting.records import write_records

    rng = np.random.default_rng(1)
    label = rng.integers(0, 2, 80)
    right = {"baseline": rng.random(80) < 0.9, "a": rng.random(80) < 0.6, "b": rng.random(80) < 0.7,
             "c": rng.random(80) < 0.8}
    rows = lambda name: [{"example": i, "split": "validation", "label": int(y), "prediction": int(y if ok else 1 - y)}  # noqa: E731
                         for i, (y, ok) in enumerate(zip(label, right[name]))]
    base_records = write_records(tmp_path / "baseline.parquet", rows("baseline"))
    for name in ("a", "b", "c"):
        job = tmp_path / "sweep" / name
        write_records(job / "records.parquet", rows(name))
        accuracy = {key: float(right[key].mean()) for key in (name, "baseline")}
        (job / "results.json").write_text(json.dumps({
            "kind": "eval", "complete": True, "mode": "eval", "group": "adhoc", "model": "m", "task": "t",
            "checkpoint": {"weights_hash": "w"}, "seed": 0, "plan_name": name,
            "plan": {"rules": [{"heads": "L0", "policy": "prune"}], "policies": {"L0H0": "prune"}},
            "policy": "prune", "unit": "sentence", "renormalize": False,
            "metrics": {"validation": {"accuracy": accuracy[name]}},
            "baseline": {"validation": {"accuracy": accuracy["baseline"]}},
            "delta": {"validation": {"accuracy": accuracy[name] - accuracy["baseline"]}},
            "num_examples": {"validation": 80}, "records": "records.parquet",
            "baseline_records": {"validation": str(base_records)},
            "config": {"mode": "eval", "data": {"max_eval_examples": None}}}))
    whole = headlab.load_sweep(tmp_path / "sweep", resampling=Resampling(400, 400)).set_index("plan")
    records = tmp_path / "sweep/c/records.parquet"
    records.write_bytes(records.read_bytes()[:100])
    cut = headlab.load_sweep(tmp_path / "sweep", resampling=Resampling(400, 400)).set_index("plan")
    assert cut.loc["c", "note"].startswith("per-example records missing") and np.isnan(cut.loc["c", "p_adjusted"])
    assert cut.loc["c", "delta"] == whole.loc["c", "delta"]
    p = whole.loc[["a", "b"], "p_value"].to_numpy()
    assert (cut.loc[["a", "b"], "p_value"].to_numpy() == p).all()
    expected = holm(np.append(p, 1.0))[:2]  # c counted, as p = 1
    assert cut.loc[["a", "b"], "p_adjusted"].to_numpy() == pytest.approx(expected)
    assert (expected > holm(p)).any()  # (the test can tell a family of two from one of three)


def test_the_report_line_counts_its_jobs():
    from pathlib import Path

    from headlab.reporting.report import Report

    assert Report(pd.DataFrame({"job": ["a", "a"]}), Path("out")).summary() == "report of 1 job -> out"
    assert Report(pd.DataFrame({"job": ["a", "b"]}), Path("out")).summary() == "report of 2 jobs -> out"


def test_the_changed_heads_are_listed_in_layer_and_head_order():
    """Sorted as text they read L2H0,L2H1,L2H10,L2H11,L2H2."""
    import pathlib

    from headlab.reporting.sweep_table import _job_rows

    policies = {f"L{layer}H{head}": "prune" for layer, head in ((2, 10), (2, 2), (10, 0), (2, 0), (3, 1))}
    result = {"mode": "eval", "config": {"task": {"main_metric": "accuracy"}}, "plan_name": "p", "group": "g",
              "model": "m", "task": "t", "checkpoint": {"weights_hash": "w"}, "seed": 0,
              "plan": {"rules": [{"heads": sorted(policies), "policy": "prune"}], "policies": policies},
              "policy": "prune", "unit": "sentence", "renormalize": False}
    result |= {"metrics": {"v": {"a": 1.0}}, "baseline": {"v": {"a": 1.0}}, "delta": {"v": {"a": 0.0}},
               "num_examples": {"v": 1}, "records": "r", "baseline_records": {"v": "b"}}
    (row,) = _job_rows(pathlib.Path("/r"), pathlib.Path("/r/job/results.json"), result)
    assert row["changed"] == "L2H0,L2H2,L2H10,L3H1,L10H0"


def test_the_plan_grid_marks_every_column_a_rule_reaches_and_sorts_blocks_by_number():
    """``prune L0,L1,L2`` beside a random set's ``prune L0H0,L3H1``: column L0H0 read ✓ (keep) for the plan that
    prunes all of layer 0, and L0 read ✓ for the set that prunes one of its heads; head columns came in the order
    first seen (L3H1 before L0H0) and random10 before random2."""
    plans = [("layers", "prune L0,L1,L2"), ("random2", "prune L3H1,L0H0"), ("random10", "prune L0H0-1; uniform L1")]
    frame = pd.DataFrame([{"split": "validation", "family": "random" if plan.startswith("random") else "",
                           "plan": plan, "rules": rules, "metric": "accuracy", "value": 0.5, "heads": 3,
                           "delta": -0.1, "ci_low": np.nan, "ci_high": np.nan, "p_adjusted": np.nan, "task": "t"}
                          for plan, rules in plans])
    grid = layouts.plan_grid(frame, "validation", ["accuracy"]).set_index("plan")
    assert list(grid.columns[1:-1]) == ["L0", "L0H0", "L0H0-1", "L1", "L2", "L3H1"]
    assert grid.loc["layers", ["L0", "L0H0", "L0H0-1", "L1", "L2", "L3H1"]].tolist() == ["✗", "✗", "✗", "✗", "✗", "✓"]
    assert grid.loc["random2", ["L0", "L0H0", "L0H0-1", "L1", "L3H1"]].tolist() == [
        "✗ (part)", "✗", "✗ (part)", "✓", "✗"]
    assert grid.loc["random10", ["L0", "L0H0", "L0H0-1", "L1", "L3H1"]].tolist() == [
        "✗ (part)", "✗", "✗", "1/L", "✓"]
    heads = [("all", "prune all"), ("column", "prune H1"), ("layer", "prune L0"), ("head", "prune L2H1")]
    frame = pd.DataFrame([{"split": "validation", "family": "", "plan": plan, "rules": rules, "metric": "accuracy",
                           "value": 0.5, "heads": 3, "delta": -0.1, "ci_low": np.nan, "ci_high": np.nan,
                           "p_adjusted": np.nan, "task": "t"} for plan, rules in heads])
    grid = layouts.plan_grid(frame, "validation", ["accuracy"]).set_index("plan")
    assert list(grid.columns[1:-1]) == ["all", "H1", "L0", "L2H1"]  # every layer before layer 0
    assert grid.loc["all"].tolist()[1:-1] == ["✗", "✗", "✗", "✗"]
    assert grid.loc["column"].tolist()[1:-1] == ["✗ (part)", "✗", "✗ (part)", "✗"]  # H1 reaches L0H1 and L2H1
    assert grid.loc["layer"].tolist()[1:-1] == ["✗ (part)", "✗ (part)", "✗", "✓"]
    assert grid.loc["head"].tolist()[1:-1] == ["✗ (part)", "✗ (part)", "✓", "✗"]
    from headlab.reporting.sweep_table import natural_key

    assert sorted(["random10", "random2", "baseline"], key=natural_key) == ["baseline", "random2", "random10"]


def test_zero_width_intervals_draw_without_negative_error_bars(tmp_path):
    """A penalty that changed no score: its CI's ends differ from its value by rounding (-8.9e-16, as on the tiny
    model's demo_qa), which matplotlib refused as a negative error bar; the bars are the distances, clipped at 0."""
    from headlab.reporting.plots import error_bars, gates_curve

    value = 4.4923
    low, high = value + 8.9e-16, value - 8.9e-16  # both ends on the wrong side of the value by a rounding error
    np.testing.assert_array_equal(error_bars([value, 2.0, 1.0], [low, 1.5, np.nan], [high, 2.25, np.nan]),
                                  [[0.0, 0.5, 0.0], [0.0, 0.25, 0.0]])
    points = pd.DataFrame({"lambda": [0.01], "heads_pruned": [6], "f1": [value], "ci_low": [low], "ci_high": [high],
                           "baseline": [value]})
    paths = gates_curve(points, "f1", "zero width", tmp_path / "curve")
    assert paths[0].stat().st_size > 1000
