"""ablate.py mode=eval / sweep_heads end to end on a tiny BERT fine-tuned by train.py: checkpoints of every kind,
the cached baseline, per-example records, resumable sweeps, presets and launchers."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ROOT, assert_one_error_line, run
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from headlab.cli.schema import register_configs
from headlab.core.models import load_model
from headlab.reporting.results import changed_settings
from headlab.training.kept_files import weights_only

register_configs()
# every policy of the SDPA route under one plan (mask=rules)
MIXED = ("mask.rules=[{heads: L0H0, policy: prune}, {heads: L1H1, policy: uniform}, "
         "{heads: L0-1H2-3, policy: drop_intra}]")


def results(folder):
    return json.loads((folder / "results.json").read_text())


def flat(nested):
    """``{split: {metric: v}}`` -> ``{"split/metric": v}`` (pytest.approx compares flat mappings)."""
    return {f"{outer}/{inner}": v for outer, values in nested.items() for inner, v in values.items()}


def test_eval_reads_every_checkpoint_kind_and_its_baseline_equals_training(trained):
    root, train_result = trained
    job = root / "train"
    plan = ["mode=eval", "mask=prune", "mask.heads=[L0H1,L2]"]
    slim = root / "weights_only.ckpt"  # what a run without keep_training_state keeps of a best.ckpt
    shutil.copy(job / "checkpoints/last.ckpt", slim)
    weights_only(slim)
    assert "optimizer_states" not in torch.load(slim, weights_only=False)
    out = {}
    for name, kind, path in (("job", "job", job), ("lightning", "lightning", job / "checkpoints/last.ckpt"),
                             ("slim", "lightning", slim), ("pretrained", "pretrained", job / "model")):
        result = run("ablate.py", *plan, f"ckpt_path={path}", f"hydra.run.dir={root / name}", cwd_tmp=root)
        out[name] = results(root / name)
        assert out[name]["checkpoint"]["kind"] == kind and "prune L0H1,L2 [prune]" in result.stdout
        assert "LeafSpec" not in result.stderr  # Lightning's deprecation warning about its own use of torch
        assert "validation will run" not in result.stdout + result.stderr  # its val_check_interval note: no training
    assert len({r["checkpoint"]["weights_hash"] for r in out.values()}) == 1  # the same weights, four ways
    record = out["job"]
    # The baseline is the fine-tuned model's score, computed by the training module's torchmetrics: another path.
    for metric, value in train_result["metrics"]["validation"].items():
        assert record["baseline"]["validation"][metric] == pytest.approx(value, rel=1e-5, abs=1e-6)
    assert record["plan"]["policies"] == {"L0H1": "prune", **{f"L2H{h}": "prune" for h in range(4)}}
    assert (record["policy"], record["unit"], record["renormalize"]) == ("prune", "sentence", False)
    assert record["num_examples"] == {"validation": 40} and record["complete"] and len(record["config_hash"]) == 16
    for metric in record["metrics"]["validation"]:
        delta = record["metrics"]["validation"][metric] - record["baseline"]["validation"][metric]
        assert record["delta"]["validation"][metric] == pytest.approx(delta)
    for other in ("lightning", "slim", "pretrained"):
        assert flat(out[other]["metrics"]) == pytest.approx(flat(record["metrics"]))
    # Per-example records: recompute the metrics by hand from the rows.
    rows = pd.read_parquet(root / "job/records.parquet")
    assert list(rows["example"]) == list(range(40)) and set(rows["split"]) == {"validation"}
    correct = rows["label"] == rows["prediction"]
    assert record["metrics"]["validation"]["accuracy"] == pytest.approx(correct.mean())
    tp = ((rows.prediction == 1) & (rows.label == 1)).sum()
    f1 = 2 * tp / (2 * tp + (rows.prediction != rows.label).sum())
    assert record["metrics"]["validation"]["f1"] == pytest.approx(f1)
    assert record["metrics"]["validation"]["loss"] == pytest.approx(rows["loss"].mean())
    baseline_rows = pd.read_parquet(record["baseline_records"]["validation"])
    assert record["baseline"]["validation"]["loss"] == pytest.approx(baseline_rows["loss"].mean())


def test_rerun_skips_a_done_job_and_reruns_a_corrupt_one(trained):
    root, _ = trained
    args = ["mode=eval", "mask=uniform", "mask.heads=L1", f"ckpt_path={root / 'train'}", f"hydra.run.dir={root / 'u'}"]
    run("ablate.py", *args, cwd_tmp=root)
    first = results(root / "u")
    again = run("ablate.py", *args, cwd_tmp=root)
    assert "already done" in again.stdout
    (root / "u/results.json").write_text('{"complete": tr')  # a partial write
    rerun = run("ablate.py", *args, cwd_tmp=root)
    assert "already done" not in rerun.stdout and results(root / "u")["metrics"] == first["metrics"]


@pytest.mark.slow
def test_compiled_evaluation_gives_eager_per_example_losses(trained):
    """compile=true in mode=eval: the baseline (no plan), then a mixed plan through one compiled model give, per
    example, eager's losses (the plan moves them by far more than the tolerance: a compiled graph reused across
    plans would fail)."""
    root, _ = trained
    plan = ["mode=eval", "mask=rules", MIXED, f"ckpt_path={root / 'train'}"]
    for name, extra in (("eager", []), ("compiled", ["compile=true"])):
        run("ablate.py", *plan, *extra, f"baseline_dir={root / (name + '_baselines')}",
            f"hydra.run.dir={root / name}", cwd_tmp=root)
    records = {}
    for name in ("eager", "compiled"):
        summary = results(root / name)
        records[name] = (pd.read_parquet(summary["baseline_records"]["validation"]),
                         pd.read_parquet(root / name / "records.parquet"))
    assert results(root / "compiled")["config"]["compile"] is True
    for eager, compiled in zip(records["eager"], records["compiled"]):
        assert list(compiled["prediction"]) == list(eager["prediction"])
        np.testing.assert_allclose(compiled["loss"], eager["loss"], rtol=0, atol=1e-6)  # measured: 6e-8
    baseline, ablated = records["eager"]
    # every example moved well past the comparison's tolerance (measured: 7e-6 to 2e-5 since drop_* keep the
    # attention of [CLS], the classifier's token; 2e-4 to 3e-4 before)
    assert np.abs(ablated["loss"] - baseline["loss"]).min() > 5e-6


def test_baseline_is_computed_once_per_checkpoint(trained):
    root, _ = trained
    baselines = root / "baselines_once"  # this test's own cache: other tests' jobs add to the shared one
    own = f"baseline_dir={baselines}"
    for heads in ("L0", "L1"):
        run("ablate.py", "mode=eval", "mask=prune", f"mask.heads={heads}", f"ckpt_path={root / 'train'}", own,
            f"hydra.run.dir={root / ('b' + heads)}", cwd_tmp=root)
    summaries = sorted(baselines.glob("*/baseline.json"))
    stamps = [p.stat().st_mtime_ns for p in summaries]
    run("ablate.py", "mode=eval", "mask=prune", "mask.heads=L2", f"ckpt_path={root / 'train'}", own,
        f"hydra.run.dir={root / 'bL2'}", cwd_tmp=root)
    assert [p.stat().st_mtime_ns for p in sorted(baselines.glob("*/baseline.json"))] == stamps  # reused
    # Other weights (the untrained model): another key, never the cached baseline of the fine-tuned weights.
    run("ablate.py", "mode=eval", "mask=prune", "mask.heads=L2", "allow_random_head=true", own,
        f"hydra.run.dir={root / 'random_once'}", cwd_tmp=root)
    assert len(list(baselines.glob("*/baseline.json"))) == len(summaries) + 1
    assert results(root / "random_once")["baseline"] != results(root / "bL2")["baseline"]


def test_multirun_sweep_resumes_where_it_stopped(trained):
    root, _ = trained
    args = ["-m", "mode=eval", "mask=prune", "mask.heads=L0H0,L1,L2H3", f"ckpt_path={root / 'train'}",
            f"hydra.sweep.dir={root / 'sweep'}"]
    run("ablate.py", *args, cwd_tmp=root)
    jobs = sorted((root / "sweep/eval").iterdir())
    assert [j.name for j in jobs] == [f"data.max_eval_examples-40+mask.heads-{h}+mask-prune" for h in ("L0H0", "L1",
                                                                                                      "L2H3")]
    before = {j.name: results(j) for j in jobs}
    (jobs[1] / "results.json").unlink()  # as if the sweep had been killed during this job
    (jobs[2] / "results.json").write_text("{")
    again = run("ablate.py", *args, cwd_tmp=root)
    assert again.stdout.count("already done") == 1
    after = {j.name: results(j) for j in jobs}
    for name in before:
        assert flat(after[name]["metrics"]) == pytest.approx(flat(before[name]["metrics"]))


def test_a_random_task_head_is_drawn_from_the_job_seed(tmp_path, tiny_cfg):
    """Weights without a task head (allow_random_head): every job of a sweep, in one process, gets the same head
    (a resumed sweep must not mix heads); another ``seed``, another head."""
    load_model(tiny_cfg).save_pretrained(tmp_path / "bare")
    common = ["mode=eval", f"ckpt_path={tmp_path / 'bare'}", "allow_random_head=true", "mask=prune"]
    run("ablate.py", "-m", *common, "mask.heads=L0,L1", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd_tmp=tmp_path)
    jobs = {(r["config"]["mask"]["heads"], r["seed"]): r for r in map(results, (tmp_path / "sweep/eval").iterdir())}
    assert len(jobs) == 4
    hashes = {job: record["checkpoint"]["weights_hash"] for job, record in jobs.items()}
    assert hashes["L0", 0] == hashes["L1", 0] and hashes["L0", 1] == hashes["L1", 1] != hashes["L0", 0]
    assert jobs["L0", 0]["baseline"] == jobs["L1", 0]["baseline"]


def test_the_same_weights_under_another_config_get_their_own_baseline(tmp_path, tiny_cfg):
    """The baseline cache is keyed by the model, config included: the saved weights with another activation in their
    config.json (the same bytes of weights) are another model, whose baseline is its own (a fresh cache's); the same
    model copied to another folder is the same model."""
    from headlab.core.models import model_hash

    load_model(tiny_cfg).save_pretrained(tmp_path / "gelu")
    shutil.copytree(tmp_path / "gelu", tmp_path / "relu")
    config = json.loads((tmp_path / "relu/config.json").read_text())
    (tmp_path / "relu/config.json").write_text(json.dumps(config | {"hidden_act": "relu"}))
    shutil.copytree(tmp_path / "gelu", tmp_path / "copy")
    hashes = {name: model_hash(load_model(OmegaConf.create({"name_or_path": str(tmp_path / name)})))
              for name in ("gelu", "relu", "copy")}
    assert hashes["gelu"] == hashes["copy"] != hashes["relu"]

    def evaluate(name, baselines):
        run("ablate.py", "mode=eval", f"ckpt_path={tmp_path / name}", "allow_random_head=true", "mask=prune",
            "mask.heads=L0", f"baseline_dir={tmp_path / baselines}", f"hydra.run.dir={tmp_path / name}-{baselines}",
            cwd_tmp=tmp_path)
        return results(tmp_path / f"{name}-{baselines}")

    gelu, relu, fresh = evaluate("gelu", "shared"), evaluate("relu", "shared"), evaluate("relu", "fresh")
    assert relu["checkpoint"]["weights_hash"] == gelu["checkpoint"]["weights_hash"]  # the same bytes of weights
    assert relu["baseline"] == fresh["baseline"] != gelu["baseline"]
    assert len(list((tmp_path / "shared").glob("*/baseline.json"))) == 2


def test_input_stamps_follow_what_a_config_names(tmp_path):
    from headlab.analysis.jobs.identity import INPUT_KEYS
    from headlab.files import file_stamp, input_stamps, path_stamp

    (tmp_path / "job").mkdir()
    (tmp_path / "job/results.json").write_text("{}")
    (tmp_path / "job/train.log").write_text("")
    (tmp_path / "weights").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "weights" / name).write_text(name)
    (tmp_path / "clusters.json").write_text("{}")
    config = {"ckpt_path": str(tmp_path / "job"), "model": {"name_or_path": "google-bert/bert-base-uncased"},
              "task": {"data_files": {"train": str(tmp_path / "clusters.json"), "validation": str(tmp_path / "no")}},
              "mask": {"clusters": str(tmp_path / "weights"), "importance": None}}
    stamps = input_stamps(config, INPUT_KEYS)
    assert stamps == {"ckpt_path": {"results.json": file_stamp(tmp_path / "job/results.json")},  # not its log
                      "task.data_files": {"train": file_stamp(tmp_path / "clusters.json"), "validation": None},
                      "mask.clusters": {name: file_stamp(tmp_path / "weights" / name)
                                        for name in ("config.json", "model.safetensors")}}
    assert stamps["ckpt_path"]["results.json"] == [2, hashlib.blake2b(b"{}", digest_size=16).hexdigest()]  # content
    os.utime(tmp_path / "job/results.json", ns=(1, 1))  # touched, or copied by cp -r: the same content, the same stamp
    assert input_stamps(config, INPUT_KEYS) == stamps
    (tmp_path / "clusters.json").write_text("[]")  # the same size, other content
    os.utime(tmp_path / "clusters.json", ns=(1, 1))
    assert input_stamps(config, INPUT_KEYS)["task.data_files"]["train"] != stamps["task.data_files"]["train"]
    (tmp_path / "clusters.json").write_text("{}")
    (tmp_path / "job/train.log").write_text("more")  # not what a job directory's readers depend on
    (tmp_path / "job/.lock").write_text("")
    assert input_stamps(config, INPUT_KEYS) == stamps
    (tmp_path / "job/clusters.json").write_text("{}")  # a job's other files: what its readers read beside results
    assert input_stamps(config, INPUT_KEYS)["ckpt_path"]["clusters.json"] == file_stamp(tmp_path / "job/clusters.json")
    (tmp_path / "job/clusters.json").unlink()
    (tmp_path / "weights/model.safetensors").write_text("other weights")
    assert input_stamps(config, INPUT_KEYS)["mask.clusters"] != stamps["mask.clusters"]
    config["mask"]["constants"] = str(tmp_path / "clusters.json")  # optimal constants learned again: a new input
    assert input_stamps(config, INPUT_KEYS)["mask.constants"] == file_stamp(tmp_path / "clusters.json")
    del config["mask"]["constants"]
    # a train.py job: its results.json and the weights in its model/ (written over by hand: not the job's any more)
    (tmp_path / "job/model").mkdir()
    (tmp_path / "job/model/model.safetensors").write_text("weights")
    trained = input_stamps(config, INPUT_KEYS)["ckpt_path"]
    assert trained == {"results.json": file_stamp(tmp_path / "job/results.json"),
                       "model": {"model.safetensors": file_stamp(tmp_path / "job/model/model.safetensors")}}
    (tmp_path / "job/model/model.safetensors").write_text("weights edited by hand")
    assert input_stamps(config, INPUT_KEYS)["ckpt_path"] != trained
    # model.name_or_path: a folder of the user's is an input (written over: other weights); an installed package's
    # folder is not (a reinstall writes its files again, unchanged), nor is a hub name
    config["model"]["name_or_path"] = str(tmp_path / "weights")
    assert input_stamps(config, INPUT_KEYS)["model.name_or_path"] == path_stamp(str(tmp_path / "weights"))
    config["model"]["name_or_path"] = str(Path(pytest.__file__).parent)
    assert "model.name_or_path" not in input_stamps(config, INPUT_KEYS)


def test_paths_of_the_study_headlab_and_installed_packages_hash_relative_to_their_folders(tmp_path):
    """A job's hash names a path inside the study folder, headlab's bundled data or site-packages (a model shipped as
    a package) relative to that folder: the same job after the study is copied or headlab installed elsewhere."""
    import sysconfig

    import headlab
    from headlab.files import relative_paths

    data = Path(headlab.__file__).parent / "tasks/data/qnli_articles/train.jsonl"
    site = Path(sysconfig.get_path("purelib")) / "some_model/config.json"
    config = {"a": str(tmp_path / "study/cluster/seed0"), "b": [str(data)], "c": str(site), "d": "/elsewhere/x"}
    assert relative_paths(config, str(tmp_path / "study")) == {
        "a": "<root>/cluster/seed0", "b": ["<headlab>/tasks/data/qnli_articles/train.jsonl"],
        "c": "<site-packages>/some_model/config.json", "d": "/elsewhere/x"}


def test_a_job_is_not_written_into_another_jobs_folder(trained, tmp_path):
    """An eval job pointed at the fine-tuned model's own folder would write over its results.json (and so make it no
    checkpoint any more); a fine-tuning pointed at an eval job's folder likewise: one error line, nothing written."""
    root, _ = trained
    job = tmp_path / "train"
    shutil.copytree(root / "train", job)
    before = (job / "results.json").read_bytes()
    result = run("ablate.py", "mode=eval", f"ckpt_path={job}", "mask=prune", "mask.heads=L0",
                 f"hydra.run.dir={job}", cwd_tmp=tmp_path, check=False)
    assert_one_error_line(result, f"{job} holds the results of a train.py job; this ablate.py job (eval) would write")
    assert (job / "results.json").read_bytes() == before
    run("ablate.py", "mode=eval", f"ckpt_path={job}", "mask=prune", "mask.heads=L0", f"hydra.run.dir={tmp_path / 'e'}",
        cwd_tmp=tmp_path)
    evaluated = (tmp_path / "e/results.json").read_bytes()
    result = run("train.py", "trainer.max_steps=1", f"hydra.run.dir={tmp_path / 'e'}", cwd_tmp=tmp_path, check=False)
    assert_one_error_line(result, "holds the results of a mode=eval job; this train.py job (train) would write over")
    assert (tmp_path / "e/results.json").read_bytes() == evaluated


