"""JS's per-head and pairwise sums on CPU in one fused loop (numba): what ``features._js_sums`` needs.

For rows ``[N heads, T]`` (each head's weight of every (query, key) pair) and weights ``w`` ``[T]`` (the query's):

- ``own[a]   = sum_t w_t p ln p``   (p = rows[a, t])
- ``mass[a]  = sum_t w_t p``
- ``cross[a, b] = sum_t w_t s ln s`` for a < b, s = rows[a, t] + rows[b, t] (0 on and below the diagonal)

The pairwise sum is (N^2 / 2) T terms, one ``log`` each. As torch ops it takes four passes over a buffer the size of
the rows (add, log, multiply, reduce), bound by memory; here each term is computed in registers, over blocks of
``_BLOCK`` columns that stay in the cache: 3-4x faster on a CPU (BENCHMARKS.md).

Without Intel's SVML (not on PyPI for every platform) LLVM cannot vectorise a call to ``log``, so ``_log`` is
written out: Cephes' ``logf`` (x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m by a degree-9 polynomial; relative
error about 1e-7, float32's own), with the integer steps in LLVM IR because numba widens int32 arithmetic to int64.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

_BLOCK = 2048  # columns per block: a block of all heads' rows (72 x 2048 floats) fits in L2
_TINY = np.float32(1e-30)  # s ln(s + tiny): 0 for s = 0
_LN2 = np.float32(math.log(2))
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


@njit(inline="always", fastmath=True)
def _log(x):
    """ln x for float32 x > 0 (normal): Cephes' logf, e ln 2 + ln m with ln m = f - f^2/2 + f^3 P(f), f = m - 1."""
    f = _mantissa(x) - np.float32(1.0)
    z = f * f
    y = np.float32(7.0376836292e-2)
    y = y * f + np.float32(-1.1514610310e-1)
    y = y * f + np.float32(1.1676998740e-1)
    y = y * f + np.float32(-1.2420140846e-1)
    y = y * f + np.float32(1.4249322787e-1)
    y = y * f + np.float32(-1.6668057665e-1)
    y = y * f + np.float32(2.0000714765e-1)
    y = y * f + np.float32(-2.4999993993e-1)
    y = y * f + np.float32(3.3333331174e-1)
    return f + (y * f * z - np.float32(0.5) * z) + _exponent(x) * _LN2


@njit(inline="always", fastmath=True)
def _pair_block(p, q, w):
    """sum_t w s ln s, s = p + q (p already holds the tiny offset); float32 over one block."""
    total = np.float32(0.0)
    for t in range(p.size):
        s = p[t] + q[t]
        total += w[t] * s * _log(s)
    return total


@njit(fastmath=True, cache=True)
def _row(rows, w, cross, own, mass, a, lo, hi):
    """Head a's sums over columns [lo, hi): its own, and its pairs with every later head."""
    p = rows[a, lo:hi] + _TINY
    block_own, block_mass = np.float32(0.0), np.float32(0.0)
    for t in range(hi - lo):
        block_own += w[lo + t] * rows[a, lo + t] * _log(p[t])
        block_mass += w[lo + t] * rows[a, lo + t]
    own[a] += block_own
    mass[a] += block_mass
    for b in range(a + 1, rows.shape[0]):
        cross[a, b] += _pair_block(p, rows[b, lo:hi], w[lo:hi])


@njit(parallel=True, fastmath=True, cache=True)
def _sums(rows, w, cross, own, mass):
    n, count = rows.shape
    for i in prange(n // 2 + n % 2):  # head i and head n - 1 - i together: equal work per iteration
        for lo in range(0, count, _BLOCK):
            hi = min(count, lo + _BLOCK)
            _row(rows, w, cross, own, mass, i, lo, hi)
            if n - 1 - i > i:
                _row(rows, w, cross, own, mass, n - 1 - i, lo, hi)


def js_sums_cpu(rows: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cross ``[N, N]``, own ``[N]``, mass ``[N]``) of the module docstring, float64, for float32 CPU tensors;
    on as many threads as torch uses."""
    count = rows.shape[0]
    cross = np.zeros((count, count))
    own, mass = np.zeros(count), np.zeros(count)
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    _sums(rows.contiguous().numpy(), weight.contiguous().numpy(), cross, own, mass)
    return torch.from_numpy(cross), torch.from_numpy(own), torch.from_numpy(mass)
