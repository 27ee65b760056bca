"""Table 2's type plans under each bootstrap fit of the clustering (a cluster job's ``refits.json``).

A claim about a head type rests on one k-means labelling of the heads; another sample of text labels some heads
otherwise. The cluster job fits the heads again on bootstrap resamples of the sequences (``cluster.bootstrap_fits``);
the study's ``refits`` stage evaluates Table 2's plans with each fit's labels, and the findings state how each
Table 2 claim fares across them. A plan names its heads outright, so fits that give a type the same heads share one
job: its folder is ``<plan>-<digest of the heads>``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

TYPES = ("dense", "diagonal", "dense_vertical", "vertical")  # Guan et al.'s: the only clusters with claims to refit
POLICIES = ("prune", "uniform")  # Table 2's


@dataclass(frozen=True)
class RefitPlan:
    """One type plan under one fit: ``name`` (``prune_diagonal``), its job's ``folder`` name and ``heads``."""

    name: str
    folder: str
    heads: tuple[str, ...]

    @property
    def rules(self) -> dict[str, Any]:
        return {"rules": [{"heads": ",".join(self.heads), "policy": self.name.split("_", 1)[0]}]}


def refit_plans(clusters: dict[str, Any]) -> list[dict[str, RefitPlan]]:
    """Per bootstrap fit of ``clusters`` (a ``refits.json``: the clusters' names and each fit's labels),
    ``{plan: RefitPlan}`` of Table 2's type plans whose
    type has heads in that fit; ``[]`` when the clusters are not Guan et al.'s four types or have no fits."""
    if sorted(clusters.get("names", [])) != sorted(TYPES):
        return []
    fits = []
    for labels in clusters.get("refits", []):
        plans = {}
        for kind in TYPES:
            heads = tuple(head for head, label in labels.items() if label == kind)  # in the model's head order
            if heads:
                digest = hashlib.sha1(",".join(heads).encode()).hexdigest()[:10]
                plans |= {f"{policy}_{kind}": RefitPlan(f"{policy}_{kind}", f"{policy}_{kind}-{digest}", heads)
                          for policy in POLICIES}
        fits.append(plans)
    return fits