def test_a_checkpoint_written_again_at_the_same_path_runs_its_jobs_again(tmp_path, tiny_cfg):
    """A model fine-tuned again into the same folder: its finished eval jobs are not 'already done'."""
    model = load_model(tiny_cfg)
    model.save_pretrained(tmp_path / "tuned")
    args = ["mode=eval", f"ckpt_path={tmp_path / 'tuned'}", "allow_random_head=true", "mask=prune", "mask.heads=L0",
            f"hydra.run.dir={tmp_path / 'job'}"]
    run("ablate.py", *args, cwd_tmp=tmp_path)
    first = results(tmp_path / "job")
    assert "already done" in run("ablate.py", *args, cwd_tmp=tmp_path).stdout
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(2)
    model.save_pretrained(tmp_path / "tuned")
    again = run("ablate.py", *args, cwd_tmp=tmp_path).stdout
    assert "already done" not in again
    assert f"note: the files of ckpt_path changed since {tmp_path / 'job/results.json'} was written" in again
    second = results(tmp_path / "job")
    assert second["checkpoint"]["weights_hash"] != first["checkpoint"]["weights_hash"]
    assert second["config_hash"] != first["config_hash"] and second["inputs"] != first["inputs"]
    assert "already done" in run("ablate.py", *args, cwd_tmp=tmp_path).stdout
    other = run("ablate.py", *[a.replace("mask.heads=L0", "mask.heads=L1") for a in args], cwd_tmp=tmp_path).stdout
    assert f"note: settings changed since {tmp_path / 'job/results.json'} was written " \
        '(mask.heads "L0" -> "L1"): running the job again' in other


