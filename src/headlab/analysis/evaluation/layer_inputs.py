"""The unablated hidden states entering a swept layer, kept from one layer's pass over the data to the next.

A head sweep makes one pass over the data per layer (``sweep_heads.py``); each needs, per batch, the unablated input
of its layer. Without a store, layer l's pass runs layers 0..l-1 again for it (L(L-1)/2 layers per batch over a
sweep, ~5.5 forwards of a 12-layer model); with one, each pass runs its own layer once more and keeps what enters the
next. Batches are keyed by ``(dataloader_idx, batch_idx)``: every pass iterates the same evaluation loaders in the same
order. Kept tensors stay where the model is, up to a budget (a quarter of the GPU's free memory, 2 GiB on a CPU);
batches past it run the layers below again, as without a store.
"""

from __future__ import annotations

import torch

CPU_BUDGET = 2 * 2**30  # bytes kept in host memory
GPU_SHARE = 4  # a GPU keeps up to 1 / GPU_SHARE of its free memory when the first batch is kept


class LayerInputs:
    """Per batch, the hidden states ``[batch, seq, hidden]`` entering one layer (the next one a sweep runs)."""

    def __init__(self, budget: int | None = None):
        self.budget = budget  # bytes; None: set from the first kept tensor's device
        self.used = 0
        self._kept: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}  # key -> (layer, hidden states)

    def take(self, layer: int, key: tuple[int, int], tokens: torch.Size | None = None) -> torch.Tensor | None:
        """The input of ``layer`` for batch ``key``, no longer kept; None if it was not kept (or was kept for another
        layer: a pass that did not run in between, e.g. a layer a resumed sweep had already written). ``tokens``: the
        batch's ``[batch, seq]``, which the kept tensor must have (else the loaders changed order between passes)."""
        found = self._kept.pop(key, None)
        if found is None:
            return None
        self.used -= found[1].nbytes
        if tokens is not None and found[1].shape[:2] != tokens:
            raise RuntimeError(f"batch {key}: kept input {tuple(found[1].shape)} for {tuple(tokens)} tokens; the "
                               "evaluation loaders gave other batches than in the previous layer's pass")
        return found[1] if found[0] == layer else None

    def has_room(self) -> bool:
        return self.budget is None or self.used < self.budget

    def keep(self, layer: int, key: tuple[int, int], hidden: torch.Tensor) -> None:
        """Keep ``hidden``, the input of ``layer`` for batch ``key`` (its device's budget permitting)."""
        if self.budget is None:
            self.budget = (torch.cuda.mem_get_info(hidden.device)[0] // GPU_SHARE if hidden.device.type == "cuda"
                           else CPU_BUDGET)
        self.take(layer, key)  # a batch keeps one tensor
        if self.used + hidden.nbytes > self.budget:
            return
        self._kept[key] = (layer, hidden)
        self.used += hidden.nbytes
