"""headlab.ablate against the float64 reference forward, the untouched model and a sliced model."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_close_rel
from reference import bert_contexts, bert_forward, classifier_logits, params_of, qa_logits, substitutes_from
from transformers import BertForQuestionAnswering, BertForSequenceClassification, BertModel
from transformers.masking_utils import create_bidirectional_mask

import headlab
from headlab.core.patch.attention import register_attention
from headlab.core.plans import POLICIES

MIXED_RULES = [
    {"heads": "L0H0", "policy": "prune"},
    {"heads": "L0H1", "policy": "uniform"},
    {"heads": "L0H2", "policy": "drop_intra"},
    {"heads": "L0H3", "policy": "drop_inter"},
    {"heads": "L1", "policy": "drop_intra"},
    {"heads": "L1H1,L1H3", "policy": "uniform"},  # non-contiguous heads in one group (L1H3 optimal below)
    {"heads": "L2H0,L2H2", "policy": "prune"},
    {"heads": "L2H3", "policy": "drop_inter"},
]
SUBSTITUTED_RULES = [  # every policy: MIXED_RULES with mean, resample and optimal heads among the others
    *MIXED_RULES,
    {"heads": "L1H0", "policy": "mean"},  # next to drop_intra and uniform heads
    {"heads": "L0H0,L1H2", "policy": "resample"},  # at an end; between uniform heads
    {"heads": "L2H2", "policy": "mean"},  # beside a pruned head and a kept one
    {"heads": "L1H3", "policy": "optimal"},  # at an end, beside a resample head
]

# pruned heads at the ends of every layer, next to keep and uniform ones: each layer's context is the other heads'
# padded with zero heads (LayerState.pad), (before, after) = (1, 0), (1, 1), (0, 2)
PADDED_RULES = [
    {"heads": "L0H0,L1H0,L1H3,L2H2-3", "policy": "prune"},
    {"heads": "L0H1,L2H0", "policy": "uniform"},
]


def plan_of(rules, model):
    return headlab.HeadPlan.from_rules(rules, model.config.num_hidden_layers, model.config.num_attention_heads)


def reference(model, inputs, plan, sentence_ids, renormalize, substitutes=None):
    return bert_forward(params_of(model), model.config, inputs["input_ids"], inputs["attention_mask"],
                        inputs["token_type_ids"], plan.policy_of, sentence_ids, renormalize, substitutes=substitutes)


def constants_of(model) -> torch.Tensor:
    """Constants for ``optimal`` heads, ``[layers, heads, head_dim]`` (float64, seeded)."""
    heads = model.config.num_attention_heads
    shape = (model.config.num_hidden_layers, heads, model.config.hidden_size // heads)
    return torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)


def substituted(model, inputs):
    """``(means, head_sources, substitutes)``: headlab's means over ``inputs`` and resample sources (each row's
    source is the next row, of another length), and the reference's by definition (``optimal`` heads: the constants
    of ``constants_of``)."""
    sources = [(b + 1) % len(inputs["input_ids"]) for b in range(len(inputs["input_ids"]))]
    means = headlab.head_means(model, [inputs])
    head_sources = headlab.resample_sources(model, {k: v[sources] for k, v in inputs.items()},
                                            inputs["input_ids"].shape[1], means)
    on_cpu = {k: v.cpu() for k, v in inputs.items()}
    contexts = bert_contexts({k: v.cpu() for k, v in params_of(model).items()}, model.config, on_cpu)
    by_definition = substitutes_from(contexts, on_cpu["attention_mask"], sources)[0]
    constants, seq = constants_of(model), inputs["input_ids"].shape[1]

    def substitutes(layer, b, h, policy):
        return constants[layer, h].expand(seq, -1) if policy == "optimal" else by_definition(layer, b, h, policy)

    return means, head_sources, substitutes


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_on_all_heads_matches_reference(tiny_model, inputs, sentence_ids, policy, renormalize, drop_route):
    plan = plan_of([{"heads": "all", "policy": policy}], tiny_model)
    means, head_sources, substitutes = substituted(tiny_model, inputs)
    with torch.no_grad(), headlab.ablate(tiny_model, plan, renormalize=renormalize, means=means,
                                         constants=constants_of(tiny_model)):
        out = tiny_model(**inputs, sentence_ids=sentence_ids, head_sources=head_sources).last_hidden_state
    expected = reference(tiny_model, inputs, plan, sentence_ids, renormalize, substitutes)
    valid = inputs["attention_mask"].bool()  # padded query rows are not compared
    assert_close_rel(out[valid], expected[valid])


def test_pruned_heads_at_the_ends_pad_the_others_context(tiny_model, inputs):
    from headlab.core.patch.layer_states import LayerState

    plan = plan_of(PADDED_RULES, tiny_model)
    assert [LayerState.build(plan, layer, False, torch.device("cpu")).pad for layer in range(3)] == [
        (1, 0), (1, 1), (0, 2)]
    with torch.no_grad(), headlab.ablate(tiny_model, plan):
        out = tiny_model(**inputs).last_hidden_state
    expected = reference(tiny_model, inputs, plan, None, False)
    valid = inputs["attention_mask"].bool()
    assert_close_rel(out[valid], expected[valid])


@pytest.mark.parametrize("renormalize", [False, True])
def test_mixed_plan_matches_reference(tiny_model, inputs, sentence_ids, renormalize, drop_route):
    plan = plan_of(SUBSTITUTED_RULES, tiny_model)
    assert set(plan.counts()) == set(POLICIES) and all(plan.counts().values())
    means, head_sources, substitutes = substituted(tiny_model, inputs)
    with torch.no_grad(), headlab.ablate(tiny_model, plan, renormalize=renormalize, means=means,
                                         constants=constants_of(tiny_model)):
        out = tiny_model(**inputs, sentence_ids=sentence_ids, head_sources=head_sources).last_hidden_state
    expected = reference(tiny_model, inputs, plan, sentence_ids, renormalize, substitutes)
    valid = inputs["attention_mask"].bool()
    assert_close_rel(out[valid], expected[valid])


def test_reference_matches_stock_model(tiny_model, inputs):
    """The reference itself is right: with every head kept it reproduces transformers' SDPA model."""
    plan = headlab.HeadPlan.keep_all(3, 4)
    with torch.no_grad():
        out = tiny_model(**inputs).last_hidden_state
    valid = inputs["attention_mask"].bool()
    assert_close_rel(out[valid], reference(tiny_model, inputs, plan, None, False)[valid])


