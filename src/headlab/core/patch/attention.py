"""Patched self-attention that applies a HeadPlan (DESIGN.md sections 2-3; ``ablate.py`` enters plans).

transformers 5 has no ``head_mask``; every BERT-family self-attention dispatches through ``AttentionInterface``. We
register one attention function (and the SDPA padding mask under the same name, or padding is silently lost). A
model gets a controller once, at its first ``ablate``: its self-attention modules and configs. What a plan needs per
layer (boolean head masks on the model's device) is built once per (model, plan, renormalize) and cached, so
entering a plan sets a few attributes; an all-``keep`` plan, and every all-``keep`` layer, runs stock SDPA.

Per layer, the heads that keep, prune or take uniform attention share one SDPA call; ``drop_*`` heads form one group
per policy (a slice when contiguous, so no copy). No seq x seq weights are materialised and no branch depends on
data on a GPU (no host-device synchronisation; the forward compiles with ``fullgraph=True``; on the CPU an unpadded
batch's padding mask is dropped, as stock does, by reading it):

==========================  =====================================================================
keep                        SDPA, unchanged
prune                       the head's values are zeroed in that call: its context vector is 0. When the
                            layer's other keep / uniform heads are one slice without the pruned ones
                            (a head at either end, half the heads, the whole layer), pruned heads are
                            left out of the call and their context is 0: no attention work (heads at
                            the ends and no drop_* in the layer: the others' context padded with zeros)
uniform                     the head's query is zeroed: every score is 0, so the softmax gives 1/n
                            to each valid key (dropout then acts on those weights)
drop_*, renormalize=True    SDPA with the unit mask; a query with no allowed key attends anywhere
                            and its output is zeroed
drop_*, renormalize=False   SDPA over doubled keys ``[K; K]`` with values ``[V; 0]``: the first copy
                            is masked to the allowed keys, the second to the other valid keys, so
                            the softmax normaliser covers every valid key once and only allowed keys
                            carry values: the full-row weights restricted to the allowed keys (0 for
                            a query with none), differentiable as SDPA is
==========================  =====================================================================

On a GPU, a layer with ``drop_*`` heads whose query is smaller than ``JOINT_MAX_ELEMENTS`` (a launch-bound forward, as
BERT-base's 64 x 128 tokens) is one SDPA call over every head, each head under its own mask
(``layer_states.JointCall``; without renormalising every head runs over the doubled keys, the others' second half
hidden). Larger layers, and every layer on a CPU (compute-bound), run one call per group: there the work of the
per-head masks and doubled keys costs more than the calls save (BENCHMARKS.md).

DeBERTa's attention modules call no attention function; ``disentangled.py`` routes them here, their relative-position
terms as an additive bias ``[batch, heads, seq, seq]`` (each group of heads takes its rows of it).

Per-row plans (``ablate(model, [plan_0, plan_1, ...])``, forward with ``plan_ids=LongTensor[batch]``): each layer
keeps ``[plans, heads]`` tables of the policies; the rows pick theirs by ``plan_ids``. The keep / prune / uniform
heads share one SDPA call as above (row-and-head masks), and each ``drop_*`` policy some plan uses in the layer runs
over all heads and is selected per row and head.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from headlab.core.families import family_of
from headlab.core.model_parts import depth_of, self_attention_modules
from headlab.core.patch import disentangled
from headlab.core.patch.forward_masks import ForwardMasks, edit_count
from headlab.core.patch.layer_states import LayerState, RowsState
from headlab.core.patch.recorded_weights import refuse_recorded_weights
from headlab.core.patch.sdpa_masks import heads_of, mask_heads, padding_mask_function, validity, with_bias
from headlab.core.patch.substitution import DeviceMeans, gated, substitute
from headlab.core.plans import HeadPlan

ATTENTION_NAME = "headlab"
PROBE_NAME = "headlab_probe"  # gradient_probe's attention function (``head_gradients.py``)
_CONTROLLER = "_headlab_controller"  # attribute on the model and its self-attention modules, set once
_HOOKED = "_headlab_new_forward"  # on a base model with the forward pre-hook ``_new_forward``
_CACHE_SIZE = 512  # plan states kept per model (a 24 x 16 all-heads sweep has 385 plans)
# per device type, the query size below which a layer with drop_* heads runs as one SDPA call (module docstring)
JOINT_MAX_ELEMENTS = {"cuda": 1 << 23}


class Controller:
    """What headlab keeps on a model: its self-attention modules and configs, the active plan, cached plan states."""

    def __init__(self, model: PreTrainedModel):
        self.modules = self_attention_modules(model)
        self.shape = (model.config.num_hidden_layers, model.config.num_attention_heads)  # what a plan must have
        self.probe = next(model.parameters())  # .to() moves it in place: its device is the model's (_device)
        configs = [model.config, *(m.config for m in self.modules if hasattr(m, "config"))]
        self.configs = list({id(c): c for c in configs}.values())  # the objects whose implementation switches
        self.active: tuple[LayerState | None, ...] | None = None
        self.states: dict[tuple, tuple[LayerState | None, ...]] = {}
        self.masks = ForwardMasks()  # the masks the layers of a forward share
        self.observer = None  # observe_attention's callback: (layer, query, key, attention_mask, scaling)
        self.implementations: list | None = None  # the configs' implementations from before the current block
        self.per_row = 0  # how many per-row plans the active block has (0: one plan, or none)
        self.checked: tuple | None = None  # (plan_ids, its version) last checked
        self.calls = 0  # attention calls of a module shared by depths so far in this forward (ALBERT): their depth
        self.arguments = disentangled.ForwardArguments()  # for modules their model passes no arguments to (DeBERTa)
        self.means: dict[str, DeviceMeans | None] | None = None  # mean and optimal heads' values (ablate's)
        self.last_means: DeviceMeans | None = None  # the latest block's, reused by a block with the same HeadMeans
        self.gates: torch.Tensor | None = None  # the active block's head gates (ablate's gates=) on the model's device

    @classmethod
    def of(cls, model: PreTrainedModel) -> Controller:
        """The controller of the model's attention modules, installed on their first use.

        One controller per set of self-attention modules, whichever wrapper reached them first: ``model.bert`` and
        ``model`` share theirs, so a plan entered through either is seen by both (and nesting is refused).
        """
        controller = model.__dict__.get(_CONTROLLER)
        if controller is None:
            register_attention()
            modules = self_attention_modules(model)
            found = {id(c): c for m in modules if (c := m.__dict__.get(_CONTROLLER)) is not None}
            if len(found) > 1 or (found and [id(m) for m in next(iter(found.values())).modules]
                                  != [id(m) for m in modules]):
                raise ValueError("the model's attention modules already belong to different headlab controllers")
            controller = next(iter(found.values())) if found else cls(model)
            controller.adopt(model)
            for owner in (model, model.base_model, *controller.modules):
                owner.__dict__[_CONTROLLER] = controller
            if _HOOKED not in model.base_model.__dict__:
                model.base_model.register_forward_pre_hook(_new_forward)
                model.base_model.__dict__[_HOOKED] = True
            if family_of(model).own_attention:  # DeBERTa: its modules ask route_of how to run
                for module in modules:
                    disentangled.route(module, controller.route_of)
                for owner in (model, model.base_model):
                    controller.arguments.attach(owner)
        return controller

    def route_of(self, module: torch.nn.Module) -> tuple | None:
        """How a call of a module that computes attention itself runs (``disentangled.py``): None for its stock
        forward (no headlab block, or a layer the plan leaves whole), else (attention function, forward arguments)."""
        implementation = self.configs[0]._attn_implementation_internal
        if implementation not in (ATTENTION_NAME, PROBE_NAME):
            return None
        if implementation == ATTENTION_NAME and self.observer is None and self.gates is None and (
                self.active is None or self.active[depth_of(module)] is None):
            return None
        return ALL_ATTENTION_FUNCTIONS[implementation], self.arguments.values

    def depth(self, module: torch.nn.Module) -> int:
        """The depth of this call of ``module``: its mark, or for a module shared by depths the call's position in
        the forward (counted from the base model's forward pre-hook)."""
        depth = depth_of(module)
        if depth is None:
            depth, self.calls = self.calls, self.calls + 1
        return depth

    def adopt(self, model: PreTrainedModel) -> None:
        """Switch ``model``'s config objects along with the ones already controlled (a wrapper shares its base's)."""
        for config in (model.config, *(m.config for m in self.modules if hasattr(m, "config"))):
            if all(config is not c for c in self.configs):
                self.configs.append(config)

    def __deepcopy__(self, memo: dict) -> Controller:
        """A copy of a controlled model gets an inert controller: stock attention, also when copied inside a block."""
        copy = Controller.__new__(Controller)
        memo[id(self)] = copy
        copy.modules = deepcopy(self.modules, memo)
        copy.shape, copy.probe = self.shape, deepcopy(self.probe, memo)  # the copied model's own parameter
        copy.configs = deepcopy(self.configs, memo)
        for config, original in zip(copy.configs, self.implementations or ()):
            config._attn_implementation_internal = original  # the implementation from before the block
        copy.active, copy.observer, copy.masks, copy.states = None, None, ForwardMasks(), {}
        copy.implementations, copy.per_row, copy.checked, copy.gates = None, 0, None, None
        copy.calls, copy.arguments, copy.means, copy.last_means = 0, deepcopy(self.arguments, memo), None, None
        return copy

    def check_plan_ids(self, plan_ids: Any, batch: int) -> None:
        """``plan_ids`` ``[batch]`` index the per-row plans (once per forward; under ``torch.compile``, never):
        -1 would pick the last plan, and plan_ids under one plan would be ignored."""
        if torch.compiler.is_compiling():
            return
        if self.checked is not None and self.checked[0] is plan_ids and self.checked[1] == edit_count(plan_ids):
            return  # checked at the forward's first layer
        if not self.per_row:
            raise ValueError("plan_ids given, but the model is under one plan: give ablate a list of plans for "
                             "per-row plans")
        if not isinstance(plan_ids, torch.Tensor) or tuple(plan_ids.shape) != (batch,):
            raise ValueError(f"plan_ids must be a LongTensor of shape [batch] = [{batch}]; got "
                             f"{list(plan_ids.shape) if isinstance(plan_ids, torch.Tensor) else type(plan_ids)}")
        if plan_ids.dtype.is_floating_point or plan_ids.dtype == torch.bool:
            raise ValueError(f"plan_ids must hold integers; got {plan_ids.dtype}")
        low, high = int(plan_ids.min()), int(plan_ids.max())
        if low < 0 or high >= self.per_row:
            raise ValueError(f"plan_ids holds {low if low < 0 else high}; each must index one of the "
                             f"{self.per_row} plans (0..{self.per_row - 1})")
        self.checked = (plan_ids, edit_count(plan_ids))

    def states_for(self, plan: HeadPlan | tuple[HeadPlan, ...], renormalize: bool, device: torch.device) -> tuple:
        """Per layer: a LayerState (one plan), a RowsState (a tuple of per-row plans) or None (all keep)."""
        key = (plan, renormalize, device)
        if key not in self.states:
            if len(self.states) >= _CACHE_SIZE:
                self.states.pop(next(iter(self.states)))
            rows = isinstance(plan, tuple)
            build = RowsState.build if rows else LayerState.build
            with torch.inference_mode(False):  # normal tensors: a state built while evaluating serves autograd too
                self.states[key] = tuple(build(plan, layer, renormalize, device)
                                         for layer in range((plan[0] if rows else plan).num_layers))
        return self.states[key]


def in_block(model: PreTrainedModel) -> bool:
    """Whether ``model`` runs inside ``headlab.ablate`` or ``observe_attention`` now."""
    controller = model.__dict__.get(_CONTROLLER)
    return controller is not None and (controller.active is not None or controller.observer is not None)


def headlab_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """AttentionInterface function. query/key/value: ``[batch, heads, seq, head_dim]``.

    Returns ``([batch, seq, heads, head_dim], None)`` like transformers' SDPA function.
    """
    controller, depth = call_depth(module)
    return attend(controller, depth, module, query, key, value, attention_mask, dropout, scaling, kwargs)


def call_depth(module: torch.nn.Module) -> tuple[Controller | None, int | None]:
    """The controller of an attention module and the depth of this call of it (None, None: not controlled)."""
    controller = module.__dict__.get(_CONTROLLER)
    return controller, None if controller is None else controller.depth(module)


def attend(controller: Controller | None, depth: int | None, module, query, key, value, attention_mask, dropout,
           scaling, kwargs: dict) -> tuple[torch.Tensor, None]:
    """``headlab_attention`` of the call at ``depth`` (None: not controlled)."""
    if (depth == 0 or "output_attentions" in kwargs) and not torch.compiler.is_compiling():  # once a forward
        refuse_recorded_weights(kwargs)
    if controller is not None and controller.observer is not None:  # observe_attention: its weights give the output
        weights = controller.observer(depth, query, key, attention_mask, scaling)
        if controller.active is None:
            weights = F.dropout(weights, dropout)
            return torch.matmul(weights.to(value.dtype), value).transpose(1, 2).contiguous(), None
        # observed inside ablate: the observer saw each head's own softmax; the plan's route gives the output
    layer = None if controller is None or controller.active is None else controller.active[depth]
    if controller is not None and controller.active is not None and "plan_ids" in kwargs:
        controller.check_plan_ids(kwargs["plan_ids"], query.shape[0])
    gates = None if controller is None else controller.gates
    if layer is None:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
        return gated(out, gates, depth), None
    if isinstance(layer, RowsState):
        out = _per_row(layer, controller, query, key, value, attention_mask, dropout, scaling, kwargs)
        rows = kwargs["plan_ids"].to(query.device)
    else:
        out, rows = _planned(layer, controller, query, key, value, attention_mask, dropout, scaling, kwargs), None
    if layer.substituted:  # mean / resample heads: computed as pruned, their context replaced now
        out = substitute(out, layer.substituted, depth, controller.means, kwargs, rows)
    return gated(out, gates, depth), None


def _planned(layer: LayerState, controller, query, key, value, attention_mask, dropout, scaling, kwargs):
    """The context vectors ``[batch, seq, heads, head_dim]`` of a layer under one plan."""
    sentence_ids = kwargs.get("sentence_ids")
    key_mask = kwargs.get("key_mask")  # DeBERTa's: attention_mask is its bias of this layer
    visible = None  # DeBERTa's uniform heads: the keys its mask shows, as a bias made once per forward
    if key_mask is not None and layer.uniform is not None:
        visible = controller.masks.visible_bias(key_mask, sentence_ids, query)
    if layer.joint is not None and query.numel() < JOINT_MAX_ELEMENTS.get(query.device.type, 0) and (
            key_mask is not None or attention_mask is None or attention_mask.dtype == torch.bool):
        return _joint(layer, controller, query, key, value, attention_mask, sentence_ids, visible, key_mask, dropout,
                      scaling)
    padding = attention_mask  # what the keep / prune / uniform heads' SDPA call takes
    if layer.uniform is None:  # (uniform heads read which keys are valid from the mask as it came)
        padding = controller.masks.padding_bias(attention_mask, sentence_ids, query)
    if not layer.drops and layer.skipped is None:  # one SDPA call serves every head
        out = _shared(layer.prune, layer.uniform, query, key, value, padding, dropout, scaling, visible)
        return out.transpose(1, 2).contiguous()
    if layer.pad is not None:  # pruned heads at the ends: the other heads' context, padded with zero heads
        q, k, v = (x[:, layer.shared] for x in (query, key, value))
        mask = mask_heads(padding, layer.shared)
        context = _shared(None, layer.uniform, q, k, v, mask, dropout, scaling, visible)  # [batch, heads', seq, dim]
        return F.pad(context.transpose(1, 2), (0, 0, *layer.pad))  # [batch, seq, heads, head_dim], contiguous
    contexts = []  # (heads, context [batch, seq, heads', head_dim] or 0.0 for skipped heads)
    if layer.skipped is not None:  # pruned heads without attention: their context is 0
        contexts.append((layer.skipped, 0.0))
    if layer.shared is not None:
        q, k, v = (heads_of(x, layer.shared) for x in (query, key, value))
        mask = mask_heads(padding, layer.shared)
        contexts.append((layer.shared, _shared(layer.prune, layer.uniform, q, k, v, mask, dropout, scaling, visible)))
    for policy, heads in layer.drops:  # a per-head bias (DeBERTa): the group's unit masks from its own rows
        q, k, v = (heads_of(x, heads) for x in (query, key, value))
        group_mask = mask_heads(attention_mask, heads)
        mask = controller.masks.drop_mask(policy, layer.renormalize, group_mask, sentence_ids, query, key_mask)
        zeros = None if layer.renormalize else controller.masks.zeros(v, _per_forward(attention_mask, key_mask),
                                                                      sentence_ids)
        contexts.append((heads, _restricted(q, k, v, *mask, dropout, scaling, zeros)))
    contexts = [(heads, c if isinstance(c, float) else c.transpose(1, 2)) for heads, c in contexts]
    if layer.tiled:  # slices that cover the heads in order: one copy
        return torch.cat([c for _, c in sorted(contexts, key=lambda pair: pair[0].start)], dim=2)
    out = query.new_empty(query.shape[0], query.shape[2], *query.shape[1::2])  # [batch, seq, heads, head_dim]
    for heads, context in contexts:  # every head is written by one group
        _write(out, heads, context)
    return out


def _joint(layer: LayerState, controller, query, key, value, attention_mask, sentence_ids, visible, key_mask,
           dropout, scaling):
    """A layer with ``drop_*`` heads in one SDPA call, each head under its own mask (``layer_states.JointCall``);
    returns ``[batch, seq, heads, head_dim]``. ``key_mask``: DeBERTa's, whose ``attention_mask`` is a per-layer
    bias, with ``visible`` (``_shared``)."""
    joint = layer.joint
    if visible is not None:  # DeBERTa's uniform heads: 1/n over the keys its mask shows
        attention_mask = torch.where(joint.uniform, visible, attention_mask)
    mask, has_key = controller.masks.joint_mask(joint, layer.renormalize, attention_mask, sentence_ids, query,
                                                key_mask)
    q = query if joint.uniform is None else _zero_heads(query, joint.uniform)
    v = value if joint.prune is None else _zero_heads(value, joint.prune)
    if has_key is None:  # doubled keys [K; K] with values [V; 0] (module docstring)
        key = torch.cat([key, key], dim=2)
        v = torch.cat([v, controller.masks.zeros(v, _per_forward(attention_mask, key_mask), sentence_ids)], dim=2)
    out = F.scaled_dot_product_attention(q, key, v, attn_mask=mask, dropout_p=dropout, scale=scaling).transpose(1, 2)
    return (out if has_key is None else out * has_key.transpose(1, 2)).contiguous()  # 0.0: a query without a key


def _per_forward(attention_mask, key_mask):
    """The tensor a forward's cached masks are keyed by: DeBERTa's ``key_mask`` (its bias differs per layer)."""
    return attention_mask if key_mask is None else key_mask


def _new_forward(base_model: torch.nn.Module, args) -> None:
    """Forward pre-hook of a controlled base model: modules shared by depths count from depth 0 again, and the previous
    forward's caches go (masks, checked ``plan_ids``: matched by identity and edit counter, which an inference tensor
    lacks, so a buffer refilled in place, as CUDA graphs' static inputs are, would find the old masks)."""
    controller = base_model.__dict__.get(_CONTROLLER)
    if controller is not None:
        controller.calls = 0
        if not torch.compiler.is_compiling():
            controller.masks.clear()
            controller.checked = None


def _write(out: torch.Tensor, heads: slice | torch.Tensor, context: torch.Tensor | float) -> None:
    """``out[:, :, heads] = context`` (a tensor ``[batch, seq, len(heads), head_dim]`` or a number)."""
    if isinstance(heads, slice):
        out[:, :, heads] = context
    elif isinstance(context, float):
        out.index_fill_(2, heads, context)
    else:
        out.index_copy_(2, heads, context)


def _shared(prune, uniform, q, k, v, attention_mask, dropout: float, scaling, visible=None) -> torch.Tensor:
    """keep, prune and uniform heads in one SDPA call: pruned heads' values and uniform heads' queries zeroed.

    ``prune`` / ``uniform``: boolean marks ``[1 or batch, heads, 1, 1]`` (None: no such head). ``visible``: the
    additive mask uniform heads take in place of a per-head bias (DeBERTa's, made once per forward), else found here.
    """
    if uniform is not None:
        q = _zero_heads(q, uniform)
        if visible is not None:
            attention_mask = torch.where(uniform, visible, attention_mask)
        else:
            valid, bias = validity(attention_mask, q)
            if bias is not None:  # a caller's additive bias: uniform heads see only which keys are valid
                attention_mask = torch.where(uniform, with_bias(valid, torch.zeros_like(bias)), bias)
    if prune is not None:
        v = _zero_heads(v, prune)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=dropout, scale=scaling)


