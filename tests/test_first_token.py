"""The last layer at the first token (``headlab.core.patch.first_token``): a classification head's logits equal the
whole forward's in float64, with padding and with a replayed layer's contexts, and the heads that read more are
refused."""

from __future__ import annotations

import pytest
import torch
from families import batch, tiny_model
from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification

from headlab.core.model_parts import replay_self_attention, self_attention_output
from headlab.core.patch.ablate import ablate
from headlab.core.patch.first_token import last_layer_at_first_token, plan_at_first_token, reads_first_token
from headlab.core.plans import HeadPlan
from headlab.core.units import SHARED

CLASSIFIERS = ["bert", "roberta", "xlm-roberta", "electra"]


def classifier(name: str) -> torch.nn.Module:
    return tiny_model(name, AutoModelForSequenceClassification).double()


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_logits_equal_the_whole_forward(name):
    model, inputs = classifier(name), batch()
    inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    with torch.no_grad():
        whole = model(**inputs).logits
        with last_layer_at_first_token(model, inputs["attention_mask"]):
            first = model(**inputs).logits
        # a padding key that counted would move the logits: the rows are padded to 11 tokens
        unmasked = torch.ones_like(inputs["attention_mask"])
        with last_layer_at_first_token(model, unmasked):
            wrong = model(**inputs).logits
    torch.testing.assert_close(first, whole, rtol=1e-12, atol=1e-12)
    assert (wrong - whole).abs().max() > 1e-6, "the key mask must matter, or the comparison proves nothing"


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_replayed_contexts_of_the_last_layer(name):
    """A sweep replays the last layer's contexts: changed ones (a head's columns zeroed) reach the logits as through
    the whole layer."""
    model, inputs = classifier(name), batch()
    inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    last = model.config.num_hidden_layers - 1
    with torch.no_grad():
        with self_attention_output(model, last) as seen:
            model(**inputs)
        contexts = seen[0].clone()  # [batch, seq, heads * head_dim]
        contexts[..., 8:16] = 0  # head 1 pruned
        with replay_self_attention(model, last, contexts):
            whole = model(**inputs).logits
        with last_layer_at_first_token(model, inputs["attention_mask"], contexts):
            first = model(**inputs).logits
        plain = model(**inputs).logits
    torch.testing.assert_close(first, whole, rtol=1e-12, atol=1e-12)
    assert (whole - plain).abs().max() > 1e-6


@pytest.mark.parametrize("name", ["bert", "roberta"])
@pytest.mark.parametrize("renormalize", [False, True])
def test_a_plans_last_layer_at_the_first_token(name, renormalize):
    """Every policy the first token can run, in the last layer and below, gives the whole patched forward's logits;
    ``drop_*`` leave a special first token's row alone, so the same plan on a word first must not be run there."""
    model, inputs = classifier(name), batch()
    inputs["sentence_ids"][:, 0] = SHARED  # [CLS]
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    last = f"L{layers - 1}"
    plan = HeadPlan.from_rules([{"heads": f"{last}H0", "policy": "prune"}, {"heads": f"{last}H1", "policy": "uniform"},
                                {"heads": f"{last}H2", "policy": "drop_intra"},
                                {"heads": f"{last}H3", "policy": "drop_inter"},
                                {"heads": "L0H1", "policy": "drop_inter"}, {"heads": "L0H0", "policy": "uniform"}],
                               layers, heads)
    assert plan_at_first_token(plan)
    with torch.no_grad():
        plain = model(**{k: v for k, v in inputs.items() if k != "sentence_ids"}).logits
        with ablate(model, plan, renormalize):
            whole = model(**inputs).logits
            with last_layer_at_first_token(model, inputs["attention_mask"], plan=plan):
                first = model(**inputs).logits
            with last_layer_at_first_token(model, inputs["attention_mask"]):
                unplanned = model(**inputs).logits  # the last layer's heads all kept
    torch.testing.assert_close(first, whole, rtol=1e-12, atol=1e-12)
    assert (whole - plain).abs().max() > 1e-6 and (unplanned - whole).abs().max() > 1e-6
    mean = HeadPlan.from_rules([{"heads": f"{last}H0", "policy": "mean"}], layers, heads)
    assert not plan_at_first_token(mean)
    with pytest.raises(ValueError, match="mean or resample"):
        last_layer_at_first_token(model, inputs["attention_mask"], plan=mean).__enter__()


def test_heads_that_read_more_than_the_first_token_are_refused():
    assert reads_first_token(classifier("bert"))
    assert not reads_first_token(tiny_model("bert", AutoModelForQuestionAnswering))  # spans read every position
    assert not reads_first_token(tiny_model("deberta-v2", AutoModelForSequenceClassification))  # relative positions
    assert not reads_first_token(tiny_model("modernbert", AutoModelForSequenceClassification))  # rotary positions
    relative = classifier("bert")
    relative.config.position_embedding_type = "relative_key"
    assert not reads_first_token(relative)
    refused = last_layer_at_first_token(tiny_model("bert", AutoModelForQuestionAnswering), torch.ones(1, 3))
    with pytest.raises(ValueError, match="not its last layer's first position"):
        refused.__enter__()
