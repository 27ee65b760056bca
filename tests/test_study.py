"""``python ablate.py`` (mode=study) end to end on the tiny BERT and demo_qa, shortened by ``conf/study/quick.yaml``:
every stage's files, every number of study.md against the stage file it comes from, a rerun that skips every
stage, a killed study that resumes to the same numbers, a changed setting that reruns only what depends on it;
bad input as one error line before any stage runs."""

from __future__ import annotations

import atexit
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, assert_one_error_line, in_parallel
from forked import HANG_GUARD, run_script

pytestmark = pytest.mark.slow
STAGES = ["finetune", "features", "cluster", "syntax", "compare", "tables", "controls", "refits", "sweep",
          "robustness", "importance", "prune_curve", "report"]
REPORT = "report-resamples-2000+permutations-2000"  # the tables' and sweep's report folder: study=quick's statistics


def command(folder: Path, *overrides: str) -> list[str]:
    """The quick study of the tiny BERT on demo_qa, without W&B unless ``overrides`` name a logger (its offline runs
    cost a fifth of a study's time; the ``finished`` study keeps them, and its test reads them)."""
    task = [] if any(word.startswith("task=") for word in overrides) else ["task=demo_qa"]
    logger = [] if any(word.startswith("logger=") for word in overrides) else ["logger=none"]
    return [sys.executable, str(ROOT / "ablate.py"), "model=tiny_random", "study=quick", *task, *logger,
            f"data.cache_dir={folder.parent / 'cache'}", f"baseline_dir={folder.parent / 'baselines'}",
            f"hydra.run.dir={folder}", *overrides]


EMPTY_HF_HOME = tempfile.mkdtemp(prefix="headlab-empty-hf-")  # one for the module: its runs share a fork server
atexit.register(shutil.rmtree, EMPTY_HF_HOME, True)


def environment() -> dict[str, str]:
    """Offline, with an empty Hugging Face cache."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "HF_HOME": EMPTY_HF_HOME}


def study(folder: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    result = run_script(command(folder, *overrides), cwd=ROOT, env=environment(),
                            capture_output=True, text=True, timeout=HANG_GUARD)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    folder = tmp_path_factory.mktemp("study") / "study"
    result = study(folder, "logger=wandb")
    return folder, result.stdout + result.stderr


def skipped(out: str, number: int, stage: str) -> bool:
    """Whether the study said stage ``number`` is done, or has nothing to run (the refits of numbered clusters)."""
    return re.search(rf"^\[{number}/13\] {stage}: (skipped, done|nothing to run, )", out, re.M) is not None


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "study.json").read_text())


def markdown_table(text: str, after: str) -> pd.DataFrame:
    """The first markdown table after the line containing ``after``, as strings."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line)
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return pd.DataFrame(rows[2:], columns=rows[0])


def test_every_stage_writes_its_files_and_the_report_lists_them(finished):
    folder, out = finished
    for path in ["finetune/seed0/results.json", "finetune/seed0/model/config.json",
                 "features/pretrained/features.npz", "features/seed0/features.npz",
                 "cluster/pretrained/clusters.json", "cluster/seed0/clusters.json", "cluster/seed0/types_per_layer.png",
                 "compare/seed0/ari.csv", "compare/seed0/transitions.md", "syntax/pretrained/syntax.csv",
                 "syntax/seed0/syntax.md", "syntax/seed0/syntax_examples.png",
                 "tables/table2/seed0/baseline/results.json", f"tables/table2/seed0/{REPORT}/plans_validation.md",
                 f"tables/table3/seed0/{REPORT}/table.csv", f"tables/table3_renormalized/seed0/{REPORT}/table.csv",
                 "sweep/seed0/deltas_validation.csv", "sweep/seed0/L2H3/results.json",
                 f"sweep/seed0/{REPORT}/table.csv", "importance/seed0/importance.json",
                 "importance/seed0/agreement.csv",
                 "prune_curve/seed0/prune_curve.csv", "prune_curve/seed0/prune_curve.png", "study.md", "study.json"]:
        assert (folder / path).is_file(), path
    assert not (folder / f"tables/table2/seed0/{REPORT}/curve_validation_f1.png").exists()  # types are not a dose
    renormalized = pd.read_csv(folder / f"tables/table3_renormalized/seed0/{REPORT}/table.csv")
    assert renormalized["renormalize"].all() and renormalized["unit"].eq("sentence").all()
    text = (folder / "study.md").read_text()
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (folder / link).is_file(), link
    listed = text.split("## Files")[1]
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if path.is_file() and relative.parts[0] != "wandb" and not any(p.startswith(".") for p in relative.parts):
            alike = re.escape(str(relative.parent.parent)) + r"/\{\d+ folders: [^}]+\}/" + re.escape(relative.name)
            assert str(relative) in listed or re.search(alike, listed), relative  # folders of many plans: one line
    assert re.search(r"wandb/\{\d+ offline runs", listed)
    for number, stage in enumerate(STAGES, start=1):
        assert f"[{number}/13] {stage}: " in out
    left = r"; (about \d+ minutes? left|less than a minute left)$"  # the study's estimate from the first stage on
    assert re.search(r"^\[1/13\] finetune: done in .*" + left, out, re.M), out
    assert not re.search(r"^\[12/13\] prune_curve: done in .*" + left, out, re.M)  # nothing left after it
    assert re.search(r"study done in \d+:\d\d:\d\d: .*study\.md", out)
    runs = len(list(folder.glob("wandb/offline-run-*")))  # W&B: one line a run, then how to upload them all
    assert "wandb:" not in out and len(re.findall(r"^W&B: run \S+ in ", out, re.M)) == runs > 20
    assert out.count("wandb sync") == 1
    runs = b"".join(path.read_bytes() for path in folder.glob("wandb/offline-run-*/*.wandb"))
    assert b"table2_seed0" in runs and b"cluster_seed0_types_per_layer" in runs  # the report's run


