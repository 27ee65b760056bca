"""How a number becomes a verdict, and what a finding holds.

The rule (docs/study.md, "How a claim gets its verdict"): each claim is a quantity on one side of a boundary
(``pruned vertical - pruned diagonal > 0``, ``stability > 0.95``). With the quantity's interval ``[low, high]``
(a CI, or the range of random orders, or the point itself for an exact count):

- **holds** when the whole interval lies strictly on the claim's side of the boundary;
- **does not hold** when the whole interval lies strictly on the other side;
- **inconclusive** when the interval contains the boundary (touching it counts) or is undefined (NaN).

A claim no stage of the study measured is **not tested**, with the reason. With several models (fine-tuning seeds,
or the pre-trained model beside them) each gets its own verdict; the finding counts the ones that agree.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

RULE = (
    "**How a claim gets its verdict.** Each claim is a quantity on one side of a boundary (a paired difference of the "
    "main metric between two plans above 0, a stability above 0.95, ...), with an interval: a paired bootstrap CI "
    "(the tables' report settings) for differences of scores, a Wilson interval for a share of heads, Newcombe's for "
    "a difference of two shares, the conditional-MLE CI for an odds ratio, the range of the random orders for the "
    "prune curve, the point itself for a count (heads, layers). **holds**: the whole interval lies strictly on the "
    "claim's side of the boundary; **does not hold**: it lies strictly on the other side; **inconclusive**: it "
    "contains or touches the boundary (or is undefined). **not tested**: no stage of this study measured it, with "
    "the reason. With several models (seeds, or the pre-trained model beside them) each gets its verdict and the "
    "finding counts those that agree (`mixed` when they differ). Boundaries in points are of a 0-100 score (a "
    "GLUE metric in [0, 1] scales them by 1/100). The intervals are per claim, not adjusted for the number of claims.")
HOLDS, FAILS, INCONCLUSIVE, NOT_TESTED = "holds", "does not hold", "inconclusive", "not tested"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, NOT_TESTED)


def verdict(low: float, high: float, boundary: float, above: bool = True) -> str:
    """The verdict on "the quantity is above ``boundary``" (``above=False``: below it) from its interval."""
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    if not above:
        low, high, boundary = -high, -low, -boundary
    if low > boundary:
        return HOLDS
    if high < boundary:
        return FAILS
    return INCONCLUSIVE


@dataclass(frozen=True)
class Claim:
    """A claim of the seeds: its sentence and where the paper makes it."""

    key: str  # study.json's key: "guan_table2_diagonal_vs_vertical_prune"
    text: str  # "Pruning diagonal heads costs more than pruning vertical heads"
    source: str  # "Guan et al. 2020, Table 2 (rows 3, 5)"


@dataclass(frozen=True)
class Evidence:
    """One model's numbers for a claim and their verdict."""

    model: str  # "seed0", "pretrained"
    verdict: str
    numbers: str  # "f1 +63.45 [+58.84, +67.78] (pruned vertical - pruned diagonal; boundary 0)"
    file: str  # the stage file, relative to the study folder
    values: dict = field(default_factory=dict)  # for study.json: value, low, high, boundary, ...


@dataclass(frozen=True)
class Finding:
    """A claim with its evidence per model (none: ``reason`` says why it was not tested)."""

    claim: Claim
    evidence: tuple[Evidence, ...] = ()
    reason: str = ""  # why not tested

    @property
    def verdict(self) -> str:
        """The models' common verdict; ``mixed`` when they differ."""
        found = {e.verdict for e in self.evidence}
        if not found:
            return NOT_TESTED
        return found.pop() if len(found) == 1 else "mixed"

    def counted(self) -> str:
        """``holds (2 of 2 models)``, ``mixed: holds in 2 of 3 seeds, inconclusive in 1``."""
        if not self.evidence:
            return f"{NOT_TESTED}: {self.reason}"
        names = [e.model for e in self.evidence]
        unit = "seeds" if all(name.startswith("seed") for name in names) else "models"
        counts = Counter(e.verdict for e in self.evidence)
        if len(counts) == 1:
            return self.verdict if len(names) == 1 else f"{self.verdict} ({len(names)} of {len(names)} {unit})"
        parts = [f"{v} in {n}" for v, n in counts.most_common()]
        return f"mixed: {parts[0]} of {len(names)} {unit}, " + ", ".join(parts[1:])

    def as_json(self) -> dict:
        return {"claim": self.claim.text, "source": self.claim.source, "verdict": self.verdict,
                "summary": self.counted(),
                "evidence": [{"model": e.model, "verdict": e.verdict, "numbers": e.numbers, "file": e.file,
                              **e.values} for e in self.evidence]}


def not_tested(claim: Claim, reason: str) -> Finding:
    return Finding(claim, (), reason)


def interval(value: float, low: float, high: float, digits: int = 2, sign: bool = True) -> str:
    """``+63.45 [+58.84, +67.78]`` (``n/a`` for a NaN)."""
    spec = f"{'+' if sign else ''}.{digits}f"
    show = lambda x: "n/a" if math.isnan(x) else ("inf" if math.isinf(x) else format(x, spec))  # noqa: E731
    return f"{show(value)} [{show(low)}, {show(high)}]"
