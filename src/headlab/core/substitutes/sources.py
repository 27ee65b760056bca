"""What ``resample`` heads take: each head's context vector on another input (Chan et al. 2022, causal scrubbing).

``resample_sources(model, sources, length, means)`` runs the unablated model once on a batch of source examples (row
``b`` is the source of the evaluated batch's row ``b``) and returns every head's context vectors aligned by position,
``[layers, batch, length, heads, head_dim]``: position ``p`` of row ``b`` takes the source's context at ``p``, or the
head's mean (``headlab.head_means``) where the source has no token at ``p`` (it is shorter). The forward under the plan
takes it as ``head_sources=``. ``derangement`` draws which example is whose source when they come from one set.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from transformers import PreTrainedModel

from headlab.core.substitutes.contexts import head_contexts
from headlab.core.substitutes.means import HeadMeans
from headlab.errors import UserError


def resample_sources(model: PreTrainedModel, sources: Mapping[str, torch.Tensor], length: int,
                     means: HeadMeans) -> torch.Tensor:
    """``[layers, batch, length, heads, head_dim]``: row ``b``'s source's context vectors by position, the mean where
    the source has no token (module docstring). ``sources``: the source examples' model inputs, one row per row of
    the evaluated batch; ``length``: the evaluated batch's sequence length."""
    if not isinstance(means, HeadMeans):
        raise UserError(f"resample_sources needs the heads' means (headlab.head_means), got {type(means).__name__}")
    contexts = head_contexts(model, sources)  # [layers, batch, source seq, heads, head_dim]
    present = sources["attention_mask"].bool().to(contexts.device)  # [batch, source seq]
    shared = min(length, contexts.shape[2])
    fill = torch.as_tensor(means.values, device=contexts.device).to(contexts.dtype)
    if means.over == "positions":  # [layers, positions, heads, head_dim]
        if fill.shape[1] < length:
            raise ValueError(f"inputs of {length} positions, but the means were taken per position over at most "
                             f"{fill.shape[1]}")
        fill = fill[:, None, :length]  # [layers, 1, length, heads, head_dim]
    else:  # [layers, heads, head_dim]
        fill = fill[:, None, None]  # [layers, 1, 1, heads, head_dim]
    aligned = fill.expand(contexts.shape[0], contexts.shape[1], length, *contexts.shape[3:]).clone()
    kept = present[None, :, :shared, None, None]  # [1, batch, shared, 1, 1]
    aligned[:, :, :shared] = torch.where(kept, contexts[:, :, :shared], aligned[:, :, :shared])
    return aligned


def derangement(size: int, generator: np.random.Generator) -> np.ndarray:
    """A uniformly drawn permutation of ``range(size)`` with no fixed point (no example is its own source)."""
    if size < 2:
        raise UserError(f"resample needs at least 2 reference examples (each takes another's heads); got {size}")
    while True:  # rejection: a uniform permutation is a derangement with probability about 1/e
        order = generator.permutation(size)
        if (order != np.arange(size)).all():
            return order