def test_a_rerun_note_names_each_changed_setting():
    before = {"trainer": {"max_epochs": 3, "precision": "32"}, "seeds": [0], "gone": 1}
    after = {"trainer": {"max_epochs": 1, "precision": "32"}, "seeds": [0, 1], "new": {"x": None}}
    assert changed_settings(before, after) == ["gone 1 -> (none)", "new.x (none) -> null", "seeds [0] -> [0, 1]",
                                               "trainer.max_epochs 3 -> 1"]
    assert changed_settings({"a": "x" * 100}, {"a": "y"}) == [f'a "{"x" * 36}... -> "y"']


@pytest.mark.parametrize("time_kept", [False, True], ids=["new time", "time kept"])
def test_data_written_again_at_the_same_path_is_evaluated_again_baseline_included(trained, tmp_path, time_kept):
    """Local data files regenerated in place: the job runs again and the cached baseline of the old data is not
    reused. With every label flipped, the new baseline's accuracy is 1 minus the old one (same predictions), and every
    record's label is flipped. Also when the rewrite keeps the file's size and modification time (``cp -p``, ``touch
    -r``), by which ``datasets`` knows a local file: it read the old rows from its cache."""
    root, _ = trained
    source = ROOT / "src/headlab/tasks/data/demo_pairs"
    for split in ("train", "validation"):
        (tmp_path / f"{split}.jsonl").write_text((source / f"{split}.jsonl").read_text())
    args = ["mode=eval", f"ckpt_path={root / 'train'}", "mask=prune", "mask.heads=L0H0",
            f"task.data_files={{train: {tmp_path / 'train.jsonl'}, validation: {tmp_path / 'validation.jsonl'}}}",
            f"baseline_dir={tmp_path / 'baselines'}", f"hydra.run.dir={tmp_path / 'job'}"]
    run("ablate.py", *args, cwd_tmp=tmp_path)
    before = results(tmp_path / "job")
    labels = pd.read_parquet(tmp_path / "job/records.parquet")["label"].tolist()
    rows = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    kept = (tmp_path / "validation.jsonl").stat()
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(row | {"label": 1 - row["label"]}) + "\n"
                                                       for row in rows))
    if time_kept:
        os.utime(tmp_path / "validation.jsonl", ns=(kept.st_atime_ns, kept.st_mtime_ns))
        assert (tmp_path / "validation.jsonl").stat().st_size == kept.st_size
    out = run("ablate.py", *args, cwd_tmp=tmp_path).stdout
    assert "note: the files of task.data_files changed since" in out and "already done" not in out
    assert pd.read_parquet(tmp_path / "job/records.parquet")["label"].tolist() == [1 - label for label in labels]
    after = results(tmp_path / "job")
    assert len(list((tmp_path / "baselines").glob("*/baseline.json"))) == 2  # one per version of the data
    for record in ("baseline", "metrics"):
        assert after[record]["validation"]["accuracy"] == pytest.approx(1 - before[record]["validation"]["accuracy"])


