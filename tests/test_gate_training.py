"""The gated task module (``analysis.gates.gate_training``): its training objective and its gradient by the gates,
against the model's own float64 forward with each head's context times a hard concrete draw written in the test
(tests/families.py ``reference_of``), and the deterministic gates in evaluation."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import PAIRS, TEXTS, compose_train
from families import reference_of

from headlab.analysis.gates.gate_training import gated_module
from headlab.cli.schema import register_configs

register_configs()
GATES = {"method": "l0", "l0_lambda": 0.3, "init": 0.4, "train_model": False, "lr": 0.1}


@pytest.fixture(scope="module")
def gated(tokenizer):
    cfg = compose_train("task=demo_pairs")
    module = gated_module(cfg.model, cfg.task, cfg.mask, cfg.optim, GATES).double()
    with torch.no_grad():  # gates that differ by head, some closed at test time
        module.log_alpha.copy_(torch.linspace(-3.0, 3.0, module.log_alpha.numel()).view_as(module.log_alpha))
    batch = dict(tokenizer(TEXTS, PAIRS, padding=True, return_tensors="pt"), labels=torch.tensor([1, 0, 1]))
    return module, batch


def reference_logits(module, batch, gates: torch.Tensor) -> torch.Tensor:
    """The classifier's logits with every head's context times ``gates`` ``[layers, heads]``, by definition."""
    expanded = gates.expand(len(batch["input_ids"]), *gates.shape)
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids")}
    with reference_of(module.model, lambda depth, head: "keep", None, False,
                      toward=("keep", expanded, torch.zeros_like(expanded))) as reference:
        return reference(**inputs).logits


def test_the_objective_is_the_task_loss_plus_lambda_times_the_expected_open_gates(gated):
    module, batch = gated
    module.train()
    assert not module.model.training and module.training  # a frozen model runs without dropout
    torch.manual_seed(7)
    objective = module.training_loss(batch, module(batch))
    mine, = torch.autograd.grad(objective, [module.log_alpha])
    log_alpha = module.log_alpha.detach().clone().requires_grad_(True)
    torch.manual_seed(7)  # the same uniform noise, and Louizos et al.'s draw written out
    u = torch.rand(log_alpha.shape, dtype=torch.float64) * (1 - 2e-6) + 1e-6
    s = torch.sigmoid((torch.log(u) - torch.log(1 - u) + log_alpha) / (2 / 3))
    z = (s * 1.2 - 0.1).clamp(0, 1)
    task_loss = torch.nn.functional.cross_entropy(reference_logits(module, batch, z), batch["labels"])
    expected = task_loss + 0.3 * torch.sigmoid(log_alpha - (2 / 3) * math.log(0.1 / 1.1)).sum()
    gradient, = torch.autograd.grad(expected, [log_alpha])
    assert float(objective.detach()) == pytest.approx(float(expected.detach()), rel=1e-10)
    torch.testing.assert_close(mine, gradient, rtol=1e-8, atol=1e-12)
    assert ((z > 0) & (z < 1)).any() and (z == 0).any()  # the draw has open, partial and closed gates
    assert all(p.grad is None and not p.requires_grad for p in module.model.parameters())  # only the gates train


def test_evaluation_uses_the_deterministic_gates(gated):
    module, batch = gated
    module.eval()
    with torch.no_grad():
        logits = module(batch).logits
        gates = (torch.sigmoid(module.log_alpha) * 1.2 - 0.1).clamp(0, 1)
        torch.testing.assert_close(logits, reference_logits(module, batch, gates), rtol=1e-10, atol=1e-12)
        assert (gates == 0).any() and (gates == 1).any()
