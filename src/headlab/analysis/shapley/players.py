"""The players of ``mode=shapley``: groups of heads (no torch: checked before anything loads)."""

from __future__ import annotations

from typing import Any

from headlab.core.head_files import load_clusters
from headlab.core.head_names import head_index, head_name
from headlab.errors import UserError


def player_groups(over: str, shape: tuple[int, int], clusters: Any = None) -> tuple[list[str], list[list]]:
    """``(names, groups)``: each group a list of ``(layer, head)``. ``types``: the labels of the clusters file
    (sorted; heads it does not label belong to no group and keep their heads in every coalition), ``layers``:
    ``L0``, ``L1``, ...; ``heads``: ``L0H0``, ... in layer-major order."""
    layers, heads = shape
    if over == "layers":
        return [f"L{layer}" for layer in range(layers)], [[(layer, h) for h in range(heads)] for layer in range(layers)]
    if over == "heads":
        every = [(layer, h) for layer in range(layers) for h in range(heads)]
        return [head_name(*head) for head in every], [[head] for head in every]
    if clusters is None:
        raise UserError("mode=shapley shapley.over=types needs the head types: mask.clusters=PATH (a mode=cluster "
                        "job's clusters.json)")
    labels = load_clusters(clusters, layers, heads)
    names = sorted(set(labels.values()))
    for name in names:
        if not name.strip() or name == "none" or "," in name:  # coalitions.csv: removed types comma-separated
            raise UserError(f"mask.clusters: the head type {name!r} cannot name a Shapley player (coalitions.csv "
                            "lists removed types comma-separated and writes 'none' for the full model: a name is "
                            "not empty, not 'none', without commas); rename it")
    groups = [sorted(head_index(name, layers, heads) for name, label in labels.items() if label == type_)
              for type_ in names]
    return names, groups