def test_sweep_heads_equals_separate_eval_jobs(trained):
    root, _ = trained
    run("ablate.py", "mode=sweep_heads", "mask.policy=drop_inter", "sweep.heads_per_batch=3",
        f"ckpt_path={root / 'train'}", f"hydra.run.dir={root / 'heads'}", cwd_tmp=root)
    summary = results(root / "heads")
    assert summary["kind"] == "sweep_heads" and len(summary["plans"]) == 12
    deltas = pd.read_csv(root / "heads/deltas_validation.csv", index_col=0)
    assert deltas.shape == (3, 4) and list(deltas.columns) == ["H0", "H1", "H2", "H3"]
    for layer, head in ((0, 3), (2, 1)):
        run("ablate.py", "mode=eval", "mask=drop_inter", f"mask.heads=L{layer}H{head}", f"ckpt_path={root / 'train'}",
            f"hydra.run.dir={root / f'single{layer}{head}'}", cwd_tmp=root)
        single = results(root / f"single{layer}{head}")
        swept = results(root / f"heads/L{layer}H{head}")
        assert swept["kind"] == "eval" and swept["plan"]["policies"] == single["plan"]["policies"]
        assert flat(swept["metrics"]) == pytest.approx(flat(single["metrics"]), rel=1e-5)
        table = summary["tables"]["validation"]["loss"]["delta"]
        assert table[layer][head] == pytest.approx(single["delta"]["validation"]["loss"], rel=1e-4, abs=1e-7)
        a = pd.read_parquet(root / f"heads/L{layer}H{head}/records.parquet")
        b = pd.read_parquet(root / f"single{layer}{head}/records.parquet")
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=0, atol=1e-6)  # measured: equal; another head's: 6e-5
    # Resumable per layer: a rerun with one plan's results gone redoes that layer only.
    (root / "heads/results.json").unlink()
    (root / "heads/L1H2/results.json").unlink()
    again = run("ablate.py", "mode=sweep_heads", "mask.policy=drop_inter", "sweep.heads_per_batch=3",
                f"ckpt_path={root / 'train'}", f"hydra.run.dir={root / 'heads'}", cwd_tmp=root)
    assert again.stdout.count("already done") == 2 and "L1H2" not in again.stdout.split("layer 1 done")[0]
    assert "layer 1 (0-2): 4 plans; 4 of 12 plans done" in again.stdout  # progress over heads
    deltas = sorted((results(root / f"heads/L1H{h}")["delta"]["validation"]["accuracy"], f"L1H{h}") for h in range(4))
    assert (f"layer 1 done: 4 plans [drop_inter]; validation accuracy delta from {deltas[0][0]:+.4f} ({deltas[0][1]}) "
            f"to {deltas[-1][0]:+.4f} ({deltas[-1][1]})") in again.stdout  # one line per layer, no path per plan
    assert str(root / "heads/L1H0") not in again.stdout
    redone = results(root / "heads")["tables"]["validation"]["loss"]["delta"]
    np.testing.assert_allclose(redone, summary["tables"]["validation"]["loss"]["delta"], rtol=1e-6)


