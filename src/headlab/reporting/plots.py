"""Report figures (matplotlib, headless): head-sweep heatmaps, plan bars with CIs, metric vs heads ablated,
importance heatmaps and scatter plots, prune curves, learned gates against heads pruned.

Deltas use a diverging colour map centred on 0 (red: the metric fell); cells and bars whose adjusted
p-value is below 0.05 are marked. Every function writes one file per requested format and returns
the paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm

from headlab.files import written_beside


def _save(figure, path: Path, formats: Sequence[str]) -> list[Path]:
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for extension in formats:
        target = path.parent / f"{path.name}.{extension}"
        with written_beside(target) as tmp:
            figure.savefig(tmp, dpi=150, bbox_inches="tight", format=extension)
        out.append(target)
    plt.close(figure)
    return out


def error_bars(value, low, high) -> np.ndarray:
    """``[2, n]`` distances from each value down to ``low`` and up to ``high``, as matplotlib's ``yerr`` takes them:
    0 where undefined, and never below 0 (a zero-width interval's ends differ from its value by rounding)."""
    value, low, high = (np.asarray(x, dtype=float) for x in (value, low, high))
    errors = np.vstack([value - low, high - value])
    return np.clip(np.where(np.isfinite(errors), errors, 0.0), 0.0, None)


def label_head_grid(axes, layers: int, heads: int, title: str) -> None:
    """Ticks ``L<layer>`` (rows) and ``H<head>`` (columns), axis labels and title of a layers x heads image."""
    axes.set_xticks(range(heads), [f"H{h}" for h in range(heads)] if heads > 1 else ["layer"])
    axes.set_yticks(range(layers), [f"L{layer}" for layer in range(layers)])
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    axes.set_title(title)


def head_heatmap(delta: np.ndarray, significant: np.ndarray, metric: str, title: str, path: Path,
                 formats: Sequence[str] = ("png",)) -> list[Path]:
    """Layers (rows) x heads (columns) of a metric's delta; ``*`` marks significant cells."""
    layers, heads = delta.shape
    figure, axes = plt.subplots(figsize=(max(4.0, 0.5 * heads + 2.0), max(3.0, 0.4 * layers + 1.5)))
    limit = float(np.nanmax(np.abs(delta))) if np.isfinite(delta).any() else 1.0
    limit = limit or 1.0
    image = axes.imshow(delta, cmap="RdBu", norm=TwoSlopeNorm(0.0, -limit, limit), aspect="auto")
    for layer, head in zip(*np.nonzero(significant)):
        axes.text(head, layer, "*", ha="center", va="center", fontsize=11, color="black")
    label_head_grid(axes, layers, heads, title)
    figure.colorbar(image, ax=axes, label=f"{metric} delta (ablated - baseline)")
    return _save(figure, path, formats)


def plan_bars(rows: pd.DataFrame, metric: str, title: str, path: Path, formats: Sequence[str] = ("png",),
              chance: float | None = None) -> list[Path]:
    """One bar per plan: its delta with the CI as an error bar; ``*`` above significant ones; ``chance``: the delta
    at which a plan scores what a model that learned nothing does (chance - baseline), a dotted line."""
    rows = rows.reset_index(drop=True)
    figure, axes = plt.subplots(figsize=(max(4.0, 0.6 * len(rows) + 1.5), 4.0))
    colours = ["#b2182b" if d < 0 else "#2166ac" for d in rows["delta"]]
    axes.bar(range(len(rows)), rows["delta"], yerr=error_bars(rows["delta"], rows["ci_low"], rows["ci_high"]),
             capsize=3, color=colours)
    stars = []
    for i, row in rows.iterrows():
        if np.isfinite(row["p_adjusted"]) and row["p_adjusted"] < 0.05:
            top = max(row["ci_high"] if np.isfinite(row["ci_high"]) else row["delta"], 0)
            axes.annotate("*", (i, top), xytext=(0, 1), textcoords="offset points", ha="center", va="bottom",
                          fontsize=12)
            stars.append(top)
    if stars:  # room above the highest star, so it stays inside the axes (below the title)
        low, high = axes.get_ylim()
        axes.set_ylim(low, max(high, max(stars) + 0.12 * (high - low)))
    axes.axhline(0.0, color="black", linewidth=0.8)
    if chance is not None and np.isfinite(chance):
        axes.axhline(chance, color="grey", linestyle=":", linewidth=1.0, label=f"chance ({chance:+.4g})")
        axes.legend(loc="lower left", fontsize=8)
    axes.set_xticks(range(len(rows)), rows["plan"], rotation=45, ha="right")
    axes.set_ylabel(f"{metric} delta (ablated - baseline)")
    axes.set_title(title)
    return _save(figure, path, formats)


def heads_curve(rows: pd.DataFrame, metric: str, title: str, path: Path, formats: Sequence[str] = ("png",)
                ) -> list[Path]:
    """The metric against the number of heads a plan changes, one line per policy (CIs as bands)."""
    figure, axes = plt.subplots(figsize=(5.5, 4.0))
    for policy, group in rows.groupby("policy"):
        group = group.sort_values("heads")
        axes.plot(group["heads"], group["value"], marker="o", label=policy)
        if group["ci_low"].notna().all():  # the CI of the delta, moved to the metric's scale
            axes.fill_between(group["heads"], group["baseline"] + group["ci_low"],
                              group["baseline"] + group["ci_high"], alpha=0.2)
    baseline = rows["baseline"].iloc[0]
    axes.axhline(baseline, color="grey", linestyle="--", linewidth=0.8, label="baseline")
    axes.set_xlabel("heads ablated")
    axes.set_ylabel(metric)
    axes.set_title(title)
    axes.legend()
    return _save(figure, path, formats)


def score_heatmap(scores: np.ndarray, label: str, title: str, path: Path, formats: Sequence[str] = ("png",),
                  signed: bool = False) -> list[Path]:
    """Layers x heads of per-head scores: a sequential map, or for signed values one centred on 0."""
    layers, heads = scores.shape
    figure, axes = plt.subplots(figsize=(max(4.0, 0.5 * heads + 2.0), max(3.0, 0.4 * layers + 1.5)))
    if signed:
        limit = float(np.nanmax(np.abs(scores))) or 1.0
        image = axes.imshow(scores, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -limit, limit), aspect="auto")
    else:
        image = axes.imshow(scores, cmap="viridis", aspect="auto")
    label_head_grid(axes, layers, heads, title)
    figure.colorbar(image, ax=axes, label=label)
    return _save(figure, path, formats)


