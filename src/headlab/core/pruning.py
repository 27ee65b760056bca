"""Physical head removal: ``headlab.prune_heads(model, plan)`` (transformers 5 has no ``prune_heads``).

The pruned heads' rows of the query, key and value projections and their columns of the attention output
projection are sliced out, so the model computes the same as under the ``prune`` plan (a pruned head's
context vector is 0, so its output-projection columns contribute nothing; the bias, residual and LayerNorm
stay) with fewer multiplications. A layer that loses every head skips attention altogether: its
self-attention returns a zero-width context and the output projection gives its bias. Where the attention module
applies the output projection itself (DistilBERT, ALBERT, ModernBERT), one head stays with zero values: its context
is 0, the projection gives its bias.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn.utils import skip_init
from transformers import PreTrainedModel

from headlab.core.families import family_of
from headlab.core.families.base import module_at
from headlab.core.model_parts import self_attention_modules
from headlab.core.plans import HeadPlan
from headlab.errors import UserError

PRUNED = "_headlab_pruned_heads"  # [heads removed] on each pruned self-attention module


def pruned_heads_of(model: PreTrainedModel) -> dict[int, list[int]]:
    """``{layer: [heads]}`` physically removed from ``model``'s attention modules by ``prune_heads`` (empty if none).

    Read from the modules, so pruning ``model.bert`` shows on ``model`` too.
    """
    return {depth: m.__dict__[PRUNED] for depth, m in enumerate(self_attention_modules(model)) if PRUNED in m.__dict__}


def _uninitialised_linear(*args, **kwargs) -> nn.Linear:
    """``nn.Linear(*args, **kwargs)`` without initialisation (its weights are copied in next)."""
    with warnings.catch_warnings():  # a layer left without heads has zero-width weights: torch warns on their init
        warnings.filterwarnings("ignore", "Initializing zero-element tensors is a no-op")
        return skip_init(nn.Linear, *args, **kwargs)


def _keep_rows(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    """A Linear with only the output features ``rows``."""
    out = _uninitialised_linear(linear.in_features, len(rows), bias=linear.bias is not None,
                                device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[rows])
        if linear.bias is not None:
            out.bias.copy_(linear.bias[rows])
    return out.train(linear.training)


def _keep_columns(linear: nn.Linear, columns: torch.Tensor) -> nn.Linear:
    """A Linear with only the input features ``columns``."""
    out = _uninitialised_linear(len(columns), linear.out_features, bias=linear.bias is not None,
                                device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(linear.weight[:, columns])
        if linear.bias is not None:
            out.bias.copy_(linear.bias)
    return out.train(linear.training)


def _no_heads(hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
    """Self-attention of a layer without heads: a zero-width context ``[batch, seq, 0]``."""
    return hidden_states.new_zeros(*hidden_states.shape[:-1], 0), None


def _zero_values(attention: nn.Module, family, width: int) -> None:
    """The one head left in a layer that lost all: its value rows 0, so its context is 0 as a pruned head's."""
    with torch.no_grad():
        value = getattr(attention, family.projections[-1])
        rows = slice(-width, None) if family.fused else slice(None)  # the value block of [query; key; value]
        value.weight[rows] = 0.0
        if value.bias is not None:
            value.bias[rows] = 0.0


def prune_heads(model: PreTrainedModel, plan: HeadPlan) -> PreTrainedModel:
    """Remove the heads ``plan`` prunes from ``model``, in place; returns the model.

    The plan may only keep or prune. Outputs equal those under ``headlab.ablate(model, plan)``. The pruned
    model cannot be ablated further (its layers have fewer heads) nor loaded by ``from_pretrained``.
    """
    other = sorted({policy for policy, count in plan.counts().items() if count} - {"keep", "prune"})
    if other:
        raise UserError(f"prune_heads removes pruned heads only; the plan also uses {', '.join(other)}")
    shape = (model.config.num_hidden_layers, model.config.num_attention_heads)
    if (plan.num_layers, plan.num_heads) != shape:
        raise UserError(f"plan is for {plan.num_layers} layers x {plan.num_heads} heads; the model has "
                        f"{shape[0]} x {shape[1]}")
    if pruned_heads_of(model):
        raise UserError("the model is already physically pruned; prune a fresh copy with the combined plan")
    family = family_of(model)
    modules, layers = self_attention_modules(model), family.layers(model)
    conflict = shared_prune_conflict(model, plan) if family.shared else None
    if conflict:
        raise UserError(conflict)
    count = model.config.num_attention_heads
    inside = family.output_path.startswith(family.attention_path + ".")  # the module applies the projection
    done: set[int] = set()
    for layer, attention in enumerate(modules):
        heads = plan.layer_groups(layer).get("prune", [])
        if not heads or id(attention) in done:
            continue
        done.add(id(attention))
        attention.__dict__[PRUNED] = heads
        width = getattr(attention, family.head_width)
        kept = [h for h in range(count) if h not in heads]
        silent = not kept and inside  # its forward cannot run without a head: one head stays, with zero values
        kept = kept or ([0] if inside else [])
        first = getattr(attention, family.projections[0])
        index = torch.tensor([h * width + i for h in kept for i in range(width)], dtype=torch.long,
                             device=first.weight.device)
        rows = torch.cat([index + block * count * width for block in range(3)]) if family.fused else index
        extra = [name for name in family.extra_projections if hasattr(attention, name)]  # DeBERTa's positions
        for name in (*family.projections, *extra):  # [query; key; value] blocks of a fused projection
            setattr(attention, name, _keep_rows(getattr(attention, name), rows))
        owner, _, name = family.output_path.rpartition(".")
        output = module_at(layers[layer], owner)
        setattr(output, name, _keep_columns(getattr(output, name), index))
        if silent:
            _zero_values(attention, family, width)
        for name in family.head_count:
            setattr(attention, name, len(kept))
        for name in family.head_total:
            setattr(attention, name, len(kept) * width)
        if not kept:
            attention.forward = _no_heads  # an instance attribute shadows the class's forward
    return model


def shared_prune_conflict(model: PreTrainedModel, plan: HeadPlan) -> str | None:
    """Why ``plan`` cannot be pruned physically from ``model`` (None: it can): depths that share an attention module
    (ALBERT) can only lose the same heads together."""
    by_module: dict[int, list[int]] = {}
    for depth, module in enumerate(self_attention_modules(model)):
        by_module.setdefault(id(module), []).append(depth)
    for depths in by_module.values():
        pruned = {tuple(plan.layer_groups(depth).get("prune", [])) for depth in depths}
        if len(pruned) > 1:
            return (f"depths L{depths[0]}..L{depths[-1]} share their attention weights (ALBERT): a physical prune "
                    "must remove the same heads at every one of them; use mask=prune (the masked prune, same "
                    "outputs) for a prune of some depths")
    return None
