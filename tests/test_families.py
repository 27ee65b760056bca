"""Every policy on every encoder family against the family's own eager attention in float64 with the policy applied
by definition (``tests/families.py``), per-row plans, physical pruning, and the family seam's errors."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from conftest import assert_close_rel
from families import CONFIGS, batch, reference_contexts, reference_of, tiny_model
from reference import substitutes_from

import headlab
from headlab.core.plans import POLICIES

FAMILIES = list(CONFIGS)
MIXED = [{"heads": "L0H0", "policy": "prune"}, {"heads": "L0H1", "policy": "uniform"},
         {"heads": "L0H2", "policy": "drop_intra"}, {"heads": "L0H3", "policy": "drop_inter"},
         {"heads": "L1", "policy": "drop_intra"}, {"heads": "L1H1,L1H3", "policy": "uniform"},
         {"heads": "L2H0,L2H2", "policy": "prune"}, {"heads": "L2H3", "policy": "drop_inter"},
         {"heads": "L1H0", "policy": "mean"}, {"heads": "L0H0,L1H2", "policy": "resample"},
         {"heads": "L2H2", "policy": "mean"}]
SOURCES = [1, 2, 0]  # each row's resample source: the next row (11, 8 and 5 tokens: shorter, shorter, longer)


def plan_of(rules, model) -> headlab.HeadPlan:
    return headlab.HeadPlan.from_rules(rules, model.config.num_hidden_layers, model.config.num_attention_heads)


def model_inputs(rows: dict) -> dict:
    return {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"]}


def substituted(model, rows) -> tuple:
    """``(means, head_sources, substitutes)``: headlab's means over ``rows`` and resample sources (``SOURCES``), and
    the reference's by definition."""
    means = headlab.head_means(model, [model_inputs(rows)])
    sources = {k: v[SOURCES] for k, v in model_inputs(rows).items()}
    head_sources = headlab.resample_sources(model, sources, rows["input_ids"].shape[1], means)
    return means, head_sources, substitutes_from(reference_contexts(model, rows), rows["attention_mask"], SOURCES)[0]