def _per_row(layer: RowsState, controller, query, key, value, attention_mask, dropout, scaling, kwargs):
    """Each row under its own plan (``kwargs["plan_ids"]``); returns ``[batch, seq, heads, head_dim]``."""
    plan_ids = kwargs.get("plan_ids")
    if plan_ids is None:
        raise ValueError("the model is under per-row plans: pass plan_ids=LongTensor[batch] to the forward")
    plan_ids = plan_ids.to(query.device)
    rows = lambda table: None if table is None else table[plan_ids][:, :, None, None]  # noqa: E731  [batch, heads, 1, 1]
    out = _shared(rows(layer.prune), rows(layer.uniform), query, key, value, attention_mask, dropout, scaling)
    for policy, table in layer.drops:
        mask = controller.masks.drop_mask(policy, layer.renormalize, attention_mask, kwargs.get("sentence_ids"), query)
        out = torch.where(rows(table), _restricted(query, key, value, *mask, dropout, scaling), out)
    return out.transpose(1, 2).contiguous()


def _zero_heads(x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """``x`` ``[batch, heads, seq, head_dim]`` with the marked heads zeroed, in ``x``'s own memory order.

    The projections give ``[batch, seq, heads, head_dim]`` memory seen through a transpose; filling in that
    order keeps it, so SDPA's output comes back in the layout the stock path gets (no extra copies).
    """
    return x.transpose(1, 2).masked_fill(heads.transpose(1, 2), 0.0).transpose(1, 2)


def _restricted(q, k, v, mask, has_key, dropout: float, scaling, zeros=None) -> torch.Tensor:
    """Attention limited to the allowed keys (module docstring); a query with no allowed key outputs 0.
    ``zeros``: zeros shaped as ``v`` (the doubled keys' second values), when the caller keeps some."""
    if has_key is not None:  # renormalize
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
        return out * has_key  # [batch, 1, seq, 1]: 0.0 where the query has no allowed key
    keys = torch.cat([k, k], dim=2)
    values = torch.cat([v, torch.zeros_like(v) if zeros is None else zeros], dim=2)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout, scale=scaling)


def register_attention() -> None:
    """Make ``attn_implementation="headlab"`` available (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, headlab_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, padding_mask_function)
