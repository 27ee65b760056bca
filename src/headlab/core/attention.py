"""Patched self-attention that applies a HeadPlan, and ``headlab.ablate`` (DESIGN.md sections 2-3).

transformers 5 has no ``head_mask``; every BERT-family self-attention dispatches through
``AttentionInterface``. We register one attention function (and the SDPA padding mask under
the same name, or padding is silently lost) and switch a model to it inside ``ablate``.

Per layer, heads are grouped by policy and each group takes its cheapest exact route:

==============  =====================================================================
keep            PyTorch SDPA on the group's heads (no seq x seq matrix)
prune           context vector 0 (nothing is computed)
uniform         mean of the values over non-padding keys (SDPA on a zero query under dropout)
drop_*          renormalize=True: SDPA with the unit mask; False: eager softmax, then zeroing,
                because the kept weights keep the full-row softmax normaliser
==============  =====================================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from headlab.core.plans import HeadPlan
from headlab.errors import UserError

ATTENTION_NAME = "headlab"
# Model types whose self-attention dispatches through AttentionInterface with one module per layer.
BERT_FAMILY = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "ernie")
_STATE = "_headlab_ablation"  # attribute set on each self-attention module inside `ablate`


@dataclass(frozen=True)
class LayerAblation:
    """What one layer's self-attention does under a plan: ``(policy, heads)`` groups."""

    groups: tuple[tuple[str, slice | list[int]], ...]
    renormalize: bool

    @classmethod
    def from_plan(cls, plan: HeadPlan, layer: int, renormalize: bool) -> LayerAblation:
        groups = tuple((policy, _as_index(heads)) for policy, heads in plan.layer_groups(layer).items())
        return cls(groups=groups, renormalize=renormalize)

    @property
    def is_identity(self) -> bool:
        return all(policy == "keep" for policy, _ in self.groups)

    @property
    def needs_units(self) -> bool:
        return any(policy.startswith("drop_") for policy, _ in self.groups)


def _as_index(heads: list[int]) -> slice | list[int]:
    """A slice (a view, no copy) when the heads are contiguous."""
    return slice(heads[0], heads[-1] + 1) if heads == list(range(heads[0], heads[-1] + 1)) else heads


def headlab_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """AttentionInterface function. query/key/value: ``[batch, heads, seq, head_dim]``.

    Returns ``([batch, seq, heads, head_dim], None)`` like transformers' SDPA function.
    """
    ablation: LayerAblation | None = getattr(module, _STATE, None)
    if ablation is None or ablation.is_identity:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    bias, valid = _split_mask(attention_mask, query.dtype)
    same_unit = _same_unit(kwargs.get("sentence_ids"), query) if ablation.needs_units else None
    out = query.new_zeros(query.shape)  # [batch, heads, seq, head_dim]; pruned heads stay 0
    for policy, heads in ablation.groups:
        q, k, v = query[:, heads], key[:, heads], value[:, heads]
        if policy == "keep":
            out[:, heads] = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
            )
        elif policy == "uniform":
            out[:, heads] = _uniform(q, k, v, valid, dropout)
        elif policy in ("drop_intra", "drop_inter"):
            allowed = ~same_unit if policy == "drop_intra" else same_unit  # [batch, 1, seq, seq]
            out[:, heads] = _restricted(q, k, v, bias, valid, allowed, ablation.renormalize, dropout, scaling)
    return out.transpose(1, 2).contiguous(), None


def _split_mask(attention_mask, dtype):
    """(additive float bias or None, boolean key validity or None), both ``[batch, 1, seq, seq]``."""
    if attention_mask is None:
        return None, None
    if attention_mask.dtype == torch.bool:
        return None, attention_mask
    return attention_mask, attention_mask > torch.finfo(attention_mask.dtype).min / 2


def _same_unit(sentence_ids, query) -> torch.Tensor:
    """``[batch, 1, seq, seq]``: True where query and key tokens belong to the same unit."""
    batch, _, length, _ = query.shape
    if sentence_ids is None:
        raise ValueError(
            "policies drop_intra/drop_inter need unit ids: pass sentence_ids=LongTensor[batch, seq] to the "
            "model's forward (headlab.unit_ids builds them from a tokenizer encoding)"
        )
    if tuple(sentence_ids.shape) != (batch, length):
        raise ValueError(
            f"sentence_ids has shape {list(sentence_ids.shape)}; expected [batch, seq] = [{batch}, {length}]"
        )
    sentence_ids = sentence_ids.to(query.device)
    return (sentence_ids[:, :, None] == sentence_ids[:, None, :]).unsqueeze(1)


