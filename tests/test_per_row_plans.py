"""Per-row plans (``ablate(model, [plans])`` + ``plan_ids``) and starting a forward at a layer, against the float64
reference run on each row alone under its plan."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rel
from reference import bert_forward, params_of
from test_attention import SUBSTITUTED_RULES, constants_of, plan_of, substituted

import headlab
from headlab.core.model_parts import layer_inputs, start_at_layer
from headlab.core.plans import POLICIES
from headlab.errors import UserError


def row_alone(model, inputs, sentence_ids, row, plan, renormalize, substitutes=None):
    """Row ``row`` run alone (its padding cut off) by the float64 reference: ``[length, hidden]``; ``substitutes``:
    the reference's (``test_attention.substituted``) of the whole batch."""
    length = int(inputs["attention_mask"][row].sum())
    cut = {k: v[row : row + 1, :length] for k, v in inputs.items()}
    own = None if substitutes is None else (
        lambda layer, b, h, policy: substitutes(layer, row, h, policy)[:length])
    return bert_forward(params_of(model), model.config, cut["input_ids"], cut["attention_mask"],
                        cut["token_type_ids"], plan.policy_of, sentence_ids[row : row + 1, :length], renormalize,
                        substitutes=own)[0]


def repeated(inputs, sentence_ids, times):
    return {k: v.repeat(times, 1) for k, v in inputs.items()}, sentence_ids.repeat(times, 1)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "keep"])
def test_each_row_equals_that_row_alone_under_its_plan(tiny_model, inputs, sentence_ids, policy, renormalize):
    plans = [plan_of([], tiny_model), plan_of([{"heads": "L0H1,L1-2H0-2", "policy": policy}], tiny_model),
             plan_of(SUBSTITUTED_RULES, tiny_model), plan_of([{"heads": "all", "policy": policy}], tiny_model)]
    batch = len(inputs["input_ids"])
    rows, units = repeated(inputs, sentence_ids, len(plans))  # every row under every plan
    plan_ids = torch.arange(len(plans)).repeat_interleave(batch).roll(1)  # mixed, not in blocks
    means, head_sources, substitutes = substituted(tiny_model, inputs)
    with torch.no_grad(), headlab.ablate(tiny_model, plans, renormalize=renormalize, means=means,
                                         constants=constants_of(tiny_model)):
        out = tiny_model(**rows, sentence_ids=units, plan_ids=plan_ids,
                         head_sources=head_sources.repeat(1, len(plans), 1, 1, 1)).last_hidden_state
    for i, plan_id in enumerate(plan_ids.tolist()):
        expected = row_alone(tiny_model, inputs, sentence_ids, i % batch, plans[plan_id], renormalize, substitutes)
        assert_close_rel(out[i, : len(expected)], expected)


def test_rows_of_all_keep_plans_run_the_stock_model(tiny_model, inputs):
    keep = plan_of([], tiny_model)
    with torch.no_grad():
        stock = tiny_model(**inputs).last_hidden_state
        with headlab.ablate(tiny_model, [keep, keep]):
            out = tiny_model(**inputs, plan_ids=torch.tensor([1, 0, 1])).last_hidden_state
    torch.testing.assert_close(out, stock, rtol=0, atol=0)


def test_per_row_plans_need_plan_ids_of_the_batch_size(tiny_model, inputs, sentence_ids):
    plans = [plan_of([], tiny_model), plan_of([{"heads": "L1", "policy": "prune"}], tiny_model)]
    with torch.no_grad(), headlab.ablate(tiny_model, plans):
        with pytest.raises(ValueError, match="plan_ids=LongTensor"):
            tiny_model(**inputs)
        with pytest.raises(ValueError, match=r"shape \[batch\] = \[3\]; got \[2\]"):
            tiny_model(**inputs, plan_ids=torch.tensor([0, 1]))
        for bad in (-1, 2):  # -1 picked the last plan
            with pytest.raises(ValueError, match=rf"plan_ids holds {bad}; each must index one of the 2 plans"):
                tiny_model(**inputs, plan_ids=torch.tensor([0, bad, 1]))
        with pytest.raises(ValueError, match="must hold integers"):
            tiny_model(**inputs, plan_ids=torch.tensor([0.0, 1.0, 1.0]))
    one_plan = pytest.raises(ValueError, match="plan_ids given, but the model is under one plan")
    with torch.no_grad(), headlab.ablate(tiny_model, plans[1]), one_plan:  # plan_ids would be ignored
        tiny_model(**inputs, plan_ids=torch.tensor([0, 1, 0]))
    with pytest.raises(UserError, match="non-empty sequence of HeadPlans"), headlab.ablate(tiny_model, []):
        pass


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_forward_started_at_a_layer_equals_the_full_forward(tiny_model, inputs, sentence_ids, layer):
    """Plans that change only layers >= l: the layers below compute the unablated states, so starting at l is exact."""
    plan = plan_of([{"heads": f"L{layer}H1", "policy": "drop_intra"}, {"heads": "L2H0", "policy": "uniform"}],
                   tiny_model)
    with torch.no_grad():
        with layer_inputs(tiny_model) as hidden:
            tiny_model(**inputs)
        assert len(hidden) == tiny_model.config.num_hidden_layers
        with headlab.ablate(tiny_model, plan):
            full = tiny_model(**inputs, sentence_ids=sentence_ids).last_hidden_state
            with start_at_layer(tiny_model, layer, hidden[layer]):
                started = tiny_model(**inputs, sentence_ids=sentence_ids).last_hidden_state
    valid = inputs["attention_mask"].bool()
    torch.testing.assert_close(started[valid], full[valid], rtol=1e-6, atol=1e-6)
    assert len(tiny_model.base_model.encoder.layer) == tiny_model.config.num_hidden_layers  # restored
    assert not tiny_model.base_model.encoder._forward_pre_hooks
