"""How a Table 2 claim fares when the heads are clustered again on bootstrap resamples of the text (``refits``).

Each fit's type plans ran in the refits stage (``headlab.study.refit_plans``); under each fit the claim's quantity
gets the same interval as under the main fit (an ordering's paired CI, a cost's headroom CI, at the family's level)
and the verdict of that interval. The finding states the spread. The main fit's verdict (holds or does not hold)
stands when at least half of the bootstrap fits put the estimate on its side of the boundary (the sign: each fit
alone has the power of one fit, so its significance would mix stability with power); else the claim rests on one
labelling of the heads and is inconclusive. A fit whose own profiles name its clusters otherwise (``same_types``)
was not kept: it counts against both verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headlab.files import read_json
from headlab.reporting.statistics import Resampling, paired_tests
from headlab.reporting.value_intervals import headroom_interval
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import FAILS, HOLDS, INCONCLUSIVE, NOT_TESTED, verdict
from headlab.study.refit_plans import RefitPlan, refit_plans
from headlab.tasks.chance import chance_level


@dataclass(frozen=True)
class RefitSpread:
    """A claim's quantity and verdict under each bootstrap fit of the same types (NaN and ``not tested`` where a fit
    gave one of its types no heads), against ``boundary``; ``made``: the fits made, those of other types left out."""

    values: list[float]
    verdicts: list[str]
    boundary: float
    made: int

    @property
    def holds(self) -> int:
        return self.verdicts.count(HOLDS)

    def sides(self) -> tuple[int, int]:
        """How many fits' estimates lie on the claim's side of the boundary, and on the other side."""
        return (sum(v > self.boundary for v in self.values if not math.isnan(v)),
                sum(v < self.boundary for v in self.values if not math.isnan(v)))

    def agrees(self, outcome: str) -> bool:
        """Whether the fits bear out the main fit's ``outcome``: at least half of the fits made put the estimate on
        its side of the boundary (the sign, not the significance: a fit's own interval has the power of one fit)."""
        if outcome not in (HOLDS, FAILS):
            return True
        above, below = self.sides()
        return 2 * (above if outcome == HOLDS else below) >= self.made > 0

    def describe(self, digits: int) -> str:
        known = [v for v in self.values if not math.isnan(v)]
        spread = f"{min(known):+.{digits}f} to {max(known):+.{digits}f}" if known else "none measured"
        above, below = self.sides()
        left = self.made - len(self.values)
        other = (f"; {left} fit{'s' if left > 1 else ''} whose own profiles named the clusters otherwise left out "
                 "(counted against)") if left else ""
        return (f"under {self.made} bootstrap fits of the clusters: the estimate {spread}, on the claim's side of "
                f"{self.boundary:+.4g} in {above}, on the other in {below}; holds in {self.holds}{other}")

    @classmethod
    def from_json(cls, found: dict, boundary: float) -> RefitSpread:
        """The spread ``as_json`` wrote (a seed's evidence, read again when the seeds are pooled)."""
        return cls(list(found["values"]), list(found["verdicts"]), boundary, int(found["fits"]))

    def as_json(self) -> dict:
        above, below = self.sides()
        return {"fits": self.made, "same_types": len(self.values), "holds": self.holds, "claim_side": above,
                "other_side": below, "values": self.values, "verdicts": self.verdicts}


UNMEASURED = ("the clustering's bootstrap fits were not measured (the refits stage did not run, or "
              "cluster.bootstrap_fits is 0): the verdict rests on one labelling of the heads")


def fits_of(files: StudyFiles, model: str) -> tuple[list[dict[str, RefitPlan]], int]:
    """(the plans of each bootstrap fit of the same types of ``model``'s clusters, the fits made); ``([], 0)``
    without a refits stage or fits, or when ``clusters.json`` names other types than its ``refits.json``."""
    clusters = files.job("cluster", model)
    if clusters is None or not files.jobs("refits") or not (clusters / "refits.json").is_file():
        return [], 0
    found = read_json(clusters / "refits.json", "bootstrap fits")
    if found.get("names") != read_json(clusters / "clusters.json", "clusters").get("names"):
        return [], 0  # clusters.json renamed by hand since: its fits are of other types
    return refit_plans(found), int(found.get("bootstrap_fits", len(found.get("refits", []))))


def ordering_spread(files: StudyFiles, model: str, kept: str, removed: str, level: Resampling) -> RefitSpread | None:
    """``metric(kept) - metric(removed) > 0`` under each fit, its paired CI at ``level``; None without fits."""
    fits, made = fits_of(files, model)
    if not made:
        return None
    values, verdicts = [], []
    for fit in fits:
        jobs = [files.job("refits", model, fit[plan].folder) if plan in fit else None for plan in (kept, removed)]
        if None in jobs:
            values.append(math.nan)
            verdicts.append(NOT_TESTED)
            continue
        result = paired_tests(files.metric, [files.records(jobs[0])], files.records(jobs[1]), level,
                              names=[kept])[0]
        values.append(float(result.delta))
        verdicts.append(verdict(result.ci_low, result.ci_high, 0.0))
    return RefitSpread(values, verdicts, 0.0, made)


def cost_spread(files: StudyFiles, model: str, plan: str, boundary: float, level: Resampling) -> RefitSpread | None:
    """``(plan - baseline) / (baseline - chance)`` above ``boundary`` under each fit, its CI at ``level``; None
    without fits."""
    (fits, made), base = fits_of(files, model), files.job("refits", model, "baseline")
    if not made or base is None:
        return None
    baseline = files.records(base)
    golds = files.gold_answers(list(baseline["id"])) if "exact_match" in baseline else None
    chance = chance_level(files.metric, baseline, golds, files.version)
    values, verdicts = [], []
    for fit in fits:
        job = files.job("refits", model, fit[plan].folder) if plan in fit else None
        if job is None or chance is None:
            values.append(math.nan)
            verdicts.append(NOT_TESTED)
            continue
        value, low, high = headroom_interval(files.metric, files.records(job), baseline, chance[0], level)
        values.append(float(value))
        verdicts.append(verdict(low, high, boundary))
    return RefitSpread(values, verdicts, boundary, made)


def gated(spread: RefitSpread | None, outcome: str, notes: list[str], values: dict, digits: int) -> str:
    """``outcome`` once the claim's ``spread`` across the fits is known: stated in ``notes`` and ``values``; a verdict
    of the main fit that fewer than half of the bootstrap fits bear out (``RefitSpread.agrees``) is inconclusive."""
    if spread is None:
        if outcome in (HOLDS, FAILS):
            notes.append(UNMEASURED)
        return outcome
    notes.append(spread.describe(digits))
    values["refits"] = spread.as_json()
    if not spread.agrees(outcome):
        notes.append(f"it {outcome} under the main fit of the clusters, but fewer than half of the {spread.made} "
                     "bootstrap fits put the estimate on that side: it rests on one labelling of the heads")
        return INCONCLUSIVE
    return outcome
