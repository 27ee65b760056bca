"""``output_attentions=True`` inside a headlab block: refused, the weights a forward would record are not there."""

from __future__ import annotations

try:  # the outputs a forward records (output_attentions=True): transformers 5's context variable
    from transformers.utils.output_capturing import _active_collector
except ImportError:  # pragma: no cover - another transformers 5 layout: nothing refused
    _active_collector = None


def refuse_recorded_weights(kwargs: dict) -> None:
    """``output_attentions=True`` inside a block: refused, not answered with an empty tuple (transformers records
    what the attention function returns, DeBERTa what its module returns; the planned routes materialise no weights,
    and a ``mean`` or ``resample`` head has none at all)."""
    collector = _active_collector.get() if _active_collector is not None else None
    if kwargs.get("output_attentions") or (collector and "attentions" in collector):
        raise ValueError(
            "output_attentions=True inside headlab.ablate or observe_attention: the patched attention returns no "
            "weights; observe_attention's observer receives each head's softmax weights (docs/features.md)"
        )
