"""DeBERTa-v2/v3's disentangled self-attention through headlab's attention function (the family: ``deberta.py``).

DeBERTa's ``DisentangledSelfAttention`` computes its attention itself: content scores ``q k^T / sqrt(d s)`` (``s``:
1 plus one per relative term), plus the content-to-position and position-to-content terms of its relative
embeddings, masked with the dtype's minimum, softmax, dropout, times the values. No AttentionInterface is consulted.
A controlled module gets this file's class (``route``): outside a headlab block, and for a layer the plan leaves
whole, its forward is the stock one; otherwise it computes the same projections and relative terms with the
module's own code and calls headlab's attention function (whichever the model's config names: ``ablate``'s,
``gradient_probe``'s) with

* query, key, value ``[batch, heads, seq, head_dim]`` and ``scaling = 1 / sqrt(d s)``;
* as attention mask the additive bias ``[batch, heads, seq, seq]``: the relative terms, the dtype's minimum where
  DeBERTa's mask hides a key;
* ``key_mask``: DeBERTa's own mask ``[batch, 1, seq, seq]``, the same tensor in every layer (the bias is not), from
  which a forward finds once where ``drop_*`` heads fill the bias.

``softmax(q k^T * scaling + bias)`` is DeBERTa's softmax, so every policy acts on the probabilities after it (uniform:
1/n over the keys its mask shows; drop_*: those probabilities restricted to the allowed keys). DeBERTa's task
models do not pass extra forward arguments down, so ``sentence_ids`` and ``plan_ids`` come from the controller,
which reads them as the outer model's forward starts (``ForwardArguments``, below).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

ROUTE = "_headlab_route"  # on a routed module: the controller's method that says how a call runs


class RoutedDisentangledSelfAttention(DisentangledSelfAttention):
    """DeBERTa's self-attention whose forward asks its controller how to run (module docstring)."""

    def forward(self, hidden_states, attention_mask, output_attentions=False, query_states=None, relative_pos=None,
                rel_embeddings=None):
        route = self.__dict__.get(ROUTE)
        call = None if route is None else route(self)
        if call is None:
            return super().forward(hidden_states, attention_mask, output_attentions, query_states=query_states,
                                   relative_pos=relative_pos, rel_embeddings=rel_embeddings)
        function, arguments = call
        query, key, value, bias, scaling = self.scores_inputs(hidden_states, attention_mask, query_states,
                                                              relative_pos, rel_embeddings)
        dropout = self.dropout.p if self.training else 0.0
        recorded = {"output_attentions": True} if output_attentions else {}  # refused there, with the others'
        out, _ = function(self, query, key, value, bias, dropout=dropout, scaling=scaling, key_mask=attention_mask,
                          **arguments, **recorded)
        batch, length = out.shape[:2]  # out: [batch, seq, heads, head_dim]
        return out.reshape(batch, length, -1), None  # [batch, seq, heads * head_dim]

    def scores_inputs(self, hidden_states, attention_mask, query_states, relative_pos, rel_embeddings) -> tuple:
        """(query, key, value ``[batch, heads, seq, head_dim]``, bias ``[batch, heads, seq, seq]``, scaling)."""
        heads = self.num_attention_heads
        query_states = hidden_states if query_states is None else query_states
        query = self.transpose_for_scores(self.query_proj(query_states), heads)  # [batch * heads, seq, head_dim]
        key = self.transpose_for_scores(self.key_proj(hidden_states), heads)
        value = self.transpose_for_scores(self.value_proj(hidden_states), heads)
        scale_factor = 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)
        batch, length = query_states.shape[0], query.shape[1]
        if self.relative_attention:
            rel_embeddings = self.pos_dropout(rel_embeddings)
            bias = self.disentangled_attention_bias(query, key, relative_pos, rel_embeddings, scale_factor)
            bias = bias.view(batch, heads, length, key.shape[1])
        else:
            bias = query.new_zeros(batch, heads, length, key.shape[1])
        bias = bias.masked_fill(~attention_mask.bool(), torch.finfo(query.dtype).min)  # as DeBERTa masks its scores
        split = lambda x: x.view(batch, heads, *x.shape[1:])  # noqa: E731
        return split(query), split(key), split(value), bias, 1.0 / math.sqrt(query.shape[-1] * scale_factor)


def route(module: torch.nn.Module, how: Any) -> None:
    """Make ``module`` (a ``DisentangledSelfAttention``) ask ``how(module)`` on each call: None runs the stock
    forward, ``(function, arguments)`` calls the attention function with those extra arguments."""
    if not isinstance(module, DisentangledSelfAttention):
        raise TypeError(f"expected DeBERTa's DisentangledSelfAttention, got {type(module).__name__}")
    if type(module) is DisentangledSelfAttention:
        module.__class__ = RoutedDisentangledSelfAttention
    module.__dict__[ROUTE] = how


class ForwardArguments:
    """headlab's forward arguments (``sentence_ids``, ``plan_ids``, ``head_sources``) of the forward under way,
    read by forward hooks on the models a controller serves, for attention modules their model does not pass them to
    (DeBERTa)."""

    NAMES = ("sentence_ids", "plan_ids", "head_sources")
    FLAG = "_headlab_reads_arguments"  # on a model whose forwards are read

    def __init__(self):
        self.values: dict[str, Any] = {}
        self.depth = 0  # nested forwards under way (a task model's, then its base model's)

    def attach(self, model: torch.nn.Module) -> None:
        """Read the arguments of ``model``'s forwards (once per model)."""
        if not model.__dict__.get(self.FLAG):
            model.register_forward_pre_hook(self.enter, with_kwargs=True)
            model.register_forward_hook(self.leave, with_kwargs=True, always_call=True)
            model.__dict__[self.FLAG] = True

    def enter(self, module, args, kwargs) -> None:
        found = {name: kwargs[name] for name in self.NAMES if kwargs.get(name) is not None}
        self.values = found if self.depth == 0 else {**self.values, **found}  # the outer forward's, and more
        self.depth += 1

    def leave(self, module, args, kwargs, output) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.values = {}