def test_study_md_numbers_equal_the_stage_files(finished):
    folder, _ = finished
    text = (folder / "study.md").read_text()
    results = json.loads((folder / "finetune/seed0/results.json").read_text())
    trained = results["metrics"]["validation"]
    base = markdown_table(text, "## Baseline").iloc[0]
    for metric in ("exact_match", "f1", "loss"):
        assert float(base[metric]) == pytest.approx(trained[metric], abs=5e-5)
    assert int(base["examples"]) == results["num_evaluated"]["validation"] == 24  # the fine-tuning's, not the tables'

    for table in ("table2", "table3", "table3_renormalized"):
        grid = markdown_table(text, f"tables/{table}/seed0/{REPORT}/plans_validation.md")
        tidy = pd.read_csv(folder / f"tables/{table}/seed0/{REPORT}/table.csv")
        assert len(grid) == tidy["plan"].nunique()
        for row in grid.itertuples():
            for metric in ("f1", "exact_match"):
                value = float(getattr(row, metric).split()[0])
                expected = tidy[(tidy["plan"] == row.plan) & (tidy["metric"] == metric)]["value"].item()
                assert value == pytest.approx(expected, abs=0.005 + 1e-9), (table, row.plan, metric)

    types = markdown_table(text, "Stability: the share").set_index("model")
    for name in ("pretrained", "seed0"):
        result = json.loads((folder / f"cluster/{name}/results.json").read_text())
        assert float(types.loc[name, "stability"]) == pytest.approx(result["stability"], abs=5e-5)
        assert types.loc[name, "types"] == ", ".join(f"{k} {v}" for k, v in result["counts"].items())

    compared = json.loads((folder / "compare/seed0/results.json").read_text())
    ari = compared["ari"]["pre-trained vs fine-tuned"]
    assert float(re.search(r"pre-trained vs fine-tuned (-?\d+\.\d+)", text).group(1)) == pytest.approx(ari, abs=5e-5)
    roles = markdown_table(text, "`compare/seed0/roles.md`").set_index("role")  # the syntax stage ran before it
    assert {"local", "syntactic", "nsubj"} <= set(roles.index)
    for role, counts in compared["roles"].items():
        assert [int(roles.loc[role, run]) for run in ("pre-trained", "fine-tuned")] == list(counts.values())

    for name in ("pretrained", "seed0"):
        best = pd.read_csv(folder / f"syntax/{name}/syntax.csv")
        shown = markdown_table(text, f"; `syntax/{name}/syntax.csv`")
        assert list(shown["relation"]) == list(best["relation"])
        assert [float(v) for v in shown["accuracy"]] == pytest.approx(list(100 * best["accuracy"]), abs=0.05 + 1e-9)
        assert list(shown["head"]) == [f"{h} ({d})" + (f", 1 of {n} tied" if n > 1 else "")
                                       for h, d, n in zip(best["head"], best["direction"], best["tied"])]
    assert summary_of(folder)["syntax"]["seed0"]["all"]["accuracy"] == best.set_index("relation").loc["all",
                                                                                                      "accuracy"]

    scores = np.asarray(json.loads((folder / "importance/seed0/importance.json").read_text())["importance"])
    flat = sorted((-scores[layer, head], layer, head) for layer in range(3) for head in range(4))[:10]
    top = markdown_table(text, "Top 10 heads of seed0")
    assert list(top["head"]) == [f"L{layer}H{head}" for _, layer, head in flat]
    assert [float(v) for v in top["importance"]] == pytest.approx([-s for s, _, _ in flat], abs=5e-5)

    agreement = pd.read_csv(folder / "importance/seed0/agreement.csv")
    shown = markdown_table(text, "Spearman correlation of each estimator")
    assert len(shown) == len(agreement)
    for mine, theirs in zip(shown["spearman"], agreement["spearman"]):
        assert (mine == "n/a" and np.isnan(theirs)) or float(mine) == pytest.approx(theirs, abs=5e-5)

    deltas = pd.read_csv(folder / "sweep/seed0/deltas_validation.csv", index_col=0)
    sweep = markdown_table(text, "Each head pruned alone").set_index(deltas.index.name)
    assert np.allclose(sweep.map(float).to_numpy(), deltas.to_numpy(), atol=5e-5)

    curve = pd.read_csv(folder / "prune_curve/seed0/prune_curve.csv")
    last = markdown_table(text, "The last step of each order")
    assert int(last.iloc[0]["heads pruned"]) == curve[curve["order"] == "importance"]["heads_pruned"].iloc[-1]
    assert float(last.iloc[0]["f1"]) == pytest.approx(curve[curve["order"] == "importance"]["f1"].iloc[-1], abs=5e-5)

    summary = json.loads((folder / "study.json").read_text())
    assert summary["clusters"]["seed0"]["stability"] == json.loads(
        (folder / "cluster/seed0/results.json").read_text())["stability"]
    assert summary["baseline"]["seed0"]["validation"] == trained


def test_the_findings_and_caveats_come_first_and_read_the_stage_files(finished):
    """Findings and caveats open study.md, close the terminal's summary and sit in study.json; study=quick is a smoke
    run: study.md says so at its top and every claim reads 'not tested (quick run)', its numbers kept; the tiny
    model's clusters are not Guan et al.'s types, which the reason adds; Michel et al.'s count is the sweep report's
    heads whose CI lies above the margin (removable) and below it (costly); the prune curve shows the last step that
    kept the threshold."""
    folder, out = finished
    text, summary = (folder / "study.md").read_text(), summary_of(folder)
    assert text.index("## Findings") < text.index("## Caveats") < text.index("## Baseline")
    assert "How a claim gets its verdict" in text and "findings (verdict: claim" in out and "caveat: One seed" in out
    assert text.index("**A smoke run (study.smoke=true") < text.index("## Findings")
    assert "Its verdicts are not findings" in text and "note: A smoke run (study.smoke=true" in out
    findings = summary["findings"]
    assert all(f["verdict"] == "not tested" and f["summary"].startswith("not tested (quick run") and
               all(e["verdict"] == "not tested" for e in f["evidence"]) for f in findings.values())
    assert re.search(r"^  not tested \(quick run\): Most single heads can be removed", out, re.M)
    assert findings["guan_table2_diagonal_vs_vertical_prune"]["verdict"] == "not tested"
    assert "not Guan et al.'s four types" in findings["guan_table2_diagonal_vs_vertical_prune"]["summary"]
    table = pd.read_csv(folder / f"sweep/seed0/{REPORT}/table.csv")
    rows = table[(table["metric"] == "f1") & (table["split"] == "validation")]
    # margin 1 point; a head that changed nothing (zero-width CI) gets the Clopper-Pearson bound of that many unchanged
    # examples at the table's level (Bonferroni over the heads when the sweep's CIs are simultaneous, else 0.95)
    level = 0.95 if "simultaneous" not in REPORT else 1 - 0.05 / len(rows)
    bound = 100 * (1 - ((1 - level) / 2) ** (1 / int(rows["n"].iloc[0])))
    low = np.where(rows["ci_high"] - rows["ci_low"] <= 0, rows["delta"] - bound, rows["ci_low"])
    removable, costly = int((low > -1.0).sum()), int((rows["ci_high"] < -1.0).sum())
    (michel,) = findings["michel_single_heads"]["evidence"]
    assert (michel["removable"], michel["costly"]) == (removable, costly)
    assert michel["value"] == pytest.approx(removable / len(rows))
    assert michel["file"] == f"sweep/seed0/{REPORT}/table.csv"
    assert any(caveat.startswith("**One seed.**") for caveat in summary["caveats"])
    final = json.loads((folder / "prune_curve/seed0/final_mask.json").read_text())
    importance = next(row for row in summary["prune_curve"]["seed0"] if row["order"] == "importance")
    assert importance["heads pruned"] == final["heads_pruned"]
    assert float(importance["f1"]) == pytest.approx(final["metrics"]["validation"]["f1"], abs=5e-5)