@pytest.mark.parametrize("renormalize", [False, True])
def test_all_keep_equals_untouched_model(tiny_model, inputs, sentence_ids, renormalize):
    with torch.no_grad():
        stock = tiny_model(**inputs).last_hidden_state
        with headlab.ablate(tiny_model, headlab.HeadPlan.keep_all(3, 4), renormalize=renormalize):
            patched = tiny_model(**inputs, sentence_ids=sentence_ids).last_hidden_state
    torch.testing.assert_close(patched, stock, rtol=1e-6, atol=1e-6)


def test_keep_layers_under_headlab_equal_stock_bit_for_bit(tiny_model, inputs):
    """Layers that keep every head run SDPA with headlab's padding mask ``[batch, 1, 1, seq]`` (transformers gives
    the same mask expanded over the queries): the hidden states they give are the stock ones exactly."""
    plan = plan_of([{"heads": "L2H1", "policy": "prune"}], tiny_model)
    with torch.no_grad():
        stock = tiny_model(**inputs, output_hidden_states=True).hidden_states
        with headlab.ablate(tiny_model, plan):
            patched = tiny_model(**inputs, output_hidden_states=True).hidden_states
    for layer in (1, 2):  # the outputs of layers 0 and 1, both all-keep, under headlab's attention
        assert torch.equal(patched[layer], stock[layer])
    assert not torch.equal(patched[3], stock[3])


