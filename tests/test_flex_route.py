"""The fused FlexAttention route for layers with drop_* heads (``attention_route=flex``) against the float64
reference; when the SDPA route serves a layer instead; the route's bad input."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rel
from test_attention import MIXED_RULES, SUBSTITUTED_RULES, plan_of, reference, substituted

import headlab

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # inductor's notes on the CPU kernel

PLANS = {
    "all drop_intra": [{"heads": "all", "policy": "drop_intra"}],
    "half drop_inter": [{"heads": "H0-1", "policy": "drop_inter"}],  # keep heads beside a slice of drop heads
    "mixed": MIXED_RULES,  # every policy in layer 0, non-contiguous uniform heads beside drop_intra in layer 1
    "substituted": SUBSTITUTED_RULES,  # mean and resample heads beside drop_* heads
}


def fused_forward(model, inputs, sentence_ids, plan, renormalize, means=None,
                  head_sources=None) -> tuple[torch.Tensor, bool]:
    """(last hidden state, whether a layer took the fused route) under ``plan`` on the flex route."""
    headlab.set_attention_route(model, "flex")
    with headlab.ablate(model, plan, renormalize=renormalize, means=means):
        out = model(**inputs, sentence_ids=sentence_ids, head_sources=head_sources).last_hidden_state
        forward_cache = model._headlab_controller.masks[2]
    return out, any(name[0] == "flex block mask" for name in forward_cache)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("name", list(PLANS))
def test_fused_route_matches_reference(tiny_model, inputs, sentence_ids, name, renormalize):
    plan = plan_of(PLANS[name], tiny_model)
    means, head_sources, substitutes = substituted(tiny_model, inputs)
    with torch.no_grad():
        out, fused = fused_forward(tiny_model, inputs, sentence_ids, plan, renormalize, means, head_sources)
    assert fused
    valid = inputs["attention_mask"].bool()  # padded query rows are not compared
    expected = reference(tiny_model, inputs, plan, sentence_ids, renormalize, substitutes)
    assert_close_rel(out[valid], expected[valid])


@pytest.mark.parametrize("renormalize", [False, True])
def test_fused_route_query_without_allowed_key_outputs_zero(tiny_model, inputs, renormalize):
    """One unit per row: drop_intra leaves no key at all, so the fused heads equal pruned ones (never NaN)."""
    one_unit = torch.zeros_like(inputs["input_ids"])
    plan = plan_of([{"heads": "H0,H2", "policy": "drop_intra"}], tiny_model)
    with torch.no_grad():
        out, fused = fused_forward(tiny_model, inputs, one_unit, plan, renormalize)
        with headlab.ablate(tiny_model, plan_of([{"heads": "H0,H2", "policy": "prune"}], tiny_model)):
            pruned = tiny_model(**inputs).last_hidden_state
    assert fused and torch.isfinite(out).all()
    torch.testing.assert_close(out, pruned, rtol=1e-6, atol=1e-6)


def test_fused_route_without_attention_mask(tiny_model, inputs, sentence_ids):
    """No ``attention_mask`` in the forward: headlab's mask function gives no mask, every key is valid."""
    full = {k: v for k, v in inputs.items() if k != "attention_mask"}
    plan = plan_of(MIXED_RULES, tiny_model)
    with torch.no_grad():
        out, fused = fused_forward(tiny_model, full, sentence_ids, plan, False)
    assert fused
    ones = dict(full, attention_mask=torch.ones_like(inputs["input_ids"]))
    assert_close_rel(out.flatten(0, 1), reference(tiny_model, ones, plan, sentence_ids, False).flatten(0, 1))


def test_new_padding_and_units_rebuild_the_block_mask(tiny_model, inputs, sentence_ids):
    plan = plan_of(MIXED_RULES, tiny_model)
    shorter = dict(inputs, attention_mask=inputs["attention_mask"].clone())
    shorter["attention_mask"][:, 5:] = 0
    headlab.set_attention_route(tiny_model, "flex")
    with torch.no_grad(), headlab.ablate(tiny_model, plan):
        for batch, units in ((inputs, sentence_ids), (shorter, sentence_ids), (inputs, sentence_ids.flip(-1).clone())):
            out = tiny_model(**batch, sentence_ids=units).last_hidden_state
            valid = batch["attention_mask"].bool()
            assert_close_rel(out[valid], reference(tiny_model, batch, plan, units, False)[valid])