def test_a_rerun_skips_every_stage(finished):
    folder, _ = finished
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("results.json")}
    out = study(folder).stdout
    assert all(skipped(out, n, stage) for n, stage in enumerate(STAGES, start=1)), out
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("results.json")} == before
    summary = summary_of(folder)["summary"]  # what the first run printed at its end, printed again
    assert any(line.startswith("finding") for line in summary) and "\n".join(summary) in out


def test_a_study_folder_copied_elsewhere_is_still_done(finished):
    """The jobs' hashes take the paths inside the study folder relative to it (absolute ones reran every analysis
    stage of a moved or copied study), and the files they read by content: a copy with new modification times
    (``cp -r``) reran every stage. Nor does each table job say its clusters were computed on other weights (the
    original folder's fine-tuned model, the same train.py job)."""
    folder, _ = finished
    copy = folder.parent / "study_copy"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("wandb"), copy_function=shutil.copy)  # new times
    assert (copy / "finetune/seed0/results.json").stat().st_mtime_ns != \
        (folder / "finetune/seed0/results.json").stat().st_mtime_ns
    result = study(copy)
    assert all(skipped(result.stdout, n, stage) for n, stage in enumerate(STAGES[:-1], start=1)), result.stdout
    assert f"paths are relative to `{copy}`" in (copy / "study.md").read_text()  # its own report, not the original's
    assert "was computed on" not in result.stdout + result.stderr
    shutil.rmtree(copy / "tables")  # the tables run again from the copied clusters: no note of other weights
    result = study(copy, "study.stages=[tables]")
    assert "was computed on" not in result.stdout + result.stderr, result.stderr
    assert "study done" not in result.stdout and "no report in this run: add report to study.stages" in result.stdout
    shutil.rmtree(copy)


def test_a_stage_whose_files_went_runs_again(finished):
    """A hand-deleted syntax.csv or clusters.json: the stage is not done (it said 'skipped, done' and study.md lost
    the section, or the study never recovered); the jobs that held them run again, with a note, to the same files."""
    folder, _ = finished
    kept = {name: (folder / name).read_bytes() for name in ("syntax/seed0/syntax.csv", "cluster/seed0/clusters.json")}
    for name in kept:
        (folder / name).unlink()
    out = study(folder).stdout
    assert "note: since the stage finished, cluster/seed0/clusters.json missing: cluster/seed0 runs again" in out
    assert "note: since the stage finished, syntax/seed0/syntax.csv missing: syntax/seed0 runs again" in out
    assert "[4/13] syntax: skipped" not in out and "[3/13] cluster: skipped" not in out
    assert {name: (folder / name).read_bytes() for name in kept} == kept
    assert "`syntax/seed0/syntax.csv`" in (folder / "study.md").read_text()
    assert "[1/13] finetune: skipped, done" in out and "[2/13] features: skipped, done" in out


def test_a_report_by_hand_with_other_settings_keeps_off_the_studys_tables(finished):
    """mode=report over a study's table with other statistics writes its own folder; a study file changed by hand
    is found (not 'skipped, done'): the stage's reports are written again with the study's settings."""
    folder, _ = finished
    table = folder / "tables/table2/seed0"
    mine = {path: path.read_bytes() for path in (table / REPORT).iterdir()}
    by_hand = run_script([sys.executable, str(ROOT / "ablate.py"), "mode=report", f"sweep_dir={table}",
                              "report.confidence=0.5", "report.correction=none", "logger=none"], cwd=ROOT,
                             env=environment(), capture_output=True, text=True, timeout=HANG_GUARD)
    assert by_hand.returncode == 0, by_hand.stderr[-2000:]
    assert (table / "report-confidence-0.5+correction-none/plans_validation.md").is_file()
    assert {path: path.read_bytes() for path in (table / REPORT).iterdir()} == mine
    (table / REPORT / "plans_validation.md").write_text("| plan |\n|---|\n| hand-made |\n")
    out = study(folder).stdout
    assert f"note: since the stage finished, tables/table2/seed0/{REPORT}/plans_validation.md changed: its " \
           "reports are written again" in out
    assert {path: path.read_bytes() for path in (table / REPORT).iterdir()} == mine
    assert "hand-made" not in (folder / "study.md").read_text()