def test_padding_mask_is_not_expanded_over_queries(tiny_model, inputs):
    register_attention()
    config = copy.deepcopy(tiny_model.config)
    config._attn_implementation_internal = "headlab"
    embeds = tiny_model.embeddings(inputs["input_ids"])
    mask = create_bidirectional_mask(config=config, inputs_embeds=embeds, attention_mask=inputs["attention_mask"])
    batch, seq = inputs["input_ids"].shape
    assert mask.shape == (batch, 1, 1, seq) and mask.dtype == torch.bool
    assert torch.equal(mask[:, 0, 0], inputs["attention_mask"].bool())


def test_keep_layer_next_to_ablated_layer_equals_stock_without_padding(tiny_model, tokenizer):
    """Unpadded batches reach the function with attention_mask=None (trap 3): still exact."""
    batch = tokenizer(["the city is old", "he was born in"], return_tensors="pt")
    assert batch["attention_mask"].all()
    plan = plan_of([{"heads": "L1", "policy": "uniform"}, {"heads": "L2H0", "policy": "keep"}], tiny_model)
    with torch.no_grad(), headlab.ablate(tiny_model, plan):
        out = tiny_model(**batch).last_hidden_state
    expected = bert_forward(params_of(tiny_model), tiny_model.config, batch["input_ids"], batch["attention_mask"],
                            batch["token_type_ids"], plan.policy_of)
    assert_close_rel(out, expected)


def sliced_model(model: BertModel, pruned: dict[int, list[int]]) -> BertModel:
    """A physically smaller model: the pruned heads' Q/K/V rows and output-projection columns removed."""
    small = copy.deepcopy(model)
    small.config = copy.deepcopy(model.config)
    d = model.config.hidden_size // model.config.num_attention_heads
    for layer, heads in pruned.items():
        attention = small.encoder.layer[layer].attention
        kept = [h for h in range(model.config.num_attention_heads) if h not in heads]
        rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in kept])
        for name in ("query", "key", "value"):
            old = getattr(attention.self, name)
            new = torch.nn.Linear(old.in_features, len(rows))
            new.weight.data, new.bias.data = old.weight.data[rows].clone(), old.bias.data[rows].clone()
            setattr(attention.self, name, new)
        old = attention.output.dense
        new = torch.nn.Linear(len(rows), old.out_features)
        new.weight.data, new.bias.data = old.weight.data[:, rows].clone(), old.bias.data.clone()
        attention.output.dense = new
        attention.self.num_attention_heads = len(kept)
        attention.self.all_head_size = len(rows)
    return small


def test_prune_equals_physically_removed_heads(tiny_model, inputs):
    pruned = {0: [1], 1: [0, 3], 2: [0, 1, 2]}
    small = sliced_model(tiny_model, pruned)
    assert small.encoder.layer[1].attention.self.query.out_features == 2 * 8
    plan = plan_of([{"heads": "L0H1,L1H0,L1H3,L2H0-2", "policy": "prune"}], tiny_model)
    with torch.no_grad():
        expected = small(**inputs).last_hidden_state
        with headlab.ablate(tiny_model, plan):
            out = tiny_model(**inputs).last_hidden_state
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("task_head", [BertForSequenceClassification, BertForQuestionAnswering])
def test_task_heads_match_reference(tiny_model, inputs, sentence_ids, task_head):
    torch.manual_seed(1)
    model = task_head(copy.deepcopy(tiny_model.config)).eval()
    plan = plan_of(MIXED_RULES, model)
    with torch.no_grad(), headlab.ablate(model, plan):
        out = model(**inputs, sentence_ids=sentence_ids)
    params = params_of(model)
    hidden = bert_forward(params, model.config, inputs["input_ids"], inputs["attention_mask"],
                          inputs["token_type_ids"], plan.policy_of, sentence_ids)
    if task_head is BertForSequenceClassification:
        assert_close_rel(out.logits, classifier_logits(params, hidden))
    else:
        start, end = qa_logits(params, hidden)
        valid = inputs["attention_mask"].bool()
        assert_close_rel(out.start_logits[valid], start[valid])
        assert_close_rel(out.end_logits[valid], end[valid])


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("heads", ["all", "H0-1", "H0,H2"])  # one group per layer, a slice beside others, indices
def test_query_without_allowed_key_outputs_zero_not_nan(tiny_model, inputs, renormalize, heads, drop_route):
    """One unit per row: drop_intra leaves no key at all, so its heads equal pruned ones."""
    one_unit = torch.zeros_like(inputs["input_ids"])
    plan = plan_of([{"heads": heads, "policy": "drop_intra"}], tiny_model)
    with torch.no_grad(), headlab.ablate(tiny_model, plan, renormalize=renormalize):
        out = tiny_model(**inputs, sentence_ids=one_unit).last_hidden_state
    assert torch.isfinite(out).all()
    no_attention = plan_of([{"heads": heads, "policy": "prune"}], tiny_model)
    with torch.no_grad(), headlab.ablate(tiny_model, no_attention):
        pruned = tiny_model(**inputs).last_hidden_state
    torch.testing.assert_close(out, pruned, rtol=1e-6, atol=1e-6)


