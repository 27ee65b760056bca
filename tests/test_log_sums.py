"""The fused CPU loops (numba) of JS and entropy, and JS's torch ops, against sums written here in float64."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from numba import njit

from headlab.analysis.types.features import _js_sums, _js_sums_torch
from headlab.analysis.types.log_sums import _log2, entropy_cpu, js_sums_cpu


@njit
def _logs(x, out):
    for i in range(x.size):
        out[i] = _log2(x[i])


def brute_force(rows: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cross, own, mass) from their definitions, float64, a pair at a time; 0 ln 0 = 0."""
    rows, weight = rows.astype(np.float64), weight.astype(np.float64)
    xlnx = lambda x: np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)  # noqa: E731
    count = len(rows)
    cross = np.zeros((count, count))
    for a in range(count):
        for b in range(a + 1, count):
            cross[a, b] = (weight * xlnx(rows[a] + rows[b])).sum()
    return cross, (weight * xlnx(rows)).sum(1), (weight * rows).sum(1)


def attention_rows(rng: np.random.Generator, heads: int, columns: int) -> np.ndarray:
    """[heads, columns] of softmax-like weights: Dirichlet rows of 16 keys, some sharp, some exactly 0 (pruned)."""
    keys = 16
    rows = rng.dirichlet(np.full(keys, 0.3), size=(heads, -(-columns // keys))).reshape(heads, -1)[:, :columns]
    rows[heads // 2, : columns // 3] = 0.0  # a pruned head's weights
    rows[0, :: 7] = 1e-39  # subnormal weights
    return rows.astype(np.float32)


@pytest.mark.parametrize(("heads", "columns"), [(1, 5), (2, 1), (3, 2047), (5, 2048), (8, 2049), (13, 6001)])
def test_the_fused_loop_equals_the_sums_by_definition(heads, columns):
    """Odd and even head counts (heads are paired for the threads), block edges (2048 columns), one column."""
    rng = np.random.default_rng(heads * 1000 + columns)
    rows, weight = attention_rows(rng, heads, columns), rng.random(columns).astype(np.float32)
    expected = brute_force(rows, weight)
    for got, want, name in zip(js_sums_cpu(torch.from_numpy(rows), torch.from_numpy(weight)), expected,
                               ("cross", "own", "mass")):
        assert got.dtype == torch.float64
        scale = np.abs(want).max() + 1.0
        np.testing.assert_allclose(got.numpy(), want, atol=2e-6 * scale, rtol=0, err_msg=name)
        if name == "cross":
            np.testing.assert_array_equal(np.tril(got.numpy()), 0.0)


def test_the_torch_loop_and_the_fused_loop_give_the_same_divergences():
    rng = np.random.default_rng(7)
    rows, weight = torch.from_numpy(attention_rows(rng, 9, 3000)), torch.rand(3000, generator=torch.manual_seed(0))
    cross, own, mass = brute_force(rows.numpy(), weight.numpy())
    expected = np.triu((own[:, None] + own[None, :]) / 2 - cross / 2 + np.log(2) / 2 * (mass[:, None] + mass[None, :]),
                       1)
    for got in (_js_sums(rows, weight), _js_sums(rows.double(), weight.double())):  # fused loop, then torch's
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-5 * np.abs(expected).max(), rtol=0)
    for got, want in zip(_js_sums_torch(rows, weight), (cross, own, mass)):
        np.testing.assert_allclose(got.numpy(), want, atol=2e-6 * (np.abs(want).max() + 1.0), rtol=0)


def test_entropy_of_every_row_equals_its_definition():
    rng = np.random.default_rng(3)
    weights = rng.dirichlet(np.full(37, 0.2), size=(3, 5, 37))  # [batch, heads, seq, seq]
    weights[0, 1, 2] = np.eye(37)[4]  # a one-hot row: 0 ln 0 terms, entropy 0
    weights[1, 0, :, 10:] = 0.0  # padding keys
    weights[1, 0] /= weights[1, 0].sum(-1, keepdims=True)
    weights = weights.astype(np.float32)
    exact = weights.astype(np.float64)
    expected = -np.where(exact > 0, exact * np.log(np.where(exact > 0, exact, 1.0)), 0.0).sum(-1)
    got = entropy_cpu(torch.from_numpy(weights))
    assert got.shape == (3, 5, 37) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), expected, atol=2e-6, rtol=0)
    assert got[0, 1, 2] == 0.0
    np.testing.assert_allclose(entropy_cpu(torch.full((2, 8, 8), 1 / 8)).numpy(), np.log(8), rtol=1e-6)


def test_the_written_out_log_is_as_exact_as_float32():
    rng = np.random.default_rng(0)
    x = np.concatenate([10.0 ** rng.uniform(-30, 0.31, 100_000), rng.uniform(0.5, 2.0, 100_000),
                        [1.0, 2.0, 0.5, np.sqrt(0.5), np.sqrt(2.0), 1e-30, 1.17549435e-38]]).astype(np.float32)
    out = np.empty_like(x)
    _logs(x, out)
    exact = np.log2(x.astype(np.float64))
    spacing = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)  # one float32 ulp of the result
    assert np.all(np.abs(out - exact) <= 2.5 * spacing + 1e-7)  # within 2.5 ulp, or 1e-7 near log2 x = 0
    assert [out[x == v][0] for v in (1.0, 2.0, 0.5)] == [0.0, 1.0, -1.0]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: numba's pool would ask no more threads than torch")
def test_the_fused_loops_leave_torchs_thread_count_as_it_was():
    """numba's OpenMP pool shares torch's libgomp and, when it starts, set the process's OpenMP threads to every core:
    after a features job torch ran on 2 threads where ``OMP_NUM_THREADS=1`` asked 1 (a fresh process: the pool
    starts once)."""
    script = ("import torch\nfrom headlab.analysis.types.log_sums import entropy_cpu, js_sums_cpu\n"
              "js_sums_cpu(torch.rand(8, 64), torch.rand(64))\nentropy_cpu(torch.rand(2, 8, 8))\n"
              "print(torch.get_num_threads())")
    result = subprocess.run([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"},
                            capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["1"]
