"""How a Table 2 claim fares when the heads are clustered again on bootstrap resamples of the text (``refits``).

Each fit's type plans ran in the refits stage (``headlab.study.refit_plans``); under each fit the claim's quantity
gets the same interval as under the main fit (an ordering's paired CI, a cost's headroom CI, at the family's level)
and the verdict of that interval. The finding states the spread. A claim that holds under the main fit but under
fewer than half of the bootstrap fits rests on one labelling of the heads: it is inconclusive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headlab.files import read_json
from headlab.reporting.statistics import Resampling, paired_tests
from headlab.reporting.value_intervals import headroom_interval
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import HOLDS, INCONCLUSIVE, NOT_TESTED, verdict
from headlab.study.refit_plans import RefitPlan, refit_plans
from headlab.tasks.chance import chance_level


@dataclass(frozen=True)
class RefitSpread:
    """A claim's quantity and verdict under each bootstrap fit (NaN and ``not tested`` where a fit gave one of its
    types no heads, or its job did not run)."""

    values: list[float]
    verdicts: list[str]

    @property
    def holds(self) -> int:
        return self.verdicts.count(HOLDS)

    def enough(self) -> bool:
        """Holds under at least half of the fits."""
        return 2 * self.holds >= len(self.verdicts)

    def describe(self, digits: int) -> str:
        known = [v for v in self.values if not math.isnan(v)]
        spread = (f"{min(known):+.{digits}f} to {max(known):+.{digits}f}" if known else "none measured")
        return (f"under {len(self.values)} bootstrap fits of the clusters: holds in {self.holds}, the estimate "
                f"{spread}")

    def as_json(self) -> dict:
        return {"fits": len(self.values), "holds": self.holds, "values": self.values, "verdicts": self.verdicts}


def fits_of(files: StudyFiles, model: str) -> list[dict[str, RefitPlan]]:
    """The bootstrap fits' plans of ``model``'s clusters; ``[]`` without a refits stage or fits."""
    clusters = files.job("cluster", model)
    if clusters is None or not files.jobs("refits"):
        return []
    return refit_plans(read_json(clusters / "clusters.json", "clusters"))


def ordering_spread(files: StudyFiles, model: str, kept: str, removed: str, level: Resampling) -> RefitSpread | None:
    """``metric(kept) - metric(removed) > 0`` under each fit, its paired CI at ``level``; None without fits."""
    fits = fits_of(files, model)
    if not fits:
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
    return RefitSpread(values, verdicts)


def cost_spread(files: StudyFiles, model: str, plan: str, boundary: float, level: Resampling) -> RefitSpread | None:
    """``(plan - baseline) / (baseline - chance)`` above ``boundary`` under each fit, its CI at ``level``; None
    without fits."""
    fits, base = fits_of(files, model), files.job("refits", model, "baseline")
    if not fits or base is None:
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
    return RefitSpread(values, verdicts)


def gated(spread: RefitSpread | None, outcome: str, notes: list[str], values: dict, digits: int) -> str:
    """``outcome`` once the claim's ``spread`` across the fits is known: stated in ``notes`` and ``values``; a claim
    that holds under the main fit but under fewer than half of the bootstrap fits is inconclusive."""
    if spread is None:
        return outcome
    notes.append(spread.describe(digits))
    values["refits"] = spread.as_json()
    if outcome == HOLDS and not spread.enough():
        notes.append(f"it holds under the main fit of the clusters but under only {spread.holds} of "
                     f"{len(spread.verdicts)} bootstrap fits: it rests on one labelling of the heads")
        return INCONCLUSIVE
    return outcome
