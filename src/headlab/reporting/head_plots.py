"""Figures of per-head attention features and head types (matplotlib, headless): panels of layers x heads maps.

Every function writes one file per requested format and returns the paths (``plots._save``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from headlab.reporting.plots import _save, plt


def head_panels(panels: Mapping[str, np.ndarray], title: str, path: Path, formats: Sequence[str] = ("png",),
                marks: Mapping[str, np.ndarray] | None = None, mark_label: str = "") -> list[Path]:
    """One layers x heads heatmap per entry of ``panels`` (each ``[L, H]``); ``marks`` (boolean ``[L, H]`` per
    panel) put a dot on the marked heads."""
    count = len(panels)
    columns = min(count, 4)
    rows = -(-count // columns)
    layers, heads = next(iter(panels.values())).shape
    size = (max(3.0, 0.3 * heads + 1.5), max(2.5, 0.3 * layers + 1.2))
    figure, axes = plt.subplots(rows, columns, figsize=(size[0] * columns, size[1] * rows), squeeze=False)
    for axis, (name, values) in zip(axes.flat, panels.items()):
        image = axis.imshow(values, cmap="viridis", aspect="auto")
        if marks is not None and name in marks:
            layer, head = np.nonzero(marks[name])
            axis.scatter(head, layer, s=12, c="white", edgecolors="black", linewidths=0.5, label=mark_label)
        axis.set_title(name)
        axis.set_xticks(range(heads), [str(h) for h in range(heads)], fontsize=6)
        axis.set_yticks(range(layers), [str(layer) for layer in range(layers)], fontsize=6)
        axis.set_xlabel("head")
        axis.set_ylabel("layer")
        figure.colorbar(image, ax=axis)
    for axis in list(axes.flat)[count:]:
        axis.axis("off")
    figure.suptitle(title + (f" (dots: {mark_label})" if marks and mark_label else ""))
    figure.tight_layout()
    return _save(figure, path, formats)


def role_panels(roles: pd.DataFrame, title: str, path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Mean sieve score per head, one panel per sieve, dots on the heads that have the role."""
    layers, heads = int(roles["layer"].max()) + 1, int(roles["head"].max()) + 1
    panels, marks = {}, {}
    for name, part in roles.groupby("sieve", sort=False):
        means, role = np.full((layers, heads), np.nan), np.zeros((layers, heads), dtype=bool)
        means[part["layer"], part["head"]] = part["mean"]
        role[part["layer"], part["head"]] = part["role"]
        panels[name], marks[name] = means, role
    attrs = roles.attrs
    label = f"role: mean > {attrs.get('tau')}, {attrs.get('correction')} p < {attrs.get('alpha')}"
    return head_panels(panels, title, path, formats, marks, label)
