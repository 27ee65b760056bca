"""Every head's mean context vector over a reference set (mean ablation's substitute), on a tiny model of each family,
against the output projections' own inputs averaged by hand in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from families import batch, tiny_model

from headlab.core.head_means import head_means
from headlab.errors import UserError

PROJECTIONS = {"bert": "attention.output.dense", "deberta-v3": "attention.output.dense",
               "distilbert": "attention.out_lin", "albert": "attention.dense", "modernbert": "attn.Wo"}


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
    from headlab.core.head_means import load_means, save_means

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
