"""The masks SDPA gets under a plan: padding, and the unit masks of ``drop_*`` (DESIGN.md section 3).

Unit masks are ``[batch, 1, seq, keys]`` over the same (query, key) pairs for every layer and head (``[batch, heads,
seq, keys]`` for a layer in one SDPA call, the same for every layer with the same heads' policies), so a forward builds
each once (``ForwardMasks`` keeps them), as SDPA's additive mask (``unit_bias``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers.masking_utils import bidirectional_mask_function, prepare_padding_mask, sdpa_mask

from headlab.core.units import SHARED


def unit_mask(policy: str, renormalize: bool, valid, bias, relation) -> tuple:
    """(SDPA mask, ``has_key`` ``[batch, 1, seq, 1]`` or None) of a ``drop_*`` policy; the same for every layer.

    renormalize: the allowed keys (a query with none attends anywhere; ``has_key`` zeroes it afterwards).
    Otherwise ``[allowed | other valid keys]`` ``[batch, 1, seq, 2 seq]`` for the doubled keys.
    """
    allowed = ~dropped_keys(policy, relation)
    keep = allowed & valid
    if renormalize:
        has_key = keep.any(-1, keepdim=True)
        return with_bias(keep | ~has_key, bias), has_key
    rest = valid & ~allowed  # valid keys a query may not use: they count in the softmax normaliser only
    return torch.cat([with_bias(keep, bias), with_bias(rest, bias)], dim=-1), None  # [batch, 1, seq, 2 seq]


def dropped_keys(policy: str, relation) -> torch.Tensor:
    """``[batch, 1, seq, seq]``: the keys ``policy`` takes from each query (its own unit's for ``drop_intra``, the
    other units' for ``drop_inter``; never a special token's, nor a special token's own: ``unit_relation``)."""
    return relation.intra if policy == "drop_intra" else relation.inter


def heads_dropped_keys(intra, inter, relation) -> torch.Tensor:
    """``[batch, heads, seq, seq]``: per head the keys its policy takes from each query (``dropped_keys``), none for
    the heads of neither policy; ``intra`` / ``inter``: ``[1, heads, 1, 1]`` marks of each policy's heads or None."""
    parts = [marks & dropped_keys(policy, relation) for policy, marks in (("drop_intra", intra), ("drop_inter", inter))
             if marks is not None]
    return parts[0] if len(parts) == 1 else parts[0] | parts[1]


def unit_bias(dropped, renormalize: bool, valid, dtype: torch.dtype) -> tuple:
    """``unit_mask`` for a boolean padding mask (``valid``; None: every key valid), as SDPA's additive mask in
    ``dtype`` (``additive``), and ``has_key`` as a 1.0 / 0.0 factor in ``dtype`` (or None), made with the fewest ops: a
    forward on a GPU is launch-bound, and these run in every forward with ``drop_*`` heads. ``dropped``: the keys each
    head's policy takes away, ``[batch, 1 or heads, seq, seq]`` (``dropped_keys``, ``heads_dropped_keys``): a head
    with none dropped gets the padding mask, and without renormalising its second half of the keys hidden."""
    invalid = None if valid is None else ~valid  # padded keys
    keys = dropped.shape[-1]
    if renormalize:
        hidden = dropped if invalid is None else dropped | invalid
        has_key = ~hidden.all(-1, keepdim=True)  # [batch, heads, seq, 1]; a query with none attends anywhere (zeroed)
        mask = _aligned_zeros(dropped.shape, dtype, dropped.device)
        return mask.masked_fill_(hidden & has_key, float("-inf")), has_key.to(dtype)
    mask = _aligned_zeros((*dropped.shape[:-1], 2 * keys), dtype, dropped.device)  # [allowed | other valid keys]
    # the second copy of the keys shows the dropped valid ones, which count in the normaliser only: it hides
    # ~dropped | invalid, which for booleans is dropped <= invalid (one op)
    hidden = (dropped, ~dropped) if invalid is None else (dropped | invalid, dropped <= invalid)
    mask[..., :keys].masked_fill_(hidden[0], float("-inf"))
    mask[..., keys:].masked_fill_(hidden[1], float("-inf"))
    return mask, None


def unit_hides(policy: str, renormalize: bool, key_mask, sentence_ids, query) -> tuple:
    """(the keys each query of ``policy`` may not use, as one or two boolean masks ``[batch, 1, seq, seq]``,
    ``has_key`` in the query's dtype or None): ``unit_mask``'s masks as where to fill a bias (its first and second
    halves without renormalising), for a bias that differs per layer; ``key_mask``: the keys each query sees."""
    allowed = ~dropped_keys(policy, unit_relation(sentence_ids, query))
    keep = allowed & key_mask
    if renormalize:
        has_key = keep.any(-1, keepdim=True)
        return (~(keep | ~has_key),), has_key.to(query.dtype)
    return (~keep, ~(key_mask & ~allowed)), None


def validity(attention_mask, query) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(boolean key validity, additive float bias or None); validity broadcasts to ``[batch, 1, seq, seq]``."""
    if attention_mask is None:
        return torch.ones(1, 1, 1, query.shape[2], dtype=torch.bool, device=query.device), None
    if attention_mask.dtype == torch.bool:
        return attention_mask, None
    return attention_mask > torch.finfo(attention_mask.dtype).min / 2, attention_mask


def with_bias(keep: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """SDPA's ``attn_mask``: ``keep`` itself, or the bias with -inf where ``keep`` is False."""
    return keep if bias is None else bias.masked_fill(~keep, float("-inf"))


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean SDPA mask as an additive bias in ``dtype`` (0 where True, -inf where False), SDPA's own conversion,
    made once per forward instead of in every call; its rows start at multiples of 16 elements in memory (a view of
    wider storage), so the memory-efficient CUDA kernel takes it without padding a copy in every call. A float mask
    is returned as it is."""
    if mask.dtype != torch.bool:
        return mask
    return _aligned_zeros(mask.shape, dtype, mask.device).masked_fill_(~mask, float("-inf"))


def _aligned_zeros(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """Zeros of ``shape`` whose rows (last dimension) start at multiples of 16 elements (``additive``)."""
    *outer, keys = shape
    return torch.zeros(*outer, -(-keys // 16) * 16, dtype=dtype, device=device)[..., :keys]


def heads_of(x: torch.Tensor, heads: slice | torch.Tensor) -> torch.Tensor:
    """``x``'s rows of ``heads`` on dimension 1 (``[batch, heads, ...]``): a view for a slice."""
    return x[:, heads] if isinstance(heads, slice) else x.index_select(1, heads)


def mask_heads(mask: torch.Tensor | None, heads: slice | torch.Tensor) -> torch.Tensor | None:
    """A mask's rows of ``heads`` where it has one per head (DeBERTa's bias ``[batch, heads, seq, seq]``)."""
    return heads_of(mask, heads) if mask is not None and mask.dim() == 4 and mask.shape[1] > 1 else mask


class UnitPairs(NamedTuple):
    """Which (query, key) pairs each ``drop_*`` policy takes: ``[batch, 1, seq, seq]`` booleans."""

    intra: torch.Tensor  # of one unit, neither a special token
    inter: torch.Tensor  # of two units, neither a special token


def unit_relation(sentence_ids, query) -> UnitPairs:
    """The pairs of one unit and of two, leaving out every pair with a special token (id ``SHARED``: in every unit,
    so neither policy takes its pairs). Booleans: an int8 relation made Inductor emit C++ that does not compile."""
    sentence_ids = checked_unit_ids(sentence_ids, query)
    same = (sentence_ids[:, :, None] == sentence_ids[:, None, :]).unsqueeze(1)  # [batch, 1, seq, seq]
    text = sentence_ids != SHARED  # [batch, seq]
    both = (text[:, :, None] & text[:, None, :]).unsqueeze(1)
    return UnitPairs(same & both, both & ~same)


def checked_unit_ids(sentence_ids, query) -> torch.Tensor:
    """The forward's ``sentence_ids`` ``[batch, seq]`` on the query's device; ``ValueError`` if missing or misshapen."""
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
    return sentence_ids.to(query.device)


def padding_mask_function(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                          attention_mask=None, **kwargs):
    """transformers' SDPA mask without the host read: the bidirectional padding mask ``[batch, 1, 1, kv_length]``.

    ``sdpa_mask`` decides whether it may skip the mask by reading it (``padding_mask.all()``), a host-device
    synchronisation on GPUs; here a mask on a GPU is always given, and one on the CPU is skipped as there when
    nothing is padded (reading it is no synchronisation). It is not expanded over the queries (``sdpa_mask``
    expands it to ``[batch, 1, q_length, kv_length]``): SDPA broadcasts it, and the additive mask SDPA makes of a
    boolean one in every call is then ``seq`` times smaller (the same result, bit for bit). Without an
    ``attention_mask`` there is no mask (None). Other mask kinds go to ``sdpa_mask``, materialised.
    """
    if mask_function is bidirectional_mask_function:
        if attention_mask is None:
            return None  # no padding, so no mask (what sdpa_mask's skip gives here, without reading data)
        if attention_mask.dim() == 2:
            padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)  # [batch, kv_length] bool
            if padding.device.type == "cpu" and not torch.compiler.is_compiling() and bool(padding.all()):
                return None  # no padding: as sdpa_mask skips it (reading a CPU tensor is no synchronisation)
            return padding[:, None, None, :]  # [batch, 1, 1, kv_length]
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, **kwargs)