def test_random_head_sets_are_uniform_draws_evaluated_as_eval_jobs(trained):
    """sweep.family=random: per size, draws sets of that many distinct heads, each head equally likely; each set's
    records are those of a mode=eval job of the same heads, and a rerun finds every size done."""
    root, _ = trained
    args = ["mode=sweep_heads", "mask.policy=uniform", "sweep.family=random", "sweep.sizes=[5,2]", "sweep.draws=3",
            f"ckpt_path={root / 'train'}", f"hydra.run.dir={root / 'random'}"]
    out = run("ablate.py", *args, cwd_tmp=root).stdout
    assert "size 5 done: 3 plans [uniform]" in out and "size 2 done: 3 plans [uniform]" in out
    summary = results(root / "random")
    assert summary["family"] == "random" and list(summary["sets"]) == ["5", "2"]
    heads = {size: [tuple(s["heads"]) for s in sets] for size, sets in summary["sets"].items()}
    assert all(len(set(h)) == int(size) for size, draws in heads.items() for h in draws)
    assert len(set(heads["5"])) == 3  # three different sets
    chosen = summary["sets"]["2"][1]
    run("ablate.py", "mode=eval", "mask=uniform", f"mask.heads=[{','.join(chosen['heads'])}]",
        f"ckpt_path={root / 'train'}", f"hydra.run.dir={root / 'one_set'}", cwd_tmp=root)
    a = pd.read_parquet(root / f"random/{chosen['plan']}/records.parquet")
    b = pd.read_parquet(root / "one_set/records.parquet")
    np.testing.assert_allclose(a["loss"], b["loss"], rtol=0, atol=1e-6)
    assert chosen["metrics"]["validation"]["accuracy"] == results(root / "one_set")["metrics"]["validation"]["accuracy"]
    (root / "random/results.json").unlink()  # a killed job: its summary and one set of size 2 not written
    (root / f"random/{chosen['plan']}/results.json").unlink()
    again = run("ablate.py", *args, cwd_tmp=root).stdout
    assert "size 5: already done" in again and "size 2 done: 3 plans" in again
    assert results(root / "random")["sets"] == summary["sets"]
    report = run("ablate.py", "mode=report", f"sweep_dir={root / 'random'}", "report.resamples=400",
                 "report.permutations=400", cwd_tmp=root).stdout  # a plan grid of the sets, each by its name
    assert "uniform_random5_00" in report and "uniform_random2_02" in report
    # the draws: uniform over heads, without replacement, each size its own stream (a size added keeps the others')
    from headlab.analysis.evaluation.sweep_plans import random_plans

    many = random_plans("prune", 3, 4, (3,), 4000, 0)
    counts = np.zeros(12)
    for _, _, plan in many:
        for layer, head in plan.heads_with("prune"):
            counts[layer * 4 + head] += 1
    assert all(len(plan.heads_with("prune")) == 3 for _, _, plan in many)
    assert np.abs(counts / 4000 - 0.25).max() < 0.03  # each head in 3 of 12 sets; 4000 draws: SD 0.007
    alone = random_plans("prune", 3, 4, (2,), 3, 0)
    beside = random_plans("prune", 3, 4, (5, 2), 3, 0)
    assert [p.heads_with("prune") for _, _, p in alone] == [p.heads_with("prune") for _, s, p in beside if s == 2]


