"""Substituted heads (``mean``, ``resample``, ``optimal``): their context vector replaced after the layer's attention.

``attend`` computes a layer's context vectors with these heads pruned, then ``substitute`` puts in their place

* ``mean``: the head's mean context vector over a reference set (``headlab.head_means``), the same at every token
  (``over="tokens"``) or the mean of the token's position (``over="positions"``); the controller holds the means of
  the block (``ablate(..., means=)``) on the model's device;
* ``resample``: the head's context vector on another input, from the forward argument ``head_sources``
  ``[layers, batch, seq, heads, head_dim]`` (``headlab.resample_sources``: the unablated model on each row's source
  example, aligned by position);
* ``optimal``: a constant per head (``ablate(..., constants=)``: ``[layers, heads, head_dim]``), the same at every
  token: the constant that minimises the loss (Li & Janson 2024, learned by ``mode=gates gates.method=optimal``).

Means and resampled values are constants: no gradient flows into them; constants given as a tensor that requires a
gradient get theirs (learning the optimal constants). Gates (``ablate(..., gates=)``) then multiply each
head's context, substituted or not; gradients flow into them (learned gates).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

SOURCES = "head_sources"  # the forward argument with the resample sources


class DeviceMeans:
    """``HeadMeans`` values on the model's device, in the model's dtype: ``[layers, heads, head_dim]`` (tokens) or
    ``[layers, positions, heads, head_dim]`` (positions)."""

    def __init__(self, means: Any, device: torch.device, dtype: torch.dtype):
        self.source = means  # the HeadMeans these came from (identity: a block with the same means reuses them)
        if isinstance(means, torch.Tensor):  # constants [layers, heads, head_dim], differentiable when they train
            self.per_position, self.values = False, means.to(device=device, dtype=dtype)
            return
        self.per_position = means.over == "positions"
        self.values = torch.as_tensor(np.asarray(means.values), device=device).to(dtype)

    def at(self, depth: int, seq: int) -> torch.Tensor:
        """``[1, 1 or seq, heads, head_dim]``: the means of layer ``depth`` for ``seq`` positions."""
        values = self.values[depth]
        if not self.per_position:
            return values[None, None]
        if seq > values.shape[0]:
            raise ValueError(f"inputs of {seq} positions, but the means were taken per position over at most "
                             f"{values.shape[0]} (mean_over=positions needs reference examples at least as long)")
        return values[None, :seq]


def substitute(out: torch.Tensor, substituted, depth: int, values: dict[str, DeviceMeans | None], kwargs: dict,
               rows: torch.Tensor | None = None) -> torch.Tensor:
    """``out`` ``[batch, seq, heads, head_dim]`` with each substituted head's context replaced.

    ``substituted``: ``(policy, marks)`` with marks ``[1, 1, heads, 1]`` (one plan) or ``[plans, heads]`` tables
    (per-row plans: ``rows`` are the batch's ``plan_ids``). ``values``: the block's means (``"mean"``) and constants
    (``"optimal"``).
    """
    seq = out.shape[1]
    for policy, marks in substituted:
        chosen = marks if rows is None else marks[rows][:, None, :, None]  # [1 or batch, 1, heads, 1]
        if policy in ("mean", "optimal"):
            if values.get(policy) is None:
                given = "means= (headlab.head_means)" if policy == "mean" else "constants= (mask.constants)"
                raise ValueError(f"the plan has {policy} heads but no values for them: give ablate {given}")
            value = values[policy].at(depth, seq)
        else:
            value = _sources(kwargs, depth, out.shape)
        out = torch.where(chosen, value.to(out.dtype), out)
    return out


def _sources(kwargs: dict, depth: int, shape: torch.Size) -> torch.Tensor:
    """Layer ``depth``'s resample sources ``[batch, seq, heads, head_dim]`` from the forward's ``head_sources``."""
    sources = kwargs.get(SOURCES)
    if sources is None:
        raise ValueError(f"the plan has resample heads: pass {SOURCES}= (headlab.resample_sources) to the forward")
    if not isinstance(sources, torch.Tensor) or sources.dim() != 5 or tuple(sources.shape[1:]) != tuple(shape):
        found = list(sources.shape) if isinstance(sources, torch.Tensor) else type(sources).__name__
        raise ValueError(f"{SOURCES} must be a tensor [layers, batch, seq, heads, head_dim] with [batch, seq, heads, "
                         f"head_dim] = {list(shape)}; got {found}")
    return sources[depth]


def gated(out: torch.Tensor, gates: torch.Tensor | None, depth: int) -> torch.Tensor:
    """``out`` ``[batch, seq, heads, head_dim]`` with each head's context times its gate of layer ``depth``:
    ``gates`` ``[layers, heads]`` (every row) or ``[batch, layers, heads]`` (a gate per row); None: ``out``."""
    if gates is None:
        return out
    gate = gates[depth][None] if gates.dim() == 2 else gates[:, depth]  # [1 or batch, heads]
    return out * gate[:, None, :, None].to(out.dtype)
