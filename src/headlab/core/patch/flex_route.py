"""The fused route for layers with ``drop_*`` heads: one FlexAttention call over all of a layer's heads.

headlab's SDPA route serves such a layer with two or more SDPA calls (its keep / prune / uniform heads, then
each ``drop_*`` group over doubled keys with a materialised ``[batch, 1, seq, 2 seq]`` mask). Here the layer
is one compiled ``flex_attention`` call: ``mask_mod`` reads the key validity and the unit ids (``[batch, seq]``
each) and the head's policy code inside the kernel, so no seq x seq mask exists, and the block mask (built
once per forward for each head pattern, shared by the layers with that pattern) lets keep heads skip the
blocks they never see.

==========================  ======================================================================
prune / uniform             the head's values / query zeroed by the caller, as on the SDPA route
drop_*, renormalize=False   keys ``[K; K]``, values ``[V; 0]``: keep heads see the valid keys of the first
                            copy; a drop head sees its allowed keys in the first copy and its other valid
                            keys in the second (the softmax normaliser only), so its weights are the
                            full-row weights restricted to the allowed keys (0 for a query with none)
drop_*, renormalize=True    keys ``K``; a drop head sees its allowed keys only; a query with none is a
                            fully masked row, which FlexAttention outputs as 0
==========================  ======================================================================

Opt-in (``set_attention_route(model, "flex")``; ``attention_route=flex`` on the command line) and meant for
GPUs, where one kernel per layer replaces several launches. ``applies`` says when the SDPA route serves a layer
instead: dropout (FlexAttention has none), a caller's additive mask, or, on CPU, inputs that need gradients (no
CPU backward), float64 (no CPU kernel) or a compiled model (inductor's CPU lowering fails on the block mask).
The first forwards compile the kernel (``torch.compile``; a second sequence length recompiles it once with
dynamic shapes; on CPU, once per shape).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F

from headlab.core.patch.sdpa_masks import checked_unit_ids

_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the compiled CPU kernel's; float64 takes SDPA
_CODES = {"drop_intra": 1, "drop_inter": 2}  # 0: keep, prune or uniform (the caller zeroes values / queries)


@dataclass(frozen=True)
class FusedHeads:
    """A layer's policies over all its heads, for the fused route."""

    codes: torch.Tensor  # [heads] int8: 0 keep / prune / uniform, 1 drop_intra, 2 drop_inter
    pattern: tuple[int, ...]  # the same codes on the host: the block mask is cached per pattern
    prune: torch.Tensor | None  # [1, heads, 1, 1] bool (None: no pruned head)
    uniform: torch.Tensor | None  # [1, heads, 1, 1] bool (None: no uniform head)

    @classmethod
    def build(cls, groups: dict[str, list[int]], num_heads: int, device: torch.device) -> FusedHeads:
        """From a layer's ``{policy: heads}`` (``HeadPlan.layer_groups``)."""
        policy = {h: p for p, heads in groups.items() for h in heads}
        pattern = tuple(_CODES.get(policy.get(h, "keep"), 0) for h in range(num_heads))

        def marks(name: str) -> torch.Tensor | None:
            chosen = [policy.get(h) == name for h in range(num_heads)]
            return torch.tensor(chosen, device=device).view(1, -1, 1, 1) if any(chosen) else None

        codes = torch.tensor(pattern, dtype=torch.int8, device=device)
        return cls(codes, pattern, marks("prune"), marks("uniform"))


def applies(query, key, value, attention_mask, dropout: float) -> bool:
    """Whether the fused route can serve this call (static facts only: no data is read)."""
    if dropout > 0.0:
        return False
    if attention_mask is not None and (attention_mask.dtype != torch.bool or attention_mask.shape[2] != 1):
        return False  # a caller's additive or per-query mask
    if query.device.type != "cpu":
        return True
    if torch.compiler.is_compiling():  # inductor's CPU lowering of a traced block mask fails (torch 2.13)
        return False
    needs_grad = query.requires_grad or key.requires_grad or value.requires_grad
    return query.dtype in _CPU_DTYPES and not needs_grad


def fused_attention(heads: FusedHeads, renormalize: bool, forward_cache: dict, query, key, value, attention_mask,
                    sentence_ids, scaling) -> torch.Tensor:
    """query/key/value ``[batch, heads, seq, head_dim]`` (pruned values and uniform queries already zeroed);
    ``attention_mask``: None or headlab's boolean padding mask ``[batch, 1, 1, seq]``.

    Returns ``[batch, seq, heads, head_dim]``. ``forward_cache`` lives for one forward: it keeps the block masks.
    """
    batch, num_heads, seq, _ = query.shape
    name = ("flex block mask", heads.pattern, renormalize)
    if name not in forward_cache:
        valid = (torch.ones(batch, seq, dtype=torch.bool, device=query.device) if attention_mask is None
                 else attention_mask[:, 0, 0, :])  # [batch, seq]
        units = checked_unit_ids(sentence_ids, query)  # [batch, seq]
        forward_cache[name] = _block_mask(heads.codes, valid, units, batch, num_heads, seq, renormalize)
    if not renormalize:
        key, value = torch.cat([key, key], dim=2), F.pad(value, (0, 0, 0, seq))  # [K; K], [V; 0]
    flex_attention = _kernels(query.device)[0]
    out = flex_attention(query, key, value, block_mask=forward_cache[name], scale=scaling)
    return out.transpose(1, 2).contiguous()


def _block_mask(codes, valid, units, batch: int, num_heads: int, seq: int, renormalize: bool):
    """The layer's mask as a FlexAttention block mask; ``codes`` ``[heads]``, ``valid`` / ``units`` ``[batch, seq]``."""

    def allowed(b, h, q, kv):  # a drop head's allowed keys: another unit's (drop_intra) or its own (drop_inter)
        same = units[b, q] == units[b, kv]
        return torch.where(codes[h] == _CODES["drop_intra"], ~same, same)

    if renormalize:
        def mask_mod(b, h, q, kv):
            return valid[b, kv] & ((codes[h] == 0) | allowed(b, h, q, kv))
        keys = seq
    else:
        def mask_mod(b, h, q, kv):  # kv < seq: the first copy of the keys; kv >= seq: the second
            first = kv < seq
            kv = torch.where(first, kv, kv - seq)
            return valid[b, kv] & torch.where(codes[h] == 0, first, first == allowed(b, h, q, kv))
        keys = 2 * seq
    create_block_mask = _kernels(valid.device)[1]
    return create_block_mask(mask_mod, batch, num_heads, seq, keys, device=valid.device)


@cache
def _compiled(static: bool):
    """(flex_attention, create_block_mask), each compiled once per process.

    ``static``: one compilation per shape. CPUs need it: torch 2.13's CPU FlexAttention template fails to compile
    with dynamic shapes (a C++ error); elsewhere a second shape recompiles once with dynamic shapes.
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    dynamic = False if static else None
    return torch.compile(flex_attention, dynamic=dynamic), torch.compile(create_block_mask, dynamic=dynamic)


def _kernels(device: torch.device) -> tuple:
    """(flex_attention, create_block_mask) compiled; inside a compiled model, the plain functions (its compiler
    lowers them)."""
    if torch.compiler.is_compiling():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        return flex_attention, create_block_mask
    return _compiled(device.type == "cpu")
