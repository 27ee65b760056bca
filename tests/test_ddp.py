"""Distributed evaluation sees every example exactly once: sampler shards, and 2-process gloo runs."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT
from forked import HANG_GUARD, run_script
from test_training import QUICK

from headlab.training.datamodule import ExactlyOnceSampler

DEMO_QA = ROOT / "src/headlab/tasks/data/demo_qa/validation.json"


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_shards_cover_every_row_once_and_keep_groups_whole(world_size):
    groups = [0, 0, 0, 1, 2, 2, 3, 4, 4, 4, 4, 5, 6, 6, 7]  # e.g. the features of 8 SQuAD questions
    shards = [list(ExactlyOnceSampler(groups, world_size, rank)) for rank in range(world_size)]
    assert sorted(i for shard in shards for i in shard) == list(range(len(groups)))
    owners = {}
    for rank, shard in enumerate(shards):
        assert len(ExactlyOnceSampler(groups, world_size, rank)) == len(shard)
        for i in shard:
            assert owners.setdefault(groups[i], rank) == rank  # a group never spans two processes
    with pytest.raises(ValueError, match="rank 2 is outside 0..1"):
        ExactlyOnceSampler(groups, 2, 2)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_by_length_each_process_reads_its_own_groups_longest_first(world_size):
    """With row lengths, a process gets the rows it gets without them, whole groups in their own row order, the
    groups ordered by their longest row (ties: the first row first)."""
    groups = [0, 0, 0, 1, 2, 2, 3, 4, 4, 4, 4, 5, 6, 6, 7]
    lengths = [9, 9, 4, 3, 7, 12, 3, 5, 5, 5, 2, 11, 3, 1, 7]
    for rank in range(world_size):
        plain = list(ExactlyOnceSampler(groups, world_size, rank))
        by_length = list(ExactlyOnceSampler(groups, world_size, rank, lengths=lengths))
        assert sorted(by_length) == plain
        blocks = {}
        for i in plain:
            blocks.setdefault(groups[i], []).append(i)
        expected = sorted(blocks.values(), key=lambda rows: (-max(lengths[i] for i in rows), rows[0]))
        assert by_length == [i for rows in expected for i in rows]
    everything = list(ExactlyOnceSampler(groups, 1, 0, lengths=lengths))
    assert everything == [4, 5, 11, 0, 1, 2, 14, 7, 8, 9, 10, 3, 6, 12, 13]  # written out by hand


def test_a_finished_job_releases_its_gloo_process_group(tmp_path):
    """Lightning destroys NCCL groups at exit only; a gloo group left to interpreter shutdown can abort the rank."""
    import torch.distributed as dist

    from headlab.training.tracking import tracked_job

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError), tracked_job():
            raise RuntimeError("a failed job")  # keeps the group: its peers may be waiting in a collective
        assert dist.is_initialized()
        with tracked_job():
            dist.barrier()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def evaluate(devices, task, out, *overrides):
    # Batch size 1: no padding, so each example's logits do not depend on which rows share its batch.
    command = [sys.executable, str(ROOT / "tests/scripts/ddp_eval.py"), str(devices), task, str(out),
               "data.eval_batch_size=1", "data.max_eval_examples=41", *overrides]
    result = run_script(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(("task", "overrides"), [("demo_pairs", []),
                                                 ("demo_qa", ["task.max_length=64", "task.doc_stride=16"])])
def test_two_process_evaluation_equals_one_process(tmp_path, task, overrides):
    cache = f"data.cache_dir={tmp_path / 'cache'}"
    single = evaluate(1, task, tmp_path / "single.json", cache, *overrides)
    double = evaluate(2, task, tmp_path / "double.json", cache, *overrides)
    assert (single["world_size"], double["world_size"]) == (1, 2)
    assert single["evaluated"] == double["evaluated"] == {"validation": 41}  # no example twice, none left out
    if task == "demo_qa":  # predictions_validation.json: every question once, as one process writes it
        files = [json.loads((tmp_path / f"{run}_predictions/predictions_validation.json").read_text())
                 for run in ("single", "double")]
        ids = [article["paragraphs"] for article in json.loads(DEMO_QA.read_text())["data"]]
        first_ids = [qa["id"] for paragraphs in ids for paragraph in paragraphs for qa in paragraph["qas"]][:41]
        assert list(files[1]) == list(files[0]) == first_ids
        assert files[1] == files[0]
    for name, value in single["metrics"]["validation"].items():
        # Sums in another order: the mean loss may differ in the last float32 bits, the rest must not.
        tolerance = 1e-6 if name == "loss" else 0
        assert double["metrics"]["validation"][name] == pytest.approx(value, rel=tolerance, abs=0), name


@pytest.mark.slow
def test_train_py_fine_tunes_on_two_cpu_processes(tmp_path):
    """trainer=ddp through Hydra: Lightning reruns train.py for rank 1 in the same job directory."""
    run = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train.py"), *QUICK, "task=demo_pairs", f"data.cache_dir={tmp_path / 'c'}",
               f"hydra.run.dir={run}", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
               "trainer.precision=32-true", "data.max_eval_examples=41"]
    result = run_script(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((run / "results.json").read_text())
    assert record["num_evaluated"] == {"validation": 41} and record["global_step"] == 4
    assert record["config"]["trainer"]["devices"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(("task", "mode"), [("demo_pairs", ["mode=eval", "mask=rules",  # unit ids, and [CLS] moved
                                                            "mask.rules=[{heads: L0H1-2, policy: drop_intra}, "
                                                            "{heads: L1, policy: prune}]"]),
                                            ("demo_qa", ["mode=sweep_heads", "mask.policy=prune", "task.max_length=64",
                                                         "task.doc_stride=16"])])
def test_ablate_py_on_two_cpu_processes_equals_one(tmp_path, task, mode):
    """ablate.py under trainer=ddp: every example scored once, the records and metrics of one process."""
    def ablate(name, *ddp):
        command = [sys.executable, str(ROOT / "ablate.py"), "model=tiny_random", f"task={task}", "logger=none",
                   "allow_random_head=true", "trainer.enable_progress_bar=false", "data.eval_batch_size=1",
                   "data.max_eval_examples=23", f"data.cache_dir={tmp_path / 'cache'}", *mode,
                   f"baseline_dir={tmp_path / name / 'baselines'}", f"hydra.run.dir={tmp_path / name}", *ddp]
        result = run_script(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)
        assert result.returncode == 0, result.stderr[-3000:]
        return tmp_path / name

    single = ablate("single")
    double = ablate("double", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                    "trainer.precision=32-true")
    folder = "L1H2" if "mode=sweep_heads" in mode else "."
    one, two = (json.loads((run / folder / "results.json").read_text()) for run in (single, double))
    assert one["num_examples"] == two["num_examples"] == {"validation": 23}
    for part in ("metrics", "baseline"):
        for name, value in one[part]["validation"].items():
            assert two[part]["validation"][name] == pytest.approx(value, rel=1e-6 if name == "loss" else 0, abs=0)
    rows = [pd.read_parquet(run / folder / "records.parquet") for run in (single, double)]
    assert list(rows[1]["example"]) == list(rows[0]["example"]) == list(range(23))
    assert list(rows[1]["prediction"]) == list(rows[0]["prediction"])
    # Per example, the same loss (batch size 1: the same sums; measured equal), which the plan moves by about 1e-4
    # (drop_* keep [CLS]'s attention, so the last layer is pruned to move the classifier's token).
    np.testing.assert_allclose(rows[1]["loss"], rows[0]["loss"], rtol=0, atol=1e-7)
    baseline = pd.read_parquet(one["baseline_records"]["validation"])
    assert (rows[0]["loss"] - baseline["loss"]).abs().max() > 5e-6


@pytest.mark.slow
def test_importance_on_two_cpu_processes_equals_one(tmp_path):
    """mode=importance under trainer=ddp: each process scores its share, the per-example rows are gathered."""
    def importance(name, *ddp):
        command = [sys.executable, str(ROOT / "ablate.py"), "mode=importance", "model=tiny_random", "task=demo_qa",
                   "task.max_length=64", "task.doc_stride=16", "logger=none", "allow_random_head=true",
                   "trainer.enable_progress_bar=false", "data.eval_batch_size=4", "importance.max_examples=23",
                   f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / name}", *ddp]
        result = run_script(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads((tmp_path / name / "importance.json").read_text())

    one = importance("single")
    two = importance("double", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                     "trainer.precision=32-true")
    assert one["settings"]["num_examples"] == two["settings"]["num_examples"] > 23  # features: windows of questions
    for name, scores in one["raw"].items():
        if name != "batch":  # HF's granularity depends on which examples share a batch
            np.testing.assert_allclose(two["raw"][name], scores, rtol=1e-5, atol=1e-9, err_msg=name)
    for kind, scores in one["key_types"].items():
        np.testing.assert_allclose(two["key_types"][kind], scores, rtol=1e-5, atol=1e-9, err_msg=kind)


@pytest.mark.slow
def test_sigterm_stops_a_two_process_run_without_a_collective_in_the_handler(tmp_path):
    """Lightning's SIGTERM handler broadcast a tensor from inside the handler: under NCCL the ranks hung, under gloo
    rank 1 died with a traceback. Both processes now stop with exit status 143 and one note, and none is left."""
    import os
    import signal
    import subprocess
    import time

    log = tmp_path / "out.txt"
    command = [sys.executable, str(ROOT / "train.py"), *QUICK, "task=demo_pairs", "trainer.max_steps=100000",
               "data.max_train_examples=2000", "trainer.val_check_interval=20", f"data.cache_dir={tmp_path / 'c'}",
               f"hydra.run.dir={tmp_path / 'run'}", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
               "trainer.precision=32-true"]
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "LOCAL_RANK")}
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        deadline = time.monotonic() + HANG_GUARD
        while "step 20 (epoch" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)  # training has started in both processes (a validation ran)
        time.sleep(2)
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(timeout=120)
        finally:
            os.killpg(process.pid, signal.SIGKILL) if process.poll() is None else None
    text = log.read_text()
    assert status == 143, text[-3000:]
    assert text.count("note: interrupted (SIGTERM) during train.py") == 1, text[-3000:]
    assert "Traceback" not in text and "Connection closed by peer" not in text, text[-3000:]
    time.sleep(2)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True).stdout.split()
    assert not left, left
