"""The fused drop_* route that benchmarks/flex_drop.py times (FlexAttention, compiled) against the float64 reference."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import ROOT, assert_close_rel
from reference import bert_forward, params_of
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

import headlab
from headlab.core.sdpa_masks import padding_mask_function

sys.path.insert(0, str(ROOT / "benchmarks"))
from flex_drop import FlexRoute

NAME = "headlab_flex_test"


@pytest.mark.slow
@pytest.mark.parametrize(("policy", "renormalize"), [("drop_intra", False), ("drop_inter", True)])
def test_fused_route_matches_reference(tiny_model, inputs, sentence_ids, policy, renormalize):
    layers, heads = tiny_model.config.num_hidden_layers, tiny_model.config.num_attention_heads
    plan = headlab.HeadPlan.from_rules([{"heads": f"H0-{heads // 2 - 1}", "policy": policy}], layers, heads)
    AttentionInterface.register(NAME, FlexRoute(torch.arange(heads) < heads // 2, policy, renormalize))
    AttentionMaskInterface.register(NAME, padding_mask_function)
    tiny_model.config._attn_implementation_internal = NAME
    with torch.no_grad():
        out = tiny_model(**inputs, sentence_ids=sentence_ids).last_hidden_state
    expected = bert_forward(params_of(tiny_model), tiny_model.config, inputs["input_ids"], inputs["attention_mask"],
                            inputs["token_type_ids"], plan.policy_of, sentence_ids, renormalize)
    valid = inputs["attention_mask"].bool()
    assert_close_rel(out[valid], expected[valid])
