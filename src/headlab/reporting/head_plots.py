"""Figures of per-head attention features and head types (matplotlib, headless): panels of layers x heads maps.

Every function writes one file per requested format and returns the paths (``plots._save``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.colors import to_rgba
from matplotlib.ticker import MaxNLocator
from scipy.optimize import linear_sum_assignment

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


# Guan et al.'s head types keep their colour in every figure (and their order in stacked bars), whichever comes first.
TYPE_COLOURS = {"dense": "tab:blue", "diagonal": "tab:red", "dense_vertical": "tab:pink", "vertical": "tab:cyan"}


def _type_order(kind: str) -> int:
    """Sort key: the head types in ``TYPE_COLOURS`` order, other names after them (a stable sort keeps theirs)."""
    types = list(TYPE_COLOURS)
    return types.index(kind) if kind in types else len(types)


def _colours(values: Sequence) -> tuple[list, dict]:
    """A colour per distinct value (the head types' own; else tab10 / viridis for many), and the legend mapping."""
    distinct = list(dict.fromkeys(values))
    if set(distinct) <= set(TYPE_COLOURS):
        mapping = {value: TYPE_COLOURS[value] for value in distinct}
    else:
        mapping = dict(zip(distinct, _palette(len(distinct))))
    return [mapping[v] for v in values], mapping


def embeddings(points: Mapping[str, np.ndarray], clusters: Sequence[str], layers: Sequence[int], title: str,
               path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Each 2-D embedding (``[heads, 2]``) twice: coloured by cluster (Guan Fig. 2) and by layer (Clark Fig. 6)."""
    figure, axes = plt.subplots(2, len(points), figsize=(5.0 * len(points), 9.0), squeeze=False)
    for column, (name, xy) in enumerate(points.items()):
        for row, (values, what) in enumerate(((list(clusters), "cluster"), ([f"L{v}" for v in layers], "layer"))):
            colours, mapping = _colours(values)
            axis = axes[row, column]
            axis.scatter(xy[:, 0], xy[:, 1], c=colours, s=18)
            for value, colour in mapping.items():
                axis.scatter([], [], color=colour, label=value)
            axis.legend(fontsize=6, loc="best", ncol=2 if len(mapping) > 8 else 1)
            axis.set_title(f"{name}, by {what}")
            axis.set_xticks([])
            axis.set_yticks([])
    figure.suptitle(title)
    figure.tight_layout()
    return _save(figure, path, formats)


def matched_colours(labels: Mapping[str, Sequence[str]]) -> dict[str, dict[str, Any]]:
    """Per run (``{run: per-head labels}``, the first is the reference), a colour per label: a later run's cluster
    takes the colour of the reference cluster it shares most heads with (one-to-one, Hungarian assignment on the
    overlap counts), so matching clusters look alike across panels even when unnamed (``cluster0`` of one run
    and ``cluster0`` of another are unrelated); clusters with no partner get colours of their own. Guan et al.'s
    types keep their colours. Each run's labels come in stacking order: the reference's, then the unmatched."""
    runs = list(labels)
    everything = [label for run in runs for label in labels[run]]
    if set(everything) <= set(TYPE_COLOURS):
        return {run: {label: TYPE_COLOURS[label] for label in sorted(set(labels[run]), key=_type_order)}
                for run in runs}
    reference = sorted(set(labels[runs[0]]), key=_label_order)
    fixed = {label: to_rgba(TYPE_COLOURS[label]) for label in reference if label in TYPE_COLOURS}
    spare = iter(c for c in _palette(len(reference) + sum(len(set(labels[run])) for run in runs[1:]) + len(fixed))
                 if c not in fixed.values())
    mapping = {runs[0]: {label: fixed[label] if label in fixed else next(spare) for label in reference}}
    for run in runs[1:]:
        own = sorted(set(labels[run]), key=_label_order)
        overlap = pd.crosstab(pd.Series(list(labels[runs[0]])), pd.Series(list(labels[run]))).reindex(
            index=reference, columns=own, fill_value=0).to_numpy()  # [reference clusters, this run's clusters]
        rows, columns = linear_sum_assignment(-overlap)
        partner = {own[c]: r for r, c in zip(rows, columns) if overlap[r, c] > 0}
        own.sort(key=lambda label: partner.get(label, len(reference)))
        mapping[run] = {label: mapping[runs[0]][reference[partner[label]]] if label in partner else next(spare)
                        for label in own}
    return mapping


def _label_order(label: str) -> tuple[int, int, str]:
    """Guan et al.'s types first, then other names in natural order (``cluster2`` before ``cluster10``)."""
    return _type_order(label), len(label), label


def _palette(count: int) -> list[tuple[float, ...]]:
    """``count`` distinct RGBA colours (tab10, viridis for more)."""
    cmap = plt.get_cmap("tab10" if count <= 10 else "viridis", count)
    return [to_rgba(cmap(i)) for i in range(count)]


def types_per_layer(counts: pd.DataFrame, title: str, path: Path, formats: Sequence[str] = ("png",),
                    colours: Mapping[str, Mapping[str, Any]] | None = None) -> list[Path]:
    """Stacked bars of head types per layer (Guan Fig. 3); ``counts``: one row per layer, one column per type.
    Several models (Guan Fig. 4): ``counts`` with a ``model`` column, one panel per model; ``colours`` (per
    model, a colour per type: ``matched_colours``) colours them and gives each panel its own legend."""
    models = list(dict.fromkeys(counts["model"])) if "model" in counts else [None]
    figure, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.5), squeeze=False, sharey=True)
    for axis, model in zip(axes[0], models):
        part = counts if model is None else counts[counts["model"] == model]
        part = part.drop(columns=[c for c in ("model",) if c in part]).set_index("layer")
        part = part[list(colours[model]) if colours else sorted(part.columns, key=_type_order)]
        bottom = np.zeros(len(part))
        mapping = colours[model] if colours else _colours(list(part.columns))[1]
        for kind in part.columns:
            axis.bar(part.index, part[kind], bottom=bottom, color=mapping[kind], label=kind)
            bottom += part[kind].to_numpy()
        axis.set_xticks(part.index, [str(layer) for layer in part.index])
        axis.set_xlabel("layer")
        axis.set_title(model or title)
        if colours:  # under the panel's axis label
            axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=min(len(part.columns), 3))
    axes[0, 0].set_ylabel("heads")
    axes[0, 0].yaxis.set_major_locator(MaxNLocator(integer=True))
    if not colours:
        axes[0, -1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the bars, never on them
    if models != [None]:
        figure.suptitle(title)
    figure.tight_layout()
    return _save(figure, path, formats)


def feature_boxes(features: np.ndarray, clusters: Sequence[str], bins: Sequence[str], title: str, path: Path,
                  formats: Sequence[str] = ("png",)) -> list[Path]:
    """Box plots of the distance features of the heads of each cluster (Guan Fig. 1, bottom)."""
    names = list(dict.fromkeys(clusters))
    figure, axes = plt.subplots(len(names), 1, figsize=(9.0, 2.2 * len(names)), squeeze=False, sharex=True)
    labels = np.asarray(clusters)
    for axis, name in zip(axes[:, 0], names):
        chosen = features[labels == name]
        axis.boxplot([chosen[:, i] for i in range(chosen.shape[1])], showfliers=False)
        axis.set_title(f"{name} ({len(chosen)} heads)", fontsize=9)
        axis.set_ylabel("attention")
    axes[-1, 0].set_xticks(range(1, len(bins) + 1), list(bins), rotation=90, fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    return _save(figure, path, formats)


def centroid_profiles(centroids: Mapping[str, Mapping[str, Sequence[float]]], bins: Sequence[str], title: str,
                      path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Each head type's mean distance features (its centroid), one panel per model (``{model: {type: [bins]}}``)."""
    figure, axes = plt.subplots(1, len(centroids), figsize=(4.6 * len(centroids), 3.2), squeeze=False, sharey=True)
    for axis, (model, types) in zip(axes[0], centroids.items()):
        for name in sorted(types, key=_type_order):
            axis.plot(range(len(bins)), types[name], marker="o", markersize=3, label=name, color=TYPE_COLOURS.get(name))
        axis.set_title(model, fontsize=9)
        axis.set_xticks(range(len(bins)), list(bins), rotation=90, fontsize=7)
        axis.legend(fontsize=7)
    axes[0, 0].set_ylabel("mean attention")
    figure.suptitle(title)
    figure.tight_layout()
    return _save(figure, path, formats)
