"""Figures of the syntax heads: each head's best relation (a heatmap per direction) and Clark et al.'s Fig. 5 (the
attention lines of a relation's best head on a sentence, gold arcs of that relation in red)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from headlab.reporting.plots import _save, label_head_grid


def best_relation_heatmap(accuracies: pd.DataFrame, direction: str, title: str, path: Path,
                          formats: Sequence[str] = ("png",)) -> list[Path]:
    """Layers x heads: each head's highest accuracy over the relations (``all`` left out), the relation written in."""
    rows = accuracies[(accuracies["direction"] == direction) & (accuracies["relation"] != "all")]
    layers, heads = int(rows["layer"].max()) + 1, int(rows["head"].max()) + 1
    rows = rows.dropna(subset=["accuracy"])  # heads a plan changes: no accuracy, a blank cell
    best = rows.loc[rows.groupby(["layer", "head"])["accuracy"].idxmax()]
    values = np.full((layers, heads), np.nan)
    values[best["layer"], best["head"]] = best["accuracy"]
    figure, axes = plt.subplots(figsize=(max(4.0, 0.9 * heads + 2.0), max(3.0, 0.5 * layers + 1.5)))
    image = axes.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for row in best.itertuples():
        colour = "black" if row.accuracy > 0.6 else "white"
        axes.text(row.head, row.layer, f"{row.relation}\n{row.accuracy:.2f}", ha="center", va="center",
                  fontsize=6, color=colour)
    label_head_grid(axes, layers, heads, title)
    figure.colorbar(image, ax=axes, label=f"best relation's accuracy ({direction})")
    return _save(figure, path, formats)


def attention_lines(panels: Sequence[dict], title: str, path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """One panel per dict: ``words``, ``weights`` [n, n] (word attention: the left column's word attends to the right
    column's), ``arcs`` [(left, right)] 0-based word pairs of the relation's gold arcs, ``label``."""
    figure, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 0.32 * max(len(p["words"]) for p in panels)
                                                         + 1.5), squeeze=False)
    for axis, panel in zip(axes[0], panels):
        words, weights = panel["words"], panel["weights"]
        n = len(words)
        for i in range(n):
            axis.text(0, n - 1 - i, words[i], ha="right", va="center", fontsize=8)
            axis.text(1, n - 1 - i, words[i], ha="left", va="center", fontsize=8)
            for j in range(n):
                if weights[i, j] > 0.05:
                    axis.plot([0.03, 0.97], [n - 1 - i, n - 1 - j], color="tab:blue",
                              alpha=float(min(1, weights[i, j])), linewidth=1.2)
        for left, right in panel["arcs"]:
            axis.plot([0.03, 0.97], [n - 1 - left, n - 1 - right], color="tab:red", linestyle="--", linewidth=1)
        axis.set_xlim(-0.6, 1.6)
        axis.set_ylim(-1, n)
        axis.axis("off")
        axis.set_title(panel["label"], fontsize=9)
    figure.suptitle(title)
    return _save(figure, path, formats)
