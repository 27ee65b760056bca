"""headlab.prune_heads: the sliced model computes what the prune plan computes, with fewer weights."""

from __future__ import annotations

import copy

import pytest
import torch

import headlab
from headlab.core.models import load_model
from headlab.errors import UserError

RULES = [{"heads": "L0H1,L0H2,L1", "policy": "prune"}, {"heads": "L2H3", "policy": "prune"}]  # L1: every head


@pytest.mark.parametrize("head", ["sequence_classification", "question_answering"])
def test_physically_pruned_model_equals_the_prune_plan(tiny_cfg, inputs, head):
    model = load_model(tiny_cfg, head)
    plan = headlab.HeadPlan.from_rules(RULES, 3, 4)
    with torch.no_grad(), headlab.ablate(model, plan):
        expected = model(**inputs)
    pruned = headlab.prune_heads(copy.deepcopy(model), plan)
    with torch.no_grad():
        got = pruned(**inputs)
    for name in ("logits", "start_logits", "end_logits"):
        if name in got:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
            assert not torch.allclose(got[name], model(**inputs)[name])  # the plan changes the output
    removed = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in pruned.parameters())
    width, hidden = 32 // 4, 32
    assert removed == 7 * (3 * (hidden * width + width) + width * hidden)  # q, k, v rows + output columns
    with pytest.raises(UserError, match="physically removed"), headlab.ablate(pruned, plan):
        pass


def test_only_prune_plans_are_removed(tiny_cfg):
    model = load_model(tiny_cfg)
    with pytest.raises(UserError, match="uses uniform"):
        headlab.prune_heads(model, headlab.HeadPlan.from_rules([{"heads": "L0", "policy": "uniform"}], 3, 4))
