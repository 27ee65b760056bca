"""The benchmark scripts' bad arguments: one ``error:`` line naming the value, exit status 2, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import ROOT, assert_one_error_line, in_parallel
from forked import HANG_GUARD, run_script

NO_CUDA = not torch.cuda.is_available()

# (script, arguments, text the error line must contain)
CASES = [
    ("attention_overhead.py", ["--dtype", "float64"], "'float64'"),
    ("attention_overhead.py", ["--shape", "bert-huge"], "'bert-huge'"),
    ("attention_overhead.py", ["--device", "tpu"], "'tpu'"),
    ("attention_overhead.py", ["--only", "two heads"], "--only 'two heads' names no plan; plans: identity"),
    ("train_throughput.py", ["--precision", "16-mixed"], "'16-mixed'"),
    ("train_throughput.py", ["--shape", "gpt2"], "'gpt2'"),
    ("eval_speed.py", ["sweep", "--rows", "100"], "--rows 100 needs --task demo_pairs"),
    ("eval_speed.py", ["sweep", "--precision", "bf17"], "'bf17'"),
    ("eval_speed.py", ["sweep", "--only", "sweep_heads,plain"], "--only 'sweep_heads,plain': 'plain' is not a side of "
                     "sweep; choose from sweep_heads"),
    ("features_speed.py", ["speed", "--sequences", "0"], "--sequences 0"),
    ("features_speed.py", ["js", "--columns", "0"], "--columns 0"),
    ("profile_plan.py", ["--shape", "tiny", "--heads", "H0-5"], "--heads 'H0-5'"),
    ("substitutes_speed.py", ["heads", "--permutations", "1"], "--permutations at least 2"),
    ("substitutes_speed.py", ["shapley", "--over", "heads"], "'heads'"),
]
if NO_CUDA:
    CASES += [(script, ["--device", "cuda"], "CUDA is not available")
              for script in ("attention_overhead.py", "train_throughput.py", "eval_speed.py sweep")]


def run(script: str, arguments: list[str]) -> subprocess.CompletedProcess:
    script, *words = script.split()
    command = [sys.executable, str(ROOT / "benchmarks" / script), *words, *arguments]
    return run_script(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)


@pytest.fixture(scope="module")
def outcomes():
    return in_parallel(lambda case: run(case[0], case[1]), CASES)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_bad_benchmark_argument_prints_one_error_line(case, outcomes):
    assert_one_error_line(outcomes[case], CASES[case][2])
