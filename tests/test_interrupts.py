"""Ctrl-C (SIGINT) and SIGTERM end every job alike: exit status 128 + the signal (130, 143, as a shell reports them),
one ``note:`` of where, no traceback; what finished stays valid and a rerun gives an uninterrupted run's results.

A SIGTERM was ignored by an evaluation (Lightning's own handler only sets a flag, read between batches) and ended
a fine-tuning with a traceback and status 1; a Ctrl-C ended a single job with Lightning's status 1 and no note."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
from conftest import COMMON, ROOT
from forked import HANG_GUARD, run_script
from safetensors.torch import load_file

from headlab.study.interrupts import Interrupted, Terminated, stopping_on_signals

NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_the_block_with_its_status_and_one_note(signum):
    said, before = [], signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as stopped, stopping_on_signals(said.append, lambda: "the work", "run it again"):
        os.kill(os.getpid(), signum)
        time.sleep(5)  # the handler raises at once
    assert stopped.value.code == 128 + signum and said == [f"note: interrupted ({NAMES[signum]}) during the work; "
                                                            "run it again"]
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers before it are back


def test_a_swallowed_signal_still_ends_the_block_and_an_inner_note_is_the_only_one():
    said = []
    inner = stopping_on_signals(said.append, lambda: "inner")
    with pytest.raises(Interrupted) as stopped, stopping_on_signals(said.append, lambda: "outer"), inner:
        try:  # as a weakref callback or a library would swallow it
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Terminated:
            pass
    assert stopped.value.code == 143 and len(said) == 1 and said[0].startswith("note: interrupted (SIGTERM) during "
                                                                               "inner;")
    with pytest.raises(SystemExit) as other, stopping_on_signals(said.append, lambda: "outer"):
        sys.exit(2)  # bad input, not a signal: passes as it is
    assert other.value.code == 2 and len(said) == 1


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1"}


def signalled(command: list[str], ready, signum: int, logs) -> subprocess.CompletedProcess:
    """``command`` in a plain process of its own (its output in files under ``logs``), sent ``signum`` once
    ``ready()`` holds (polled; it must hold before the command ends)."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "stdout", "w") as out, open(logs / "stderr", "w") as err:
        process = subprocess.Popen(command, cwd=ROOT, env=environment(), stdout=out, stderr=err)
        while not ready() and process.poll() is None:
            time.sleep(0.01)
        assert process.poll() is None, "the command ended before it was interrupted"
        process.send_signal(signum)
        process.wait(timeout=HANG_GUARD)
    return subprocess.CompletedProcess(command, process.returncode, (logs / "stdout").read_text(),
                                       (logs / "stderr").read_text())


def assert_one_note(result: subprocess.CompletedProcess, signum: int, where: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 128 + signum, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    notes = [line for line in result.stdout.splitlines() if line.startswith("note: interrupted")]
    assert len(notes) == 1 and re.match(rf"note: interrupted \({NAMES[signum]}\) during {where}; run the same command "
                                        "to go on from there", notes[0]), output[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_evaluation_stopped_by_a_signal_reruns_to_the_uninterrupted_results(tmp_path, signum):
    """Sent once the job evaluates (its baseline's lock file exists): the rerun's records are an uninterrupted run's."""
    def command(job: str) -> list[str]:
        return [sys.executable, str(ROOT / "ablate.py"), *[o for o in COMMON if "max_eval" not in o],
                "mode=eval", "allow_random_head=true", "mask=resample", "mask.heads=L0", "mask.resamples=8",
                "mask.reference_examples=100", "data.max_eval_examples=160", "data.eval_batch_size=2",
                f"data.cache_dir={tmp_path / 'cache'}", f"baseline_dir={tmp_path / job / 'baselines'}",
                f"hydra.run.dir={tmp_path / job / 'job'}"]

    whole = run_script(command("whole"), cwd=ROOT, env=environment(), capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr[-3000:]
    locks = tmp_path / "stopped/baselines"
    result = signalled(command("stopped"), lambda: locks.is_dir() and any(locks.glob("*.lock")), signum,
                       tmp_path / "logs")
    assert_one_note(result, signum, re.escape(f"ablate.py mode=eval, job {tmp_path / 'stopped/job'}"))
    assert not (tmp_path / "stopped/job/results.json").exists() and not any(locks.glob("*.lock"))
    again = run_script(command("stopped"), cwd=ROOT, env=environment(), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    mine, theirs = (json.loads((tmp_path / job / "job/results.json").read_text()) for job in ("stopped", "whole"))
    assert mine["metrics"] == theirs["metrics"] and mine["baseline"] == theirs["baseline"]
    pd.testing.assert_frame_equal(*(pd.read_parquet(tmp_path / job / "job/records.parquet")
                                    for job in ("stopped", "whole")))


@pytest.mark.slow
def test_a_fine_tuning_stopped_by_sigterm_resumes_to_the_same_weights(tmp_path):
    """SIGTERM once the first checkpoint is written (Lightning's handler alone ended it with a traceback, status 1):
    status 143 and a note; the rerun resumes from last.ckpt to the uninterrupted run's weights, byte for byte."""
    command = [sys.executable, str(ROOT / "train.py"), "model=tiny_random", "task=demo_qa", "trainer.max_epochs=3",
               "trainer.num_sanity_val_steps=0", "data.max_train_examples=64", "data.max_eval_examples=24",
               "optim.lr=1e-3", "logger=none", "trainer.enable_progress_bar=false",
               f"data.cache_dir={tmp_path / 'cache'}"]
    whole = run_script([*command, f"hydra.run.dir={tmp_path / 'whole'}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=HANG_GUARD)
    assert whole.returncode == 0, whole.stderr[-3000:]
    stopped = tmp_path / "stopped"
    result = signalled([*command, f"hydra.run.dir={stopped}"], (stopped / "checkpoints/last.ckpt").exists,
                       signal.SIGTERM, tmp_path / "logs")
    assert_one_note(result, signal.SIGTERM, re.escape(f"train.py, job {stopped}"))
    assert not (stopped / "results.json").exists()
    again = run_script([*command, f"hydra.run.dir={stopped}"], cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((stopped / "results.json").read_text())["resumed_from"] == str(stopped / "checkpoints/last.ckpt")
    mine, theirs = (load_file(folder / "model/model.safetensors") for folder in (stopped, tmp_path / "whole"))
    assert mine.keys() == theirs.keys() and all((mine[name] == theirs[name]).all() for name in mine)


@pytest.mark.slow
def test_a_study_stopped_by_sigterm_says_its_stage_and_resumes(tmp_path):
    """The study's own note (its stage and job) and no other; the rerun skips what finished and completes."""
    folder = tmp_path / "study"
    command = [sys.executable, str(ROOT / "ablate.py"), "model=tiny_random", "study=quick", "logger=none",
               "study.stages=[finetune,features]", f"data.cache_dir={tmp_path / 'cache'}",
               f"baseline_dir={tmp_path / 'baselines'}", f"hydra.run.dir={folder}"]
    result = signalled(command, (folder / "features").is_dir, signal.SIGTERM, tmp_path / "logs")
    assert_one_note(result, signal.SIGTERM, r"\[2/2\] features(, job features/\S+)?")
    again = run_script(command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=HANG_GUARD)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[1/2] finetune: skipped, done" in again.stdout and "[2/2] features: done" in again.stdout
