"""The features' sums of p ln p on CPU, each in one fused loop (numba): JS's pairwise sums and Clark's entropy.

``js_sums_cpu``: for rows ``[N heads, T]`` (each head's weight of every (query, key) pair) and weights ``w``
``[T]`` (the query's):

- ``own[a]   = sum_t w_t p ln p``   (p = rows[a, t])
- ``mass[a]  = sum_t w_t p``
- ``cross[a, b] = sum_t w_t s ln s`` for a < b, s = rows[a, t] + rows[b, t] (0 on and below the diagonal)

The pairwise sum is (N^2 / 2) T terms, one ``log`` each. As torch ops it takes four passes over a buffer the size of
the rows (add, log, multiply, reduce), bound by memory; here each term is computed in registers, over blocks of
``_BLOCK`` columns that stay in the cache: 5-7x faster on a CPU (BENCHMARKS.md).

``entropy_cpu``: ``-sum_j p ln p`` of every attention row, one pass instead of torch's four (add, log, multiply, sum).

Without Intel's SVML (not on PyPI for every platform) LLVM cannot vectorise a call to ``log``, so ``_log2`` is
written out: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log2 x = e + f R(f) with f = m - 1 and R a degree-8 fit of
log2(1 + f) / f (within 2.5 float32 ulp of the exact log2); the loops sum ``p log2 p`` and multiply by ln 2 at
the end. The integer steps are written in LLVM IR because numba widens int32 arithmetic to int64 (20% slower).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

_BLOCK = 2048  # columns per block: a block of all heads' rows (72 x 2048 floats) fits in L2
_TINY = np.float32(1e-30)  # s log2(s + tiny): 0 for s = 0 (and a normal float32, which _log2 needs)
_LN2_64 = math.log(2)
_I32 = ir.IntType(32)
_SQRT_HALF = ir.Constant(_I32, 0x3F3504F3)  # the bits of float32 sqrt(1/2)


def _offset_bits(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x's bits minus sqrt(1/2)'s: e above bit 23 and m's mantissa below, for x = m 2^e, m in [sqrt(1/2), sqrt(2))."""
    return builder.sub(builder.bitcast(x, _I32), _SQRT_HALF)


@intrinsic
def _mantissa(typingctx, x):
    """m of x = m 2^e, m in [sqrt(1/2), sqrt(2)) (x > 0, normal)."""
    def codegen(context, builder, signature, args):
        bits = builder.and_(_offset_bits(builder, args[0]), ir.Constant(_I32, 0x007FFFFF))
        return builder.bitcast(builder.add(bits, _SQRT_HALF), ir.FloatType())
    return types.float32(types.float32), codegen


@intrinsic
def _exponent(typingctx, x):
    """e of x = m 2^e, m in [sqrt(1/2), sqrt(2)), as a float32."""
    def codegen(context, builder, signature, args):
        return builder.sitofp(builder.ashr(_offset_bits(builder, args[0]), ir.Constant(_I32, 23)), ir.FloatType())
    return types.float32(types.float32), codegen


def _log2_fit(degree: int = 8, nodes: int = 64) -> tuple[np.float32, ...]:
    """Coefficients (constant first, float32) of R(f) ~ log2(1 + f) / f on f in [sqrt(1/2) - 1, sqrt(2) - 1]: least
    squares at Chebyshev nodes (relative error 3e-8 at degree 8)."""
    low, high = math.sqrt(0.5) - 1, math.sqrt(2) - 1
    f = (low + high) / 2 + (high - low) / 2 * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    fit = np.polynomial.Chebyshev.fit(f, np.log2(1 + f) / f, degree, domain=[low, high])
    return tuple(np.float32(c) for c in fit.convert(kind=np.polynomial.Polynomial).coef)


_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8 = _log2_fit()


