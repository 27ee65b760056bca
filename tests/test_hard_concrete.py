"""Hard concrete gates against Louizos et al.'s formulas, written here in float64 from the paper (section 4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headlab.analysis.gates import hard_concrete

LOG_ALPHA = torch.tensor([-6.0, -1.5, -0.2, 0.0, 0.7, 2.5, 8.0], dtype=torch.float64)


def reference_sample(log_alpha: float, u: float) -> float:
    s = 1.0 / (1.0 + math.exp(-(math.log(u) - math.log(1.0 - u) + log_alpha) / (2.0 / 3.0)))
    return min(1.0, max(0.0, s * 1.2 - 0.1))


def test_a_sample_is_the_stretched_clipped_binary_concrete_draw():
    u = torch.tensor([0.01, 0.2, 0.5, 0.5, 0.93, 0.6, 0.999], dtype=torch.float64)
    z = hard_concrete.sample(LOG_ALPHA, u)
    assert z.tolist() == pytest.approx([reference_sample(a, b) for a, b in zip(LOG_ALPHA.tolist(), u.tolist())],
                                       abs=1e-15)
    assert z[0] == 0.0 and z[-1] == 1.0  # exact zeros and ones, the point of stretching


def test_the_expected_l0_is_the_probability_that_a_gate_is_open():
    """The closed form against the probability of a draw being above 0, found by the inverse of the sample in u:
    z > 0 iff s > -gamma / (zeta - gamma) iff u > 1 / (1 + exp(log_alpha - beta log(-gamma / zeta)))."""
    expected = hard_concrete.open_probability(LOG_ALPHA)
    for log_alpha, p in zip(LOG_ALPHA.tolist(), expected.tolist()):
        gamma, zeta = -0.1, 1.1
        threshold = -gamma / (zeta - gamma)  # the s at which the stretched value is 0
        logit = math.log(threshold / (1 - threshold)) * (2.0 / 3.0) - log_alpha  # log u - log(1 - u) at it
        u_zero = 1.0 / (1.0 + math.exp(-logit))
        assert p == pytest.approx(1.0 - u_zero, rel=1e-12)
        assert p == pytest.approx(1.0 / (1.0 + math.exp(-(log_alpha - (2.0 / 3.0) * math.log(0.1 / 1.1)))), rel=1e-12)
    generator = torch.Generator().manual_seed(0)  # and by counting draws
    draws = torch.stack([hard_concrete.sample(LOG_ALPHA, generator=generator) for _ in range(40000)])
    np.testing.assert_allclose((draws > 0).double().mean(0), expected, atol=0.01)


def test_the_test_time_gate_and_the_gradient_of_the_penalty():
    gates = hard_concrete.deterministic(LOG_ALPHA)
    reference = [min(1.0, max(0.0, 1.2 / (1.0 + math.exp(-a)) - 0.1)) for a in LOG_ALPHA.tolist()]
    assert gates.tolist() == pytest.approx(reference, abs=1e-15)
    log_alpha = LOG_ALPHA.clone().requires_grad_(True)
    hard_concrete.open_probability(log_alpha).sum().backward()
    p = hard_concrete.open_probability(LOG_ALPHA)
    torch.testing.assert_close(log_alpha.grad, p * (1 - p))  # d sigmoid(x) / dx
