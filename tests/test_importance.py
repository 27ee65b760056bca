"""Gradient head importance, first-order estimates and key-type gradients against float64 brute force.

The reference takes each example alone through the independent float64 forward of ``reference.py`` with gates
on every head, and one backward pass per example; the estimators are reductions of those per-example values.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import bert_forward, classifier_logits, params_of, qa_logits
from test_attention import substituted

import headlab
from headlab.core.head_gradients import GradientProbe, gradient_probe
from headlab.core.importance import head_gradients, normalize_importance
from headlab.core.model_parts import self_attention_of
from headlab.core.models import load_model
from headlab.core.plans import ESTIMABLE
from headlab.errors import UserError

LABELS = torch.tensor([2, 0, 1])


@pytest.fixture
def classifier(tiny_cfg):
    return load_model(tiny_cfg, "sequence_classification", {"num_labels": 3}).double()


@pytest.fixture
def batch(inputs, sentence_ids):
    return {**inputs, "sentence_ids": sentence_ids, "labels": LABELS}


def rows(batch, *slices):
    return [{k: v[s] for k, v in batch.items()} for s in slices]


def batch_inputs(batch):
    return {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def reference_gradients(model, batch, policies=(), renormalize=False, qa=False, substitutes=None):
    """Per example (alone, one backward each): gate gradient, sum_t |g . z|, sum_t g . (z' - z) per policy,
    and |d loss / d A| of every head, all ``[layers, heads, ...]`` float64. ``substitutes``: what mean and resample
    heads take, of the whole batch (``test_attention.substituted``)."""
    params, config = params_of(model), model.config
    layers, heads = config.num_hidden_layers, config.num_attention_heads
    out = []
    for b in range(len(batch["input_ids"])):
        one = {k: v[b:b + 1] for k, v in batch.items()}
        gates = torch.ones(1, layers, heads, dtype=torch.float64, requires_grad=True)
        record = {"attention": [], **{p: [] for p in policies if p != "prune"}}
        own = None if substitutes is None else (lambda layer, _, h, policy, b=b: substitutes(layer, b, h, policy))
        hidden = bert_forward(params, config, one["input_ids"], one["attention_mask"], one["token_type_ids"],
                              lambda layer, head: "keep", one["sentence_ids"], renormalize, gates, record, own)
        if qa:
            start, end = qa_logits(params, hidden)
            n = int(one["attention_mask"].sum())  # the softmax over the feature's own positions, not its padding
            loss = (F.cross_entropy(start[:, :n], one["start_positions"])
                    + F.cross_entropy(end[:, :n], one["end_positions"])) / 2
        else:
            loss = F.cross_entropy(classifier_logits(params, hidden), one["labels"])
        attention = [a for *_, a in record["attention"]]
        gate, *grads = torch.autograd.grad(loss, [gates, *record["contexts"], *attention])
        context_grads, attention_grads = grads[:layers], grads[layers:]
        split = lambda t: t.detach().view(t.shape[1], heads, -1)  # noqa: E731  [seq, heads, head_dim]
        token = torch.stack([(split(g) * split(z)).sum(-1).abs().sum(0)
                             for g, z in zip(context_grads, record["contexts"])])
        estimates = {}
        for policy in policies:
            alternative = [torch.zeros_like(z) for z in record["contexts"]] if policy == "prune" else record[policy]
            estimates[policy] = torch.stack([(split(g) * (split(a) - split(z))).sum((0, 2))
                                             for g, a, z in zip(context_grads, alternative, record["contexts"])])
        weights = {(layer, h): g.abs() for (layer, _, h, _), g in zip(record["attention"], attention_grads)}
        out.append({"gate": gate[0], "token": token, "estimates": estimates, "weights": weights})
    return out


@pytest.mark.parametrize("renormalize", [False, True])
def test_every_per_example_value_equals_the_float64_reference(classifier, batch, renormalize):
    means, head_sources, substitutes = substituted(classifier, batch_inputs(batch))
    parts = [{**part, "head_sources": head_sources[:, cut]}
             for part, cut in zip(rows(batch, slice(0, 2), slice(2, 3)), (slice(0, 2), slice(2, 3)))]
    mine = head_gradients(classifier, parts, policies=ESTIMABLE, renormalize=renormalize, means=means)
    expected = reference_gradients(classifier, batch, ESTIMABLE, renormalize, substitutes=substitutes)
    assert mine.num_examples == 3 and (mine.order[:, 0] == [0, 1, 2]).all()
    for b, ref in enumerate(expected):
        np.testing.assert_allclose(mine.gate[b], ref["gate"], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(mine.token_abs[b], ref["token"], rtol=1e-9, atol=1e-12)
        for policy in ESTIMABLE:
            np.testing.assert_allclose(mine.estimates[policy][b], ref["estimates"][policy], rtol=1e-8, atol=1e-12)
    assert np.abs(mine.gate).min() > 0  # not a vacuous comparison
    gates = np.stack([ref["gate"].numpy() for ref in expected])
    tokens = np.stack([ref["token"].numpy() for ref in expected])
    np.testing.assert_allclose(mine.importance("example"), np.abs(gates).mean(0), rtol=1e-9)
    np.testing.assert_allclose(mine.importance("token"), tokens.mean(0), rtol=1e-9)
    np.testing.assert_allclose(mine.importance("fisher"), (gates ** 2).mean(0), rtol=1e-9)
    batches = np.abs(gates[:2].sum(0)) + np.abs(gates[2])  # the gradient of a batch's summed loss, per batch
    np.testing.assert_allclose(mine.importance("batch"), batches / 3, rtol=1e-9)
    assert (mine.importance("token") >= mine.importance("example") - 1e-15).all()
    assert (mine.importance("example") >= mine.importance("batch") - 1e-15).all()
    np.testing.assert_allclose(mine.estimate("prune"), -gates.mean(0), rtol=1e-8)  # prune: minus the gate gradient


def test_question_answering_gradients_equal_the_reference(tiny_cfg, inputs, sentence_ids):
    model = load_model(tiny_cfg, "question_answering").double()
    batch = {**inputs, "sentence_ids": sentence_ids, "start_positions": torch.tensor([3, 5, 1]),
             "end_positions": torch.tensor([4, 9, 2])}
    mine = head_gradients(model, [batch], policies=("uniform",))
    for b, ref in enumerate(reference_gradients(model, batch, ("uniform",), qa=True)):
        np.testing.assert_allclose(mine.gate[b], ref["gate"], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(mine.estimates["uniform"][b], ref["estimates"]["uniform"], rtol=1e-8, atol=1e-12)


def test_key_type_gradients_equal_the_reference(classifier, batch, tokenizer):
    mine = headlab.key_type_gradients(classifier, tokenizer, rows(batch, slice(0, 3)))
    expected = reference_gradients(classifier, batch)
    ids = batch["input_ids"]
    types = {"cls": ids == tokenizer.cls_token_id, "sep": ids == tokenizer.sep_token_id,
             "punct": (ids == tokenizer.convert_tokens_to_ids(".")) | (ids == tokenizer.convert_tokens_to_ids(","))}
    layers, heads = classifier.config.num_hidden_layers, classifier.config.num_attention_heads
    for kind in ("cls", "sep", "punct", "other"):
        reference = np.zeros((layers, heads))
        for layer in range(layers):
            for h in range(heads):
                per_example = []
                for b, ref in enumerate(expected):
                    valid = batch["attention_mask"][b].bool()
                    keys = valid & ~(types["cls"][b] | types["sep"][b] | types["punct"][b]) if kind == "other" \
                        else valid & types[kind][b]
                    if keys.any():
                        per_example.append(ref["weights"][(layer, h)][valid][:, keys].mean().item())
                reference[layer, h] = np.mean(per_example)
        np.testing.assert_allclose(mine[kind].numpy(), reference, rtol=1e-8)
    assert types["punct"].any()


@pytest.mark.parametrize("policy", ESTIMABLE)
def test_each_estimate_is_the_limit_of_the_measured_loss_change(classifier, batch, policy):
    """Finite differences: move one head's context vector a fraction eps of the way to its ablated value."""
    layer, head = 1, 2
    means, head_sources, _ = substituted(classifier, batch_inputs(batch))  # the next row's heads for resample
    estimate = headlab.ablation_estimate(classifier, [{**batch, "head_sources": head_sources}], policy,
                                         means=means)[layer, head].item()
    plan = headlab.HeadPlan.from_rules([{"heads": f"L{layer}H{head}", "policy": policy}], 3, 4)
    module, width = self_attention_of(classifier, layer), classifier.config.hidden_size // 4
    columns = slice(head * width, (head + 1) * width)
    seen = []
    hook = module.register_forward_hook(lambda m, args, out: seen.append(out[0]))
    with torch.no_grad():
        loss0 = classifier(**batch).loss.item()
        with headlab.ablate(classifier, plan, means=means):
            measured = classifier(**batch, head_sources=head_sources).loss.item() - loss0
    hook.remove()
    kept, ablated = seen

    def loss_at(eps):
        def move(m, args, out):
            moved = out[0].clone()
            moved[..., columns] = kept[..., columns] + eps * (ablated[..., columns] - kept[..., columns])
            return (moved, *out[1:])

        handle = module.register_forward_hook(move)
        with torch.no_grad():
            loss = classifier(**batch).loss.item()
        handle.remove()
        return loss

    assert abs(loss_at(1.0) - loss0 - measured) < 1e-12  # the interpolation ends at the measured ablation
    errors = [abs((loss_at(eps) - loss0) / eps - estimate) / abs(estimate) for eps in (1e-1, 1e-2, 1e-3)]
    assert errors[2] < 1e-5  # the estimate is the derivative at eps = 0 ...
    assert errors[2] < errors[1] < errors[0] or errors[0] < 1e-6  # ... and the error shrinks with eps (unless at
    # the float64 floor already: uniform attention's effect on this random model is nearly linear)


def test_example_importance_does_not_depend_on_the_batch_size(classifier, batch):
    one_by_one = headlab.head_importance(classifier, rows(batch, slice(0, 1), slice(1, 2), slice(2, 3)))
    together = headlab.head_importance(classifier, [batch])
    torch.testing.assert_close(one_by_one, together, rtol=1e-9, atol=1e-12)
    raw = [headlab.head_importance(classifier, b, granularity="batch", normalize_layer=False,
                                   normalize_global=False) for b in ([batch], rows(batch, slice(0, 1), slice(1, 3)))]
    assert not torch.allclose(*raw)  # HF's granularity does


def test_gates_leave_the_forward_unchanged(tiny_cfg, batch):
    model = load_model(tiny_cfg, "sequence_classification", {"num_labels": 3})
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        expected = model(**inputs).logits
    means, head_sources, _ = substituted(model, inputs)
    with torch.enable_grad(), gradient_probe(model, ESTIMABLE, means=means) as probe:
        got = model(**inputs, sentence_ids=batch["sentence_ids"], head_sources=head_sources).logits
        assert probe.gates.shape == (3, 3, 4) and probe.gates.requires_grad
    assert torch.equal(got, expected)
    assert all(p.requires_grad for p in model.parameters())  # restored
    assert model.config._attn_implementation == "sdpa"


def test_heads_a_plan_prunes_score_zero(classifier, batch):
    plan = headlab.HeadPlan.from_rules([{"heads": "L0H1,L2", "policy": "prune"}], 3, 4)
    scores = head_gradients(classifier, [batch], plan=plan, policies=("prune", "uniform"))
    raw = scores.importance("example")
    assert (raw[0, 1] == 0) and (raw[2] == 0).all() and (raw[0, [0, 2, 3]] > 0).all() and (raw[1] > 0).all()
    assert (scores.estimate("prune")[2] == 0).all()  # z = 0 already: nothing left to remove
    assert (np.abs(scores.estimate("uniform")[2]) > 0).all()  # uniform attention would give them a context again


def test_a_plan_first_used_while_evaluating_can_be_scored(classifier, batch):
    """The plan's cached tensors, built under ``torch.inference_mode`` (Lightning's validate), must serve autograd."""
    plan = headlab.HeadPlan.from_rules([{"heads": "L0H1,L2", "policy": "prune"}], 3, 4)
    expected = head_gradients(copy.deepcopy(classifier), [batch], plan=plan).importance("example")
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "sentence_ids")}
    with torch.inference_mode(), headlab.ablate(classifier, plan):
        classifier(**inputs)
    np.testing.assert_array_equal(head_gradients(classifier, [batch], plan=plan).importance("example"), expected)