def _uniform(q, k, v, valid, dropout):
    """Weight 1/n on each of the n valid keys of every query row."""
    if dropout > 0:  # dropout acts on the uniform weights: SDPA with a zero query gives exactly them
        return F.scaled_dot_product_attention(torch.zeros_like(q), k, v, attn_mask=valid, dropout_p=dropout)
    if valid is None:
        return v.mean(dim=2, keepdim=True).expand_as(v)
    first_row = valid[:, :, :1]  # [batch, 1, 1, seq]
    if valid.shape[2] == 1 or torch.equal(valid, first_row.expand_as(valid)):  # padding mask: same keys per query
        valid = first_row
    weights = valid.to(v.dtype)  # [batch, 1, 1 or seq, seq]
    mean = (weights @ v) / weights.sum(-1, keepdim=True).clamp(min=1)
    return mean.expand(-1, -1, v.shape[2], -1)


def _restricted(q, k, v, bias, valid, allowed, renormalize, dropout, scaling):
    """Attention limited to ``allowed`` keys; a row with no allowed key outputs 0."""
    keep = allowed if valid is None else allowed & valid  # [batch, 1, seq, seq]
    if renormalize:  # mask the scores before the softmax: remaining weights sum to 1
        has_key = keep.any(-1, keepdim=True)  # [batch, 1, seq, 1]
        mask = keep | ~has_key  # empty rows attend anywhere (finite), then get zeroed
        if bias is not None:
            mask = bias.masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
        return out * has_key
    scale = q.shape[-1] ** -0.5 if scaling is None else scaling
    scores = (q @ k.transpose(-1, -2)) * scale  # [batch, heads, seq, seq]
    if bias is not None:
        scores = scores + bias
    if valid is not None:
        scores = scores.masked_fill(~valid, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1) * keep
    weights = F.dropout(weights, p=dropout, training=dropout > 0)
    return weights @ v


def register_attention() -> None:
    """Make ``attn_implementation="headlab"`` available (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, headlab_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


# --------------------------------------------------------------------------- models


def check_bert_family(config) -> None:
    """ValueError unless the config is a BERT-family encoder headlab can patch."""
    model_type = getattr(config, "model_type", None)
    if model_type not in BERT_FAMILY:
        raise UserError(
            f"model_type {model_type!r} is not a supported BERT-family encoder; supported: {', '.join(BERT_FAMILY)}"
        )


def self_attention_modules(model: PreTrainedModel) -> list[torch.nn.Module]:
    """The model's self-attention modules, one per layer, in layer order."""
    if not isinstance(model, PreTrainedModel):
        raise UserError(f"expected a Hugging Face PreTrainedModel, got {type(model).__name__}")
    check_bert_family(model.config)
    modules = [
        m for m in model.modules() if type(m).__name__.endswith("SelfAttention") and hasattr(m, "layer_idx")
    ]
    layers = sorted(m.layer_idx for m in modules)
    if layers != list(range(model.config.num_hidden_layers)):
        raise UserError(
            f"{type(model).__name__}: found self-attention layers {layers}, expected one for each of "
            f"0..{model.config.num_hidden_layers - 1}"
        )
    return sorted(modules, key=lambda m: m.layer_idx)


@contextmanager
def ablate(model: PreTrainedModel, plan: HeadPlan, renormalize: bool = False) -> Iterator[PreTrainedModel]:
    """Run ``model`` under ``plan`` inside the block; restore it exactly on exit (also on error).

    ``model`` is any HF BERT-family model, bare or with a task head. Policies ``drop_*`` need
    ``sentence_ids=`` in the forward call. The attention implementation is switched on the
    model's config object, so another model sharing that object switches too.
    """
    if not isinstance(renormalize, bool):
        raise UserError(f"renormalize must be true or false, got {renormalize!r}")
    modules = self_attention_modules(model)
    shape = (model.config.num_hidden_layers, model.config.num_attention_heads)
    if (plan.num_layers, plan.num_heads) != shape:
        raise UserError(
            f"plan is for {plan.num_layers} layers x {plan.num_heads} heads; the model has {shape[0]} x {shape[1]}"
        )
    if any(hasattr(m, _STATE) for m in modules):
        raise ValueError("model is already inside headlab.ablate; nested ablation is not supported")
    register_attention()
    original = model.config._attn_implementation
    try:
        for module in modules:
            setattr(module, _STATE, LayerAblation.from_plan(plan, module.layer_idx, renormalize))
        model.set_attn_implementation(ATTENTION_NAME)
        yield model
    finally:
        model.set_attn_implementation(original)
        for module in modules:
            if hasattr(module, _STATE):
                delattr(module, _STATE)
