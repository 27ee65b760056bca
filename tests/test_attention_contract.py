"""The GPU contract of the patched attention (DESIGN.md section 3): exact in float64 too, plan states built
once and cached, no host-device synchronisation (``torch.compile(fullgraph=True)`` finds no data-dependent
branch; on CUDA, ``set_sync_debug_mode("error")``)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rel
from test_attention import MIXED_RULES, SUBSTITUTED_RULES, constants_of, plan_of, reference, substituted

import headlab
from headlab.core.patch.attention import Controller
from headlab.core.plans import POLICIES

PLANS = {**{policy: [{"heads": "L0H1,L1,L2H2-3", "policy": policy}] for policy in POLICIES if policy != "keep"},
         "mixed": SUBSTITUTED_RULES}


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("name", list(PLANS))
def test_float64_model_matches_reference_to_1e_10(tiny_model, inputs, sentence_ids, name, renormalize, drop_route):
    model = tiny_model.double()
    plan = plan_of(PLANS[name], model)
    means, head_sources, substitutes = substituted(model, inputs)
    with torch.no_grad(), headlab.ablate(model, plan, renormalize=renormalize, means=means,
                                         constants=constants_of(model)):
        out = model(**inputs, sentence_ids=sentence_ids, head_sources=head_sources).last_hidden_state
    valid = inputs["attention_mask"].bool()
    expected = reference(model, inputs, plan, sentence_ids, renormalize, substitutes)
    assert_close_rel(out[valid], expected[valid], rtol=1e-10)


def test_plan_states_are_built_once_and_cached(tiny_model):
    plan = plan_of(MIXED_RULES, tiny_model)
    with headlab.ablate(tiny_model, plan):
        controller = tiny_model._headlab_controller
        first = controller.active
    with headlab.ablate(tiny_model, plan_of(MIXED_RULES, tiny_model)):  # an equal plan: the same state objects
        assert controller.active is first
    assert Controller.of(tiny_model) is controller and controller.active is None
    layer0, layer1 = first[0], first[1]  # L0: H0 prune, H1 uniform, H2 drop_intra, H3 drop_inter
    assert layer0.skipped == slice(0, 1) and layer0.shared == slice(1, 2) and layer0.prune is None  # H0: no attention
    assert layer0.uniform.flatten().tolist() == [True]
    assert list(layer0.drops) == [("drop_intra", slice(2, 3)), ("drop_inter", slice(3, 4))]
    assert layer1.shared.tolist() == [1, 3] and layer1.uniform.flatten().tolist() == [True, True]  # non-contiguous
    layer2 = first[2]  # L2: H0, H2 prune, H1 keep, H3 drop_inter: H1 alone is a slice, so H0 and H2 skip attention
    assert layer2.skipped.tolist() == [0, 2] and layer2.shared == slice(1, 2) and layer2.prune is None
    middle = controller.states_for(plan_of([{"heads": "L0H1", "policy": "prune"}], tiny_model), False,
                                   torch.device("cpu"))[0]  # H0 and H2-3 would not be one slice: zeroed values
    assert middle.skipped is None and middle.shared == slice(0, 4)
    assert middle.prune.flatten().tolist() == [False, True, False, False]
    assert [state is None for state in controller.states_for(plan_of([], tiny_model), False, torch.device("cpu"))] \
        == [True] * 3
    with pytest.raises(ValueError, match="nesting is not supported"), headlab.ablate(tiny_model, plan), \
            headlab.ablate(tiny_model, plan):
        pass
    with pytest.raises(ValueError, match="nesting is not supported"), \
            headlab.observe_attention(tiny_model, lambda layer, weights: None), headlab.ablate(tiny_model, plan):
        pass
    with pytest.raises(ValueError, match="already observed; observe_attention does not nest"), \
            headlab.observe_attention(tiny_model, lambda layer, weights: None), \
            headlab.observe_attention(tiny_model, lambda layer, weights: None):
        pass


@pytest.mark.parametrize("renormalize", [False, True])
def test_observed_inside_a_plan_the_output_is_the_plans_and_kept_heads_show_their_weights(
        tiny_model, inputs, sentence_ids, renormalize):
    """``observe_attention`` inside ``ablate``: the model's output is the plan's (float64 reference), and the heads
    the plan keeps show the reference's weights, which the changed heads of earlier layers shaped."""
    from tests.reference import bert_forward, params_of

    model = tiny_model.double()
    plan = plan_of(MIXED_RULES, model)
    seen = {}
    with torch.no_grad(), headlab.ablate(model, plan, renormalize=renormalize), \
            headlab.observe_attention(model, lambda layer, weights: seen.__setitem__(layer, weights.clone())):
        out = model(**inputs, sentence_ids=sentence_ids).last_hidden_state
    record = {"weights": []}
    expected = bert_forward(params_of(model), model.config, inputs["input_ids"], inputs["attention_mask"],
                            inputs["token_type_ids"], plan.policy_of, sentence_ids, renormalize, record=record)
    valid = inputs["attention_mask"].bool()
    assert_close_rel(out[valid], expected[valid], rtol=1e-10)
    compared = 0
    for layer, example, head, weights in record["weights"]:
        if plan.policy_of(layer, head) == "keep":
            n = int(valid[example].sum())
            rows = valid[example].nonzero().flatten()
            observed = seen[layer][example, head][rows][:, valid[example]]
            torch.testing.assert_close(observed.double(), weights[rows][:, valid[example]], rtol=0, atol=1e-6)
            compared += n
    assert compared > 0 and len(seen) == model.config.num_hidden_layers


