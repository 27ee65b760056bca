"""The last layer at the first token only, for heads that read nothing else of it.

A sequence classification head of BERT, RoBERTa, ELECTRA or ERNIE reads the first token's final hidden state
([CLS], ``<s>``) and nothing else, so of the last layer only that position's query, context and feed-forward are
needed: its keys and values still come from every position. Head sweeps and activation patching run the layers above
the changed one once per plan or patch, and evaluation runs every plan's whole forward; inside
``last_layer_at_first_token`` the last layer costs its key and value projections and little more (a classification
sweep of BERT-base does ~12 % less work, MiniLM's 6 layers ~14 %). Other heads (SQuAD spans, mean pooling) and
families whose attention depends on positions inside the layer (DeBERTa's relative positions, ModernBERT's rotary
ones) run the whole layer, as without it.

A plan's last layer at the first token (``FIRST_TOKEN_POLICIES``): a pruned head's context is 0 and a uniform head's
query is 0 (the patch's own operations, ``attention.py``); ``drop_intra`` and ``drop_inter`` leave the first token's
row as it is, since the first token is a special token, which keeps every attention (``headlab.core.units``). Mean
and resample heads take values computed over every position: their plans run the whole layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel

from headlab.core.families import family_of
from headlab.core.plans import HeadPlan

FIRST_TOKEN_HEADS = ("BertForSequenceClassification", "RobertaForSequenceClassification",
                     "XLMRobertaForSequenceClassification", "CamembertForSequenceClassification",
                     "ElectraForSequenceClassification", "ErnieForSequenceClassification")  # read [:, 0] only
FIRST_TOKEN_POLICIES = ("keep", "prune", "uniform", "drop_intra", "drop_inter")  # a last layer's, at the first token
BERT_LAYERS = ("bert", "roberta")  # families whose layers are BERT's: attention.self, attention.output, intermediate,
                                   # output (positions only in the embeddings)


def reads_first_token(model: PreTrainedModel) -> bool:
    """Whether ``model``'s output depends on its last layer's first position only, and that layer can compute it
    alone (a BERT-style layer with absolute position embeddings)."""
    return (type(model).__name__ in FIRST_TOKEN_HEADS and family_of(model).name in BERT_LAYERS
            and getattr(model.config, "position_embedding_type", "absolute") == "absolute")


def plan_at_first_token(plan: HeadPlan) -> bool:
    """Whether ``plan``'s last layer can run at the first token alone (its heads' policies in
    ``FIRST_TOKEN_POLICIES``; ``drop_*`` heads also need the first token to be a special token, as it is in the
    units of a tokenizer that adds them: the caller's to check)."""
    return all(plan.policy_of(plan.num_layers - 1, h) in FIRST_TOKEN_POLICIES for h in range(plan.num_heads))


@contextmanager
def last_layer_at_first_token(model: PreTrainedModel, key_mask: torch.Tensor, contexts: torch.Tensor | None = None,
                              plan: HeadPlan | None = None) -> Iterator[PreTrainedModel]:
    """Inside the block, ``model``'s last layer returns the first position only (``[batch, 1, hidden]``: the head
    reads the same value as without it). ``key_mask`` ``[batch, seq]`` (1: a token, 0: padding) says which keys the
    first token attends to; ``contexts`` ``[batch, seq, heads * head_dim]``: the layer's heads' context vectors to
    use instead of its attention (a sweep's replayed layer), else they are computed, under ``plan``'s last layer
    when one is given (``plan_at_first_token``). Needs ``reads_first_token``."""
    if not reads_first_token(model):
        raise ValueError(f"{type(model).__name__}: its output is not its last layer's first position alone")
    if plan is not None and not plan_at_first_token(plan):
        raise ValueError("the plan's last layer has heads under mean or resample: it runs at every position")
    layer = family_of(model).layers(model)[-1]  # also inside start_at_layer, whose list is shorter
    last = model.config.num_hidden_layers - 1
    uniform = _heads(plan, last, "uniform", key_mask.device)
    pruned = _heads(plan, last, "prune", key_mask.device)

    def first_position(hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        first = hidden_states[:, :1]  # [batch, 1, hidden]
        heads = (contexts[:, :1] if contexts is not None
                 else first_token_attention(layer.attention.self, hidden_states, key_mask, uniform, pruned))
        # [batch, 1, heads * dim]
        attended = layer.attention.output(heads, first)  # output projection, residual and layer norm
        return layer.output(layer.intermediate(attended), attended)  # [batch, 1, hidden]

    layer.forward = first_position  # an instance attribute shadows the class's forward
    try:
        yield model
    finally:
        del layer.forward


def _heads(plan: HeadPlan | None, layer: int, policy: str, device: torch.device) -> torch.Tensor | None:
    """``[1, heads, 1, 1]`` marks of ``layer``'s heads under ``policy`` in ``plan``, or None (no such head)."""
    if plan is None or not any(plan.policy_of(layer, h) == policy for h in range(plan.num_heads)):
        return None
    marks = [plan.policy_of(layer, h) == policy for h in range(plan.num_heads)]
    return torch.tensor(marks, device=device)[None, :, None, None]


def first_token_attention(attention: torch.nn.Module, hidden_states: torch.Tensor, key_mask: torch.Tensor,
                          uniform: torch.Tensor | None = None, pruned: torch.Tensor | None = None) -> torch.Tensor:
    """The first position's heads' context vectors ``[batch, 1, heads * head_dim]`` of a BERT self-attention module
    over ``hidden_states`` ``[batch, seq, hidden]``, padding keys (``key_mask`` 0) left out; the heads marked in
    ``uniform`` (``[1, heads, 1, 1]``) with their query zeroed (1/n over the valid keys), those in ``pruned`` 0."""
    batch = hidden_states.shape[0]
    heads, width = attention.num_attention_heads, attention.attention_head_size
    split = lambda t: t.view(batch, -1, heads, width).transpose(1, 2)  # noqa: E731  [batch, heads, len, width]
    query = split(attention.query(hidden_states[:, :1]))  # [batch, heads, 1, width]
    if uniform is not None:
        query = query.masked_fill(uniform, 0.0)
    key, value = split(attention.key(hidden_states)), split(attention.value(hidden_states))  # [batch, heads, seq, w]
    mask = key_mask[:, None, None, :].bool()  # [batch, 1, 1, seq]
    context = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                               scale=attention.scaling)  # [batch, heads, 1, width]
    if pruned is not None:
        context = context.masked_fill(pruned, 0.0)
    return context.transpose(1, 2).reshape(batch, 1, heads * width)