def with_constants(model, rows, substitutes) -> tuple:
    """Random constants ``[layers, heads, head_dim]`` for ``optimal`` heads, and ``substitutes`` extended with them."""
    heads = model.config.num_attention_heads
    shape = (model.config.num_hidden_layers, heads, model.config.hidden_size // heads)
    constants = torch.randn(shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    seq = rows["input_ids"].shape[1]
    return constants, lambda depth, b, h, policy: (constants[depth, h].expand(seq, shape[2]) if policy == "optimal"
                                                   else substitutes(depth, b, h, policy))


def expected(model, plan, rows, renormalize, policy_of=None, substitutes=None) -> torch.Tensor:
    with torch.no_grad(), reference_of(model, policy_of or plan.policy_of, rows["sentence_ids"], renormalize,
                                       substitutes=substitutes) as ref:
        return ref(**model_inputs(rows)).last_hidden_state


def compare(out, reference, rows) -> None:
    valid = rows["attention_mask"].bool()  # padded query rows are not compared
    assert_close_rel(out[valid], reference[valid])


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, tiny_model(request.param)


def test_the_reference_under_keep_is_the_stock_model(family):
    _, model = family
    rows = batch()
    with torch.no_grad():
        stock = model(**model_inputs(rows)).last_hidden_state
    compare(stock, expected(model, plan_of([], model), rows, False), rows)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_on_all_heads_equals_the_reference(family, policy, renormalize):
    _, model = family
    rows, plan = batch(), plan_of([{"heads": "all", "policy": policy}], model)
    means, head_sources, substitutes = substituted(model, rows)
    constants, substitutes = with_constants(model, rows, substitutes)
    with torch.no_grad(), headlab.ablate(model, plan, renormalize=renormalize, means=means, constants=constants):
        out = model(**model_inputs(rows), sentence_ids=rows["sentence_ids"], head_sources=head_sources
                    ).last_hidden_state
    reference = expected(model, plan, rows, renormalize, substitutes=substitutes)
    compare(out, reference, rows)
    if policy != "keep":  # the policy matters on this model, so the comparison could fail
        stock = expected(model, plan_of([], model), rows, False)
        assert (reference - stock)[rows["attention_mask"].bool()].abs().max() > 1e-2


@pytest.mark.parametrize("renormalize", [False, True])
def test_a_mixed_plan_equals_the_reference(family, renormalize, drop_route):
    _, model = family
    rows, plan = batch(), plan_of(MIXED, model)
    means, head_sources, substitutes = substituted(model, rows)
    with torch.no_grad(), headlab.ablate(model, plan, renormalize=renormalize, means=means):
        out = model(**model_inputs(rows), sentence_ids=rows["sentence_ids"], head_sources=head_sources
                    ).last_hidden_state
    compare(out, expected(model, plan, rows, renormalize, substitutes=substitutes), rows)


def test_per_row_plans_equal_each_rows_reference(family):
    _, model = family
    rows = batch()
    plans = [plan_of(MIXED, model), plan_of([{"heads": "all", "policy": "uniform"}], model), plan_of([], model),
             plan_of([{"heads": "all", "policy": "resample"}], model)]
    plan_ids = torch.tensor([1, 0, 2, 3, 0])
    repeated = {key: value[[0, 1, 2, 0, 2]] for key, value in rows.items()}  # rows 0 and 2 twice
    means, head_sources, substitutes = substituted(model, rows)
    with torch.no_grad(), headlab.ablate(model, plans, means=means):
        out = model(**model_inputs(repeated), sentence_ids=repeated["sentence_ids"], plan_ids=plan_ids,
                    head_sources=head_sources[:, [0, 1, 2, 0, 2]]).last_hidden_state
    for row, (source, plan) in enumerate(zip([0, 1, 2, 0, 2], (plans[i] for i in plan_ids.tolist()))):
        one = {key: value[source : source + 1] for key, value in rows.items()}
        own = lambda depth, b, h, policy, source=source: substitutes(depth, source, h, policy)  # noqa: E731
        compare(out[row : row + 1], expected(model, plan, one, False, substitutes=own), one)


@pytest.mark.parametrize("which", ["some", "a whole layer"])
def test_physical_pruning_equals_the_reference(family, which):
    name, model = family
    rows = batch()
    rules = [{"heads": "L0H0,L0H3,L1H1-2" if which == "some" else "L0H0,L0H3,L1", "policy": "prune"}]
    if name.startswith("albert"):  # depths sharing weights lose the same heads
        rules = [{"heads": "H1,H2" if which == "some" else "all", "policy": "prune"}]
    plan = plan_of(rules, model)
    pruned = headlab.prune_heads(copy.deepcopy(model), plan)
    with torch.no_grad():
        out = pruned(**model_inputs(rows)).last_hidden_state
    compare(out, expected(model, plan, rows, False), rows)


def test_albert_refuses_a_physical_prune_of_one_depth():
    model = tiny_model("albert")
    with pytest.raises(headlab.UserError, match=r"depths L0\.\.L2 share their attention weights \(ALBERT\): a "
                                                r"physical prune must remove the same heads at every one of them; "
                                                r"use mask=prune"):
        headlab.prune_heads(model, plan_of([{"heads": "L1H0", "policy": "prune"}], model))


def test_shape_and_family_from_config_json_alone(tmp_path):
    from omegaconf import OmegaConf

    from headlab.core.model_files import model_shape

    for name in FAMILIES:
        folder = tmp_path / name
        tiny_model(name).save_pretrained(folder)
        config = json.loads((folder / "config.json").read_text())
        layers = config.get("num_hidden_layers", config.get("n_layers"))
        assert model_shape(OmegaConf.create({"name_or_path": str(folder)})) == (layers, 4), name
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2/config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(headlab.UserError, match=r"model_type 'gpt2' is not a supported BERT-family encoder; "
                                                r"supported: bert, electra, ernie, roberta, xlm-roberta, camembert, "
                                                r"distilbert, albert, deberta-v2, modernbert"):
        model_shape(OmegaConf.create({"name_or_path": str(tmp_path / "gpt2")}))
    (tmp_path / "albert2").mkdir()
    (tmp_path / "albert2/config.json").write_text(json.dumps({"model_type": "albert", "inner_group_num": 2}))
    with pytest.raises(headlab.UserError, match=r"inner_group_num=2: headlab patches ALBERTs with one layer per "
                                                r"group"):
        model_shape(OmegaConf.create({"name_or_path": str(tmp_path / "albert2")}))


def test_a_prune_curve_times_only_masks_the_weights_allow():
    """The prune curve's final mask is timed physically unless depths sharing weights (ALBERT) lose different heads."""
    from headlab.core.pruning import shared_prune_conflict

    albert, bert = tiny_model("albert"), tiny_model("bert")
    differs, same = [{"heads": "L0H1,L2H3", "policy": "prune"}], [{"heads": "H1", "policy": "prune"}]
    assert shared_prune_conflict(albert, plan_of(differs, albert)).startswith("depths L0..L2 share their attention")
    assert shared_prune_conflict(albert, plan_of(same, albert)) is None
    assert shared_prune_conflict(bert, plan_of(differs, bert)) is None


def test_attention_features_equal_the_definitions_on_the_familys_own_attention(family):
    """``attention_features`` (the observer of each attention call) against every head's weights in the family's own
    float64 forward: ALBERT's depths by call, ModernBERT's windows, DistilBERT's modules."""
    from test_features import assert_matches, reference

    from headlab.core.tiny_tokenizers import tiny_tokenizer

    _, model = family
    tokenizer, rows = tiny_tokenizer(), batch()  # the WordPiece ids of [CLS], [SEP], "," and "." lie in the vocabulary
    mask, lengths = rows["attention_mask"], rows["attention_mask"].sum(1)
    ids = rows["input_ids"].clone()
    ids[:, 0], ids[torch.arange(3), lengths - 1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids[0, 4], ids[1, 2] = tokenizer.convert_tokens_to_ids(","), tokenizer.convert_tokens_to_ids(".")
    record: list = []
    with torch.no_grad(), reference_of(model, lambda depth, head: "keep", None, False, record) as ref:
        ref(input_ids=ids, attention_mask=mask)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    sequences = []
    for b, n in enumerate(lengths.tolist()):
        maps = np.zeros((layers, heads, n, n))
        for depth, example, head, weights in record:
            if example == b:
                maps[depth, head] = weights[:n, :n].numpy()
        sequences.append((ids[b, :n].tolist(), maps))
    features = headlab.attention_features(model, tokenizer, [{"input_ids": ids, "attention_mask": mask}])
    assert_matches(features, reference(sequences), atol=2e-5)


@pytest.fixture(scope="module", params=FAMILIES)
def classifier(request):
    from transformers import AutoModelForSequenceClassification

    return request.param, tiny_model(request.param, AutoModelForSequenceClassification).double()


@pytest.mark.parametrize("renormalize", [False, True])
def test_gradient_importance_and_estimates_equal_the_reference(classifier, renormalize):
    """Per example: d loss / d gate and every first-order estimate g . (z' - z), from the family's own float64
    forward with a gate and a step toward each policy on every head (``reference_of(toward=...)``)."""
    from headlab.core.importance import head_gradients
    from headlab.core.plans import ESTIMABLE

    name, model = classifier
    rows, labels = batch(), torch.tensor([1, 0, 1])
    means, head_sources, substitutes = substituted(model, rows)
    mine = head_gradients(model, [{**rows, "labels": labels, "head_sources": head_sources}], policies=ESTIMABLE,
                          renormalize=renormalize, means=means)
    shape = (3, model.config.num_hidden_layers, model.config.num_attention_heads)
    for policy in ESTIMABLE:
        gates = torch.ones(shape, dtype=torch.float64, requires_grad=True)
        steps = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
        with reference_of(model, lambda depth, head: "keep", rows["sentence_ids"], renormalize,
                          toward=(policy, gates, steps), substitutes=substitutes) as reference:
            logits = reference(**model_inputs(rows)).logits
        gate, estimate = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"),
                                             [gates, steps])
        np.testing.assert_allclose(mine.gate, gate.numpy(), rtol=1e-7, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(mine.estimates[policy], estimate.numpy(), rtol=1e-7, atol=1e-10,
                                   err_msg=f"{name} {policy}")
        assert np.abs(estimate.numpy()).max() > 1e-6  # 1e4 times atol: the comparison can fail


@pytest.mark.parametrize(("rules", "per_row"), [(MIXED, False), (MIXED, True), ([], False)],
                         ids=["mixed plan", "mixed plan, a gate per row", "no plan"])
def test_gates_multiply_each_heads_context_after_the_plan(classifier, rules, per_row):
    """``ablate(gates=)``: each head's context times its gate, after the plan (0 closes a head), and the loss's
    gradient by the gates (what learned gates train on): the family's own float64 forward with ``gate * z``."""
    name, model = classifier
    rows, labels = batch(), torch.tensor([1, 0, 1])
    plan = plan_of(rules, model)
    means, head_sources, substitutes = substituted(model, rows)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    values = torch.rand((3 if per_row else 1, layers, heads), generator=torch.Generator().manual_seed(2),
                        dtype=torch.float64) * 1.5
    values[..., 0, 1] = 0.0  # a closed head
    gates = (values if per_row else values[0]).clone().requires_grad_(True)
    with headlab.ablate(model, plan, means=means, gates=gates):
        logits = model(**model_inputs(rows), sentence_ids=rows["sentence_ids"], head_sources=head_sources).logits
    mine, = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"), [gates])
    reference_gates = values.expand(3, layers, heads).clone().requires_grad_(True)
    with reference_of(model, plan.policy_of, rows["sentence_ids"], False, substitutes=substitutes,
                      toward=("keep", reference_gates, torch.zeros_like(reference_gates))) as reference:
        expected_logits = reference(**model_inputs(rows)).logits
    gradient, = torch.autograd.grad(torch.nn.functional.cross_entropy(expected_logits, labels, reduction="sum"),
                                    [reference_gates])
    torch.testing.assert_close(logits, expected_logits, rtol=1e-9, atol=1e-12, msg=name)
    torch.testing.assert_close(mine, gradient if per_row else gradient.sum(0), rtol=1e-7, atol=1e-10, msg=name)
    assert gradient.abs().max() > 1e-6 and (values != 1).any()  # the gates matter: the comparison can fail


@pytest.mark.parametrize("per_row", [False, True], ids=["one plan", "a head per row"])
def test_optimal_heads_take_their_constants_and_train_them(classifier, per_row):
    """``optimal`` heads (``ablate(constants=)``): the head's context is its constant at every token, beside other
    policies, and the loss's gradient by the constants (what optimal ablation trains on) is the family's own float64
    forward's. Per-row plans replace one head per row (the training's batches)."""
    name, model = classifier
    rows, labels = batch(), torch.tensor([1, 0, 1])
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    width = model.config.hidden_size // heads
    values = torch.randn((layers, heads, width), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    constants = values.clone().requires_grad_(True)
    if per_row:
        chosen = ["L0H1", "L1H2", "L2H3"]
        plans = [plan_of([{"heads": head, "policy": "optimal"}], model) for head in chosen]
        plan_ids = torch.tensor([0, 1, 2])
    else:
        plans = plan_of([{"heads": "L0H1,L2", "policy": "optimal"}, {"heads": "L1H0", "policy": "prune"}], model)
    with headlab.ablate(model, plans, constants=constants):
        extra = {"plan_ids": plan_ids} if per_row else {}
        logits = model(**model_inputs(rows), **extra).logits
    mine, = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"), [constants])
    reference_constants = values.clone().requires_grad_(True)
    expected_rows = []
    for row in range(3):
        plan = plans[row] if per_row else plans
        one = {key: value[row : row + 1] for key, value in rows.items()}
        seq = one["input_ids"].shape[1]
        put = lambda depth, b, h, policy, seq=seq: reference_constants[depth, h].expand(seq, width)  # noqa: E731
        with reference_of(model, plan.policy_of, None, False, substitutes=put) as reference:
            expected_rows.append(reference(**model_inputs(one)).logits)
    expected_logits = torch.cat(expected_rows)
    gradient, = torch.autograd.grad(torch.nn.functional.cross_entropy(expected_logits, labels, reduction="sum"),
                                    [reference_constants])
    torch.testing.assert_close(logits, expected_logits, rtol=1e-9, atol=1e-12, msg=name)
    torch.testing.assert_close(mine, gradient, rtol=1e-7, atol=1e-10, msg=name)
    touched = gradient.abs().sum(-1) > 0  # [layers, heads]: only the optimal heads' constants get a gradient
    assert touched.sum() == (3 if per_row else 1 + heads) and gradient.abs().max() > 1e-6


def test_task_models_take_unit_and_plan_ids_to_every_layer(classifier):
    """Per-row plans with drop_*, mean and resample heads through a task model (DeBERTa's do not pass extra arguments
    down: ``sentence_ids``, ``plan_ids`` and ``head_sources`` reach its attention by forward hooks)."""
    name, model = classifier
    rows = batch()
    plans = [plan_of(MIXED, model), plan_of([{"heads": "all", "policy": "drop_inter"}], model), plan_of([], model)]
    plan_ids = torch.tensor([1, 0, 2])
    means, head_sources, substitutes = substituted(model, rows)
    with torch.no_grad(), headlab.ablate(model, plans, means=means):
        out = model(**model_inputs(rows), sentence_ids=rows["sentence_ids"], plan_ids=plan_ids,
                    head_sources=head_sources).logits
    with torch.no_grad():
        stock = model(**model_inputs(rows)).logits
    assert (out - stock)[:2].abs().amax(1).min() > 1e-6  # the plans move each row they change: the test can fail
    for row, plan in enumerate(plans[i] for i in plan_ids.tolist()):
        one = {key: value[row : row + 1] for key, value in rows.items()}
        own = lambda depth, b, h, policy, row=row: substitutes(depth, row, h, policy)  # noqa: E731
        with torch.no_grad(), reference_of(model, plan.policy_of, one["sentence_ids"], False,
                                           substitutes=own) as reference:
            np.testing.assert_allclose(out[row : row + 1].numpy(), reference(**model_inputs(one)).logits.numpy(),
                                       rtol=1e-9, atol=1e-12, err_msg=name)
    with torch.no_grad(), headlab.ablate(model, plans[1]), pytest.raises(ValueError, match="need unit ids"):
        model(**model_inputs(rows))  # the arguments of the forward before are not kept


def test_a_forward_started_at_a_layer_equals_the_whole_forward(family):
    """``start_at_layer`` (head sweeps): ELECTRA projects its embeddings, DeBERTa-v2's convolution follows layer 0
    only, ModernBERT's encoder is its base model; ALBERT's shared layers cannot start at a depth."""
    from headlab.core.model_parts import layer_inputs, start_at_layer

    name, model = family
    rows = model_inputs(batch())
    if name.startswith("albert"):
        with pytest.raises(headlab.UserError, match="cannot start at a depth"), start_at_layer(model, 1, None):
            pass
        return
    with torch.no_grad(), layer_inputs(model) as seen:
        whole = model(**rows).last_hidden_state
    for layer in range(1, model.config.num_hidden_layers):
        with torch.no_grad(), start_at_layer(model, layer, seen[layer]):
            np.testing.assert_array_equal(model(**rows).last_hidden_state.numpy(), whole.numpy(), err_msg=name)


def test_segment_units_come_from_token_type_ids_only_where_the_model_takes_them():
    """RoBERTa's token_type_ids (when asked for) are all 0: estimates by ``unit='segment'`` would see one unit."""
    from transformers import AutoModelForSequenceClassification

    rows = batch()
    labelled = {**model_inputs(rows), "labels": torch.ones(3, dtype=torch.long)}
    zeros = {**labelled, "token_type_ids": torch.zeros_like(rows["input_ids"])}
    for name in ("roberta", "xlm-roberta"):
        model = tiny_model(name, AutoModelForSequenceClassification)
        with pytest.raises(headlab.UserError, match=rf"unit='segment' reads the segments from token_type_ids, which a "
                                                    rf"{name} tokenizer gives as all 0"):
            headlab.ablation_estimate(model, [zeros], "drop_inter", unit="segment")
    model = tiny_model("distilbert", AutoModelForSequenceClassification)
    with pytest.raises(headlab.UserError, match="token_type_ids, which the batch does not have"):
        headlab.ablation_estimate(model, [labelled], "drop_inter", unit="segment")


def test_output_attentions_inside_a_block_is_refused_and_the_model_is_restored(family):
    """The patched attention returns no weights: ``output_attentions=True`` inside ``ablate`` or
    ``observe_attention`` is an error naming the observer, not an empty tuple (or DeBERTa's Nones) that reads as a
    model without attention (checked on the eager implementation, whose stock forward does return them)."""
    name, model = family
    rows = model_inputs(batch())
    plan = plan_of([{"heads": "L1H0", "policy": "uniform"}], model)
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    before = eager(**rows, output_attentions=True)
    assert len(before.attentions) == model.config.num_hidden_layers, name
    with pytest.raises(ValueError, match="output_attentions=True inside headlab.ablate or observe_attention"), \
            headlab.ablate(eager, plan):
        eager(**rows, output_attentions=True)
    with pytest.raises(ValueError, match="output_attentions=True inside headlab.ablate or observe_attention"), \
            headlab.observe_attention(eager, lambda layer, weights: None):
        eager(**rows, output_attentions=True)
    after = eager(**rows, output_attentions=True)
    for one, other in zip(before.attentions, after.attentions, strict=True):
        torch.testing.assert_close(one, other, rtol=0, atol=0)