def test_a_killed_study_resumes_to_the_same_numbers(finished, tmp_path):
    """Killed in the clustering, stopped by Ctrl-C in the tables, then run to its end: the stages through the tables
    (those after read the same resumable jobs) give the finished study's numbers."""
    folder = tmp_path / "study"
    stages = "study.stages=[finetune,features,cluster,syntax,compare,tables,report]"
    process = subprocess.Popen(command(folder, stages), cwd=ROOT, env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    for line in process.stdout:
        if line.startswith("[3/7] cluster"):
            process.send_signal(signal.SIGKILL)
            break
    process.wait(timeout=HANG_GUARD)
    assert not (folder / "study.md").exists() and (folder / "features/stage.json").is_file()
    # Resumed, then Ctrl-C during the tables (once swallowed in a weakref callback: the study ran on to exit 0)
    process = subprocess.Popen(command(folder, stages), cwd=ROOT, env=environment(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    out = ""
    for line in process.stdout:
        out += line
        if line.startswith("[6/7] tables"):
            process.send_signal(signal.SIGINT)
            break
    out += process.stdout.read()
    assert process.wait(timeout=HANG_GUARD) == 130, out[-3000:]
    assert "[1/7] finetune: skipped, done" in out and "[2/7] features: skipped, done" in out
    assert "[3/7] cluster: head types" in out
    assert re.search(r"note: interrupted \(Ctrl-C\) during \[6/7\] tables(, job tables/\S+)?; run the same "
                     r"command to go on", out) and "[7/7]" not in out and not (folder / "study.md").exists()
    out = study(folder, stages).stdout
    assert "[5/7] compare: skipped, done" in out and "[6/7] tables: Guan" in out
    mine, theirs = (json.loads((f / "study.json").read_text()) for f in (folder, finished[0]))
    for key in ("baseline", "clusters", "compare", "syntax"):
        assert mine[key] == theirs[key], key


def test_a_stage_left_out_with_other_settings_is_said_to_be_stale(finished):
    """Only the report, with a sweep setting that differs from the sweep's files: the report says so."""
    folder, _ = finished
    out = study(folder, "study.stages=[report]", "study.sweep.data.max_eval_examples=8").stdout
    assert "note: Not this command's settings: the files of sweep were computed with other settings" in out
    assert "the files of sweep were computed" in (folder / "study.md").read_text()
    study(folder)  # back to the study's settings: nothing stale, the report says nothing of it
    assert "Not this command's settings" not in (folder / "study.md").read_text()


def test_stale_stages_stay_out_of_the_report_and_plans_of_another_clustering_retire(finished, tmp_path):
    """k = 3 in a copy of the study: with only the clustering rerun, the report leaves out the tables, comparison and
    robustness (of the k = 4 types: rows ``prune_cluster3`` beside three new types); the whole study then runs, the
    k = 4 plans moved out of the folders the tables' reports read (they made every later run fail: two settings)."""
    folder = tmp_path / "study"
    shutil.copytree(finished[0], folder, symlinks=True)
    # only the report: the clusters are of k = 4, and so is every stage that read them (never shown as current)
    out = study(folder, "study.stages=[report]", "study.cluster.cluster.k=3").stdout
    assert ("the files of cluster were computed with other settings (or inputs), and compare, tables, controls, "
            "refits, robustness read them") in out, out
    text = (folder / "study.md").read_text()
    assert "prune_cluster" not in text
    rerun = re.search(r"Run three \(the stages done are reused\): `([^`]*)`", text)[1]  # as typed, every stage
    assert "study.cluster.cluster.k=3" in rerun and "++" not in rerun and "study.stages" not in rerun, rerun
    assert f" hydra.run.dir={folder} " in rerun, rerun  # the stages done are reused in this folder only
    assert "_Left out: the tables stage read the cluster stage's files, which are of other settings" in text
    assert "the cluster stage's files are of other settings or inputs (left out" in text  # not "did not run"
    assert not {"tables", "compare", "robustness"} & set(summary_of(folder))
    assert "tables/table2" not in text.split("## Files")[1]  # the Files list leaves them out too
    # a stage of the run that would read the stale clusters: refused in one line before anything runs
    refused = study(folder, "study.stages=[tables,report]", "study.cluster.cluster.k=3", check=False)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: study.stages: tables reads the files of cluster, which are of other settings or inputs than this "
        "command's: add cluster to study.stages (and the stages between), or leave tables out"], refused.stderr
    out = study(folder, "study.stages=[cluster,report]", "study.cluster.cluster.k=3").stdout
    assert "the files of compare, tables, controls, robustness were computed with other settings" in out
    text = (folder / "study.md").read_text()
    assert "cluster3" not in text and "_Left out: the tables stage's files were computed with other settings" in text
    assert "tables" not in summary_of(folder) and "compare" not in summary_of(folder)
    out = study(folder, "study.cluster.cluster.k=3").stdout
    assert re.search(r"note: \d+ job folder\(s\) of plans this study no longer has moved to \S+/tables/\.retired "
                     r"\(table2/seed0/prune_cluster3", out), out
    assert (folder / "tables/.retired/table2/seed0/prune_cluster3/results.json").is_file()
    assert not (folder / "tables/table2/seed0/prune_cluster3").exists()
    text = (folder / "study.md").read_text()
    assert "cluster3" not in text and "_Left out:" not in text and "prune_cluster2" in text


def test_the_refits_stage_evaluates_table_2s_type_plans_under_each_bootstrap_fit(finished, tmp_path):
    """Guan et al.'s types named by hand: a job per distinct head set of each type under each bootstrap fit of
    clusters.json, whose plan removes exactly that fit's heads of the type, and a baseline; a rerun skips it."""
    folder = tmp_path / "study"
    shutil.copytree(finished[0], folder, symlinks=True)
    named = ("study.stages=[cluster,tables,controls,refits,report]",
             "study.cluster.cluster.names=[dense,diagonal,dense_vertical,vertical]")
    out = study(folder, *named).stdout
    fits = json.loads((folder / "cluster/seed0/refits.json").read_text())["refits"]
    assert len(fits) == 2 and all(len(fit) == 12 for fit in fits)  # study=quick: 2 fits of the 12 heads
    expected = {(policy, kind, frozenset(head for head, label in fit.items() if label == kind))
                for fit in fits for kind in ("dense", "diagonal", "dense_vertical", "vertical")
                for policy in ("prune", "uniform") if kind in fit.values()}
    found = set()
    for path in (folder / "refits/seed0").glob("*/results.json"):
        plan = json.loads(path.read_text())["plan"]
        if path.parent.name == "baseline":
            assert plan["policies"] == {}
            continue
        policy, kind = path.parent.name.split("-")[0].split("_", 1)
        found.add((policy, kind, frozenset(head for head, given in plan["policies"].items() if given == policy)))
    assert found == expected
    assert re.search(r"^\[4/5\] refits: .*, \d+ jobs", out, re.M), out
    assert "[4/5] refits: skipped, done" in study(folder, *named).stdout
    # the report: each Table 2 claim's quantity under each fit, beside the main fit's (study.json's numbers)
    evidence = summary_of(folder)["findings"]["guan_table2_diagonal_vs_vertical_prune"]["evidence"][0]
    spread = evidence["refits"]
    assert spread["fits"] == 2 and len(spread["values"]) == spread["same_types"] == 2  # names by hand: every fit
    assert (f"refits seed0: guan_table2_diagonal_vs_vertical_prune {evidence['value']:+.4f} under the main "
            "fit, ") in out
    section = (folder / "study.md").read_text().split("## Refits")[1].split("\n## ")[0]
    assert "guan_table2_diagonal_vs_vertical_prune" in section
    # more fits: the clusters file is the same, so the tables and the controls stay done; the refits run
    more = study(folder, *named, "study.cluster.cluster.bootstrap_fits=3").stdout
    assert "[2/5] tables: skipped, done" in more and "[3/5] controls: skipped, done" in more, more
    assert len(json.loads((folder / "cluster/seed0/refits.json").read_text())["refits"]) == 3


def test_a_changed_setting_reruns_only_the_stages_it_changes(finished):
    """Fewer stability fits: new clusters, so the comparison, the tables and the robustness stage (their clusters
    file) run again; the fine-tuning, features, sweep, importance and prune curve do not (runs last: it changes the
    study)."""
    folder, _ = finished
    report = folder / f"tables/table2/seed0/{REPORT}"
    listed = json.loads((report / "report.json").read_text())
    (report / "report.json").write_text(json.dumps(listed | {"files": [*listed["files"], "curve_old.png"]}))
    for name in ("curve_old.png", "mine.png"):  # a figure of the earlier report, a file of the user's
        (report / name).write_bytes(b"png")
    out = study(folder, "study.cluster.cluster.stability_fits=2").stdout
    ran = {stage for n, stage in enumerate(STAGES, start=1) if not skipped(out, n, stage)}
    assert ran == {"cluster", "compare", "tables", "robustness", "report"}, out
    assert re.search(r"note: settings changed since \S+/cluster/seed0/results.json was written \(cluster\."
                     r"stability_fits \d+ -> 2\)", out), out  # the setting, not the files it changes downstream
    assert not (report / "curve_old.png").exists() and (report / "mine.png").is_file()


def test_a_study_with_other_settings_gets_its_own_folder_and_latest_follows(tmp_path):
    """Without ``hydra.run.dir``: ``outputs/study/TASK/MODEL/finetuned-<settings>-<hash>``; the earlier study keeps
    its files, more seeds join their study's folder, ``latest`` links the study started last."""
    def fine_tune(*overrides: str) -> str:
        argv = [a for a in command(tmp_path / "study", "study.stages=[finetune]", *overrides)
                if not a.startswith("hydra.run.dir=")]
        result = run_script(argv, cwd=tmp_path, env=environment(), capture_output=True, text=True,
                                timeout=HANG_GUARD)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    studies = tmp_path / "outputs/study/demo_qa/tiny_random"
    fine_tune()
    quick, = [p for p in studies.iterdir() if p.name != "latest"]
    assert re.fullmatch(r"finetuned-study-quick-[0-9a-f]{8}", quick.name)
    first = (quick / "finetune/seed0/results.json").read_text()
    out = fine_tune("study.finetune.trainer.max_epochs=1")
    other, = [p for p in studies.iterdir() if p.name not in ("latest", quick.name)]
    assert re.fullmatch(r"finetuned-finetune.trainer.max_epochs-1\+study-quick-[0-9a-f]{8}", other.name)
    assert (quick / "finetune/seed0/results.json").read_text() == first and "settings changed" not in out
    assert json.loads((other / "finetune/seed0/results.json").read_text())["config"]["trainer"]["max_epochs"] == 1
    assert os.readlink(studies / "latest") == other.name
    fine_tune("study.seeds=[0,1]")  # a seed more: the same study
    assert (quick / "finetune/seed1/results.json").is_file() and os.readlink(studies / "latest") == quick.name
    assert len(list(studies.iterdir())) == 3


def test_bad_study_settings_are_one_error_line_before_any_stage(finished, tmp_path):
    folder, _ = finished
    trained_elsewhere = folder / "finetune/seed0"
    cases = [
        (["study.stages=[finetune,bogus]"], "study.stages: 'bogus' is not a stage"),
        (["study.stages=[cluster,report]"], "cluster needs the results of features"),
        (["study.stages=[features]"], "features needs the results of finetune"),
        (["study.seeds=[]"], "study.seeds=[]"),
        (["study.seeds=[1,1]"], "names a seed twice"),
        (["study.checkpoint=/no/such/job"], "study.checkpoint='/no/such/job'"),
        ([f"study.checkpoint={trained_elsewhere}", "task=demo_pairs"], "task=demo_qa"),
        ([f"study.checkpoint={trained_elsewhere / 'model'}"], "is not a headlab checkpoint"),
        ([f"study.checkpoint={trained_elsewhere}", "study.seeds=[0,1]"], "the checkpoint is one fine-tuned model"),
        (["model=bert_base_uncased"], "google-bert/bert-base-uncased"),  # the hub, offline
        (["mask=prune", "mask.heads=L0"], "mode=study analyses the whole model"),
        (["+study.features.features.bogus=1"], "study.features.features.bogus: Key 'bogus' not in"),
        (["study.finetune.optim.lr=0"], "optim.lr=0.0"),
        (["study.tables.report.resamples=200"], "study.tables.report.resamples=200 is below 2000: a verdict reads"),
        (["study.robustness.shapley.resamples=100"], "study.robustness.shapley.resamples=100 is below 2000"),
        (["task.eval_splits=[validation,train]"], "the study would fine-tune on the examples it scores"),
        (["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"], "mode=study runs its stages in one process"),
        (["study.cluster.cluster.k=100"], "study.cluster.cluster.k=100: the model has 12 heads"),  # came after 2 stages
        (["study.syntax.syntax.conllu=/no/such.conllu"], "study.syntax.syntax.conllu='/no/such.conllu': no such file"),
        (["study.robustness.mask.reference_examples=1"], "study.robustness.mask.reference_examples=1: resample needs"),
    ]
    folders = [tmp_path / f"case{i}" / "study" for i in range(len(cases))]
    results = in_parallel(lambda case, where: study(where, *case[0], check=False), cases, folders)
    for (overrides, expected), result, where in zip(cases, results, folders):
        assert_one_error_line(result, expected)
        assert not any((where / stage).exists() for stage in STAGES), overrides
    # a fine-tuning setting its checks refuse, over the finished study: refused before the job, which would have
    # retired the finished results.json ("settings changed ... running the job again") and then failed
    result = study(folder, "study.finetune.mask.heads=L0", check=False)
    assert_one_error_line(result, "study.finetune.mask.heads='L0' needs a policy")
    assert (folder / "finetune/seed0/results.json").is_file()


def test_a_second_study_in_a_running_studys_folder_is_refused(finished):
    """Two studies on one folder collided on a temporary file name in the tables stage; now the second one stops."""
    from filelock import FileLock

    folder, _ = finished
    with FileLock(folder / ".study.lock"):  # a study running there (its own process would hold it the same)
        result = study(folder, check=False)
    assert_one_error_line(result, f"another study is running in {str(folder)!r} (it holds .study.lock)")


def test_more_seeds_add_their_models_the_seeds_comparison_and_no_meaningless_mean(finished):
    """study.seeds=[0,1] over the finished study: seed 1 is fine-tuned and analysed, seed 0's jobs are reused; the
    clusters of the two seeds are compared; the tiny model's clusters are unnamed (cluster0 of one seed is not
    cluster0 of the other), so no table averages them across seeds (runs last: it adds a seed to the study)."""
    folder, _ = finished
    before = (folder / "sweep/seed0/results.json").stat().st_mtime_ns
    out = study(folder, "study.seeds=[0,1]").stdout
    assert "[1/13] finetune: fine-tune the model on the task, 2 jobs" in out
    assert (folder / "sweep/seed0/results.json").stat().st_mtime_ns == before
    assert (folder / "finetune/seed1/model/config.json").is_file() and (folder / "prune_curve/seed1").is_dir()
    seeds = json.loads((folder / "compare/seeds/results.json").read_text())
    assert [run["name"] for run in seeds["runs"]] == ["seed0", "seed1"]
    text = (folder / "study.md").read_text()
    assert f"seed0 vs seed1 {seeds['ari']['seed0 vs seed1']:.4f}" in text
    assert not (folder / f"tables/table2/{REPORT}").exists() and "No table across seeds" in text
    assert set(json.loads((folder / "study.json").read_text())["importance"]) == {"seed0", "seed1"}


def test_one_seed_again_reports_that_seed_only(finished):
    """study.seeds=[0] after [0,1] in the same folder: seed1's files stay, but study.md, study.json and the terminal
    show no comparison between seeds and nothing of seed1 (they showed 'seed0 vs seed1' and seed1's roles)."""
    folder, _ = finished
    assert (folder / "compare/seeds/results.json").is_file()
    out = study(folder, "study.seeds=[0]").stdout
    text, summary = (folder / "study.md").read_text(), summary_of(folder)
    assert "seed1" not in text.split("## Files")[0] and "seed1" not in out and "seeds" not in summary["compare"]
    assert "seed1" not in json.dumps({key: value for key, value in summary.items() if key != "inputs"})


def test_a_mean_over_seeds_needs_types_named_by_their_profiles(tmp_path):
    from omegaconf import OmegaConf

    from headlab.study.stage_reports import same_types_in_every_seed
    from headlab.study.stages import Study

    cfg = OmegaConf.create({"study": {"checkpoint": None, "seeds": [0, 1]}})
    study_ = Study(cfg, tmp_path, "g")
    for named in ([True, True], [True, False], [(True, "by hand"), (True, "by hand")]):
        for seed, how in enumerate(named):
            by_hand = isinstance(how, tuple)
            (tmp_path / f"cluster/seed{seed}").mkdir(parents=True, exist_ok=True)
            (tmp_path / f"cluster/seed{seed}/clusters.json").write_text(json.dumps(
                {"named": how[0] if by_hand else how, "named_by_hand": by_hand}))
        assert same_types_in_every_seed(study_) == (named == [True, True])


def test_a_given_checkpoint_is_analysed_without_fine_tuning(finished, tmp_path):
    folder = tmp_path / "study"
    job = finished[0] / "finetune/seed0"
    out = study(folder, f"study.checkpoint={job}", "study.stages=[finetune,features,cluster,compare,report]").stdout
    assert f"[1/5] finetune: skipped, study.checkpoint={job} is the fine-tuned model" in out
    assert not (folder / "finetune").exists() and (folder / "features/checkpoint/features.npz").is_file()
    compared = json.loads((folder / "compare/checkpoint/results.json").read_text())
    assert compared["runs"][1]["path"] == str(folder / "cluster/checkpoint/clusters.json")
    assert json.loads((folder / "features/checkpoint/results.json").read_text())["checkpoint"]["path"] == str(
        job / "model")
    # more seeds: the given checkpoint is one model, so the command the caveat gives fine-tunes three instead
    rerun = re.search(r"Fine-tune three seeds instead of the given checkpoint \(one model\): `([^`]*)`",
                      (folder / "study.md").read_text())[1]
    assert "study.checkpoint" not in rerun and rerun.endswith("'study.seeds=[0,1,2]'"), rerun



def test_the_robustness_section_equals_its_jobs_files(finished):
    """Table 2 under prune, mean and resample from the Shapley jobs' coalitions (each type removed alone), the types'
    Shapley values, the sweeps' Spearman correlations, and one sentence per ordering that the prune intervals
    separate (the pairs they do not in one line; the console's count of those that hold)."""
    import scipy.stats

    folder, out = finished
    section = (folder / "study.md").read_text().split("## Robustness")[1].split("\n## ")[0]
    table = markdown_table(section, "Table 2 under each method")
    for policy in ("prune", "mean", "resample"):
        job = folder / f"robustness/shapley_{policy}/seed0"
        scores = pd.read_parquet(job / "coalitions.parquet")
        full = scores[scores["removed"] == "none"].sort_values("example")["score"].to_numpy()
        values = {row["group"]: row["value"] for row in json.loads((job / "results.json").read_text())["values"]}
        for row in table.itertuples(index=False):
            row = dict(zip(table.columns, row))
            alone = scores[scores["removed"] == row["type"]].sort_values("example")["score"].to_numpy()
            assert row[f"removed alone, {policy}"].startswith(f"{(alone - full).mean():+.4g} [")
            assert row[f"Shapley, {policy}"].startswith(f"{values[row['type']]:+.4g} [")
    deltas = {p: pd.read_csv(folder / f"robustness/sweep_{p}/seed0/deltas_validation.csv", index_col=0).stack()
              for p in ("prune", "mean", "resample")}
    pairs = markdown_table(section, "Spearman correlation").set_index("methods")["spearman"]
    for a, b in (("prune", "mean"), ("prune", "resample"), ("mean", "resample")):
        expected = scipy.stats.spearmanr(deltas[a].to_numpy(), deltas[b].to_numpy()).statistic
        assert pairs[f"{a} vs {b}"] == ("n/a" if np.isnan(expected) else f"{expected:.4f}")
    sentences = [line for line in section.splitlines() if line.startswith("- ")]
    assert summary_of(folder)["robustness"]["seed0"]["conclusions"] == [s[2:] for s in sentences]
    # an ordering is stated only where the paired interval under prune excludes 0 (recomputed here: scipy's BCa of
    # the per-example differences, Bonferroni over the pairs; per-example Shapley values by brute force over the
    # coalitions)
    scores = pd.read_parquet(folder / "robustness/shapley_prune/seed0/coalitions.parquet")
    scores = scores[scores["split"] == "validation"].pivot(index="example", columns="removed", values="score")
    types = list(table["type"])
    loss = json.loads((folder / "robustness/shapley_prune/seed0/results.json").read_text())["score"] == "loss"

    def separated(difference: np.ndarray) -> int:
        if np.all(difference == difference[0]):
            return int(np.sign(difference[0]))
        pairs = math.comb(len(types), 2)  # Bonferroni over each family of pairs
        ci = scipy.stats.bootstrap((difference,), np.mean, method="BCa", n_resamples=2000,
                                   confidence_level=1 - 0.05 / pairs, rng=np.random.default_rng(0)).confidence_interval
        return 1 if ci.low > 0 else -1 if ci.high < 0 else 0

    def phi(t: str) -> np.ndarray:
        total = np.zeros(len(scores))
        others = [o for o in types if o != t]
        for size in range(len(types)):
            for kept in itertools.combinations(others, size):
                value = lambda k: scores[",".join(sorted(set(types) - set(k))) or "none"].to_numpy()  # noqa: E731
                total += (math.factorial(size) * math.factorial(len(types) - size - 1) / math.factorial(len(types))
                          * (value((*kept, t)) - value(kept)))
        return total

    costs, helps, unseparated = [], [], []
    for a, b in itertools.combinations(types, 2):
        side = separated((scores[a] - scores[b]).to_numpy() * (1 if loss else -1))
        if side:
            costs.append((a, b) if side > 0 else (b, a))
        else:
            unseparated.append(f"{a} and {b}")
        side = separated((phi(a) - phi(b)) * (-1 if loss else 1))
        if side:
            helps.append((a, b) if side > 0 else (b, a))
    stated = [re.match(r"- removing (\S+) heads costs more \S+ than removing (\S+) heads", s).groups()
              for s in sentences[:-1]]
    assert sorted(stated) == sorted(costs) and sentences[-1].startswith("- the types by Shapley value")
    if helps:
        order = re.search(r"\(prune: ([^)]*)\)", sentences[-1]).group(1).split(", ")
        assert sorted(order) == sorted(f"{a} > {b}" for a, b in helps)
    else:
        assert "no two are separated by their paired intervals under prune" in sentences[-1]
    assert (f"so no conclusion: {'; '.join(unseparated)}." in section) == bool(unseparated)
    held = sum(s.endswith(": holds under prune, mean, resample") for s in sentences)
    stated = len(sentences) - (not helps)  # a ranking whose every pair is not separated states nothing
    assert (f"robustness seed0: {held} of {stated} conclusions hold under prune, mean, resample" if stated else
            "robustness seed0: no conclusion: no two types are separated under prune") in out


def examples(*means: float, n: int = 200, seed: int = 0) -> list[np.ndarray]:
    """Per-example changes of a score (n examples each), one array per mean, with shared noise (paired)."""
    noise = np.random.default_rng(seed).normal(0, 0.3, n)
    return [mean + noise + np.random.default_rng(seed + 1 + i).normal(0, 0.02, n) for i, mean in enumerate(means)]


def test_robustness_counts_the_conclusions_that_hold_by_their_verdicts_not_by_words():
    """Two types named like the verdicts' words: the count comes from the comparisons (it once counted sentences
    without 'ties' / 'flips' / 'changes', so types so named never held)."""
    from headlab.study.report_robustness import conclusions

    methods, score = ["prune", "mean"], "accuracy"
    ties, flips = examples(-0.5, -0.1)
    helpful, useless = examples(0.3, 0.1, seed=5)
    agree = {(m, "ties"): ties for m in methods} | {(m, "flips"): flips for m in methods}
    phis = {(m, "ties"): helpful for m in methods} | {(m, "flips"): useless for m in methods}
    sentences, held, _ = conclusions(["flips", "ties"], agree, phis, methods, score)
    assert held == 2 and sentences[0].startswith("removing ties heads costs more accuracy than removing flips")
    assert sentences[0].endswith("holds under prune, mean")
    turned = agree | {("mean", "ties"): examples(-0.05, seed=9)[0] + ties - ties.mean()}  # flips costs more: a flip
    sentences, held, _ = conclusions(["flips", "ties"], turned, phis, methods, score)
    assert held == 1 and "flips under mean (" in sentences[0]


def test_two_types_whose_paired_difference_is_significant_are_separated():
    """Per-example changes that vary a lot between examples but move together: the two types' own intervals overlap
    (the old rule said 'tie'), while their paired difference, +0.05 on every example but a little noise, excludes 0:
    the ordering is stated. Zero changes state nothing and are listed as not separated."""
    from headlab.study.report_robustness import _mean_interval, conclusions

    methods, types = ["prune", "mean"], ["a", "b"]
    shared = np.random.default_rng(3).choice([-1.0, 0.0, 1.0], 300)
    a, b = shared - 0.05 + np.random.default_rng(4).normal(0, 0.01, 300), shared
    assert _mean_interval(a, 0.95)[2] > _mean_interval(b, 0.95)[1]  # their own intervals overlap
    changes = {(m, "a"): a for m in methods} | {(m, "b"): b for m in methods}
    zero = {(m, t): np.zeros(300) for m in methods for t in types}
    sentences, held, unseparated = conclusions(types, changes, zero, methods, "accuracy")
    assert unseparated == [] and held == 1
    assert re.match(r"removing a heads costs more accuracy than removing b heads, by \+0\.04\d+ \[\+0\.04",
                    sentences[0])
    sentences, held, unseparated = conclusions(types, zero, zero, methods, "accuracy")
    assert held == 0 and unseparated == ["a and b"]
    assert sentences == ["the types by Shapley value: no two are separated by their paired intervals under prune, so "
                         "no order is stated"]


def test_a_reversal_is_a_flip_only_when_it_and_the_interaction_exclude_0():
    """Under prune removing a costs clearly more than b; under mean b costs more, the reversal and the interaction
    (prune's difference minus mean's, per example) both excluding 0: it flips. A reversal inside the noise is not
    separated, not a flip."""
    from headlab.study.report_robustness import _mean_interval, _relation

    n = 400
    interval = lambda values: _mean_interval(values, 0.95)  # noqa: E731
    prune_diff = 0.2 + np.random.default_rng(1).normal(0, 0.1, n)
    mean_diff = -0.05 + np.random.default_rng(2).normal(0, 0.1, n)
    assert _relation({"prune": prune_diff, "mean": mean_diff}, "prune", "mean", interval)[0] == -1
    noisy = -0.05 + np.random.default_rng(5).normal(0, 2, n)
    assert _relation({"prune": prune_diff, "mean": noisy}, "prune", "mean", interval)[0] == 0
    assert _relation({"prune": prune_diff, "mean": prune_diff + 0.01}, "prune", "mean", interval)[0] == 1


def test_the_robustness_stage_work_grows_with_the_types_coalitions_and_the_draws():
    """The time estimate of the robustness stage: each of the 2^k - 1 coalitions besides the full model, and each
    resample draw (its sources and its ablated forward), on every evaluated example."""
    from omegaconf import OmegaConf

    from headlab.study.progress import SWEEP_PASSES, Sizes, stage_work

    sizes = Sizes(train=100, eval=50, layers=2, heads=3)
    cfg = OmegaConf.create({"data": {"max_eval_examples": 10}, "mask": {"resamples": 3}})
    per_method = 10 * (SWEEP_PASSES * 2 * 3 + 2 ** 5 - 1)  # 10 examples: 6 single-head plans, 31 coalitions
    assert stage_work("robustness", cfg, sizes, 2, types=5) == pytest.approx(2 * (1 + 1 + 2 * 3) * per_method)


def test_the_estimate_after_a_resume_counts_only_the_jobs_that_ran(tmp_path):
    """A resumed stage that ran 1 of its 4 jobs in 10 s did a quarter of its work in that time: the rate is 10 s a
    quarter stage, not a whole one (the estimate was 4x too low); a stage that ran no job adds no rate."""
    from types import SimpleNamespace

    from headlab.study.run import StudyRun

    runner = StudyRun.__new__(StudyRun)
    runner.stages, runner.study = ["tables", "sweep"], SimpleNamespace(folder=tmp_path)
    runner.work = {"tables": 400.0, "sweep": 800.0}.get
    runner.ran = [("tables", 1 / 4, 10.0)]  # 100 passes in 10 s: 800 passes take 80 s
    assert runner.time_left(1) == "; about 1 minute left"
    runner.ran = [("tables", 1 / 4, 60.0)]  # 100 passes a minute: 8 minutes
    assert runner.time_left(1) == "; about 8 minutes left"
    runner.ran = []
    assert runner.time_left(1) == ""


def test_a_resumed_stage_is_timed_by_the_jobs_it_ran_not_its_reports(tmp_path, monkeypatch):
    """A stage resumed with 1 of its 2 jobs left: the rate the time left is read at is that job's 10 s for half the
    stage, not the 110 s with the stage's reports (100 s here), which made the estimate after a resume several times
    too high."""
    import headlab.reporting.results as results
    import headlab.study.run as study_run
    import headlab.study.stage_reports as stage_reports
    from headlab.study.run import StudyRun
    from headlab.study.stages import Job

    now = [0.0]
    monkeypatch.setattr(study_run.time, "monotonic", lambda: now[0])
    jobs = [Job(tmp_path / "tables/done", None, "eval"), Job(tmp_path / "tables/left", None, "eval")]
    monkeypatch.setattr(study_run, "stage_jobs", lambda study, stage: jobs)
    monkeypatch.setattr(study_run, "run_job", lambda job: now.__setitem__(0, now[0] + 10))
    monkeypatch.setattr(study_run, "stage_manifest", lambda *args: {})
    monkeypatch.setattr(results, "read_complete", lambda path, hash_: {} if "done" in str(path) else None)
    monkeypatch.setattr(stage_reports, "retire_other_jobs", lambda *args: [])
    monkeypatch.setattr(stage_reports, "write_stage_reports", lambda *args: now.__setitem__(0, now[0] + 100))
    runner = StudyRun.__new__(StudyRun)
    runner.study, runner.stages, runner.ran, runner.start = study_run.Study(None, tmp_path, "g"), ["tables"], [], 0
    runner.tracked, runner.wandb, runner.say = False, False, lambda text: None
    runner.interrupts = SimpleNamespace(listen=lambda: None, check=lambda: None)
    runner.stage_key = lambda stage, jobs: {"jobs": {"tables/done": "h", "tables/left": "h"}}
    runner.time_left = lambda number: ""
    runner.run_stage("tables", "[1/1] tables", 1)
    assert runner.ran == [("tables", 0.5, 10.0)]


def test_a_later_stage_of_other_settings_counts_in_the_time_left(tmp_path, monkeypatch):
    """The sweep's marker is of other jobs' hashes (a copied study, a changed setting): it will run again, so its
    work counts; a marker of the jobs as they are now does not (the estimate said "less than a minute" after the
    fine-tuning of a copied study that then ran 9 more minutes)."""
    import headlab.study.run as study_run
    from headlab.study.run import StudyRun

    monkeypatch.setattr(study_run, "stage_jobs", lambda study, stage: [])
    runner = StudyRun.__new__(StudyRun)
    runner.stages, runner.study = ["tables", "sweep"], study_run.Study(None, tmp_path, "g")
    runner.work = {"tables": 400.0, "sweep": 800.0}.get
    runner.ran = [("tables", 1.0, 40.0)]  # 10 passes a second: the sweep's 800 take 80 s
    runner.stage_key = lambda stage, jobs: {"jobs": {"sweep/seed0": "now"}}
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep/stage.json").write_text(json.dumps({"key": {"jobs": {"sweep/seed0": "before"}}}))
    assert runner.time_left(1) == "; about 1 minute left"
    (tmp_path / "sweep/stage.json").write_text(json.dumps({"key": {"jobs": {"sweep/seed0": "now"}}}))
    assert runner.time_left(1) == ""


def test_robustness_draws_no_conclusion_for_a_model_that_cannot_show_one(tmp_path):
    """Type a costs far more than type b under prune: an ordering is stated; the same numbers of a model at its floor
    (or ceiling, or without a baseline: ``findings.limits``) keep their table and state no ordering."""
    from types import SimpleNamespace

    from headlab.study.report_base import StudyReport
    from headlab.study.report_robustness import types_table

    folder = tmp_path / "robustness/shapley_prune/seed0"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    full = rng.uniform(0.8, 1.0, 30)
    rows = [{"split": "validation", "removed": removed, "example": i, "score": score}
            for removed, scores in (("none", full), ("a", full - 0.5), ("b", full - 0.01 * rng.random(30)),
                                    ("a,b", full - 0.55))
            for i, score in enumerate(scores)]
    pd.DataFrame(rows).to_parquet(folder / "coalitions.parquet")
    values = [{"split": "validation", "group": "a", "value": 0.5, "ci_low": 0.45, "ci_high": 0.55},
              {"split": "validation", "group": "b", "value": 0.01, "ci_low": 0.0, "ci_high": 0.02}]
    (folder / "results.json").write_text(json.dumps({"score": "f1", "splits": {"validation": {}}, "players": ["a", "b"],
                                                     "config": {"shapley": {"confidence": 0.95}}, "values": values}))
    for limited in (None, "seed0's baseline is at its floor: f1 50 reaches chance 50"):
        report = StudyReport(SimpleNamespace(folder=tmp_path))
        types_table(report, "seed0", {"prune": folder}, {}, limited)
        sentences = [line for line in report.markdown if line.startswith("- ")]
        if limited is None:
            assert sentences and sentences[0].startswith("- removing a heads costs more f1 than removing b heads")
        else:
            assert not sentences and f"No conclusion is drawn from these: {limited}." in report.markdown
            assert report.console == [f"robustness seed0: no conclusion: {limited}"]
        assert any(line.startswith("| a ") for line in "\n".join(report.markdown).splitlines())  # the table stays


def test_the_terminal_names_the_split_of_each_plan_grid_where_there_are_several():
    from headlab.study.report_types import grid_heading

    assert grid_heading("Table 2: ...", "seed0", "validation", 1) == "Table 2: ..., seed0:"
    headings = [grid_heading("Table 2: ...", "seed0", split, 2) for split in ("validation_matched", "test")]
    assert headings == ["Table 2: ..., seed0, split validation_matched:", "Table 2: ..., seed0, split test:"]


def test_the_gates_stage_of_a_qa_study_reports_the_main_metric_beside_the_prune_curve(finished, tmp_path):
    """demo_qa: gates.csv holds exact_match before f1, the paired statistics are of f1 (the main metric): study.md's
    L0 table and its figure beside the prune curve read f1 (the figure's intervals of exact_match against f1's
    baseline had negative error bars: the report stage died)."""
    folder = tmp_path / "study"
    shutil.copytree(finished[0], folder, symlinks=True)
    study(folder, "study.stages=[gates,report]", "study.gates.gates.lambdas=[0.1]")
    gates = pd.read_csv(folder / "gates/l0/seed0/gates.csv")
    section = (folder / "study.md").read_text().split("## Learned gates")[1].split("\n## ")[0]
    table = markdown_table(section, "L0 gates (Voita et al. 2019)")
    assert list(table.columns[:4]) == ["lambda", "heads_kept", "heads_pruned", "fractional"]
    assert [float(cell) for cell in table["f1 change"]] == pytest.approx(gates["delta"].round(4).tolist(), abs=1e-12)
    assert [float(cell) for cell in table["f1"]] == pytest.approx(gates["f1"].round(4).tolist(), abs=1e-12)
    assert table["heads_pruned"].tolist() == [str(n) for n in gates["heads_pruned"]]
    assert (folder / "gates/l0/seed0/with_prune_curve.png").is_file()