def compiled_equals_eager(model, inputs, sentence_ids, plan, renormalize, backend):
    means, head_sources, substitutes = substituted(model, inputs)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend, dynamic=False)
    with torch.no_grad(), headlab.ablate(model, plan, renormalize=renormalize, means=means,
                                         constants=constants_of(model)):
        eager = model(**inputs, sentence_ids=sentence_ids, head_sources=head_sources).last_hidden_state
        traced = compiled(**inputs, sentence_ids=sentence_ids, head_sources=head_sources).last_hidden_state
    valid = inputs["attention_mask"].bool()
    assert_close_rel(traced[valid], eager[valid], rtol=1e-5)
    assert_close_rel(traced[valid], reference(model, inputs, plan, sentence_ids, renormalize, substitutes)[valid])


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("name", list(PLANS))
def test_fullgraph_compile_finds_no_data_dependent_branch(
        tiny_model, inputs, sentence_ids, name, renormalize, drop_route):
    """A graph break under fullgraph=True raises: the forward has no branch on tensor data (no host sync)."""
    compiled_equals_eager(tiny_model, inputs, sentence_ids, plan_of(PLANS[name], tiny_model), renormalize, "aot_eager")


@pytest.mark.slow
def test_inductor_compiled_mixed_plan_equals_eager(tiny_model, inputs, sentence_ids):
    compiled_equals_eager(tiny_model, inputs, sentence_ids, plan_of(SUBSTITUTED_RULES, tiny_model), False, "inductor")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("name", list(PLANS))
def test_no_host_sync_on_cuda(tiny_model, inputs, sentence_ids, name, renormalize, drop_route):
    model = tiny_model.cuda()
    inputs = {k: v.cuda() for k, v in inputs.items()}
    units = sentence_ids.cuda()  # (a host-to-device copy synchronises: done before the check)
    plan = plan_of(PLANS[name], model)
    means, head_sources, substitutes = substituted(model, inputs)
    with torch.no_grad(), headlab.ablate(model, plan, renormalize=renormalize, means=means,
                                         constants=constants_of(model)):
        model(**inputs, sentence_ids=units, head_sources=head_sources)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = model(**inputs, sentence_ids=units, head_sources=head_sources).last_hidden_state
        finally:
            torch.cuda.set_sync_debug_mode("default")
    valid = inputs["attention_mask"].bool().cpu()
    expected = reference(model.cpu(), {k: v.cpu() for k, v in inputs.items()}, plan, sentence_ids, renormalize,
                         substitutes)
    assert_close_rel(out.cpu()[valid], expected[valid])


@pytest.mark.parametrize("renormalize", [False, True])
def test_unit_masks_are_rebuilt_for_new_or_edited_inputs(tiny_model, inputs, sentence_ids, renormalize, drop_route):
    """drop_* masks are built once per forward; a new forward (new tensors, or ids edited in place, also inference
    tensors, which have no edit counter) rebuilds them."""
    plan = plan_of(MIXED_RULES, tiny_model)
    other = sentence_ids.flip(-1).clone()
    valid = inputs["attention_mask"].bool()
    with torch.no_grad(), headlab.ablate(tiny_model, plan, renormalize=renormalize):
        for units in (sentence_ids, other, sentence_ids):
            out = tiny_model(**inputs, sentence_ids=units).last_hidden_state
            assert_close_rel(out[valid], reference(tiny_model, inputs, plan, units, renormalize)[valid])
        units = sentence_ids.clone()
        tiny_model(**inputs, sentence_ids=units)
        units.copy_(other)  # the same tensor object, edited in place
        out = tiny_model(**inputs, sentence_ids=units).last_hidden_state
    assert_close_rel(out[valid], reference(tiny_model, inputs, plan, other, renormalize)[valid])
    with torch.inference_mode(), headlab.ablate(tiny_model, plan, renormalize=renormalize):  # as Lightning evaluates
        for units in (sentence_ids.clone(), other.clone()):
            out = tiny_model(**inputs, sentence_ids=units).last_hidden_state
            assert_close_rel(out[valid], reference(tiny_model, inputs, plan, units, renormalize)[valid])
        buffer = sentence_ids.clone()  # an inference tensor (no edit counter), refilled in place: CUDA graphs' inputs
        unpadded = dict(inputs, attention_mask=torch.ones_like(inputs["attention_mask"]))  # no mask tensor: None
        for units in (sentence_ids, other, sentence_ids):
            buffer.copy_(units)
            out = tiny_model(**unpadded, sentence_ids=buffer).last_hidden_state
            assert_close_rel(out, reference(tiny_model, unpadded, plan, units, renormalize))


@pytest.mark.parametrize("rules", [PLANS["drop_intra"], MIXED_RULES])
def test_forwards_with_other_padding_inside_one_plan(tiny_model, inputs, sentence_ids, rules, drop_route):
    """What the layers of a forward share (unit masks) is rebuilt when the padding changes."""
    plan = plan_of(rules, tiny_model)
    shorter = dict(inputs, attention_mask=inputs["attention_mask"].clone())
    shorter["attention_mask"][:, 5:] = 0
    with torch.no_grad(), headlab.ablate(tiny_model, plan):
        for batch in (inputs, shorter, inputs):
            out = tiny_model(**batch, sentence_ids=sentence_ids).last_hidden_state
            valid = batch["attention_mask"].bool()
            assert_close_rel(out[valid], reference(tiny_model, batch, plan, sentence_ids, False)[valid])
