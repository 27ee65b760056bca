"""Hard concrete gates (Louizos et al. 2018, section 4), one per head as Voita et al. 2019 put them.

A gate with location ``log_alpha`` draws ``u ~ U(0, 1)`` and

    s = sigmoid((log u - log(1 - u) + log_alpha) / beta)       # the binary concrete sample
    z = min(1, max(0, s (zeta - gamma) + gamma))               # stretched to (gamma, zeta), then clipped

so ``z`` is exactly 0 or 1 with positive probability. The expected L0 norm (the probability that ``z`` is not 0) is
``sigmoid(log_alpha - beta log(-gamma / zeta))``, differentiable in ``log_alpha``. At test time the gate is the
deterministic ``min(1, max(0, sigmoid(log_alpha) (zeta - gamma) + gamma))``. The constants are the papers':
``beta = 2/3``, ``(gamma, zeta) = (-0.1, 1.1)``.
"""

from __future__ import annotations

import math

import torch

BETA = 2.0 / 3.0  # temperature
GAMMA, ZETA = -0.1, 1.1  # the stretch interval
EPSILON = 1e-6  # u is drawn from [EPSILON, 1 - EPSILON]: log u and log(1 - u) stay finite


def sample(log_alpha: torch.Tensor, u: torch.Tensor | None = None, generator: torch.Generator | None = None
           ) -> torch.Tensor:
    """A draw of the gates ``z`` (shaped as ``log_alpha``), differentiable in ``log_alpha`` (reparameterised);
    ``u``: the uniform noise (drawn when None)."""
    if u is None:
        u = torch.rand(log_alpha.shape, generator=generator, device=log_alpha.device, dtype=log_alpha.dtype)
        u = u * (1 - 2 * EPSILON) + EPSILON
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return (s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)


def open_probability(log_alpha: torch.Tensor) -> torch.Tensor:
    """P(z != 0) per gate: its expected L0 norm (the penalty sums it over the heads)."""
    return torch.sigmoid(log_alpha - BETA * math.log(-GAMMA / ZETA))


def deterministic(log_alpha: torch.Tensor) -> torch.Tensor:
    """The test-time gates: the clipped, stretched ``sigmoid(log_alpha)``; a head whose gate is 0 is closed."""
    return (torch.sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0)