def test_sweep_heads_on_albert_runs_whole_forwards_equal_to_eval_jobs(tmp_path):
    """ALBERT's depths share one layer's modules, so no forward starts at a layer: each plan runs a whole forward,
    the same computation as a ``mode=eval`` job's (equal to the bit), and each depth's prune its own."""
    args = ["model=tiny_albert", "mask.policy=prune", "data.max_eval_examples=24", "allow_random_head=true"]
    run("ablate.py", "mode=sweep_heads", "sweep.family=layer", *args, f"hydra.run.dir={tmp_path / 'heads'}",
        cwd_tmp=tmp_path)
    run("ablate.py", "mode=eval", "mask=prune", "mask.heads=L1", *args, f"hydra.run.dir={tmp_path / 'single'}",
        cwd_tmp=tmp_path)
    single = results(tmp_path / "single")
    assert flat(results(tmp_path / "heads/L1")["metrics"]) == pytest.approx(flat(single["metrics"]), rel=1e-6)
    losses = {job: pd.read_parquet(tmp_path / job / "records.parquet")["loss"].to_numpy()
              for job in ("heads/L0", "heads/L1", "heads/L2", "single")}
    assert np.array_equal(losses["heads/L1"], losses["single"])
    assert not np.array_equal(losses["heads/L0"], losses["single"])  # a random head's effects are small, not 0
    assert not np.array_equal(losses["heads/L2"], losses["single"])


