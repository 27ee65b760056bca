"""The masks SDPA gets under a plan: padding, and the unit masks of ``drop_*`` (DESIGN.md section 3).

Unit masks are ``[batch, 1, seq, keys]`` over the same (query, key) pairs for every layer and head, so a
forward builds each once (``Controller`` in ``attention.py`` keeps them). They are additive (0 / -inf) in
the query's dtype: SDPA would convert a boolean mask again in every call.
"""

from __future__ import annotations

import torch
from transformers.masking_utils import bidirectional_mask_function, prepare_padding_mask, sdpa_mask


def unit_inputs(attention_mask, sentence_ids, query) -> tuple:
    """(key validity, additive bias or None, same unit ``[batch, 1, seq, seq]``): what every unit mask starts from."""
    return (*validity(attention_mask, query), same_unit(sentence_ids, query))


def unit_mask(policy: str, renormalize: bool, valid, bias, same, dtype: torch.dtype, buffers=None) -> tuple:
    """(SDPA mask in ``dtype``, ``has_key`` ``[batch, 1, seq, 1]`` or None) of a ``drop_*`` policy; the same for
    every layer. ``buffers``: as ``additive_mask`` takes them.

    renormalize: the allowed keys (a query with none attends anywhere; ``has_key`` zeroes it afterwards).
    Otherwise ``[allowed | other valid keys]`` ``[batch, 1, seq, 2 seq]`` for the doubled keys.
    """
    allowed = ~same if policy == "drop_intra" else same
    keep = allowed & valid
    if renormalize:
        has_key = keep.any(-1, keepdim=True)
        return _for_sdpa(keep | ~has_key, bias, dtype, buffers), has_key
    rest = valid & ~allowed  # valid keys a query may not use: they count in the softmax normaliser only
    both = torch.cat([keep, rest], dim=-1)  # [batch, 1, seq, 2 seq]
    return _for_sdpa(both, None if bias is None else torch.cat([bias, bias], dim=-1), dtype, buffers), None


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


def _for_sdpa(keep: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, buffers: dict | None) -> torch.Tensor:
    """``with_bias`` in the form SDPA takes fastest: additive in ``dtype`` when there is no bias."""
    return additive_mask(keep, dtype, buffers) if bias is None else with_bias(keep, bias)


def additive_mask(keep: torch.Tensor, dtype: torch.dtype, buffers: dict | None = None) -> torch.Tensor:
    """The boolean SDPA mask ``keep`` as the additive one SDPA would make of it (0 where True, -inf where False).

    SDPA converts a boolean mask in every call, and on CPU its conversion (``where``) costs more than the
    attention of a small head; a forward converts once and every layer reuses the result. ``1 / keep - 1``,
    negated, gives exactly 0 and -inf. Dimensions broadcast by stride 0 stay broadcast (no full-size copy).
    ``buffers``: ``{(shape, dtype): tensor}``, memory to write the result into (one entry kept; under
    ``torch.compile`` none is used).
    """
    broadcast = [dim for dim in range(keep.dim()) if keep.stride(dim) == 0 and keep.shape[dim] > 1]
    compact = keep
    for dim in broadcast:
        compact = compact.narrow(dim, 0, 1)
    ones = compact.view(torch.uint8)  # 1 / 0 (as uint8: several times faster to convert than bool on CPU)
    if buffers is None or torch.compiler.is_compiling():
        ones = ones.to(dtype)
    else:
        key = (tuple(ones.shape), dtype, ones.device)
        if key not in buffers:
            buffers.clear()
            with torch.inference_mode(False):  # usable outside inference mode too
                buffers[key] = torch.empty(ones.shape, dtype=dtype, device=ones.device)
        ones = buffers[key].copy_(ones)
    return ones.reciprocal_().neg_().add_(1.0).expand(keep.shape)


def same_unit(sentence_ids, query) -> torch.Tensor:
    """``[batch, 1, seq, seq]``: True where query and key tokens belong to the same unit."""
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
    sentence_ids = sentence_ids.to(query.device)
    return (sentence_ids[:, :, None] == sentence_ids[:, None, :]).unsqueeze(1)


def padding_mask_function(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                          attention_mask=None, **kwargs):
    """transformers' SDPA mask without the host read: the plain bidirectional padding mask as a broadcast view.

    ``sdpa_mask`` decides whether it may skip the mask by reading it (``padding_mask.all()``), a host-device
    synchronisation on GPUs; here the mask is always given. Other mask kinds go to ``sdpa_mask``, materialised.
    """
    if mask_function is bidirectional_mask_function and attention_mask is not None and attention_mask.dim() == 2:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)  # [batch, kv_length] bool
        return padding[:, None, None, :].expand(batch_size, 1, q_length, kv_length)
    kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask, **kwargs)