@njit(inline="always", fastmath=True)
def _log2(x):
    """log2 x for float32 x > 0 (normal): e + f R(f), x = m 2^e, f = m - 1, R(f) ~ log2(1 + f) / f."""
    f = _mantissa(x) - np.float32(1.0)
    r = _C8 * f + _C7
    r = r * f + _C6
    r = r * f + _C5
    r = r * f + _C4
    r = r * f + _C3
    r = r * f + _C2
    r = r * f + _C1
    r = r * f + _C0
    return f * r + _exponent(x)


@njit(inline="always", fastmath=True)
def _pair_block(p, q, w):
    """sum_t w s log2 s, s = p + q (p already holds the tiny offset); float32 over one block."""
    total = np.float32(0.0)
    for t in range(p.size):
        s = p[t] + q[t]
        total += w[t] * s * _log2(s)
    return total


@njit(fastmath=True, cache=True)
def _row(rows, w, cross, own, mass, a, lo, hi):
    """Head a's sums over columns [lo, hi) (log2): its own, and its pairs with every later head."""
    p = rows[a, lo:hi] + _TINY
    block_own, block_mass = np.float32(0.0), np.float32(0.0)
    for t in range(hi - lo):
        block_own += w[lo + t] * rows[a, lo + t] * _log2(p[t])
        block_mass += w[lo + t] * rows[a, lo + t]
    own[a] += block_own
    mass[a] += block_mass
    for b in range(a + 1, rows.shape[0]):
        cross[a, b] += _pair_block(p, rows[b, lo:hi], w[lo:hi])


@njit(parallel=True, fastmath=True, cache=True)
def _sums(rows, w, cross, own, mass):
    """Every head's block sums, added into cross / own / mass (log2)."""
    n, count = rows.shape
    for i in prange(n // 2 + n % 2):  # head i and head n - 1 - i together: equal work per iteration
        for lo in range(0, count, _BLOCK):
            hi = min(count, lo + _BLOCK)
            _row(rows, w, cross, own, mass, i, lo, hi)
            if n - 1 - i > i:
                _row(rows, w, cross, own, mass, n - 1 - i, lo, hi)


@contextmanager
def _on_torchs_threads() -> Iterator[None]:
    """numba's loops on as many threads as torch uses (numba's own default is every core), and torch's count kept:
    numba's OpenMP pool runs on the libgomp torch loaded and, when it starts, sets the process's OpenMP threads to
    every core (torch then ran on 2 threads where 1 was asked, and the spare one spun beside other processes)."""
    threads = torch.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def js_sums_cpu(rows: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cross ``[N, N]``, own ``[N]``, mass ``[N]``) of the module docstring, float64, for float32 CPU tensors;
    on as many threads as torch uses."""
    count = rows.shape[0]
    cross = np.zeros((count, count))
    own, mass = np.zeros(count), np.zeros(count)
    with _on_torchs_threads():
        _sums(rows.contiguous().numpy(), weight.contiguous().numpy(), cross, own, mass)
    cross *= _LN2_64  # the loop sums s log2 s
    own *= _LN2_64
    return torch.from_numpy(cross), torch.from_numpy(own), torch.from_numpy(mass)


@njit(parallel=True, fastmath=True, cache=True)
def _entropies(rows, out):
    """out[r] = -sum_j p log2 p over row r of ``rows`` ``[R, seq]``."""
    for r in prange(rows.shape[0]):
        total = np.float32(0.0)
        for j in range(rows.shape[1]):
            total += rows[r, j] * _log2(rows[r, j] + _TINY)
        out[r] = -total


def entropy_cpu(weights: torch.Tensor) -> torch.Tensor:
    """``[..., seq]`` entropy (nats) of each row of ``weights`` ``[..., seq, seq]`` (float32, CPU): -sum p ln p."""
    rows = weights.detach().contiguous().view(-1, weights.shape[-1]).numpy()
    out = np.empty(rows.shape[0], dtype=np.float32)
    with _on_torchs_threads():
        _entropies(rows, out)
    return torch.from_numpy(out).view(weights.shape[:-1]).mul_(_LN2_64)