@pytest.mark.parametrize("mask", ["padding vector", "per query", "none"])
def test_uniform_alternative_is_the_mean_of_the_valid_values(mask):
    """The probe's uniform ``z'``: a closed form under a key-validity mask, SDPA over zero queries otherwise."""
    g = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(3, 4, 7, 5, generator=g, dtype=torch.float64) for _ in range(3))
    valid = torch.arange(7)[None, :] < torch.tensor([7, 4, 2])[:, None]  # [batch, seq]
    masks = {"padding vector": valid[:, None, None, :], "none": None,
             "per query": valid[:, None, None, :].expand(3, 1, 7, 7).clone()}
    probe = GradientProbe(None, 1, ("uniform",), False, False)
    got = probe._alternative("uniform", query, key, value, masks[mask], None, None)  # [batch, heads, seq, head_dim]
    keys = torch.ones_like(valid) if mask == "none" else valid
    expected = torch.stack([value[b][:, keys[b]].mean(1) for b in range(3)])  # [batch, heads, head_dim]
    torch.testing.assert_close(got, expected[:, :, None].expand_as(got), rtol=1e-12, atol=1e-12)


def test_normalisations_as_defined():
    scores = np.array([[3.0, 4.0], [1.0, 0.0]])
    np.testing.assert_allclose(normalize_importance(scores, True, False), [[0.6, 0.8], [1.0, 0.0]])
    np.testing.assert_allclose(normalize_importance(scores, False, True), [[0.75, 1.0], [0.25, 0.0]])
    np.testing.assert_allclose(normalize_importance(scores, True, True), [[0.6, 0.8], [1.0, 0.0]])
    assert (normalize_importance(np.ones((2, 2)), False, True) == 0).all()


def test_bad_input_is_refused(classifier, tiny_cfg, batch):
    no_labels = {k: v for k, v in batch.items() if k != "labels"}
    with pytest.raises(UserError, match="no labels"):
        headlab.head_importance(classifier, [no_labels])
    with pytest.raises(UserError, match="no loss"):
        headlab.head_importance(load_model(tiny_cfg), [batch])
    with pytest.raises(UserError, match="no examples"):
        headlab.head_importance(classifier, [])
    with pytest.raises(UserError, match="granularity"):
        headlab.head_importance(classifier, [batch], granularity="per_token")