def test_model_restored_on_exit_and_on_exception(tiny_model, inputs, sentence_ids):
    before_impl = tiny_model.config._attn_implementation
    before_config = tiny_model.config.to_dict()
    with torch.no_grad():
        before = tiny_model(**inputs).last_hidden_state
    plan = plan_of(MIXED_RULES, tiny_model)
    with headlab.ablate(tiny_model, plan):
        assert tiny_model.config._attn_implementation == "headlab"
    with pytest.raises(RuntimeError, match="boom"), headlab.ablate(tiny_model, plan):
        raise RuntimeError("boom")
    assert tiny_model.config._attn_implementation == before_impl == "sdpa"
    assert tiny_model.config.to_dict() == before_config
    assert tiny_model._headlab_controller.active is None  # the controller stays (installed once), inactive
    with torch.no_grad():
        assert torch.equal(tiny_model(**inputs).last_hidden_state, before)


@pytest.mark.parametrize("rules", [MIXED_RULES, PADDED_RULES], ids=["mixed", "padded"])
def test_gradients_match_reference(tiny_model, tokenizer, rules, drop_route):
    """Fine-tuning under a plan: d(output)/d(weights) equals the float64 reference's gradient."""
    batch = tokenizer(["the city is old. he left!", "who was it?"], ["it was smith.", "no"], padding=True,
                      return_tensors="pt")
    units = torch.tensor([[0] * 4 + [1] * 20, [0] * 3 + [1] * 21])[:, : batch["input_ids"].shape[1]]
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    plan = plan_of(rules, tiny_model)
    weight = torch.randn(tiny_model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with headlab.ablate(tiny_model, plan):
        out = tiny_model(**inputs, sentence_ids=units).last_hidden_state
    (out[inputs["attention_mask"].bool()] @ weight).sum().backward()

    params = {k: v.requires_grad_() for k, v in params_of(tiny_model).items()}
    expected = bert_forward(params, tiny_model.config, inputs["input_ids"], inputs["attention_mask"],
                            inputs["token_type_ids"], plan.policy_of, units)
    (expected[inputs["attention_mask"].bool()] @ weight.double()).sum().backward()
    for name in ("encoder.layer.0.attention.self.query.weight", "encoder.layer.1.attention.self.value.weight",
                 "encoder.layer.2.attention.self.key.weight", "embeddings.word_embeddings.weight"):
        grad = dict(tiny_model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
        assert_close_rel(grad, params[name].grad, rtol=1e-4)


def test_training_mode_with_dropout_is_finite_and_random(tiny_model, inputs, sentence_ids):
    tiny_model.config.attention_probs_dropout_prob = 0.5
    for module in tiny_model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.5
    tiny_model.train()
    plan = plan_of([{"heads": "L0", "policy": "uniform"}, {"heads": "L1", "policy": "drop_inter"},
                    {"heads": "L2", "policy": "drop_intra"}], tiny_model)
    for renormalize in (False, True):
        with headlab.ablate(tiny_model, plan, renormalize=renormalize):
            first = tiny_model(**inputs, sentence_ids=sentence_ids).last_hidden_state
            second = tiny_model(**inputs, sentence_ids=sentence_ids).last_hidden_state
        assert torch.isfinite(first).all() and not torch.equal(first, second)


def test_uniform_under_dropout_is_uniform_in_expectation(tiny_model, inputs):
    """Dropout acts on the 1/n weights: averaged over many draws the context is the eval context (1/n mean)."""
    tiny_model.config.attention_probs_dropout_prob = 0.3
    contexts = []
    self_attention = tiny_model.encoder.layer[0].attention.self
    handle = self_attention.register_forward_hook(lambda module, args, output: contexts.append(output[0]))
    plan = plan_of([{"heads": "L0", "policy": "uniform"}], tiny_model)
    torch.manual_seed(0)
    with torch.no_grad(), headlab.ablate(tiny_model, plan):
        tiny_model.eval()(**inputs)
        self_attention.train()  # dropout in this layer's attention only
        for _ in range(2000):
            tiny_model.encoder.layer[0](tiny_model.embeddings(inputs["input_ids"], inputs["token_type_ids"]),
                                        attention_mask=_bool_mask(inputs["attention_mask"]))
    handle.remove()
    exact, draws = contexts[0], torch.stack(contexts[1:]).mean(0)  # [batch, seq, hidden]
    valid = inputs["attention_mask"].bool()
    torch.testing.assert_close(draws[valid], exact[valid], rtol=0, atol=0.03)
    # and the eval context is the mean of the values over the row's non-padding keys
    values = self_attention.value(tiny_model.embeddings(inputs["input_ids"], inputs["token_type_ids"]))
    mean = (values * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)  # [batch, hidden]
    torch.testing.assert_close(exact[1, 0], mean[1], rtol=1e-5, atol=1e-6)
    assert not torch.equal(contexts[1], contexts[2])


def _bool_mask(attention_mask):
    """[batch, seq] padding mask -> the [batch, 1, seq, seq] boolean mask SDPA takes."""
    n = attention_mask.shape[1]
    return attention_mask.bool()[:, None, None, :].expand(-1, 1, n, n)


@pytest.mark.parametrize("renormalize", [False, True])
def test_custom_per_query_mask_matches_reference(tiny_model, inputs, sentence_ids, renormalize):
    """A caller's 4D mask that differs per query (a band of width 2 within the padding) is respected."""
    n = inputs["input_ids"].shape[1]
    band = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs() <= 2  # [seq, seq]
    mask = band & inputs["attention_mask"].bool()[:, None, :]  # [batch, seq, seq]
    plan = plan_of(MIXED_RULES, tiny_model)
    model_inputs = {**inputs, "attention_mask": mask[:, None]}  # [batch, 1, seq, seq], passed through as is
    with torch.no_grad(), headlab.ablate(tiny_model, plan, renormalize=renormalize):
        out = tiny_model(**model_inputs, sentence_ids=sentence_ids).last_hidden_state
    expected = bert_forward(params_of(tiny_model), tiny_model.config, inputs["input_ids"], mask,
                            inputs["token_type_ids"], plan.policy_of, sentence_ids, renormalize)
    valid = inputs["attention_mask"].bool()
    assert_close_rel(out[valid], expected[valid])


@pytest.mark.parametrize("family", ["roberta", "electra", "xlm-roberta"])
def test_other_bert_family_models(family, inputs, sentence_ids):
    """RoBERTa-style encoders: all-keep is the stock model; a plan changes it; exit restores it."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(family, vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=80, type_vocab_size=2)
    torch.manual_seed(0)
    model = AutoModel.from_config(config).eval()
    with torch.no_grad():
        stock = model(**inputs).last_hidden_state
        with headlab.ablate(model, headlab.HeadPlan.keep_all(2, 4)):
            kept = model(**inputs).last_hidden_state
        with headlab.ablate(model, plan_of(MIXED_RULES[:6], model)):
            changed = model(**inputs, sentence_ids=sentence_ids).last_hidden_state
        after = model(**inputs).last_hidden_state
    torch.testing.assert_close(kept, stock, rtol=1e-6, atol=1e-6)
    assert torch.isfinite(changed).all() and (changed - stock).abs().max() > 1e-3
    assert torch.equal(after, stock)
