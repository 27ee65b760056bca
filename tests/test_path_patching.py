"""Path patching (``analysis/patching/paths.py``) against the definition's frozen-run construction (Wang et al. 2022)
on every family's tiny three- (ALBERT with two groups: four-) layer classifier in float64, each step by hooks on the
modules the definitions name (``test_activation_sites.by_definition``)."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np
import pytest
import torch
from families import tiny_model
from test_activation_sites import by_definition, head_columns
from test_patching import paired_batch
from transformers import AutoModelForSequenceClassification

from headlab.analysis.patching.paths import PathEvaluator, path_specs
from headlab.errors import UserError


def contexts(model, name: str, inputs: dict) -> dict[int, torch.Tensor]:
    """Every layer's heads' contexts ``[batch, seq, heads * head_dim]`` in a forward of ``inputs``."""
    seen: dict[int, list] = {layer: [] for layer in range(model.config.num_hidden_layers)}
    with torch.no_grad(), ExitStack() as stack:
        for layer, found in seen.items():
            stack.enter_context(by_definition(model.base_model, name, "head", layer, found.append))
        model(**inputs)
    return {layer: found[0] for layer, found in seen.items()}


def reference(model, name: str, spec, base: dict, source: dict) -> torch.Tensor:
    """The logits of the path patch by definition: (1) the base run with every head's context the base run's but the
    sender's, the source run's; what the receivers' inputs are there is recorded; (2) the base run with those inputs
    (with the model's output as the receiver, (1)'s logits)."""
    base_heads, source_heads = contexts(model, name, base), contexts(model, name, source)
    sender = spec.sender

    def frozen(layer):
        def change(activation):
            new = base_heads[layer].clone()
            if layer == sender.layer:
                cols = head_columns(name, "head", sender.head)
                new[..., cols] = source_heads[layer][..., cols]
            return new
        return change

    with torch.no_grad(), ExitStack() as stack:
        for layer in range(model.config.num_hidden_layers):
            stack.enter_context(by_definition(model.base_model, name, "head", layer, frozen(layer)))
        reaching = {}
        for site in spec.receivers or ():
            if (site.kind, site.layer) not in reaching:
                reaching[(site.kind, site.layer)] = []
                stack.enter_context(by_definition(model.base_model, name, site.kind, site.layer,
                                                  reaching[(site.kind, site.layer)].append))
        logits = model(**base).logits
    if spec.receivers is None:
        return logits

    def received(kind, layer):
        def change(activation):
            new = activation.clone()
            for site in spec.receivers:
                if (site.kind, site.layer) == (kind, layer):
                    cols = head_columns(name, kind, site.head)
                    new[..., cols] = reaching[(kind, layer)][0][..., cols]
            return new
        return change

    with torch.no_grad(), ExitStack() as stack:
        for kind, layer in reaching:
            stack.enter_context(by_definition(model.base_model, name, kind, layer, received(kind, layer)))
        return model(**base).logits


@pytest.mark.parametrize("receivers, inputs", [(None, ["query"]), ([(2, 0), (2, 3), (1, 2)], ["query", "key", "value"]),
                                               ([(2, 1)], ["value"])], ids=["output", "qkv", "value"])
@pytest.mark.parametrize("name", ["bert", "albert-groups", "deberta-v2", "modernbert", "distilbert", "roberta"])
def test_a_path_patch_is_the_frozen_run_construction(name, receivers, inputs):
    model = tiny_model(name, AutoModelForSequenceClassification).double()
    rows = paired_batch()
    clean = {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"]}
    corrupted = clean | {"input_ids": rows["corrupt_input_ids"]}
    specs = path_specs([(0, 1), (1, 3)], receivers, inputs)
    for direction, (base, source) in (("noising", (clean, corrupted)), ("denoising", (corrupted, clean))):
        evaluator = PathEvaluator(model, "classification", specs, direction)
        evaluator.validation_step(rows, 0)
        evaluator.on_validation_epoch_end()
        for index, spec in enumerate(specs):
            logits = reference(model, name, spec, base, source)
            picked = logits.gather(1, torch.stack([rows["labels"], rows["corrupt_labels"]], 1))
            np.testing.assert_allclose(evaluator.scores[index]["logit_diff"], (picked[:, 0] - picked[:, 1]).numpy(),
                                       rtol=1e-9, atol=1e-12, err_msg=f"{direction} {spec.name}")
            if direction == "noising":
                clean_ld = evaluator.scores["clean"]["logit_diff"]
                assert not np.allclose(evaluator.scores[index]["logit_diff"], clean_ld, rtol=0, atol=1e-10)  # it moves


def test_a_sender_above_every_receiver_is_refused():
    with pytest.raises(UserError, match=r"sender L2H0 has no receiver in a later layer \(receivers: L1H0, L2H1\)"):
        path_specs([(0, 0), (2, 0)], [(1, 0), (2, 1)], ["query"])
