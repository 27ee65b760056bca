"""Every head's mean context vector over a reference set (mean ablation's substitute), on a tiny model of each family,
against the output projections' own inputs averaged by hand in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from families import batch, tiny_model

from headlab.core.substitutes.means import head_means
from headlab.errors import UserError

PROJECTIONS = {"bert": "attention.output.dense", "deberta-v3": "attention.output.dense",
               "distilbert": "attention.out_lin", "albert": "attention.dense", "modernbert": "attn.Wo",
               "albert-groups": "attention.dense"}  # two groups: the second module serves depths 2 and 3


def projection_inputs(model, name, rows) -> list[torch.Tensor]:
    """Per depth, in call order, the input of the output projection ``[batch, seq, heads * head_dim]``."""
    seen = []
    modules = {id(m): m for n, m in model.named_modules() if n.endswith(PROJECTIONS[name])}
    handles = [m.register_forward_pre_hook(lambda module, args: seen.append(args[0].double()))
               for m in modules.values()]
    with torch.no_grad():
        model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"])
    for handle in handles:
        handle.remove()
    return seen


@pytest.mark.parametrize("name", list(PROJECTIONS))
@pytest.mark.parametrize("over", ["tokens", "positions"])
def test_means_equal_the_projections_inputs_averaged_by_hand(name, over):
    model = tiny_model(name)
    batches = [batch(seed=1), batch(seed=2)]
    batches[1] = {key: value[:2, :9] for key, value in batches[1].items()}  # another length: positions differ
    means = head_means(model, batches, over)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    width = 32 // heads
    inputs = [projection_inputs(model, name, rows) for rows in batches]
    if over == "tokens":
        expected, count = np.zeros((layers, heads, width)), 0
        for rows, per_layer in zip(batches, inputs):
            for b, row in enumerate(rows["attention_mask"]):
                for t in range(len(row)):
                    if row[t]:
                        count += 1
                        for layer in range(layers):
                            expected[layer] += per_layer[layer][b, t].view(heads, width).numpy()
        np.testing.assert_allclose(means.values, expected / count, rtol=1e-12, atol=1e-15)
        assert means.counts == count == 24 + 9 + 8  # 11, 8, 5 tokens; 9, 8
    else:
        expected, counts = np.zeros((layers, 11, heads, width)), np.zeros(11)
        for rows, per_layer in zip(batches, inputs):
            for b, row in enumerate(rows["attention_mask"]):
                for t in range(len(row)):
                    if row[t]:
                        counts[t] += 1
                        for layer in range(layers):
                            expected[layer, t] += per_layer[layer][b, t].view(heads, width).numpy()
        np.testing.assert_array_equal(means.counts, counts)
        np.testing.assert_allclose(means.values, expected / counts[None, :, None, None], rtol=1e-12, atol=1e-15)
    assert np.abs(means.values).max() > 1e-3  # contexts are not zero: the comparison can fail


def test_a_reference_set_without_tokens_is_refused():
    model, rows = tiny_model("bert"), batch()
    rows["attention_mask"] = torch.zeros_like(rows["attention_mask"])
    with pytest.raises(UserError, match="the reference set has no tokens"):
        head_means(model, [rows])
    with pytest.raises(UserError, match="mean_over='words' is not one of tokens, positions"):
        head_means(model, [batch()], "words")


def test_saved_means_load_for_their_identity_only(tmp_path):
    from headlab.core.substitutes.means import load_means, save_means

    model = tiny_model("bert")
    means = head_means(model, [batch()], "positions")
    identity = {"weights": "abc123", "reference": "validation", "examples": 512, "mean_over": "positions"}
    path = save_means(means, tmp_path / "means.npz", identity)
    assert [p.name for p in tmp_path.iterdir()] == ["means.npz"]  # no temporary file left
    loaded = load_means(path, dict(reversed(identity.items())))  # the same identity, keys in another order
    assert loaded.over == "positions" and loaded.positions == 11
    np.testing.assert_array_equal(loaded.values, means.values)
    np.testing.assert_array_equal(loaded.counts, means.counts)
    assert load_means(path, {**identity, "weights": "other"}) is None  # another model's means
    assert load_means(tmp_path / "missing.npz", identity) is None
    (tmp_path / "cut.npz").write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # a killed copy
    assert load_means(tmp_path / "cut.npz", identity) is None
    (tmp_path / "text.npz").write_text("not an archive")
    assert load_means(tmp_path / "text.npz", identity) is None


def test_resample_sources_are_the_source_contexts_by_position_and_the_mean_past_their_end():
    """Row b takes row SOURCES[b]'s contexts (the reference's, float64) where that row has a token, else the mean."""
    from families import reference_contexts
    from reference import substitutes_from

    from headlab.core.substitutes.sources import resample_sources

    model, rows = tiny_model("deberta-v3"), batch()
    order = [2, 0, 1]  # 5 tokens for 11, 11 for 8, 8 for 5
    inputs = {key: rows[key] for key in ("input_ids", "attention_mask")}
    means = head_means(model, [inputs])
    sources = resample_sources(model, {key: value[order] for key, value in inputs.items()}, 11, means)
    substitute, reference_means = substitutes_from(reference_contexts(model, rows), rows["attention_mask"], order)
    assert sources.shape == (3, 3, 11, 4, 8)
    np.testing.assert_allclose(means.values, reference_means.numpy(), rtol=1e-5, atol=1e-6)
    for layer in range(3):
        for b in range(3):
            for h in range(4):
                np.testing.assert_allclose(sources[layer, b, :, h].double().numpy(),
                                           substitute(layer, b, h, "resample").numpy(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(sources[:, 0, 4], sources[:, 0, 5])  # row 0's source has 5 tokens: the mean from there
    assert torch.equal(sources[:, 0, 5], sources[:, 0, 10])
    shorter = resample_sources(model, {key: value[order] for key, value in inputs.items()}, 4, means)
    assert torch.equal(shorter, sources[:, :, :4])  # an evaluated batch shorter than its sources: cut


def test_a_derangement_moves_every_example_and_is_seeded():
    from headlab.core.substitutes.sources import derangement

    draws = [derangement(5, np.random.default_rng(seed)) for seed in range(200)]
    assert all(sorted(d) == list(range(5)) and (d != np.arange(5)).all() for d in draws)
    assert len({tuple(d) for d in draws}) == 44  # every derangement of 5 is drawn (there are 44)
    np.testing.assert_array_equal(derangement(9, np.random.default_rng(3)), derangement(9, np.random.default_rng(3)))
    with pytest.raises(UserError, match="resample needs at least 2 reference examples"):
        derangement(1, np.random.default_rng(0))


def test_substituted_heads_without_their_values_fail_loudly():
    import headlab

    model, rows = tiny_model("bert"), batch()
    inputs = {key: rows[key] for key in ("input_ids", "attention_mask")}
    plan = headlab.HeadPlan.from_rules([{"heads": "L1H2", "policy": "mean"}], 3, 4)
    with pytest.raises(UserError, match="the plan has mean heads: ablate needs means="), headlab.ablate(model, plan):
        pass
    other = head_means(tiny_model("distilbert"), [inputs])  # 3 x 4 x 8 too: a foreign model of the same shape passes
    wide = head_means(tiny_model("bert"), [inputs])
    wide = type(wide)(wide.over, np.zeros((3, 4, 16)), wide.counts)
    foreign = pytest.raises(UserError, match=r"the means are for \[layers, heads, head_dim\] = \[3, 4, 16\]; the "
                                             r"model has \[3, 4, 8\]: means of another model")
    with foreign, headlab.ablate(model, plan, means=wide):
        pass
    resample = headlab.HeadPlan.from_rules([{"heads": "L0", "policy": "resample"}], 3, 4)
    with torch.no_grad(), headlab.ablate(model, resample, means=other):
        with pytest.raises(ValueError, match="the plan has resample heads: pass head_sources="):
            model(**inputs)
        with pytest.raises(ValueError, match=r"head_sources must be a tensor \[layers, batch, seq, heads, head_dim\] "
                                             r"with \[batch, seq, heads, head_dim\] = \[3, 11, 4, 8\]; "
                                             r"got \[3, 2, 11, 4, 8\]"):
            model(**inputs, head_sources=torch.zeros(3, 2, 11, 4, 8))
    inside = pytest.raises(ValueError, match="head_contexts needs the unablated model")
    with inside, headlab.ablate(model, plan, means=other):
        headlab.resample_sources(model, inputs, 11, other)