def estimate_scatter(estimate: np.ndarray, measured: np.ndarray, xlabel: str, ylabel: str, title: str, path: Path,
                     formats: Sequence[str] = ("png",)) -> list[Path]:
    """One point per head: an estimator against the measured ablation, with the line y = x."""
    figure, axes = plt.subplots(figsize=(4.5, 4.5))
    x, y = np.ravel(estimate), np.ravel(measured)
    axes.scatter(x, y, s=14, alpha=0.8)
    low, high = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
    axes.plot([low, high], [low, high], color="grey", linewidth=0.8, linestyle="--", label="y = x")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.legend(loc="best")
    return _save(figure, path, formats)


def prune_curve(rows: pd.DataFrame, metric: str, threshold: float, title: str, path: Path,
                formats: Sequence[str] = ("png",), chance: float | None = None) -> list[Path]:
    """The metric against heads pruned: the importance order, each random order (thin) and their mean; ``chance``:
    what a model that learned nothing scores, a dotted line."""
    figure, axes = plt.subplots(figsize=(5.5, 4.0))
    random = rows[rows["order"] == "random"]
    for _, group in random.groupby("seed"):
        axes.plot(group["heads_pruned"], group[metric], color="grey", alpha=0.4, linewidth=0.8)
    if len(random):
        mean = random.groupby("heads_pruned")[metric].mean()
        axes.plot(mean.index, mean.values, color="grey", linestyle="--", marker=".",
                  label=f"random order (mean of {random['seed'].nunique()})")
    ordered = rows[rows["order"] == "importance"].sort_values("heads_pruned")
    axes.plot(ordered["heads_pruned"], ordered[metric], marker="o", label="by importance")
    axes.axhline(threshold, color="#b2182b", linestyle=":", linewidth=0.8, label="stop threshold")
    if chance is not None and np.isfinite(chance):
        axes.axhline(chance, color="black", linestyle=":", linewidth=0.8, label=f"chance ({chance:.4g})")
    axes.set_xlabel("heads pruned")
    axes.set_ylabel(metric)
    axes.set_title(title)
    axes.legend(loc="lower left", fontsize=8)  # the curves start high at the left: that corner stays free
    return _save(figure, path, formats)