def test_jobs_of_two_families_in_one_folder_give_the_records_of_clean_folders(tmp_path):
    """The tokenised-data cache once keyed on the tokenizer's name and length: every tiny tokenizer is named '', and
    ALBERT's and DeBERTa's have 202 tokens, so DeBERTa's job after ALBERT's in one folder was fed ALBERT's tokens."""
    args = ["mask=prune", "mask.heads=L0H0", "data.max_eval_examples=24", "allow_random_head=true"]
    for model, folder in (("tiny_albert", "shared"), ("tiny_deberta", "shared"), ("tiny_deberta", "clean")):
        run("ablate.py", "mode=eval", f"model={model}", *args, f"hydra.run.dir={tmp_path / folder / model}",
            cwd_tmp=tmp_path / folder)
    shared, clean = (pd.read_parquet(tmp_path / f / "tiny_deberta/records.parquet") for f in ("shared", "clean"))
    pd.testing.assert_frame_equal(shared, clean)
    albert = pd.read_parquet(tmp_path / "shared/tiny_albert/records.parquet")
    assert not np.array_equal(albert["loss"].to_numpy(), clean["loss"].to_numpy())


def compose_ablate(*overrides, hydra=False):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("ablate", overrides=["model=tiny_random", *overrides], return_hydra_config=hydra)


@pytest.mark.parametrize(("preset", "mode", "count"), [("guan2020_table2", "eval", 11), ("guan2020_table3", "eval", 8),
                                                       ("single_head", "sweep_heads", 0), ("all_but_one",
                                                       "sweep_heads", 0), ("layer_uniform", "sweep_heads", 0),
                                                       ("single_head_uniform", "sweep_heads", 0)])
def test_presets_compose_and_name_the_group(preset, mode, count):
    cfg = compose_ablate(f"experiment={preset}", hydra=True)
    assert cfg.mode == mode and cfg.hydra.runtime.choices.experiment == preset
    if count:
        swept = cfg.hydra.sweeper.params.plan.split(",")
        assert len(swept) == count and set(swept) == set(cfg.plans) and cfg.hydra.mode.name == "MULTIRUN"
    else:
        assert cfg.mask.policy in ("prune", "uniform") and cfg.sweep.family in ("single_head", "all_but_one", "layer")


def test_table2_plans_select_the_paper_head_types(tmp_path):
    from headlab.analysis.jobs.checks import job_mask
    from headlab.core.masks import plan_from_mask

    clusters = tmp_path / "clusters.json"  # a hand-written clusters file, as mode=cluster will write
    clusters.write_text(json.dumps({"labels": {"L0H0": "dense", "L0H1": "diagonal", "L1H0": "dense_vertical",
                                               "L1H1": "vertical"}}))
    cfg = compose_ablate("experiment=guan2020_table2", "plan=prune_dense_vertical+vertical",
                         f"mask.clusters={clusters}")
    plan = plan_from_mask(job_mask(cfg), 3, 4)
    assert plan.heads_with("prune") == [(1, 0), (1, 1)]
    cfg = compose_ablate("experiment=guan2020_table3", "plan=drop_inter_all_but_diagonal", f"mask.clusters={clusters}")
    assert plan_from_mask(job_mask(cfg), 3, 4).heads_with("drop_inter") == [(0, 0), (1, 0), (1, 1)]


