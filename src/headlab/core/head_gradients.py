"""Per-example head gradients from one forward and one backward pass (DESIGN.md section 4).

Inside ``gradient_probe(model, ...)`` every self-attention runs through one more attention function
(``headlab_probe``): it computes the heads' context vectors as ``headlab.ablate`` would (the plan of an
enclosing ``ablate`` applies), multiplies them by gates ``[batch, layers, heads]`` of ones, and keeps,
per layer, what the first-order estimates need:

* ``z``: the context vectors ``[batch, seq, heads, head_dim]`` (the graph node the gradient is taken at);
* ``z' - z`` for each requested policy, where ``z'`` is the context vector the policy gives on the same
  layer input (computed without gradient, with the functions ``ablate`` uses, so the estimate and the
  measured ablation share one definition); ``prune`` needs none (``z' = 0``), and ``uniform`` under a
  padding mask is the closed form of its SDPA call: every query's context is the mean of the valid values;
  ``mean`` takes the probe's means (``gradient_probe(means=)``), ``resample`` the forward's ``head_sources``
  (several draws: their mean, since the estimate is linear in ``z'``);
* the values ``[batch, heads, seq, head_dim]``, for the gradient with respect to the attention weights:
  with ``z_i = sum_j A_ij v_j`` (``A`` after the softmax, before dropout), ``d loss / d A_ij = g_i . v_j``.

``probe.gradients(loss)`` then takes one backward pass to the gates and the context vectors. The loss
must be a sum over examples, so that ``d loss / d gate[b]`` is example b's own gradient. The model's
parameters are frozen inside the probe (no weight gradients are computed).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface

from headlab.core.patch.attention import PROBE_NAME, Controller, _restricted, _shared, attend, call_depth
from headlab.core.patch.sdpa_masks import padding_mask_function, validity
from headlab.core.patch.substitution import SOURCES, DeviceMeans
from headlab.core.plans import ESTIMABLE, SUBSTITUTED
from headlab.errors import UserError

_PROBE = "_headlab_probe"  # attribute on the self-attention modules while a probe is active
KEY_TYPES = ("cls", "sep", "punct", "other")


@dataclass
class BatchGradients:
    """One batch's per-example values, each ``[batch, layers, heads]`` float64 on the CPU.

    ``gate``: d loss_b / d gate[b, l, h]. ``token_abs``: sum over tokens of |g . z| (Michel et al.'s code).
    ``estimates[policy]``: sum over tokens of g . (z' - z). ``key_types[type]``: mean |d loss_b / d A[i, j]|
    over the valid queries i and the keys j of that type (NaN where the example has no such key).
    """

    gate: torch.Tensor
    token_abs: torch.Tensor
    estimates: dict[str, torch.Tensor]
    key_types: dict[str, torch.Tensor]


class GradientProbe:
    """What one forward under ``gradient_probe`` keeps per layer, and its backward pass."""

    def __init__(self, controller: Controller, num_layers: int, policies: Sequence[str], renormalize: bool,
                 values: bool, means: DeviceMeans | None = None):
        unknown = sorted(set(policies) - set(ESTIMABLE))
        if unknown:
            raise ValueError(f"no first-order estimate for policies {unknown}; estimable: {', '.join(ESTIMABLE)}")
        if "mean" in policies and means is None:
            raise UserError("the estimate of mean needs the heads' means: "
                            "gradient_probe(means=headlab.head_means(...))")
        self.controller, self.num_layers, self.means = controller, num_layers, means
        self._sources: torch.Tensor | None = None  # the current forward's head_sources (resample), set at depth 0
        self.policies, self.renormalize, self.keep_values = tuple(policies), renormalize, values
        self._clear()

    def _clear(self) -> None:
        self.gates: torch.Tensor | None = None  # [batch, layers, heads], requires grad
        self.contexts: list[torch.Tensor | None] = [None] * self.num_layers  # [batch, seq, heads, head_dim]
        self.deltas: dict[str, list[torch.Tensor | None]] = {p: [None] * self.num_layers for p in self.policies}
        self.values: list[torch.Tensor | None] = [None] * self.num_layers  # [batch, heads, seq, head_dim]

    def capture(self, layer: int, out, query, key, value, attention_mask, scaling, kwargs: dict) -> torch.Tensor:
        """Gate the layer's context vectors ``out`` ``[batch, seq, heads, head_dim]`` and keep what is needed."""
        if layer == 0 or self.gates is None:  # a new forward
            self._clear()
            batch, _, heads, _ = out.shape
            self.gates = torch.ones(batch, self.num_layers, heads, dtype=out.dtype, device=out.device,
                                    requires_grad=True)
        gated = out * self.gates[:, layer, None, :, None]
        self.contexts[layer] = gated
        with torch.no_grad():
            z = out.detach()
            for policy in self.policies:
                if policy in SUBSTITUTED:  # [batch or 1, seq or 1, heads, head_dim]
                    self.deltas[policy][layer] = self._substitute(policy, layer, z) - z
                elif policy != "prune":
                    alternative = self._alternative(policy, query, key, value, attention_mask, scaling,
                                                    kwargs.get("sentence_ids"))
                    self.deltas[policy][layer] = alternative.transpose(1, 2) - z
            if self.keep_values:
                self.values[layer] = value.detach()
        return gated

    def _substitute(self, policy: str, layer: int, z: torch.Tensor) -> torch.Tensor:
        """``z'`` of a ``mean`` / ``resample`` head at ``layer``: ``[batch or 1, seq or 1, heads, head_dim]``."""
        if policy == "mean":
            return self.means.at(layer, z.shape[1]).to(z.dtype)
        sources = self._sources
        if sources is None:
            raise UserError("the estimate of resample needs head_sources= in the forward (headlab.resample_sources)")
        if sources.shape[1] != z.shape[0]:  # several draws, stacked draw-major: their mean
            sources = sources.view(sources.shape[0], -1, *z.shape).mean(1)
        return sources[layer].to(z.dtype)

    def _alternative(self, policy, query, key, value, attention_mask, scaling, sentence_ids) -> torch.Tensor:
        """``z'``: every head of the layer under ``policy``, ``[batch, heads, seq, head_dim]`` (no dropout)."""
        if policy == "uniform":
            valid, _ = validity(attention_mask, query)
            if valid.shape[-2] == 1:  # the same valid keys for every query: 1/n weights on them, in closed form
                weights = valid.to(value.dtype)  # [batch or 1, 1, 1, seq]
                context = (weights / weights.sum(-1, keepdim=True)) @ value  # [batch, heads, 1, head_dim]
                return context.expand(-1, -1, query.shape[2], -1)
            every_head = torch.ones(1, query.shape[1], 1, 1, dtype=torch.bool, device=query.device)
            return _shared(None, every_head, query, key, value, attention_mask, 0.0, scaling)
        mask = self.controller.masks.drop_mask(policy, self.renormalize, attention_mask, sentence_ids, query)
        return _restricted(query, key, value, *mask, 0.0, scaling)

    def gradients(self, loss: torch.Tensor, key_masks: dict[str, torch.Tensor] | None = None,
                  query_valid: torch.Tensor | None = None) -> BatchGradients:
        """One backward pass of ``loss`` (a sum over examples) to this forward's gates and context vectors.

        ``key_masks[type]``: ``[batch, seq]`` booleans of the keys of each type, ``query_valid`` ``[batch, seq]``
        the non-padding queries (both needed for ``key_types``; the probe must keep values).
        """
        if self.gates is None or any(c is None for c in self.contexts):
            raise RuntimeError("gradient_probe: run one full forward of the model before asking for gradients")
        gate, *grads = torch.autograd.grad(loss, [self.gates, *self.contexts])
        per_layer = lambda f: torch.stack([f(layer, g) for layer, g in enumerate(grads)], dim=1)  # noqa: E731
        z = lambda layer: self.contexts[layer].detach()  # noqa: E731
        token_abs = per_layer(lambda layer, g: (g * z(layer)).sum(-1).abs().sum(1))  # [batch, layers, heads]
        estimates = {}
        for policy in self.policies:
            delta = (lambda layer: -z(layer)) if policy == "prune" else (lambda layer, p=policy: self.deltas[p][layer])
            estimates[policy] = per_layer(lambda layer, g, d=delta: (g * d(layer)).sum((1, 3)))
        key_types = {}
        if key_masks is not None:
            if not self.keep_values:
                raise ValueError("gradient_probe(values=True) is needed for gradients by key type")
            by_type = per_layer(lambda layer, g: _mean_abs_by_key_type(g, self.values[layer], key_masks, query_valid))
            key_types = {kind: by_type[..., i] for i, kind in enumerate(key_masks)}  # [batch, layers, heads] each
        self._clear()
        cpu = lambda t: t.detach().to("cpu", torch.float64)  # noqa: E731
        return BatchGradients(cpu(gate), cpu(token_abs), {p: cpu(e) for p, e in estimates.items()},
                              {k: cpu(v) for k, v in key_types.items()})


def _mean_abs_by_key_type(grad, values, key_masks, query_valid) -> torch.Tensor:
    """``[batch, heads, types]``: per key type (in ``key_masks`` order), the mean over valid queries i and keys j
    of that type of |g_i . v_j| (NaN: the example has no such key).

    grad ``[batch, seq, heads, head_dim]``, values ``[batch, heads, seq, head_dim]``, ``key_masks[type]`` and
    query_valid ``[batch, seq]`` booleans.
    """
    weight_grads = (grad.transpose(1, 2) @ values.transpose(-1, -2)).abs()  # [batch, heads, seq, seq]
    keys = torch.stack(list(key_masks.values()), dim=-1).to(grad.dtype)  # [batch, seq, types]
    queries = query_valid.to(grad.dtype)  # [batch, seq]
    to_keys = weight_grads @ keys[:, None]  # [batch, heads, seq, types]: summed over each type's keys
    total = (to_keys * queries[:, None, :, None]).sum(2)  # [batch, heads, types]
    pairs = queries.sum(-1)[:, None] * keys.sum(1)  # [batch, types]
    return total / pairs[:, None, :]  # 0 / 0 = NaN where the example has no key of the type


def probe_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """AttentionInterface function: the active plan (``attend``), then the probe's gates and capture."""
    controller, depth = call_depth(module)
    out, _ = attend(controller, depth, module, query, key, value, attention_mask, dropout, scaling, kwargs)
    probe = module.__dict__.get(_PROBE)
    if probe is None:
        return out, None
    if depth == 0:
        probe._sources = kwargs.get(SOURCES)
    return probe.capture(depth, out, query, key, value, attention_mask, scaling, kwargs), None


def key_type_masks(input_ids: torch.Tensor, attention_mask: torch.Tensor, cls_id: int, sep_id: int,
                   punct_ids: Sequence[int]) -> dict[str, torch.Tensor]:
    """``{type: [batch, seq] bool}`` of the keys [CLS], [SEP], ``.``/``,`` and every other non-padding token."""
    valid = attention_mask.bool()
    masks = {"cls": input_ids == cls_id, "sep": input_ids == sep_id, "punct": torch.isin(
        input_ids, torch.tensor(list(punct_ids), device=input_ids.device))}
    masks = {kind: mask & valid for kind, mask in masks.items()}
    masks["other"] = valid & ~(masks["cls"] | masks["sep"] | masks["punct"])
    return masks


@contextmanager
def gradient_probe(model: PreTrainedModel, policies: Sequence[str] = (), renormalize: bool = False,
                   values: bool = False, means: Any = None) -> Iterator[GradientProbe]:
    """Inside the block, forwards gate and capture every head (module docstring); the model is restored on exit.

    Use it inside ``headlab.ablate`` to score heads under a plan. ``policies``: those whose ``z' - z`` is kept
    (``drop_*`` need ``sentence_ids`` in the forward, ``resample`` its ``head_sources``; ``mean`` needs
    ``means``, a ``HeadMeans``); ``values``: keep the values for key-type gradients.
    """
    controller = Controller.of(model)
    AttentionInterface.register(PROBE_NAME, probe_attention)
    AttentionMaskInterface.register(PROBE_NAME, padding_mask_function)
    on_device = None if means is None else DeviceMeans(means, next(model.parameters()).device,
                                                       next(model.parameters()).dtype)
    probe = GradientProbe(controller, model.config.num_hidden_layers, policies, renormalize, values, on_device)
    originals = [config._attn_implementation_internal for config in controller.configs]
    trainable = [p for p in model.parameters() if p.requires_grad]
    try:
        for module in controller.modules:
            module.__dict__[_PROBE] = probe
        for config in controller.configs:
            config._attn_implementation_internal = PROBE_NAME
        for parameter in trainable:
            parameter.requires_grad_(False)
        yield probe
    finally:
        for parameter in trainable:
            parameter.requires_grad_(True)
        for config, original in zip(controller.configs, originals):
            config._attn_implementation_internal = original
        for module in controller.modules:
            module.__dict__.pop(_PROBE, None)
        if controller.active is None:
            controller.masks.clear()
