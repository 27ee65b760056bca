"""train.py end to end on the tiny random BERT: results, checkpoints, resuming, masks, loggers, bad input."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, assert_one_error_line, compose_train
from forked import HANG_GUARD, run_script
from safetensors.torch import load_file

from headlab.cli.schema import register_configs
from headlab.core.models import load_model
from headlab.training.kept_files import WEIGHT_KEYS, weights_only

register_configs()
QUICK = ["model=tiny_random", "logger=csv", "trainer.enable_progress_bar=false", "data.batch_size=8",
         "data.max_train_examples=64", "data.max_eval_examples=40", "trainer.max_steps=4",
         "trainer.val_check_interval=2", "trainer.log_every_n_steps=1"]
SHORT_QA = ["task.max_length=64", "task.doc_stride=16"]  # several windows per context


def train(tmp_path, *overrides, run_dir=None, check=True):
    run_dir = run_dir or tmp_path / "run"
    result = run_script(
        [sys.executable, str(ROOT / "train.py"), *QUICK, f"data.cache_dir={tmp_path / 'cache'}",
         f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD,
    )
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def results(run_dir):
    return json.loads((run_dir / "results.json").read_text())


def loss_steps(run_dir):
    """Steps at which the run logged a training loss (its CSV log)."""
    header, *rows = (line.split(",") for line in (run_dir / "csv/version_0/metrics.csv").read_text().splitlines())
    return [int(row[header.index("step")]) for row in rows if row[header.index("train/loss")]]


def test_finetune_demo_pairs_writes_typed_results_and_skips_when_done(tmp_path):
    out = train(tmp_path, "task=demo_pairs")
    run = tmp_path / "run"
    record = results(run)
    assert record["kind"] == "train" and record["complete"] is True
    assert (record["task"], record["model"], record["seed"]) == ("demo_pairs", "tiny_random", 0)
    assert record["global_step"] == 4
    assert set(record["metrics"]["validation"]) == {"accuracy", "f1", "loss"}
    assert 0 <= record["metrics"]["validation"]["accuracy"] <= 1
    assert record["main_metric"] == "validation/accuracy"
    assert record["num_examples"] == {"train": 64, "validation": 40}
    assert record["num_evaluated"] == {"validation": 40}
    # The final weights once (model/); a best.ckpt only when it holds others, with its weights only.
    assert record["final_weights"] == str(run / "model") and record["last_checkpoint"] is None
    assert not (run / "checkpoints/last.ckpt").exists() and record["best_score"] is not None
    best_step = 4 if record["best_checkpoint"] == str(run / "model") else 2
    if best_step == 2:
        assert record["best_checkpoint"] == str(run / "checkpoints/best.ckpt")
        assert set(torch.load(run / "checkpoints/best.ckpt", weights_only=False)) == set(WEIGHT_KEYS)
    else:
        assert not (run / "checkpoints").exists() and not (run / "checkpoints.json").exists()
    assert record["versions"]["torch"] == torch.__version__ and len(record["config_hash"]) == 16
    assert record["config"]["task"]["name"] == "demo_pairs" and record["plan"]["rules"] == []
    assert str(run / "results.json") in out.stdout
    where = "the final weights" if best_step == 4 else run / "checkpoints/best.ckpt"
    assert f"best        validation/accuracy {record['best_score']:.4f}: {where}\n" in out.stdout
    assert f"weights     {run / 'model'} (the final weights" in out.stdout and "state  " not in out.stdout
    console = out.stdout + out.stderr  # Lightning's messages once each (no tips), and in the log file
    assert console.count("GPU available:") == 1 and "GPU available:" in (run / "train.log").read_text()
    assert "Tip: " not in console and "weights_only" not in console  # Lightning's note on an implicit default
    assert "exists and is not empty" not in console  # Lightning's warning about the checkpoint directory
    final = ", ".join(f"{name} {value:.4f}" for name, value in record["metrics"]["validation"].items())
    progress = [line.split(" - ", 1)[1] for line in (run / "train.log").read_text().splitlines()
                if "[headlab.training.modules]" in line]  # a line per validation, for logs without a progress bar
    assert progress[0].startswith("step 2 (epoch 0): validation accuracy ") and len(progress) == 2
    assert progress[-1] == f"step 4 (epoch 0): validation {final}"
    metrics_csv = (run / "csv/version_0/metrics.csv").read_text()
    assert "validation/accuracy" in metrics_csv and "train/loss" in metrics_csv
    mtime = (run / "results.json").stat().st_mtime_ns
    again = train(tmp_path, "task=demo_pairs")
    assert "already done" in again.stdout and (run / "results.json").stat().st_mtime_ns == mtime


def test_finetune_demo_qa_merges_windows_and_writes_predictions(tmp_path):
    train(tmp_path, "task=demo_qa", *SHORT_QA)
    record = results(tmp_path / "run")
    assert set(record["metrics"]["validation"]) == {"exact_match", "f1", "loss"}
    assert 0 <= record["metrics"]["validation"]["f1"] <= 100
    predictions = json.loads((tmp_path / "run/predictions_validation.json").read_text())
    assert len(predictions) == 40 and all(isinstance(text, str) for text in predictions.values())


def test_resume_continues_from_a_checkpoint(tmp_path):
    first = tmp_path / "first"
    out = train(tmp_path, "task=demo_pairs", "keep_training_state=true", run_dir=first)
    last = first / "checkpoints/last.ckpt"
    assert results(first)["last_checkpoint"] == str(last) and "optimizer_states" in torch.load(last, weights_only=False)
    assert f"state       {last} (continue training with train.py ckpt_path=PATH)" in out.stdout
    second = tmp_path / "second"
    out = train(tmp_path, "task=demo_pairs", "trainer.max_steps=8", f"ckpt_path={first / 'checkpoints/last.ckpt'}",
                "keep_training_state=true", run_dir=second)
    record = results(second)
    assert record["global_step"] == 8 and record["resumed_from"] == str(first / "checkpoints/last.ckpt")
    assert "Restoring states from the checkpoint" in out.stderr + out.stdout and "trained no step" not in out.stdout
    before, after = loss_steps(first), loss_steps(second)
    assert len(before) == len(after) == 4 and min(after) > max(before)  # only the new steps were trained
    assert Path(record["best_checkpoint"]).parent == second / "checkpoints"  # not the first run's best

    # Its weights depend on the first run: the plain command (from scratch) is another job, not "already done".
    shutil.copytree(second, tmp_path / "continued")
    plain = train(tmp_path, "task=demo_pairs", "trainer.max_steps=8", "keep_training_state=true", run_dir=second)
    assert "already done" not in plain.stdout and "files of ckpt_path (not given now) changed" in plain.stdout
    assert results(second)["config_hash"] != record["config_hash"] and results(second)["resumed_from"] is None
    # A run continued from a state that had finished its steps trains none, and says so (its one validation, of the
    # weights it was given, is its best).
    finished = tmp_path / "continued/checkpoints/last.ckpt"
    out = train(tmp_path, "task=demo_pairs", "trainer.max_steps=8", f"ckpt_path={finished}", run_dir=tmp_path / "none")
    assert "had finished its training (step 8" in out.stdout and "this run trained no step" in out.stdout
    assert results(tmp_path / "none")["best_checkpoint"] == str(tmp_path / "none/model")
    assert results(tmp_path / "none")["global_step"] == 8

    # A killed job (checkpoint, no results.json) resumes on rerun from its own last.ckpt.
    (first / "results.json").unlink()
    train(tmp_path, "task=demo_pairs", run_dir=first)
    assert results(first)["resumed_from"] == str(first / "checkpoints/last.ckpt")
    assert results(first)["global_step"] == 4 and not last.exists()  # kept only when asked
    again = train(tmp_path, "task=demo_pairs", "keep_training_state=true", run_dir=first).stdout
    assert "already done" in again and "note: keep_training_state=true, but this run finished without it: its " \
        "training state (checkpoints/last.ckpt) is gone" in again  # it said "already done" only

    # A checkpoint without the training state (what a finished run keeps of best.ckpt) cannot be continued.
    slim = tmp_path / "slim.ckpt"
    shutil.copy(second / "checkpoints/last.ckpt", slim)
    weights_only(slim)
    for path, said in ((slim, "holds weights only"),
                       (last, "no such checkpoint file (a finished run keeps it only with keep_training_state=true)")):
        out = train(tmp_path, "task=demo_pairs", "trainer.max_steps=12", f"ckpt_path={path}", run_dir=tmp_path / "x",
                    check=False)
        assert_one_error_line(out, said)


def test_another_config_in_the_same_directory_starts_afresh(tmp_path):
    """A second run with other settings in one hydra.run.dir: never resumed from the first run's last.ckpt (it
    would start at step 4 of 4 and train nothing)."""
    train(tmp_path, "task=demo_pairs", "keep_training_state=true")
    first = results(tmp_path / "run")
    out = train(tmp_path, "task=demo_pairs", "optim.lr=1e-3", "keep_training_state=true")
    second = results(tmp_path / "run")
    assert second["config_hash"] != first["config_hash"]
    assert second["resumed_from"] is None and second["global_step"] == 4
    assert f"note: {tmp_path / 'run/checkpoints'} held the checkpoints of another config" in out.stdout
    assert sorted(p.name for p in (tmp_path / "run/checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    owner = json.loads((tmp_path / "run/checkpoints.json").read_text())
    assert owner == {"config_hash": second["config_hash"]}
    state = torch.load(tmp_path / "run/checkpoints/last.ckpt", weights_only=False)
    assert state["hyper_parameters"]["optim"]["lr"] == 1e-3


def test_data_regenerated_at_the_same_path_trains_again(tmp_path):
    source = ROOT / "src/headlab/tasks/data/demo_pairs"
    for split in ("train", "validation"):
        (tmp_path / f"{split}.jsonl").write_text((source / f"{split}.jsonl").read_text())
    files = f"task.data_files={{train: {tmp_path / 'train.jsonl'}, validation: {tmp_path / 'validation.jsonl'}}}"
    train(tmp_path, "task=demo_pairs", files)
    first = results(tmp_path / "run")
    assert set(first["inputs"]["task.data_files"]) == {"train", "validation"}
    assert "already done" in train(tmp_path, "task=demo_pairs", files).stdout
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    (tmp_path / "train.jsonl").write_text("\n".join(lines[::-1]) + "\n")  # other data at the same path
    out = train(tmp_path, "task=demo_pairs", files).stdout
    assert "note: the files of task.data_files changed since" in out and "already done" not in out
    second = results(tmp_path / "run")
    assert second["config_hash"] != first["config_hash"] and second["resumed_from"] is None


def test_an_evaluation_split_may_be_named_as_a_module_attribute(tmp_path):
    """A data file's split named ``eval`` (an attribute of every torch module, which a ModuleDict of per-split metrics
    refused with a KeyError) trains and scores under that name."""
    source = ROOT / "src/headlab/tasks/data/demo_pairs/validation.jsonl"
    train(tmp_path, "task=demo_pairs", f"+task.data_files.eval={source}", "task.eval_splits=[eval]")
    result = results(tmp_path / "run")
    assert set(result["metrics"]) == {"eval"} and result["num_evaluated"]["eval"] > 0


def test_the_mask_applies_during_training(tmp_path):
    """Pruned heads give their query / key / value weights no gradient: with no weight decay
    they end where they started, while the other layers move."""
    train(tmp_path, "task=demo_pairs", "mask=prune", "mask.heads=L0", "optim.weight_decay=0", "optim.lr=1e-2")
    state = load_file(tmp_path / "run/model/model.safetensors")  # the final weights, as ablate.py reads them
    initial = load_model(compose_train().model, "sequence_classification", {"num_labels": 2}).state_dict()
    for layer, same in ((0, True), (1, False)):
        name = f"bert.encoder.layer.{layer}.attention.self.query.weight"
        assert torch.equal(state[name], initial[name]) is same
    assert results(tmp_path / "run")["plan"]["policies"] == {f"L0H{h}": "prune" for h in range(4)}


@pytest.mark.parametrize("overrides", [["mask=drop_inter", "mask.heads=all", "mask.unit=segment"],
                                       ["mask=drop_intra", "mask.heads=L1", "trainer.precision=bf16-mixed",
                                        "trainer.accumulate_grad_batches=2"]])
def test_sentence_masks_mixed_precision_and_accumulation_train(tmp_path, overrides):
    train(tmp_path, "task=demo_qa", *SHORT_QA, *overrides)
    assert results(tmp_path / "run")["global_step"] == 4


def test_regression_task_from_local_files(tmp_path):
    """STS-B's format from local JSON lines: one output, MSE loss, Pearson and Spearman."""
    rows = [{"sentence1": f"The city {i} is old.", "sentence2": f"It was born in {1900 + i}.", "label": i % 11 / 2,
             "idx": i} for i in range(48)]
    path = tmp_path / "stsb.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    train(tmp_path, "task=stsb", f"task.data_files={{train: {path}, validation: {path}}}")
    metrics = results(tmp_path / "run")["metrics"]["validation"]
    assert set(metrics) == {"pearson", "spearman", "loss"} and -1 <= metrics["pearson"] <= 1


