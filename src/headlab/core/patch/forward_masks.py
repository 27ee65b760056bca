"""The masks the layers of one forward share under a plan, built by the first layer that needs them.

SDPA's masks as additive biases in the model's dtype (SDPA converts a boolean mask in every call), the unit masks of
``drop_*`` (``sdpa_masks.unit_mask``) and the zero values of the doubled keys: on a GPU a forward is launch-bound, and
each of these is one op fewer per layer (BENCHMARKS.md).
"""

from __future__ import annotations

import torch

from headlab.core.patch.sdpa_masks import additive, unit_inputs, unit_mask

_KEPT = 4  # (mask, unit ids) pairs whose masks are kept


class ForwardMasks:
    """Masks keyed by the identity of the forward's mask and unit-id tensors (``cache``); ``clear`` at a block's end."""

    def __init__(self):
        self.kept: list[tuple] = []  # [(tensors, values, {name: mask})], newest first

    def clear(self) -> None:
        self.kept = []

    def cache(self, attention_mask, sentence_ids, query) -> dict:
        """A dict of masks built from these inputs by the first layer that needs them, reused by the rest.

        Keyed by the identity of the mask and unit-id tensors (and their in-place edit counters), never by value:
        every layer of a forward gets the same objects. The latest few pairs are kept, so layers that alternate
        between masks (ModernBERT's local and global layers) find theirs. Under ``torch.compile`` nothing is kept:
        each layer builds its own and the compiler fuses.
        """
        if torch.compiler.is_compiling():
            return {}
        tensors = (attention_mask, sentence_ids)  # compared by identity, never by value
        values = (query.device, *(edit_count(t) for t in tensors))  # in-place edits
        for entry in self.kept:
            if all(a is b for a, b in zip(entry[0], tensors)) and entry[1] == values:
                return entry[2]
        entry = (tensors, values, {})  # holds the tensors: their ids stay theirs while kept
        self.kept = [entry, *self.kept[: _KEPT - 1]]
        return entry[2]

    def drop_mask(self, policy: str, renormalize: bool, attention_mask, sentence_ids, query) -> tuple:
        """``unit_mask`` of ``policy`` for this forward, additive in the query's dtype (``additive``), and
        ``has_key`` as 1.0 / 0.0 in that dtype (a factor: one op zeroes the queries without an allowed key)."""
        cache = self.cache(attention_mask, sentence_ids, query)
        if "unit inputs" not in cache:
            cache["unit inputs"] = unit_inputs(attention_mask, sentence_ids, query)
        key = (policy, renormalize, query.dtype)
        if key not in cache:
            mask, has_key = unit_mask(policy, renormalize, *cache["unit inputs"])
            cache[key] = additive(mask, query.dtype), None if has_key is None else has_key.to(query.dtype)
        return cache[key]

    def padding_bias(self, attention_mask, sentence_ids, query):
        """A boolean padding mask as this forward's additive bias (``additive``); any other mask as it is."""
        if attention_mask is None or attention_mask.dtype != torch.bool:
            return attention_mask
        cache = self.cache(attention_mask, sentence_ids, query)
        key = ("padding", query.dtype)
        if key not in cache:
            cache[key] = additive(attention_mask, query.dtype)
        return cache[key]

    def zeros(self, like: torch.Tensor, attention_mask, sentence_ids) -> torch.Tensor:
        """Zeros shaped as ``like`` (the doubled keys' second values), made once per forward and shape."""
        cache = self.cache(attention_mask, sentence_ids, like)
        key = ("zeros", like.shape, like.dtype)
        if key not in cache:
            cache[key] = torch.zeros_like(like)
        return cache[key]


def edit_count(tensor: torch.Tensor | None) -> int | None:
    """The tensor's in-place edit counter; inference tensors have none (they are matched by identity only)."""
    return None if tensor is None or tensor.is_inference() else tensor._version
