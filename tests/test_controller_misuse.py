"""One controller per set of attention modules, whichever wrapper (``model`` or ``model.bert``) reached it first;
copies of a model inside a block come out with stock attention; the pruned-model check sees the base model's heads.
Every expected output is the float64 reference forward of tests/reference.py."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_close_rel
from reference import bert_forward, classifier_logits, params_of
from transformers import BertForSequenceClassification

import headlab
from headlab.core.pruning import pruned_heads_of
from headlab.errors import UserError

RULES = [{"heads": "L0", "policy": "prune"}, {"heads": "L1H0-1", "policy": "uniform"}]


@pytest.fixture
def classifier(tiny_model):
    torch.manual_seed(3)
    return BertForSequenceClassification(copy.deepcopy(tiny_model.config)).eval()


def plan_of(model, rules=RULES):
    return headlab.HeadPlan.from_rules(rules, model.config.num_hidden_layers, model.config.num_attention_heads)


def expected_logits(model, inputs, plan):
    """The classifier's logits under ``plan`` (None: stock attention), from the float64 reference."""
    params = params_of(model)
    policy_of = plan.policy_of if plan is not None else (lambda layer, head: "keep")
    hidden = bert_forward(params, model.config, inputs["input_ids"], inputs["attention_mask"],
                          inputs["token_type_ids"], policy_of)
    return classifier_logits(params, hidden)


@pytest.mark.parametrize("first", ["ablate", "features", "prune_heads"])
def test_base_model_first_then_full_model_applies_the_plan(classifier, tokenizer, inputs, first):
    plan = plan_of(classifier)
    if first == "ablate":
        with headlab.ablate(classifier.bert, plan):
            pass
    elif first == "features":
        headlab.attention_features(classifier.bert, tokenizer, [inputs], families=("distance",))
    else:  # a copy is pruned; the original's modules are untouched
        headlab.prune_heads(copy.deepcopy(classifier).bert, plan_of(classifier, [{"heads": "L0", "policy": "prune"}]))
    with torch.no_grad(), headlab.ablate(classifier, plan):
        out = classifier(**inputs).logits
    assert_close_rel(out, expected_logits(classifier, inputs, plan))
    if first != "prune_heads":
        assert classifier.__dict__["_headlab_controller"] is classifier.bert.__dict__["_headlab_controller"]


def test_nesting_through_the_other_wrapper_is_refused_and_keeps_the_outer_plan(classifier, inputs):
    plan = plan_of(classifier)
    with torch.no_grad(), headlab.ablate(classifier, plan):
        with pytest.raises(ValueError, match="nesting"), headlab.ablate(classifier.bert, plan_of(classifier, [])):
            pass
        out = classifier(**inputs).logits  # the outer plan still holds
    assert_close_rel(out, expected_logits(classifier, inputs, plan))


def test_deep_copy_inside_a_block_has_stock_attention(classifier, inputs):
    plan = plan_of(classifier)
    with torch.no_grad(), headlab.ablate(classifier, plan):
        twin = copy.deepcopy(classifier)
        assert_close_rel(classifier(**inputs).logits, expected_logits(classifier, inputs, plan))
        assert_close_rel(twin(**inputs).logits, expected_logits(classifier, inputs, None))  # never ablated
    with torch.no_grad():
        assert_close_rel(twin(**inputs).logits, expected_logits(classifier, inputs, None))
        assert twin.config._attn_implementation == "sdpa"
        with headlab.ablate(twin, plan):  # the copy has a controller of its own that works
            assert_close_rel(twin(**inputs).logits, expected_logits(classifier, inputs, plan))
        assert_close_rel(classifier(**inputs).logits, expected_logits(classifier, inputs, None))


def test_pruning_the_base_model_shows_on_the_full_model(classifier):
    headlab.prune_heads(classifier.bert, plan_of(classifier, [{"heads": "L0H0", "policy": "prune"}]))
    assert pruned_heads_of(classifier) == {0: [0]}
    with pytest.raises(UserError, match="physically removed"), headlab.ablate(classifier, plan_of(classifier)):
        pass
    with pytest.raises(UserError, match="already physically pruned"):
        headlab.prune_heads(classifier, plan_of(classifier, [{"heads": "L1H0", "policy": "prune"}]))