def gates_curve(points: pd.DataFrame, metric: str, title: str, path: Path, formats: Sequence[str] = ("png",),
                curve: pd.DataFrame | None = None, chance: float | None = None) -> list[Path]:
    """The metric against heads pruned by learned gates: one point per penalty (``lambda``, ``heads_pruned``,
    ``metric``, ``ci_low`` / ``ci_high`` of the metric, ``baseline``: a line), with ``curve`` (a prune curve's rows:
    ``order``, ``seed``, ``heads_pruned``, ``metric``) drawn beside: its importance order and its random orders."""
    figure, axes = plt.subplots(figsize=(5.5, 4.0))
    if curve is not None and len(curve):
        random = curve[curve["order"] == "random"]
        if len(random):
            mean = random.groupby("heads_pruned")[metric].mean()
            axes.plot(mean.index, mean.values, color="grey", linestyle="--", marker=".",
                      label=f"random order (mean of {random['seed'].nunique()})")
        ordered = curve[curve["order"] == "importance"].sort_values("heads_pruned")
        axes.plot(ordered["heads_pruned"], ordered[metric], marker="o", color="#4393c3", label="by importance")
    points = points.sort_values("heads_pruned")
    axes.errorbar(points["heads_pruned"], points[metric], yerr=error_bars(points[metric], points["ci_low"],
                                                                          points["ci_high"]),
                  color="#b2182b", marker="s", capsize=3, label="L0 gates (CI)")
    for _, row in points.iterrows():
        axes.annotate(f"{row['lambda']:g}", (row["heads_pruned"], row[metric]), textcoords="offset points",
                      xytext=(4, 4), fontsize=7)
    axes.axhline(points["baseline"].iloc[0], color="grey", linewidth=0.8, label="unablated")
    if chance is not None and np.isfinite(chance):
        axes.axhline(chance, color="black", linestyle=":", linewidth=0.8, label=f"chance ({chance:.4g})")
    axes.set_xlabel("heads pruned")
    axes.set_ylabel(metric)
    axes.set_title(title)
    axes.legend(loc="lower left", fontsize=8)
    return _save(figure, path, formats)


def shapley_waterfall(names: Sequence[str], values: np.ndarray, low: np.ndarray, high: np.ndarray, empty: float,
                      full: float, score: str, title: str, path: Path, formats: Sequence[str] = ("png",),
                      shown: int = 20) -> list[Path]:
    """From the score with every group removed to the full model's, one bar per group's Shapley value (the largest
    ``shown`` by size; the rest as one bar), with its confidence interval at the bar's end."""
    order = np.argsort(-np.abs(values), kind="stable")
    rows = [(names[i], values[i], low[i], high[i]) for i in order[:shown]]
    if len(order) > shown:
        rest = values[order[shown:]].sum()
        rows.append((f"{len(order) - shown} others", rest, np.nan, np.nan))
    figure, axes = plt.subplots(figsize=(max(5.0, 0.45 * len(rows) + 2.5), 4.0))
    level = empty
    for x, (_, value, lo, hi) in enumerate(rows):
        axes.bar(x, value, bottom=level, color="tab:blue" if value >= 0 else "tab:red")
        if np.isfinite(lo):
            axes.errorbar(x, level + value, yerr=error_bars([value], [lo], [hi]), color="black", capsize=3, lw=1)
        level += value
    axes.axhline(empty, color="gray", lw=0.8, ls=":", label=f"every group removed: {empty:.4g}")
    axes.axhline(full, color="black", lw=0.8, ls="--", label=f"full model: {full:.4g}")
    axes.set_xticks(range(len(rows)), [row[0] for row in rows], rotation=60, ha="right")
    axes.set_ylabel(score)
    axes.set_title(title)
    axes.legend(fontsize=8)
    return _save(figure, path, formats)


def grid_heatmap(values: np.ndarray, rows: Sequence[str], columns: Sequence[str], xlabel: str, label: str, title: str,
                 path: Path, formats: Sequence[str] = ("png",), ylabel: str = "layer") -> list[Path]:
    """Layers or heads (rows) x anything (columns: heads, positions, site kinds) of a signed score, centred on 0."""
    height = 0.4 if len(rows) <= 24 else 0.18  # many rows (heads): thinner, so 144 heads fit a page
    figure, axes = plt.subplots(figsize=(max(4.0, 0.35 * len(columns) + 2.5), max(3.0, height * len(rows) + 1.5)))
    limit = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
    image = axes.imshow(values, cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -(limit or 1.0), limit or 1.0), aspect="auto")
    step = max(1, len(columns) // 32)  # at most ~32 column labels
    axes.set_xticks(range(0, len(columns), step), list(columns)[::step], rotation=90 if step > 1 else 0)
    axes.set_yticks(range(len(rows)), rows, fontsize=None if len(rows) <= 24 else 5)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    figure.colorbar(image, ax=axes, label=label)
    return _save(figure, path, formats)