@pytest.mark.parametrize(("launcher", "target"), [("joblib", "JoblibLauncher"), ("submitit_slurm", "SlurmLauncher")])
def test_parallel_and_cluster_launchers_compose(launcher, target):
    cfg = compose_ablate("experiment=guan2020_table2", f"hydra/launcher={launcher}", hydra=True)
    assert cfg.hydra.launcher._target_.endswith(target)


def test_parallel_jobs_compute_the_baseline_once(trained, tmp_path):
    """Two jobs at once (joblib) on a fresh baseline cache: one computes it under the lock, the other reads it."""
    root, _ = trained
    run("ablate.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "mode=eval", "mask=uniform",
        "mask.heads=L0,L2", f"ckpt_path={root / 'train'}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
        f"baseline_dir={tmp_path / 'baselines'}", cwd_tmp=root, fresh=True)  # forked, loky's workers took minutes
    assert len(list((tmp_path / "baselines").glob("*/baseline.json"))) == 1
    jobs = [results(job) for job in sorted((tmp_path / "sweep/eval").iterdir())]
    assert len(jobs) == 2 and jobs[0]["baseline"] == jobs[1]["baseline"]


def test_each_job_is_one_offline_wandb_run_in_the_sweeps_group(trained, tmp_path):
    """A single job is one offline W&B run, and prints one line of it (W&B's own banner and summary were some 20,
    burying the result line): where the run is and the command that uploads it."""
    root, _ = trained
    result = run("ablate.py", "mode=eval", "mask=prune", "mask.heads=L1H0", "logger=wandb", "group=my_sweep",
                 f"ckpt_path={root / 'train'}", f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=root)
    runs = list((tmp_path / "job/wandb").glob("offline-run-*"))
    assert len(runs) == 1
    printed = [line for line in (result.stdout + result.stderr).splitlines() if "wandb" in line.lower()]
    where = f"{tmp_path / 'job'}/wandb/offline-run-*-{runs[0].name.rsplit('-', 1)[1]}"
    assert len(printed) == 1 and re.fullmatch(rf"W&B: run \S+ in {re.escape(where)} \(offline; upload: wandb sync "
                                              rf"{re.escape(where)}\)", printed[0]), printed
    assert list(runs[0].parent.glob(where.rsplit("/", 1)[1])) == runs  # the folder the line names
    log = next(runs[0].glob("*.wandb")).read_bytes()  # the offline run's protobuf records hold strings verbatim
    assert b"my_sweep" in log and b"validation/accuracy_delta" in log and b"L1H0" in log


@pytest.mark.parametrize("target", ["job", "ckpt"])
def test_a_checkpoint_of_another_task_or_model_is_refused_before_loading(trained, target):
    root, _ = trained
    path = root / "train" if target == "job" else root / "train/checkpoints/last.ckpt"
    for override, named in (("task=demo_qa", "task=demo_pairs (this config: task=demo_qa)"),
                            ("model.name=other", "model=tiny_random (this config: model=other)")):
        result = run("ablate.py", "mode=eval", override, f"ckpt_path={path}", f"hydra.run.dir={root / 'x'}",
                     cwd_tmp=root, check=False)
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and last.startswith("error: ") and named in last, result.stderr[-2000:]
        assert "Traceback" not in result.stderr


def test_a_damaged_baseline_cache_is_computed_again(trained, tmp_path):
    """The cached baseline lies outside every job folder (a full disk, an interrupted copy, a hand edit can cut it):
    a truncated ``records.parquet`` (or a ``baseline.json`` that is no JSON) was a pyarrow traceback in every later job
    of the checkpoint; now a note, the baseline computed again, written whole, and the same numbers."""
    root, _ = trained
    args = ["mode=eval", "mask=prune", "mask.heads=L0H0", f"ckpt_path={root / 'train'}",
            f"baseline_dir={tmp_path / 'baselines'}"]
    run("ablate.py", *args, f"hydra.run.dir={tmp_path / 'first'}", cwd_tmp=root)
    records, = (tmp_path / "baselines").glob("*/records.parquet")
    whole = records.read_bytes()
    for damaged, name in ((records, "records.parquet"), (records.parent / "baseline.json", "baseline.json")):
        damaged.write_bytes(damaged.read_bytes()[: len(damaged.read_bytes()) // 2])
        out = run("ablate.py", *args, f"hydra.run.dir={tmp_path / name}", cwd_tmp=root).stdout
        assert f"note: the cached baseline in {records.parent} cannot be read (" in out, out
        assert results(tmp_path / name)["baseline"] == results(tmp_path / "first")["baseline"]
        assert records.read_bytes() == whole and json.loads((records.parent / "baseline.json").read_text())["complete"]