def test_a_named_multirun_runs_one_tracked_run_per_job_in_its_own_directory(tmp_path):
    result = run_script(  # the default sweep directory, under the working directory
        [sys.executable, str(ROOT / "train.py"), "-m", *QUICK, "task=demo_pairs", "logger=wandb", "seed=0,1",
         "experiment=seeds", "trainer.max_steps=2", f"data.cache_dir={tmp_path / 'cache'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD, env={**os.environ, "WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr  # W&B: one line a job, not its banner and summary
    assert "wandb:" not in printed and len(re.findall(r"^W&B: run \S+ in \S+offline-run-\*-[0-9a-f]+$", printed,
                                                       re.M)) == 2
    sweep = tmp_path / "outputs/train/multirun/seeds/demo_pairs/tiny_random"
    jobs = {results(path.parent)["seed"]: path.parent for path in sweep.glob("*/results.json")}
    assert sorted(jobs) == [0, 1]
    run_ids = set()
    for seed, job in jobs.items():
        record = results(job)
        assert f"seed-{seed}" in job.name.split("+")  # the job's overrides name its directory
        assert (record["config"]["experiment"], record["config"]["group"]) == ("seeds", "seeds")
        offline_runs = list((job / "wandb").glob("offline-run-*"))
        assert len(offline_runs) == 1
        run_ids.add(offline_runs[0].name.rsplit("-", 1)[1])
        assert record["config_hash"] in run_ids
    assert len(run_ids) == 2


def test_model_configs_name_the_hub_checkpoints():
    expected = {
        "bert_base_uncased": "google-bert/bert-base-uncased",
        "bert_large_uncased": "google-bert/bert-large-uncased",
        "bert_large_wwm_squad": "google-bert/bert-large-uncased-whole-word-masking-finetuned-squad",
        "roberta_base": "FacebookAI/roberta-base",
    }
    for name, checkpoint in expected.items():
        assert compose_train(f"model={name}").model.name_or_path == checkpoint
    for trainer in ("cpu", "gpu", "ddp"):
        assert compose_train(f"trainer={trainer}").trainer.accelerator == ("cpu" if trainer == "cpu" else "gpu")
    assert compose_train("trainer=ddp").trainer.strategy == "ddp"


@pytest.mark.parametrize(("overrides", "message"), [
    (["task=nope"], "Could not find 'task/nope'.*demo_qa"),
    (["model=nope"], "Could not find 'model/nope'.*bert_base_uncased"),
    (["task=demo_pairs", "task.data_files.train=/no/such.jsonl"], "data file '/no/such.jsonl' for split 'train'"),
    (["task=demo_pairs", "task.main_metric=pearson"], "task.main_metric='pearson' is not allowed"),
    (["task=demo_pairs", "ckpt_path=last"], "ckpt_path='last': no checkpoint at"),
    (["task=demo_pairs", "optim.lr=0"], "optim.lr=0.0 must be > 0"),
    (["task=demo_pairs", "optim.warmup_ratio=1.5"], r"optim.warmup_ratio=1.5 is out of range; it must be in \[0, 1\]"),
])
def test_bad_input_fails_with_a_clear_error(tmp_path, overrides, message):
    result = train(tmp_path, *overrides, check=False)
    assert result.returncode != 0
    assert re.search(message, result.stderr, flags=re.S), result.stderr[-2000:]
    assert not (tmp_path / "run/checkpoints").exists()


def test_labels_out_of_range_fail_before_the_model_loads(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"sentence1": "A b.", "sentence2": "C d.", "label": 7}\n')
    result = train(tmp_path, "task=demo_pairs", f"task.data_files.train={bad}", "trainer.val_check_interval=1.0",
                   check=False)  # (QUICK's interval of 2 batches is refused first for a file of one row)
    assert result.returncode != 0 and "label(s) outside 0..1, e.g. row 1 has label 7" in result.stderr
    assert "BertForSequenceClassification" not in result.stdout  # no model summary: no model was built


@pytest.mark.slow
def test_compiled_fine_tune_applies_the_plan_and_equals_eager(tmp_path):
    """compile=true (torch.compile, inductor) under a mixed plan, dropout off (compiled dropout draws other masks):
    the weights after four steps equal eager's (measured: 4e-7 apart; with layer 1's plan lost when compiled, they
    are not),
    the pruned layer's query / key / value got no gradient, and the metrics are eager's. (This tiny model's
    metrics hardly move under any plan, so they alone could not tell.)"""
    plan = ["task=demo_pairs", "mask=rules", "optim.weight_decay=0", "optim.lr=1e-2", "keep_training_state=true",
            "+model.config.hidden_dropout_prob=0.0", "+model.config.attention_probs_dropout_prob=0.0",
            "mask.rules=[{heads: L0, policy: prune}, {heads: L1H1, policy: uniform}, "
            "{heads: L1-2H2-3, policy: drop_intra}]"]
    train(tmp_path, *plan, run_dir=tmp_path / "eager")
    run = train(tmp_path, *plan, "compile=true", run_dir=tmp_path / "compiled")
    assert "torch.compile compiles the model" in run.stdout + run.stderr
    eager, compiled = (torch.load(tmp_path / kind / "checkpoints/last.ckpt", weights_only=False)["state_dict"]
                       for kind in ("eager", "compiled"))
    for name, value in eager.items():
        torch.testing.assert_close(compiled[name], value, rtol=0, atol=1e-5, msg=name)
    initial = load_model(compose_train().model, "sequence_classification", {"num_labels": 2}).state_dict()
    for layer, same in ((0, True), (1, False), (2, False)):
        for part in ("query", "key", "value"):
            name = f"bert.encoder.layer.{layer}.attention.self.{part}.weight"
            assert torch.equal(compiled[f"model.{name}"], initial[name]) is same, name
    eager, compiled = results(tmp_path / "eager"), results(tmp_path / "compiled")
    assert compiled["config"]["compile"] is True and compiled["global_step"] == eager["global_step"] == 4
    for name, value in eager["metrics"]["validation"].items():
        assert compiled["metrics"]["validation"][name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_a_run_that_ends_before_its_first_validation_is_validated_once_and_that_is_its_best(tmp_path):
    out = train(tmp_path, "task=demo_pairs", "trainer.max_steps=1", "trainer.val_check_interval=1.0")  # per epoch
    record = results(tmp_path / "run")
    assert record["best_checkpoint"] == str(tmp_path / "run/model") and record["global_step"] == 1
    assert record["best_score"] == record["metrics"]["validation"]["accuracy"]
    assert set(record["metrics"]["validation"]) == {"accuracy", "f1", "loss"}
    assert "best        validation/accuracy" in out.stdout and "the final weights" in out.stdout
    assert "could not find the monitored key" not in out.stderr  # Lightning's ModelCheckpoint warning
    assert not (tmp_path / "run/checkpoints").exists()


@pytest.mark.slow
def test_the_validation_after_training_competes_for_the_best(tmp_path):
    """Training stopped between validations is validated once more; no checkpoint callback sees that validation,
    so a run whose final weights scored best recorded an earlier, worse best.ckpt as its best (and kept it)."""
    run_dir = tmp_path / "qa"
    out = train(tmp_path, "model=tiny_random", "task=demo_qa", "data.max_train_examples=400",
                "data.max_eval_examples=150", "trainer.max_steps=10", "trainer.val_check_interval=8",
                "optim.lr=1e-3", run_dir=run_dir)
    during = [float(f1) for f1 in re.findall(r"step 8 \(epoch 0\): validation exact_match \S+, f1 (\S+),", out.stdout
                                               + out.stderr)]
    record = results(run_dir)
    final = record["metrics"]["validation"]["f1"]
    assert len(during) == 1 and final > during[0]  # the case: the final weights beat the validation at step 8
    assert record["best_checkpoint"] == str(run_dir / "model") and record["best_score"] == final
    assert not (run_dir / "checkpoints").exists()  # no worse best.ckpt kept


@pytest.mark.parametrize("bar", [False, True])
def test_the_training_loss_reaches_the_progress_bar_only_when_there_is_one(tmp_path, bar):
    """Lightning makes a number of every progress-bar value after each step: on a GPU a host-device
    synchronisation per step, which a run without a bar (sweeps, benchmarks, clusters) need not pay."""
    import lightning.pytorch as pl

    from headlab.training.datamodule import TaskDataModule
    from headlab.training.modules import task_module

    cfg = compose_train("task=demo_pairs", "data.batch_size=8", "data.max_train_examples=16",
                        f"data.cache_dir={tmp_path / 'cache'}")
    data = TaskDataModule(cfg.task, cfg.model, unit=cfg.mask.unit, **cfg.data)
    trainer = pl.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=bar, enable_model_summary=False, limit_val_batches=0,
                         num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(task_module(cfg.model, cfg.task, cfg.mask, cfg.optim), datamodule=data)
    assert ("train/loss" in trainer.progress_bar_metrics) is bar
    assert "train/loss" in trainer.callback_metrics  # logged all the same


def _fit_with_checkpoints(folder, max_steps, improving):
    """A real Lightning fit with train.py's checkpoint callbacks, validating every 2 steps; its metric rises with
    every validation (``improving``) or never moves after the first. Returns the trainer and the best callback."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from headlab.training.finetune import checkpoint_callbacks

    class Plateau(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"model": {"name": "plateau"}, "task": {"name": "demo_pairs"}})
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("validation/accuracy", float(self.global_step) if improving else 0.5)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(20, 3)), batch_size=2)
    best, last = checkpoint_callbacks(folder, "validation/accuracy")
    trainer = pl.Trainer(max_steps=max_steps, val_check_interval=2, callbacks=[best, last], logger=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         accelerator="cpu", default_root_dir=folder)
    trainer.fit(Plateau(), train_dataloaders=data, val_dataloaders=DataLoader(TensorDataset(torch.randn(4, 3))))
    return trainer, best


def test_last_ckpt_follows_every_validation_when_the_metric_stops_improving(tmp_path):
    """A killed run resumes from its last validation, not from its last improvement (Lightning 2.6's save_last
    writes last.ckpt only at steps where the best checkpoint was written)."""
    _fit_with_checkpoints(tmp_path, 7, improving=False)
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["best.ckpt", "last.ckpt"]
    assert torch.load(tmp_path / "best.ckpt", weights_only=False)["global_step"] == 2
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 6  # validations at 2, 4, 6


@pytest.mark.parametrize("improving", [False, True])
def test_a_finished_run_keeps_its_weights_once(tmp_path, improving):
    """Finished, the checkpoints keep only what model/ (the final weights) lacks: a best.ckpt of another step, with
    its weights and hyper-parameters only; nothing when the best is the final step (the metric kept improving)."""
    from headlab.training.kept_files import keep_only, kept_checkpoints

    folder, final = tmp_path / "checkpoints", tmp_path / "model"
    trainer, callback = _fit_with_checkpoints(folder, 6, improving)
    (tmp_path / "checkpoints.json").write_text("{}")
    whole = torch.load(folder / "best.ckpt", weights_only=False)
    assert {"optimizer_states", "loops"} <= set(whole) and whole["global_step"] == (6 if improving else 2)
    best, last = kept_checkpoints(folder, callback.best_model_path, trainer.global_step, final, False)
    assert last is None and best == (str(final) if improving else str(folder / "best.ckpt"))
    assert kept_checkpoints(folder, callback.best_model_path, 6, final, True) == (str(folder / "best.ckpt"),
                                                                                  str(folder / "last.ckpt"))
    record = {"best_checkpoint": best, "last_checkpoint": last}
    if not improving:  # written before the job folder moved: its paths name the old place; the files stay
        record = {key: value and value.replace(str(tmp_path), "/moved/away") for key, value in record.items()}
    for _ in range(2):  # idempotent: a rerun finishes what a killed one left
        keep_only(folder, record)
        if improving:
            assert not folder.exists() and not (tmp_path / "checkpoints.json").exists()
        else:
            assert [p.name for p in folder.iterdir()] == ["best.ckpt"]
            slim = torch.load(folder / "best.ckpt", weights_only=False)
            assert set(slim) == set(WEIGHT_KEYS) and slim["global_step"] == 2
            for name, value in whole["state_dict"].items():
                assert torch.equal(slim["state_dict"][name], value)
            assert slim["hyper_parameters"] == whole["hyper_parameters"]


class _Interrupted(Exception):
    pass


def _fit_recording_batches(folder, accumulate=1, workers=0, interrupt_at=None, resume=None, random=False,
                           save_states=True, val_check_interval=4, interrupt_in_validation=None, every_n_steps=None,
                           **trainer_args):
    """A real Lightning fit over 12 samples (6 batches of 2 per epoch, train.py's loader: ``EpochSampler``,
    ``ResumeMidEpoch``; validation after every ``val_check_interval`` batches) for 3 epochs; the (epoch, samples) of
    every batch trained, the trainer. ``random``: the loss draws from torch (dropout), numpy and Python's generators;
    ``save_states``: with ``RandomStates`` (as train.py). Interrupted (as a kill) before the training batch of global
    step ``interrupt_at``, or inside the validation of number ``interrupt_in_validation`` (1-based).
    ``every_n_steps``: ``last.ckpt`` written at the end of every that many training batches instead (the gate fits'
    checkpoints, ``headlab.analysis.gates.gate_fit``)."""
    import random as python_random

    import lightning.pytorch as pl
    import numpy as np
    from torch.utils.data import DataLoader

    from headlab.training.durable import AtomicCheckpointIO, RandomStates
    from headlab.training.epoch_order import ResumeMidEpoch, train_loader
    from headlab.training.finetune import checkpoint_callbacks

    class Recorder(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer, self.trained = torch.nn.Linear(1, 4), []

        def training_step(self, batch, batch_idx):
            self.trained.append((self.current_epoch, batch.flatten().tolist()))
            out = self.layer(batch)
            if random:
                noise = 1 + 0.1 * np.random.rand() + 0.1 * python_random.random()
                out = torch.nn.functional.dropout(out, 0.5) * noise
            return out.pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.log("validation/accuracy", 0.5)

        def on_validation_start(self):
            self.validations = getattr(self, "validations", 0) + 1
            if self.validations == interrupt_in_validation:
                raise _Interrupted

        def configure_optimizers(self):  # as the task modules: the schedule needs the number of steps
            assert self.trainer.estimated_stepping_batches > 0
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Interrupt(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == interrupt_at:
                raise _Interrupted

    samples = torch.arange(12.0).unsqueeze(1)
    train = train_loader(samples, batch_size=2, world=(1, 0), seed=3, num_workers=workers)
    module = Recorder()
    from lightning.pytorch.callbacks import ModelCheckpoint

    checkpoints = checkpoint_callbacks(folder, "validation/accuracy") if every_n_steps is None else [ModelCheckpoint(
        dirpath=folder, filename="last", monitor=None, enable_version_counter=False, every_n_train_steps=every_n_steps,
        save_on_train_epoch_end=False)]
    trainer = pl.Trainer(max_epochs=3, val_check_interval=val_check_interval, accumulate_grad_batches=accumulate,
                         callbacks=[*checkpoints, ResumeMidEpoch(),
                                    *([RandomStates()] if save_states else []),
                                    *([Interrupt()] if interrupt_at else [])],
                         logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         accelerator="cpu", default_root_dir=folder, plugins=[AtomicCheckpointIO()], **trainer_args)
    with contextlib.suppress(_Interrupted):
        trainer.fit(module, train, DataLoader(samples[:2]), ckpt_path=resume)
    return module.trained, trainer


@pytest.mark.parametrize(("accumulate", "workers"), [(1, 0), (2, 0), (1, 1)])
def test_a_run_resumed_mid_epoch_trains_on_the_same_batches_as_an_uninterrupted_one(tmp_path, accumulate, workers):
    """Killed after a validation in the middle of epoch 1 and resumed from last.ckpt, the run goes on with that
    epoch's remaining batches in the same order (a plain loader restarted the epoch: its first batches twice)."""
    uninterrupted, _ = _fit_recording_batches(tmp_path / "whole", accumulate, workers)
    assert len(uninterrupted) == 18 and uninterrupted[0][1] != [0.0, 1.0]  # shuffled
    assert sorted(x for epoch, batch in uninterrupted if epoch == 1 for x in batch) == list(range(12))
    # interrupted past the validation after epoch 1's 4th batch
    before, _ = _fit_recording_batches(tmp_path / "killed", accumulate, workers, interrupt_at=10 // accumulate + 1)
    last = torch.load(tmp_path / "killed/last.ckpt", weights_only=False)
    assert (last["epoch"], last["global_step"] * accumulate) == (1, 10)  # epoch 1, 4 of its 6 batches done
    after, _ = _fit_recording_batches(tmp_path / "killed", accumulate, workers, resume=tmp_path / "killed/last.ckpt")
    assert before[:10] + after == uninterrupted


@pytest.mark.parametrize(("every", "saved"), [(4, 4), (3, 6)])  # step 4: mid-epoch; step 6: epoch 0's last batch
def test_a_checkpoint_written_at_a_batch_end_resumes_after_that_batch(tmp_path, every, saved):
    """A ``last.ckpt`` written at a training batch's end (``every_n_train_steps``) counts that batch as processed but
    not completed: resumed, the run goes on with the next batch (it trained the saved batch a second time, and the
    gate fits came out 1e-4 off)."""
    uninterrupted, _ = _fit_recording_batches(tmp_path / "whole")
    before, _ = _fit_recording_batches(tmp_path / "killed", interrupt_at=7, every_n_steps=every)
    assert torch.load(tmp_path / "killed/last.ckpt", weights_only=False)["global_step"] == saved
    after, _ = _fit_recording_batches(tmp_path / "killed", resume=tmp_path / "killed/last.ckpt", every_n_steps=every)
    assert before[:saved] + after == uninterrupted


def test_a_run_stopped_by_max_steps_and_continued_finishes_its_epoch_first(tmp_path):
    """Lightning closes the epoch of a fit stopped by max_steps and runs that epoch's remaining batches as the next
    epoch: they are the stopped epoch's remaining samples, each once, before the next epoch's order."""
    uninterrupted, _ = _fit_recording_batches(tmp_path / "whole")
    before, trainer = _fit_recording_batches(tmp_path / "stopped", max_steps=3)
    trainer.save_checkpoint(tmp_path / "stopped.ckpt")  # as train.py does at the end
    after, _ = _fit_recording_batches(tmp_path / "continued", resume=tmp_path / "stopped.ckpt")
    assert [batch for _, batch in before + after[:3]] == [batch for _, batch in uninterrupted[:6]]
    assert [batch for _, batch in after[3:]] == [batch for epoch, batch in uninterrupted if epoch == 2]


@pytest.mark.parametrize("workers", [0, 1])
def test_a_resumed_run_with_dropout_ends_with_the_uninterrupted_weights(tmp_path, workers):
    """Killed mid-epoch and resumed: bit-equal final weights although every step draws dropout masks and numpy and
    Python random numbers; without the saved random states they differ (the test can fail)."""
    import lightning.pytorch as pl

    def final_weights(folder, save_states, **arguments):
        pl.seed_everything(0)  # as train.py: torch, numpy and Python
        _, trainer = _fit_recording_batches(folder, workers=workers, random=True, save_states=save_states, **arguments)
        return trainer.lightning_module.layer.weight.detach().clone()

    for save_states in (True, False):
        folder = tmp_path / str(save_states)
        whole = final_weights(folder / "whole", save_states)
        final_weights(folder / "killed", save_states, interrupt_at=11)
        resumed = final_weights(folder / "killed", save_states, resume=folder / "killed/last.ckpt")
        assert torch.equal(resumed, whole) == save_states, (resumed, whole)


# Where a kill leaves last.ckpt (validation only at an epoch's end: train.py's default val_check_interval=1.0)
KILLS = {"at an epoch end": dict(val_check_interval=1.0, interrupt_at=7),  # in epoch 1: last.ckpt of epoch 0's end
         "mid-epoch": dict(val_check_interval=4, interrupt_at=11),  # epoch 1, after its validation at batch 4
         "during validation": dict(val_check_interval=1.0, interrupt_in_validation=2)}  # epoch 1's, at its end


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kill", list(KILLS))
def test_a_killed_run_with_dropout_resumes_to_the_uninterrupted_weights(tmp_path, kill, workers):
    """Bit-equal final weights after a kill anywhere, dropout drawing at every step. At an epoch end the new
    epoch's loader drew its worker seed from the global generator after the checkpoint saved it, so the resumed run
    drew other dropout masks (final loss 5.3952 vs 5.3948 in train.py)."""
    import lightning.pytorch as pl

    arguments = KILLS[kill]
    interval = arguments["val_check_interval"]

    def final_weights(folder, **more):
        pl.seed_everything(0)  # as train.py
        _, trainer = _fit_recording_batches(folder, workers=workers, random=True, val_check_interval=interval, **more)
        return trainer.lightning_module.layer.weight.detach().clone()

    whole = final_weights(tmp_path / "whole")
    final_weights(tmp_path / "killed", **{k: v for k, v in arguments.items() if k != "val_check_interval"})
    saved = torch.load(tmp_path / "killed/last.ckpt", weights_only=False)
    assert saved["global_step"] == {"at an epoch end": 6, "mid-epoch": 10, "during validation": 6}[kill]
    resumed = final_weights(tmp_path / "killed", resume=tmp_path / "killed/last.ckpt")
    assert torch.equal(resumed, whole), (resumed, whole)


class _Unpicklable:
    def __reduce__(self):
        raise OSError(28, "No space left on device")  # as a full disk fails a write


def test_checkpoints_are_written_beside_their_file_and_renamed_into_place(tmp_path, monkeypatch):
    import tempfile

    from headlab.training.durable import AtomicCheckpointIO

    io, path = AtomicCheckpointIO(), tmp_path / "checkpoints/last.ckpt"
    io.save_checkpoint({"step": 1, "weights": torch.ones(1000)}, path)
    # Nothing passes through the system's temporary folder (Lightning's commit copied from there across
    # filesystems: a full disk truncated last.ckpt).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no such folder"))
    io.save_checkpoint({"step": 2, "weights": torch.ones(1000)}, path)
    with pytest.raises(OSError, match="No space left"):
        io.save_checkpoint({"step": 3, "weights": torch.ones(1000), "later": _Unpicklable()}, path)
    assert torch.load(path, weights_only=False)["step"] == 2  # the failed write left the last whole checkpoint
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # and no temporary file
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_truncated_last_checkpoint_is_said_and_the_run_resumes_from_a_whole_one(tmp_path):
    run_dir = tmp_path / "run"
    train(tmp_path, "task=demo_pairs", "keep_training_state=true")
    (run_dir / "results.json").unlink()  # killed after its last checkpoint
    last = run_dir / "checkpoints/last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a disk that filled while writing it
    out = train(tmp_path, "task=demo_pairs", "keep_training_state=true")
    assert f"note: {last} is unreadable (BadZipFile" in out.stdout and "resuming from best.ckpt" in out.stdout
    assert results(run_dir)["resumed_from"] == str(run_dir / "checkpoints/best.ckpt")
    (run_dir / "results.json").unlink()
    for name in ("last.ckpt", "best.ckpt"):
        (run_dir / "checkpoints" / name).write_bytes(b"PK\x03\x04 cut")
    out = train(tmp_path, "task=demo_pairs", "keep_training_state=true")
    assert "no other checkpoint is whole: training starts over" in out.stdout
    assert results(run_dir)["resumed_from"] is None and results(run_dir)["global_step"] == 4


def test_a_second_run_of_one_folder_is_refused_while_the_first_trains(tmp_path):
    from filelock import FileLock

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with FileLock(run_dir / ".train.lock"):  # a run training there (a process of its own would hold it the same)
        out = train(tmp_path, "task=demo_pairs", check=False)
    assert out.returncode == 2 and "error: another train.py run is training in" in out.stderr
    assert not (run_dir / "checkpoints").exists()
    train(tmp_path, "task=demo_pairs")  # once it is free


def test_the_last_line_is_an_ablate_command_ready_to_paste(tmp_path):
    """A job folder named by overrides (``=`` and ``,``): the printed command, split as a shell splits it, runs."""
    import shlex

    run_dir = tmp_path / "runs/data.batch_size=8,optim.lr=1e-4"
    out = train(tmp_path, "task=demo_pairs", run_dir=f'"{run_dir}"')  # quoted for Hydra, as a user must
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("next        python ablate.py mode=eval model=tiny_random task=demo_pairs ")
    words = shlex.split(last.split(None, 1)[1])
    result = run_script([sys.executable, str(ROOT / words[1]), *words[2:], "logger=none",
                             "trainer.enable_progress_bar=false", "data.max_eval_examples=8",
                             f"data.cache_dir={tmp_path / 'cache'}", f"baseline_dir={tmp_path / 'baselines'}",
                             f"hydra.run.dir={tmp_path / 'eval'}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "eval/results.json").read_text())["checkpoint"]["ckpt_path"] == str(run_dir)


def test_own_tsv_data_under_its_own_name_and_the_printed_command_carries_it(tmp_path):
    """A GLUE-style task from local TSV files (the README's recipe): its own name, text and label columns; the
    command printed at the end names them, so it evaluates the same data as printed."""
    import shlex

    for split, count in (("train", 48), ("dev", 20)):
        rows = [f"review {i} is {'good' if i % 2 else 'bad'}\t{i % 2}\n" for i in range(count)]
        (tmp_path / f"{split}.tsv").write_text("text\tstars\n" + "".join(rows))
    out = train(tmp_path, "task=sst2", "task.name=reviews", "task.text_fields=[text]", "task.label_field=stars",
                f"task.data_files={{train: {tmp_path / 'train.tsv'}, validation: {tmp_path / 'dev.tsv'}}}")
    assert results(tmp_path / "run")["task"] == "reviews" and results(tmp_path / "run")["num_examples"] == \
        {"train": 48, "validation": 20}
    words = shlex.split(out.stdout.strip().splitlines()[-1].split(None, 1)[1])
    assert words[3:9] == ["model=tiny_random", "task=sst2", "task.name=reviews", "task.text_fields=[text]",
                          "task.label_field=stars",
                          f"task.data_files={{train: {tmp_path / 'train.tsv'}, validation: {tmp_path / 'dev.tsv'}}}"]
    result = run_script([sys.executable, str(ROOT / words[1]), *words[2:], "logger=none",
                             f"data.cache_dir={tmp_path / 'cache'}", f"baseline_dir={tmp_path / 'baselines'}",
                             f"hydra.run.dir={tmp_path / 'eval'}"], cwd=ROOT, capture_output=True, text=True,
                            timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads((tmp_path / "eval/results.json").read_text())
    assert evaluated["task"] == "reviews" and evaluated["num_examples"]["validation"] == 20


@pytest.mark.slow
def test_train_py_killed_after_an_epoch_end_validation_resumes_to_the_same_weights(tmp_path):
    """The issue's reproduction: SIGKILL once the first epoch-end checkpoint exists (every checkpoint is at an epoch
    end with val_check_interval=1.0), rerun: model.safetensors is the uninterrupted run's, byte for byte."""
    import signal
    import time

    command = [sys.executable, str(ROOT / "train.py"), "model=tiny_random", "task=demo_qa", "trainer.max_epochs=3",
               "trainer.num_sanity_val_steps=0", "data.max_train_examples=64", "data.max_eval_examples=24",
               "optim.lr=1e-3", "logger=none", "trainer.enable_progress_bar=false",
               f"data.cache_dir={tmp_path / 'cache'}"]
    run_script([*command, f"hydra.run.dir={tmp_path / 'whole'}"], cwd=ROOT, check=True, capture_output=True)
    killed = tmp_path / "killed"
    process = subprocess.Popen([*command, f"hydra.run.dir={killed}"], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    while not (killed / "checkpoints/last.ckpt").exists() and process.poll() is None:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "results.json").exists()
    saved = torch.load(killed / "checkpoints/last.ckpt", weights_only=False)
    assert saved["global_step"] % 2 == 0 and saved["global_step"] < 6  # an epoch's end (2 batches of 32 each)
    run_script([*command, f"hydra.run.dir={killed}"], cwd=ROOT, check=True, capture_output=True)
    assert results(killed)["resumed_from"] == str(killed / "checkpoints/last.ckpt")
    whole, resumed = (load_file(folder / "model/model.safetensors") for folder in (tmp_path / "whole", killed))
    assert all(torch.equal(whole[name], resumed[name]) for name in whole)


def test_weights_fine_tuned_under_a_plan_are_refused_by_every_analysis(tmp_path):
    """train.py mask=prune mask.heads=L0: L0's heads never took part in training. The study and every analysis
    took the job (or its model/, or its .ckpt) as a whole model and named a pruned head the best syntax head."""
    from conftest import in_parallel

    job = tmp_path / "run"
    out = train(tmp_path, "task=demo_pairs", "mask=prune", "mask.heads=[L0H1,L1]", "keep_training_state=true").stdout
    assert out.strip().splitlines()[-1].startswith("next        none: fine-tuned under a plan")
    saved = json.loads((job / "model/config.json").read_text())["headlab_plan"]
    assert saved["policies"] == {"L0H1": "prune", **{f"L1H{h}": "prune" for h in range(4)}}
    common = ["model=tiny_random", "task=demo_pairs", "logger=none", f"data.cache_dir={tmp_path / 'cache'}"]
    cases = [("mode=features", f"ckpt_path={job}"), ("mode=syntax", f"ckpt_path={job / 'model'}"),
             ("mode=eval", f"ckpt_path={job / 'checkpoints/last.ckpt'}"),
             ("mode=study", f"study.checkpoint={job}", "study=quick")]
    outs = in_parallel(lambda case: run_script(
        [sys.executable, str(ROOT / "ablate.py"), *common, *case, f"hydra.run.dir={tmp_path / case[0][5:]}"], cwd=ROOT,
        capture_output=True, text=True, timeout=HANG_GUARD), cases)
    for case, out in zip(cases, outs):
        key = case[1].split("=")[0]
        assert_one_error_line(out, f"{key}={case[1].split('=', 1)[1]!r} was fine-tuned under a plan (prune ")
        assert "L0H1" in out.stderr and not (tmp_path / case[0][5:] / "results.json").exists()
    whole = tmp_path / "whole"
    train(tmp_path, "task=demo_pairs", run_dir=whole)
    assert "headlab_plan" not in json.loads((whole / "model/config.json").read_text())
