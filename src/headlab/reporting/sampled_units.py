"""The unit that was sampled: what a bootstrap resamples and a permutation test swaps.

Examples drawn together are resampled together. ``qnli_articles`` holds two pairs per question (its answer's
sentence and a distractor): the questions were sampled, not the pairs, so a resample draws questions and takes both
pairs of each; a permutation swaps a question's pairs at once. A task names the column that says which rows belong
together (``task.cluster_field``), and an evaluation writes it into its records as ``cluster``; records without that
column are resampled row by row (each row its own unit), exactly as before.

With every unit of size one, every function here reduces to the row-wise computation bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from headlab.errors import UserError
from headlab.reporting.metric_sums import Columns

CLUSTER = "cluster"  # the records' column of each example's unit


@dataclass(frozen=True)
class SampledUnits:
    """Which unit each of ``size`` examples belongs to (``groups`` None: each its own)."""

    size: int  # examples
    groups: np.ndarray | None = None  # [size] unit index of each example, 0..count-1

    @property
    def count(self) -> int:
        """The number of units: what a resample draws."""
        return self.size if self.groups is None else int(self.groups.max()) + 1

    @property
    def sizes(self) -> np.ndarray:
        """``[count]`` examples per unit."""
        return np.ones(self.size) if self.groups is None else np.bincount(self.groups).astype(np.float64)

    def weights(self, draws: np.ndarray) -> np.ndarray:
        """``[batch, size]`` how often each example is in each resample of units ``draws`` ``[batch, count]``."""
        batch = len(draws)
        rows = (np.arange(batch)[:, None] * self.count + draws).ravel()
        drawn = np.bincount(rows, minlength=batch * self.count).reshape(batch, self.count).astype(np.float64)
        return drawn if self.groups is None else drawn[:, self.groups]

    def examples(self, flags: np.ndarray) -> np.ndarray:
        """``[batch, size]``: per-unit flags ``[batch, count]`` (a permutation's swaps) given to their examples."""
        return flags if self.groups is None else flags[:, self.groups]

    def sums(self, values: np.ndarray) -> np.ndarray:
        """``[count, m]``: per-example rows ``[size, m]`` summed over each unit."""
        if self.groups is None:
            return values
        out = np.zeros((self.count, values.shape[1]))
        np.add.at(out, self.groups, values)
        return out

    def members(self) -> list[np.ndarray]:
        """Each unit's example indices."""
        if self.groups is None:
            return [np.array([i]) for i in range(self.size)]
        order = np.argsort(self.groups, kind="stable")
        return np.split(order, np.cumsum(np.bincount(self.groups))[:-1])


def sampled_units(records: Sequence[Columns], size: int) -> SampledUnits:
    """The units of examples scored in several record sets (a baseline and its plans): their ``cluster`` column,
    which every set that has one must give alike (they are the same examples), else one unit per row."""
    found = [np.asarray(r[CLUSTER]).astype(str) for r in records if CLUSTER in r]
    if not found:
        return SampledUnits(size)
    first = found[0]
    for other in found[1:]:
        if len(other) != len(first) or (other != first).any():
            raise UserError("the records group their examples into different clusters (their 'cluster' columns "
                            "differ): these are not the same examples, or were evaluated with another "
                            "task.cluster_field; evaluate them again")
    _, groups = np.unique(first, return_inverse=True)
    # numbered by first appearance, so that the units' order (and so the resamples) follows the examples'
    first_seen = np.full(groups.max() + 1, len(groups))
    np.minimum.at(first_seen, groups, np.arange(len(groups)))
    rank = np.empty_like(first_seen)
    rank[np.argsort(first_seen, kind="stable")] = np.arange(len(first_seen))
    groups = rank[groups]
    return SampledUnits(size) if groups.max() + 1 == len(groups) else SampledUnits(size, groups)
