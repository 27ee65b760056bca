"""Shared fixtures: the tiny random BERT of conf/model/tiny_random.yaml and padded batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from forked import HANG_GUARD, run_script
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from headlab.core.models import load_model, load_tokenizer
from headlab.core.patch import attention

ROOT = Path(__file__).resolve().parents[1]

TEXTS = [
    "Dr. Smith paid 3.5 million. He left! Then she said no.",
    "The city is old. It was born in 1931.",
    "Who was the doctor?",
]
PAIRS = [
    "Where did he go? To the river.",
    "Is it old?",
    "The doctor was Smith. He lives in the town.",
]


# the longest files (or classes) first: with --no-loadscope-reorder, --dist loadscope hands them to the two workers in
# collection order, so the short ones fill in at the end and both workers finish together (xdist's own reorder, by
# the number of tests, put the one-test MiniLM file of 5 minutes last: 2.5 minutes of one worker alone)
LONGEST_FIRST = ("test_minilm_finetuning.py", "test_study.py", "test_hub_recipes.py", "test_docs_recipes.py",
                 "test_family_studies.py",
                 "test_training.py", "test_ablate.py", "test_bad_input.py", "test_ddp.py", "test_cluster_cli.py",
                 "test_docs_commands.py", "test_prune_curve.py")


def pytest_configure(config):
    """Under ``-n N`` each worker (and every process it starts) gets its share of the cores as threads: the two
    workers on two cores each ran torch with two threads, and oversubscribed OpenMP spins (a study's second seed
    took 103 s beside the other worker, 25 s alone). Set before the workers start, so they inherit it."""
    # W&B lists every installed package into each run's requirements.txt (0.17 s a run: a study's 45 runs, 8 s);
    # the tests read no such list (a user's runs still get it)
    os.environ.setdefault("WANDB__SAVE_REQUIREMENTS", "false")
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 0 and "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))


def pytest_collection_modifyitems(items):
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


def compose_train(*overrides):
    """conf/train.yaml on the tiny random BERT, composed without running anything."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=["model=tiny_random", *overrides])


@pytest.fixture(scope="session")
def tiny_cfg():
    return OmegaConf.load(ROOT / "conf/model/tiny_random.yaml")


@pytest.fixture(scope="session")
def tokenizer(tiny_cfg):
    return load_tokenizer(tiny_cfg)


@pytest.fixture
def tiny_model(tiny_cfg):
    return load_model(tiny_cfg)


@pytest.fixture(params=["one call", "per group"])
def drop_route(request, monkeypatch):
    """Both ways a layer with drop_* heads runs (``attention.JOINT_MAX_ELEMENTS``): one SDPA call over every head
    (small layers on a GPU), or one call per group of heads (larger ones, and on a CPU)."""
    limit = float("inf") if request.param == "one call" else 0
    monkeypatch.setattr(attention, "JOINT_MAX_ELEMENTS", {"cpu": limit, "cuda": limit})
    return request.param


@pytest.fixture
def encoding(tokenizer):
    """A padded batch of text pairs with offsets (rows have different lengths)."""
    return tokenizer(TEXTS, PAIRS, padding=True, return_offsets_mapping=True, return_tensors="pt")


@pytest.fixture
def inputs(encoding):
    assert (encoding["attention_mask"] == 0).any(), "the batch must contain padding"
    return {k: encoding[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.fixture
def sentence_ids(inputs):
    """Caller-given unit ids: three units per row in blocks, arbitrary (non-contiguous) integers."""
    batch, n = inputs["input_ids"].shape
    ids = torch.tensor([[7, 7, 7, 2, 2, 2, 9, 9] * (n // 8 + 1)])[:, :n].repeat(batch, 1)
    ids[1] = torch.arange(n) // 3  # row 1: short units
    return ids


def assert_close_rel(actual, expected, rtol=1e-5):
    """``actual`` equals ``expected`` to ``rtol`` relative to the magnitude of ``expected``."""
    expected = expected.double()
    scale = expected.abs().max().clamp(min=1.0)
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=rtol * scale)


# ablate.py end to end (tests/test_ablate.py, tests/test_report.py)
COMMON = ["model=tiny_random", "task=demo_pairs", "logger=csv", "trainer.enable_progress_bar=false",
          "data.max_eval_examples=40"]


def wandb_log(job_dir) -> bytes:
    """The offline W&B run file a ``logger=wandb`` job wrote (tables show as ``<key>.table.json``)."""
    return next(Path(job_dir).glob("wandb/offline-run-*/*.wandb")).read_bytes()


def run(script, *overrides, cwd_tmp, check=True, cwd=ROOT, fresh=False):
    """An entry script on the tiny BERT and demo_pairs (caches under ``cwd_tmp``), in a process of its own in ``cwd``
    (forked from a preloaded server, ``tests/forked.py``; ``fresh``: a plain subprocess)."""
    flags = [o for o in overrides if o.startswith("-")]  # -m before the overrides
    overrides = [o for o in overrides if not o.startswith("-")]
    command = [sys.executable, str(ROOT / script), *flags, *COMMON, f"data.cache_dir={cwd_tmp / 'cache'}",
               *overrides]
    if script == "ablate.py" and not any(o.startswith("baseline_dir=") for o in overrides):
        command.append(f"baseline_dir={cwd_tmp / 'baselines'}")
    result = run_script(command, cwd=cwd, timeout=HANG_GUARD, fresh=fresh)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A train.py job on demo_pairs (a few steps) that kept its checkpoints/last.ckpt: its directory and results."""
    root = tmp_path_factory.mktemp("ablate")
    run("train.py", "data.batch_size=16", "data.max_train_examples=400", "trainer.max_steps=25",
        "trainer.val_check_interval=25", "optim.lr=2e-3", "keep_training_state=true", f"hydra.run.dir={root / 'train'}",
        cwd_tmp=root)
    return root, json.loads((root / "train/results.json").read_text())


def in_parallel(function, *argument_lists) -> list:
    """``function`` over the argument lists, four calls at a time (subprocesses: mostly imports, one core each)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(function, *argument_lists))


def assert_one_error_line(result: subprocess.CompletedProcess, expected: str) -> None:
    """Bad input's contract: exit status 2, no traceback, one ``error:`` line, the last one, naming ``expected``."""
    output = result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], result.stderr[-3000:]
    assert expected in errors[0], errors[0]
