"""Every head's context vectors (its output before the output projection) from one forward of the unablated model:
what ``mean`` heads average and ``resample`` heads take."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack

import torch
from transformers import PreTrainedModel

from headlab.core.model_parts import MODEL_INPUTS, head_width, self_attention_output
from headlab.core.patch.attention import in_block


def head_contexts(model: PreTrainedModel, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Every head's context vectors on ``batch`` from the unablated model: ``[layers, batch, seq, heads, head_dim]``
    in the model's dtype on its device (no gradient)."""
    if in_block(model):
        raise ValueError("head_contexts needs the unablated model: call it outside headlab.ablate / observe_attention")
    layers, heads, width = model.config.num_hidden_layers, model.config.num_attention_heads, head_width(model)
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), ExitStack() as stack:
            seen = [stack.enter_context(self_attention_output(model, layer)) for layer in range(layers)]
            model(**{name: batch[name] for name in MODEL_INPUTS if name in batch})
    finally:
        model.train(training)
    return torch.stack([context.view(*context.shape[:2], heads, width) for (context,) in seen])