def test_sdpa_route_serves_what_flex_cannot(tiny_model, inputs, sentence_ids):
    """Gradients on CPU (no CPU backward), dropout (FlexAttention has none) and float64 on CPU take the SDPA route,
    with the same results."""
    plan = plan_of(MIXED_RULES, tiny_model)
    valid = inputs["attention_mask"].bool()
    out, fused = fused_forward(tiny_model, inputs, sentence_ids, plan, False)  # gradients on
    assert not fused and out.requires_grad
    assert_close_rel(out.detach()[valid], reference(tiny_model, inputs, plan, sentence_ids, False)[valid])
    with torch.no_grad():
        model = tiny_model.double()
        out, fused = fused_forward(model, inputs, sentence_ids, plan, True)
        assert not fused
        assert_close_rel(out[valid], reference(model, inputs, plan, sentence_ids, True)[valid], rtol=1e-10)
        model.float().train()  # attention dropout 0.1 in tiny_random
        assert model.config.attention_probs_dropout_prob > 0
        out, fused = fused_forward(model, inputs, sentence_ids, plan, False)
        assert not fused and torch.isfinite(out).all()


@pytest.mark.slow
def test_compiled_model_on_cpu_takes_the_sdpa_route(tiny_model, tokenizer):
    """compile=true with attention_route=flex on CPU: inductor cannot lower the traced block mask there (torch
    2.13), so compiled CPU layers take the SDPA route; the same outputs, at two sequence lengths."""
    from conftest import PAIRS, TEXTS

    torch._dynamo.reset()
    headlab.set_attention_route(tiny_model, "flex")
    tiny_model.compile()
    plan = plan_of(MIXED_RULES, tiny_model)
    for cut in (None, 20):
        texts, pairs = (TEXTS, PAIRS) if cut is None else ([t[:cut] for t in TEXTS], [t[:cut] for t in PAIRS])
        encoding = tokenizer(texts, pairs, padding=True, return_tensors="pt")
        batch = {k: encoding[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        units = batch["token_type_ids"].clone()
        with torch.no_grad(), headlab.ablate(tiny_model, plan):
            out = tiny_model(**batch, sentence_ids=units).last_hidden_state
        valid = batch["attention_mask"].bool()
        assert_close_rel(out[valid], reference(tiny_model, batch, plan, units, False)[valid])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fullgraph_compile_of_the_fused_route_on_cuda(tiny_model, inputs, sentence_ids):
    """The fused route inside a model compiled by inductor with fullgraph=True (no data-dependent branch)."""
    model = tiny_model.cuda()
    cuda = {k: v.cuda() for k, v in inputs.items()}
    plan = plan_of(MIXED_RULES, model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    headlab.set_attention_route(model, "flex")
    with torch.no_grad(), headlab.ablate(model, plan):
        out = compiled(**cuda, sentence_ids=sentence_ids.cuda()).last_hidden_state
    valid = inputs["attention_mask"].bool()
    assert_close_rel(out.cpu()[valid], reference(model.cpu(), inputs, plan, sentence_ids, False)[valid])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("renormalize", [False, True])
def test_fused_route_on_cuda_no_host_sync_and_gradients(tiny_model, inputs, sentence_ids, renormalize):
    """On CUDA the fused route also serves gradients (eval mode): they equal the SDPA route's."""
    model = tiny_model.cuda().eval()
    cuda = {k: v.cuda() for k, v in inputs.items()}
    units = sentence_ids.cuda()
    plan = plan_of(MIXED_RULES, model)
    with torch.no_grad():
        fused_forward(model, cuda, units, plan, renormalize)  # warm-up: compiles
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out, fused = fused_forward(model, cuda, units, plan, renormalize)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    valid = inputs["attention_mask"].bool()
    assert fused
    assert_close_rel(out.cpu()[valid], reference(model.cpu(), inputs, plan, sentence_ids, renormalize)[valid])
    model.cuda()
    grads = []
    for route in ("flex", "sdpa"):
        model.zero_grad()
        headlab.set_attention_route(model, route)
        with headlab.ablate(model, plan, renormalize=renormalize):
            model(**cuda, sentence_ids=units).last_hidden_state[cuda["attention_mask"].bool()].sum().backward()
        grads.append(model.encoder.layer[0].attention.self.query.weight.grad.clone())
    assert_close_rel(grads[0], grads[1], rtol=1e-4)


def test_route_bad_input(tiny_model):  # too old a torch: test_bad_input.py
    with pytest.raises(headlab.UserError, match="attention route 'fast' is not one of sdpa, flex"):
        headlab.set_attention_route(tiny_model, "fast")
