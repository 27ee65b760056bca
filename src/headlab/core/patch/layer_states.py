"""What a plan means for one layer, built once per (model, plan, renormalize) and cached by the controller
(``attention``): which heads share one SDPA call, which are pruned or uniform, the ``drop_*`` groups, and the heads
whose context vector is substituted afterwards (``mean``, ``resample``: computed as pruned heads, then replaced)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from headlab.core.plans import SUBSTITUTED, HeadPlan


@dataclass(frozen=True)
class LayerState:
    """One layer under a plan.

    ``shared``: the keep / prune / uniform heads (a slice or an index tensor; None if there are none),
    with ``[1, heads in shared, 1, 1]`` masks of its pruned and uniform heads (None if none).
    ``skipped``: pruned heads left out of ``shared`` (their context is 0 without attention), when the other
    shared heads then form one slice (so no gather of query, key and value); None otherwise.
    ``drops``: ``(policy, heads)`` of the ``drop_*`` groups.
    ``pad``: ``(before, after)`` when the layer has no ``drop_*`` head and its skipped heads lie at either end of
    ``shared``: the context of ``shared`` padded with that many zero heads is the layer's (one op, no scatter).
    ``tiled``: the layer has ``drop_*`` heads, no skipped heads, and its groups are slices that cover the heads: the
    layer's output is their contexts concatenated (one op, no writes).
    ``substituted``: ``(policy, [1, 1, heads, 1] marks)`` of the ``mean`` / ``resample`` heads, in the layout of the
    layer's output ``[batch, seq, heads, head_dim]``; they are pruned in everything above.
    ``joint``: the layer in one SDPA call over every head (``JointCall``) when it has ``drop_*`` heads.
    """

    shared: slice | torch.Tensor | None
    prune: torch.Tensor | None
    uniform: torch.Tensor | None
    drops: tuple[tuple[str, slice | torch.Tensor], ...]
    renormalize: bool
    skipped: slice | torch.Tensor | None
    pad: tuple[int, int] | None = None
    tiled: bool = False
    substituted: tuple[tuple[str, torch.Tensor], ...] = ()
    joint: JointCall | None = None

    @classmethod
    def build(cls, plan: HeadPlan, layer: int, renormalize: bool, device: torch.device) -> LayerState | None:
        """The layer's state, or None when every head keeps its attention."""
        groups = plan.layer_groups(layer)
        if set(groups) == {"keep"}:
            return None
        substituted = tuple((policy, torch.tensor([h in groups[policy] for h in range(plan.num_heads)],
                                                  device=device).view(1, 1, -1, 1))
                            for policy in SUBSTITUTED if policy in groups)
        groups = _substituted_as_pruned(groups)
        attending = sorted(h for policy in ("keep", "uniform") for h in groups.get(policy, []))
        pruned = groups.get("prune", [])
        skip = bool(pruned) and (not attending or _is_range(attending))
        shared = attending if skip else sorted(attending + pruned)

        def marks(policy: str, heads: list[int] = shared) -> torch.Tensor | None:
            chosen = [h in groups.get(policy, ()) for h in heads]
            return torch.tensor(chosen, device=device).view(1, -1, 1, 1) if any(chosen) else None

        drops = tuple((p, _as_index(heads, device)) for p, heads in groups.items() if p.startswith("drop_"))
        pad = (shared[0], plan.num_heads - 1 - shared[-1]) if skip and shared and not drops else None
        shared_heads = _as_index(shared, device) if shared else None
        calls = [heads for _, heads in drops] + ([shared_heads] if shared else [])
        tiled = bool(drops) and not skip and all(isinstance(c, slice) for c in calls)  # they cover every head
        joint = None
        if drops:
            kinds = tuple(next((p for p in groups if p.startswith("drop_") and h in groups[p]), "padding")
                          for h in range(plan.num_heads))
            every = list(range(plan.num_heads))
            joint = JointCall(kinds, marks("prune", every), marks("uniform", every), marks("drop_intra", every),
                              marks("drop_inter", every))
        return cls(shared_heads, marks("prune"), marks("uniform"), drops, renormalize,
                   _as_index(pruned, device) if skip else None, pad, tiled, substituted, joint)


@dataclass(frozen=True)
class JointCall:
    """A layer with ``drop_*`` heads as one SDPA call over every head, each under its own mask.

    ``kinds``: per head, the mask it takes: ``"padding"`` (keep, prune, uniform: the forward's padding mask) or its
    ``drop_*`` policy's unit mask; ``prune`` / ``uniform`` / ``intra`` / ``inter``: ``[1, heads, 1, 1]`` marks of the
    heads of each policy (None if none); the call zeroes the pruned heads' values and the uniform heads' queries as
    ``LayerState.shared``'s does. A forward builds the mask of each ``kinds`` once
    (``ForwardMasks.joint_mask``); without renormalising, every head runs over the doubled keys (the others' second
    half hidden). One call where the groups took two, and a concatenation of their contexts (BENCHMARKS.md).
    """

    kinds: tuple[str, ...]
    prune: torch.Tensor | None
    uniform: torch.Tensor | None
    intra: torch.Tensor | None
    inter: torch.Tensor | None


@dataclass(frozen=True)
class RowsState:
    """One layer under per-row plans: ``[plans, heads]`` boolean tables per policy (None if no plan uses it);
    ``prune`` also marks the ``mean`` / ``resample`` heads, whose tables are in ``substituted``."""

    prune: torch.Tensor | None
    uniform: torch.Tensor | None
    drops: tuple[tuple[str, torch.Tensor], ...]
    renormalize: bool
    substituted: tuple[tuple[str, torch.Tensor], ...] = ()

    @classmethod
    def build(cls, plans: tuple[HeadPlan, ...], layer: int, renormalize: bool, device) -> RowsState | None:
        """The layer's state, or None when every plan keeps every head of the layer."""
        table = np.array([[plan.policy_of(layer, h) for h in range(plan.num_heads)] for plan in plans])
        if (table == "keep").all():
            return None

        def chosen(policy: str) -> torch.Tensor | None:
            return torch.tensor(table == policy, device=device) if (table == policy).any() else None

        drops = tuple((p, chosen(p)) for p in ("drop_intra", "drop_inter") if chosen(p) is not None)
        substituted = tuple((p, chosen(p)) for p in SUBSTITUTED if chosen(p) is not None)
        pruned = np.isin(table, ("prune", *SUBSTITUTED))
        return cls(torch.tensor(pruned, device=device) if pruned.any() else None, chosen("uniform"), drops,
                   renormalize, substituted)


def _substituted_as_pruned(groups: dict[str, list[int]]) -> dict[str, list[int]]:
    """A layer's ``{policy: heads}`` with the ``mean`` / ``resample`` heads among the pruned ones."""
    merged = {p: heads for p, heads in groups.items() if p not in SUBSTITUTED}
    substituted = [h for p in SUBSTITUTED for h in groups.get(p, [])]
    if substituted:
        merged["prune"] = sorted(merged.get("prune", []) + substituted)
    return merged


def _as_index(heads: list[int], device: torch.device) -> slice | torch.Tensor:
    """A slice when the heads are contiguous (a view, no copy), else an index tensor on the model's device."""
    if _is_range(heads):
        return slice(heads[0], heads[-1] + 1)
    return torch.tensor(heads, device=device)


def _is_range(heads: list[int]) -> bool:
    return heads == list(range(heads[0], heads[-1] + 1))
