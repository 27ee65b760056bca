"""Every head's mean context vector over a reference set: what mean ablation puts in a head's place.

A head's context vector is its output before the output projection (where ``prune`` puts zeros): ``[head_dim]`` per
token. ``head_means(model, batches)`` runs the unablated model over the batches once and averages, in float64,

* ``over="tokens"``: over every non-padding token of every example: ``[layers, heads, head_dim]``;
* ``over="positions"``: per position, over the examples long enough to have it (for inputs of a fixed template):
  ``[layers, positions, heads, head_dim]``, with the number of examples at each position.

Special tokens count as tokens: a head's mean is over what it outputs at every position the model attends from.

``save_means`` / ``load_means``: the means as one ``.npz`` with the identity they were computed for (the model's
weights, the reference set, the settings: a dict the caller builds); a file of another identity, or one that cannot
be read whole, loads as None: the caller computes the means again (a cache never answers for other inputs).
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from headlab.core.model_parts import head_width
from headlab.core.plans import MEAN_OVER
from headlab.core.substitutes.contexts import head_contexts
from headlab.errors import UserError
from headlab.files import atomic_file


@dataclass(frozen=True)
class HeadMeans:
    """Mean context vectors (module docstring); ``counts``: tokens averaged, in all (``tokens``) or per position."""

    over: str
    values: np.ndarray  # float64, [layers, heads, head_dim] or [layers, positions, heads, head_dim]
    counts: np.ndarray  # int64, [] or [positions]

    @property
    def positions(self) -> int | None:
        """How many positions the means cover (None: one mean for every position)."""
        return None if self.over == "tokens" else self.values.shape[1]


def head_means(model: PreTrainedModel, batches: Iterable[Mapping[str, torch.Tensor]],
               over: str = "tokens") -> HeadMeans:
    """The unablated model's mean context vector of every head over ``batches`` (module docstring)."""
    if over not in MEAN_OVER:
        raise UserError(f"mean_over={over!r} is not one of {', '.join(MEAN_OVER)}")
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    width = head_width(model)
    sums = np.zeros((layers, 0 if over == "positions" else 1, heads, width))  # positions grow as batches come
    counts = np.zeros(0 if over == "positions" else 1, dtype=np.int64)
    for batch in batches:
        valid = batch["attention_mask"].bool()  # [batch, seq]
        contexts = head_contexts(model, batch)  # [layers, batch, seq, heads, head_dim]
        length = valid.shape[1]
        if over == "positions" and length > sums.shape[1]:
            sums = np.pad(sums, ((0, 0), (0, length - sums.shape[1]), (0, 0), (0, 0)))
            counts = np.pad(counts, (0, length - len(counts)))
        kept = contexts.double().masked_fill(~valid.to(contexts.device)[None, :, :, None, None], 0.0)
        summed = kept.sum(1) if over == "positions" else kept.sum((1, 2))[:, None]  # [layers, seq or 1, heads, dim]
        sums[:, : summed.shape[1]] += summed.cpu().numpy()
        counts[: (length if over == "positions" else 1)] += (
            valid.sum(0) if over == "positions" else valid.sum()[None]).cpu().numpy()
    if not counts.any():
        raise UserError("the reference set has no tokens: mean ablation needs at least one non-padding token")
    if over == "tokens":
        return HeadMeans(over, sums[:, 0] / counts[0], counts[0])
    reached = int(np.flatnonzero(counts)[-1]) + 1  # padding past every example's end is no position
    if not counts[:reached].all():
        raise UserError("mean_over=positions needs inputs padded on the right (a position is the same index in every "
                        "example); this reference set has positions no example reaches before later ones")
    return HeadMeans(over, sums[:, :reached] / counts[None, :reached, None, None], counts[:reached])


def save_means(means: HeadMeans, path: str | Path, identity: dict[str, Any]) -> Path:
    """Write ``means`` and the ``identity`` they belong to (JSON-serialisable) to ``path`` atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, values=means.values, counts=means.counts, over=np.array(means.over),
             identity=np.array(json.dumps(identity, sort_keys=True)))
    with atomic_file(path, "wb") as handle:
        handle.write(buffer.getvalue())
    return Path(path)


def load_means(path: str | Path, identity: dict[str, Any]) -> HeadMeans | None:
    """The means saved at ``path`` for ``identity``; None when there are none, they are another identity's, or the
    file cannot be read whole."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if json.loads(str(data["identity"])) != json.loads(json.dumps(identity, sort_keys=True)):
                return None
            over = str(data["over"])
            values, counts = data["values"], data["counts"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if over not in MEAN_OVER or values.dtype != np.float64 or not np.isfinite(values).all():
        return None
    return HeadMeans(over, values, counts)
