"""The model's own attention weights, layer by layer, whatever attention implementation it was loaded with.

``observe_attention(model, observer)``: inside the block every forward calls ``observer(layer, weights)``
once per layer with ``softmax(q k^T * scaling + mask)`` computed from the query and key that the patched
attention function receives (float32, ``[batch, heads, seq, seq]``, 0 on padding keys). The same weights
then give the layer's output (``weights @ values``, as the eager implementation computes it), so the
attention is computed once; the weights are dropped after the layer, and a consumer that reduces them as
they come holds one layer's maps at most.

Inside ``headlab.ablate`` (``with ablate(model, plan), observe_attention(model, f):``) the observer gets each
head's own softmax weights as above, computed from the queries and keys the plan's earlier layers led to, and the
plan gives the output: the weights of the heads the plan changes are what they would attend to, not what the plan
makes them do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from headlab.core.patch.ablate import headlab_implementation
from headlab.core.patch.attention import Controller
from headlab.core.patch.sdpa_masks import validity
from headlab.core.pruning import pruned_heads_of
from headlab.errors import UserError

Observer = Callable[[int, torch.Tensor], None]


def attention_weights(query: torch.Tensor, key: torch.Tensor, attention_mask, scaling: float | None) -> torch.Tensor:
    """``[batch, heads, seq, seq]`` float32 softmax weights (0 for a query that sees no key); query and key
    ``[batch, heads, seq, head_dim]``."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale  # [batch, heads, seq, seq]
    valid, bias = validity(attention_mask, query)
    if bias is not None:
        scores = scores + bias.float()
    weights = scores.masked_fill(~valid, float("-inf")).softmax(dim=-1)
    # a query that sees no key (a padding query past a sliding window's reach: ModernBERT) gets 0, as SDPA gives it,
    # not the NaN of an all -inf softmax (it would spread through the padding positions' values)
    return weights.masked_fill(~valid.any(-1, keepdim=True), 0.0)


@contextmanager
def observe_attention(model: PreTrainedModel, observer: Observer) -> Iterator[PreTrainedModel]:
    """Call ``observer(layer, weights)`` for every layer of every forward inside the block (module docstring)."""
    controller = Controller.of(model)
    if controller.observer is not None:
        raise ValueError("the model is already observed; observe_attention does not nest")
    if pruned_heads_of(model):
        raise UserError("the model's heads were physically removed (headlab.prune_heads): features need every head")

    def call(layer: int, query, key, attention_mask, scaling) -> torch.Tensor:
        weights = attention_weights(query, key, attention_mask, scaling)
        observer(layer, weights)
        return weights

    controller.observer = call
    try:
        with headlab_implementation(controller):
            yield model
    finally:
        controller.observer = None
