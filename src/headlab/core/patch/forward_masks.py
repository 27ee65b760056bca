"""The masks the layers of one forward share under a plan, built by the first layer that needs them.

SDPA's masks as additive biases in the model's dtype (SDPA converts a boolean mask in every call), the unit masks of
``drop_*`` (``sdpa_masks.unit_mask``) and the zero values of the doubled keys: on a GPU a forward is launch-bound, and
each of these is one op fewer per layer (BENCHMARKS.md).
"""

from __future__ import annotations

import torch

from headlab.core.patch.sdpa_masks import (
    UnitPairs,
    additive,
    dropped_keys,
    heads_dropped_keys,
    unit_bias,
    unit_hides,
    unit_mask,
    unit_relation,
    validity,
)

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
        between masks (ModernBERT's local and global layers) find theirs. Each forward of the base model starts
        empty (``attention._new_forward``): an edit no counter sees (an inference tensor, a numpy buffer under
        ``torch.from_numpy``) cannot leave the previous forward's masks in place. Under ``torch.compile`` nothing is
        kept: each layer builds its own and the compiler fuses.
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

    def drop_mask(self, policy: str, renormalize: bool, attention_mask, sentence_ids, query, key_mask=None) -> tuple:
        """``unit_mask`` of ``policy`` for this forward, additive in the query's dtype (``additive``), and
        ``has_key`` as 1.0 / 0.0 in that dtype (a factor: one op zeroes the queries without an allowed key).

        ``key_mask``: where ``attention_mask`` is a bias that differs per layer (DeBERTa's ``[batch, heads, seq,
        seq]``), the mask of the keys each query sees, which does not: the keys a policy hides are then found once
        per forward and each layer fills its bias there (``-inf``), as ``unit_mask`` would from that bias.
        """
        if key_mask is not None:
            cache = self.cache(key_mask, sentence_ids, query)
            key = ("hides", policy, renormalize, query.dtype)
            if key not in cache:
                cache[key] = unit_hides(policy, renormalize, key_mask.bool(), sentence_ids, query)
            hides, has_key = cache[key]
            filled = [attention_mask.masked_fill(hide, float("-inf")) for hide in hides]
            return (filled[0] if len(filled) == 1 else torch.cat(filled, dim=-1)), has_key
        cache = self.cache(attention_mask, sentence_ids, query)
        key = (policy, renormalize, query.dtype)
        if key not in cache:
            relation = self._unit_relation(cache, sentence_ids, query)
            if attention_mask is None or attention_mask.dtype == torch.bool:
                cache[key] = unit_bias(dropped_keys(policy, relation), renormalize, attention_mask, query.dtype)
            else:  # a caller's additive bias: -inf filled into it
                mask, has_key = unit_mask(policy, renormalize, *validity(attention_mask, query), relation)
                cache[key] = mask, None if has_key is None else has_key.to(query.dtype)
        return cache[key]

    @staticmethod
    def _unit_relation(cache: dict, sentence_ids, query) -> UnitPairs:
        """``sdpa_masks.unit_relation`` of this forward, made once."""
        if "unit relation" not in cache:
            cache["unit relation"] = unit_relation(sentence_ids, query)
        return cache["unit relation"]

    def joint_mask(self, joint, renormalize: bool, attention_mask, sentence_ids, query, key_mask=None) -> tuple:
        """(mask, ``has_key`` ``[batch, heads, seq, 1]`` factor or None) of a layer in one SDPA call
        (``layer_states.JointCall`` ``joint``): per head the padding mask or its policy's unit mask (``unit_mask``:
        ``[batch, heads, seq, keys]`` renormalised, else over doubled keys ``[batch, heads, seq, 2 keys]``, where the
        other heads' second half is hidden).

        ``attention_mask`` boolean or None: the mask is made once per forward (additive, ``unit_bias``). A per-layer
        bias with the ``key_mask`` it came from (DeBERTa, ``drop_mask``): where each head's policy hides keys is found
        once per forward, and the layer's bias is filled there (``-inf``).
        """
        per_layer = key_mask is not None
        cache = self.cache(key_mask if per_layer else attention_mask, sentence_ids, query)
        key = ("joint", joint.kinds, renormalize, query.dtype)
        if key not in cache:
            if per_layer:
                cache[key] = self._joint_hides(joint.kinds, renormalize, key_mask, sentence_ids, query)
            else:
                dropped = heads_dropped_keys(joint.intra, joint.inter, self._unit_relation(cache, sentence_ids, query))
                cache[key] = unit_bias(dropped, renormalize, attention_mask, query.dtype)
        masks, has_keys = cache[key]
        if not per_layer:
            return masks, has_keys
        filled = [attention_mask.masked_fill(hide, float("-inf")) for hide in masks]
        return (filled[0] if len(filled) == 1 else torch.cat(filled, dim=-1)), has_keys

    @staticmethod
    def _joint_hides(kinds, renormalize, key_mask, sentence_ids, query) -> tuple:
        """DeBERTa's ``joint_mask`` per forward: where each head's bias is filled (one mask per half of the keys,
        ``[batch, heads, seq, keys]``), and ``has_key``."""
        valid = key_mask.bool()
        choices = {"padding": ((torch.zeros_like(valid),) + (() if renormalize else (torch.ones_like(valid),)), None)}
        for policy in set(kinds) - {"padding"}:  # the bias hides what DeBERTa's mask does; no second half
            choices[policy] = unit_hides(policy, renormalize, valid, sentence_ids, query)
        shape = (query.shape[0], 1, query.shape[2], query.shape[2])  # [batch, 1, seq, keys]: self-attention
        # per head its kind's masks: concatenations of views (an index tensor would be a host-device copy)
        hides = [torch.cat([choices[kind][0][half].expand(*shape[:-1], -1) for kind in kinds], dim=1)
                 for half in range(len(choices["padding"][0]))]  # each [batch, heads, seq, keys]
        has_keys = None
        if renormalize:
            ones = torch.ones(*shape[:-1], 1, dtype=query.dtype, device=query.device)
            has_keys = torch.cat([ones if choices[kind][1] is None else choices[kind][1] for kind in kinds],
                                 dim=1)  # [batch, heads, seq, 1]
        return hides, has_keys

    def visible_bias(self, key_mask, sentence_ids, query) -> torch.Tensor:
        """DeBERTa's mask of the keys each query sees as an additive bias (``additive``), once per forward: what its
        uniform heads take in place of their bias (1/n over those keys)."""
        cache = self.cache(key_mask, sentence_ids, query)
        key = ("visible", query.dtype)
        if key not in cache:
            cache[key] = additive(key_mask.bool(), query.dtype)
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
