"""``headlab.ablate``: a model under a plan inside a block, and the switch of its attention implementation."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import PreTrainedModel

from headlab.core.model_parts import head_width
from headlab.core.patch.attention import ATTENTION_NAME, Controller
from headlab.core.patch.substitution import DeviceMeans
from headlab.core.plans import HeadPlan
from headlab.core.pruning import PRUNED
from headlab.core.substitutes.means import HeadMeans
from headlab.errors import UserError


def _device(controller: Controller, model: PreTrainedModel) -> torch.device:
    """The model's device, from the parameter the controller keeps (``.to()`` moves parameters in place, unless
    torch is set to replace them: then from the model)."""
    if torch.__future__.get_overwrite_module_params_on_conversion():
        return next(model.parameters()).device
    return controller.probe.device


@contextmanager
def ablate(
    model: PreTrainedModel, plan: HeadPlan | Sequence[HeadPlan], renormalize: bool = False, means: Any = None,
    gates: torch.Tensor | None = None, constants: Any = None,
) -> Iterator[PreTrainedModel]:
    """Run ``model`` under ``plan`` inside the block; restore it exactly on exit (also on error).

    ``model`` is any HF BERT-family model, bare or with a task head. Policies ``drop_*`` need
    ``sentence_ids=`` in the forward call. A sequence of plans gives each row its own: the forward
    then takes ``plan_ids=LongTensor[batch]`` (indices into the sequence). The attention
    implementation is switched on the model's config object, so another model sharing that object
    switches too. Entering costs microseconds after the first time a (model, plan, renormalize) is seen.

    ``means``: the ``HeadMeans`` (``headlab.head_means``) that ``mean`` heads take; needed when a plan has any.
    ``resample`` heads take theirs from the forward argument ``head_sources`` (``headlab.resample_sources``).
    ``constants``: what ``optimal`` heads take, ``[layers, heads, head_dim]``: a ``HeadMeans`` over tokens
    (``load_constants``: a constants file) or a tensor (gradients flow into it: learning them).

    ``gates``: a float tensor ``[layers, heads]`` (or ``[batch, layers, heads]``, a gate per row) multiplying each
    head's context after the plan (0 prunes the head, 1 keeps it); gradients flow into it (learned gates).
    """
    if not isinstance(renormalize, bool):
        raise UserError(f"renormalize must be true or false, got {renormalize!r}")
    controller = Controller.of(model)
    if not isinstance(plan, HeadPlan):
        plan = tuple(plan)
        if not plan or not all(isinstance(p, HeadPlan) for p in plan):
            raise UserError("ablate takes a HeadPlan or a non-empty sequence of HeadPlans (per-row plans)")
    shape = controller.shape
    for one in plan if isinstance(plan, tuple) else (plan,):
        if (one.num_layers, one.num_heads) != shape:
            raise UserError(
                f"plan is for {one.num_layers} layers x {one.num_heads} heads; the model has {shape[0]} x {shape[1]}"
            )
    if controller.active is not None or controller.observer is not None:
        raise ValueError("model is already inside headlab.ablate or observe_attention; nesting is not supported")
    if any(PRUNED in module.__dict__ for module in controller.modules):  # prune_heads marks the modules
        raise UserError("the model's heads were physically removed (headlab.prune_heads): plans need the full model")
    device = _device(controller, model)
    means = _device_means(controller, plan, means, model, device)
    constants = _device_constants(controller, plan, constants, model, device)
    gates = _checked_gates(gates, shape, device)
    states = controller.states_for(plan, renormalize, device)
    controller.active, controller.per_row = states, len(plan) if isinstance(plan, tuple) else 0
    controller.means, controller.gates = {"mean": means, "optimal": constants}, gates
    try:  # all keep and no gates: the stock model runs untouched
        with headlab_implementation(controller, switch=gates is not None or any(s is not None for s in states)):
            yield model
    finally:
        controller.active, controller.per_row, controller.checked = None, 0, None
        controller.masks.clear()
        controller.means = controller.gates = None


def _checked_gates(gates: Any, shape: tuple[int, int], device: torch.device) -> torch.Tensor | None:
    """``ablate``'s gates on the model's device (a differentiable copy when they were elsewhere), checked."""
    if gates is None:
        return None
    if not isinstance(gates, torch.Tensor) or not gates.dtype.is_floating_point:
        raise UserError(f"gates must be a float tensor [layers, heads] or [batch, layers, heads], got "
                        f"{getattr(gates, 'dtype', type(gates).__name__)}")
    if gates.dim() not in (2, 3) or tuple(gates.shape[-2:]) != shape:
        raise UserError(f"gates are {list(gates.shape)}; the model has [layers, heads] = {list(shape)} (give "
                        "[layers, heads] or [batch, layers, heads])")
    return gates.to(device)


def _device_means(controller: Controller, plan: HeadPlan | tuple[HeadPlan, ...], means: Any, model: PreTrainedModel,
                  device: torch.device) -> DeviceMeans | None:
    """The block's means on the model's device (the previous block's when they are the same), checked."""
    if means is None:
        if any(one.counts()["mean"] for one in (plan if isinstance(plan, tuple) else (plan,))):
            raise UserError("the plan has mean heads: ablate needs means= (headlab.head_means over a reference set)")
        return None
    if not isinstance(means, HeadMeans):
        raise UserError(f"means must be a HeadMeans (headlab.head_means), got {type(means).__name__}")
    layers, heads = controller.shape
    expected = (layers, heads, head_width(model))
    found = means.values.shape[:1] + means.values.shape[-2:]
    if found != expected:
        raise UserError(f"the means are for [layers, heads, head_dim] = {list(found)}; the model has "
                        f"{list(expected)}: means of another model")
    dtype = next(model.parameters()).dtype
    cached = controller.last_means
    if cached is None or cached.source is not means or cached.values.device != device or cached.values.dtype != dtype:
        controller.last_means = cached = DeviceMeans(means, device, dtype)
    return cached


def _device_constants(controller: Controller, plan: HeadPlan | tuple[HeadPlan, ...], constants: Any,
                      model: PreTrainedModel, device: torch.device) -> DeviceMeans | None:
    """The block's optimal constants on the model's device, checked (a tensor stays differentiable)."""
    if constants is None:
        if any(one.counts()["optimal"] for one in (plan if isinstance(plan, tuple) else (plan,))):
            raise UserError("the plan has optimal heads: ablate needs constants= (mask.constants: the constants a "
                            "mode=gates gates.method=optimal job learned)")
        return None
    values = constants if isinstance(constants, torch.Tensor) else getattr(constants, "values", None)
    if values is None or (not isinstance(constants, torch.Tensor) and constants.over != "tokens"):
        raise UserError(f"constants must be a tensor or HeadMeans [layers, heads, head_dim], got "
                        f"{type(constants).__name__}")
    expected = (*controller.shape, head_width(model))
    if tuple(values.shape) != expected:
        raise UserError(f"the constants are [layers, heads, head_dim] = {list(values.shape)}; the model has "
                        f"{list(expected)}: constants of another model")
    return DeviceMeans(constants, device, next(model.parameters()).dtype)


@contextmanager
def headlab_implementation(controller: Controller, switch: bool = True) -> Iterator[None]:
    """Inside the block the controller's configs use headlab's attention (when ``switch``); restored on exit."""
    if not switch:  # nothing to switch or restore
        yield
        return
    originals = [config._attn_implementation_internal for config in controller.configs]
    outer = controller.implementations
    controller.implementations = originals if outer is None else outer
    try:
        for config in controller.configs:
            config._attn_implementation_internal = ATTENTION_NAME
        yield
    finally:
        for config, original in zip(controller.configs, originals):
            config._attn_implementation_internal = original
        controller.implementations = outer
