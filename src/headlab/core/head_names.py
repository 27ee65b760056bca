"""Head names: ``L{layer}H{head}``, both 0-based, in every file headlab reads and writes."""

from __future__ import annotations

import re

from headlab.errors import UserError

_HEAD_NAME = re.compile(r"^L(\d+)H(\d+)$")


def head_name(layer: int, head: int) -> str:
    """``L{layer}H{head}``, the name of a head in every file headlab writes."""
    return f"L{layer}H{head}"


def parse_head_name(name: str) -> tuple[int, int]:
    """``"L3H7"`` -> ``(3, 7)``; a clear error for anything else."""
    match = _HEAD_NAME.match(name.strip())
    if not match:
        raise UserError(f"head name {name!r} is not of the form L<layer>H<head>, e.g. 'L3H7'")
    return int(match.group(1)), int(match.group(2))


def head_index(name: str, num_layers: int, num_heads: int) -> tuple[int, int]:
    layer, head = parse_head_name(name)
    if not (0 <= layer < num_layers and 0 <= head < num_heads):
        raise UserError(
            f"head {name!r} is out of range for a model with {num_layers} layers x {num_heads} heads "
            f"(L0H0..L{num_layers - 1}H{num_heads - 1})"
        )
    return layer, head
