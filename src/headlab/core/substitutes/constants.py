"""The constants file: what ``optimal`` heads take (``mask.constants=FILE``; docs/gates.md).

One JSON object: ``constants`` (``[layers, heads, head_dim]``, each head's constant context vector), ``shape``, and
the ``model``, ``architecture``, ``task`` and ``checkpoint`` it was learned for (``mode=gates gates.method=optimal``
writes them), so that a file of another model or architecture is refused as clusters and importance files are
(``core.masks.plan_from_mask``). ``load_constants`` returns them as a ``HeadMeans`` over tokens: the constant is the
same at every token, as a mean head's mean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from headlab.core.substitutes.means import HeadMeans
from headlab.errors import UserError
from headlab.files import read_json

KIND = "optimal_constants"


def check_constants_file(path: str | Path, shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The file's record, checked: a constants file (``kind``), a ``[layers, heads, head_dim]`` array of finite
    numbers, of ``shape`` (layers x heads, and the heads' width when given) when given."""
    data = read_json(path, "constants")
    values = data.get("constants") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("kind") != KIND or values is None:
        raise UserError(f"mask.constants={str(path)!r} is not a constants file (the constants.json a mode=gates "
                        "gates.method=optimal job writes)")
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError):  # ragged lists, text among the numbers
        array = None
    if array is None or array.ndim != 3 or not np.isfinite(array).all():
        got = "lists of unequal lengths or values that are not numbers" if array is None else \
            f"an array of shape {list(array.shape)}" + ("" if array.ndim != 3 else " with values that are not finite")
        raise UserError(f"mask.constants={str(path)!r}: constants must be finite numbers [layers, heads, head_dim], "
                        f"got {got}")
    if shape is not None and tuple(array.shape[:len(shape)]) != tuple(shape):
        ours = " x ".join(map(str, shape))
        raise UserError(f"mask.constants={str(path)!r} holds constants of {' x '.join(map(str, array.shape))} "
                        f"(layers x heads x head width); this model's are {ours}")
    return data


def load_constants(path: str | Path) -> HeadMeans:
    """The constants of a checked file as a ``HeadMeans`` over tokens (``ablate(..., constants=)``)."""
    values = np.asarray(check_constants_file(path)["constants"], dtype=np.float64)
    return HeadMeans("tokens", values, np.zeros((), dtype=np.int64))


def constants_record(values: np.ndarray, **identity: Any) -> dict[str, Any]:
    """What ``constants.json`` holds: ``values`` ``[layers, heads, head_dim]`` and the model's identity."""
    return {"kind": KIND, **identity, "shape": list(values.shape), "constants": np.asarray(values).tolist()}
