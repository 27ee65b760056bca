"""How a number becomes a verdict, and what a finding holds.

The rule (docs/study.md, "How a claim gets its verdict"): each claim is a quantity on one side of a boundary
(``pruned vertical - pruned diagonal > 0``, ``stability > 0.95``). With the quantity's interval ``[low, high]``
(a CI, or the range of random orders, or the point itself for an exact count):

- **holds** when the whole interval lies strictly on the claim's side of the boundary;
- **does not hold** when the whole interval lies strictly on the other side;
- **inconclusive** when the interval contains the boundary (touching it counts) or is undefined (NaN).

A difference of scores also has a permutation p-value (of no difference): when the interval and the p-value
disagree about excluding 0 (the interval excludes it but ``p >= 1 - confidence``, or the other way), the verdict is
**inconclusive**, with the reason. A claim no stage of the study measured is **not tested**, with the reason; so is
every ablation claim (``Claim.ablation``) of a model at its floor or ceiling (``limits``), a claim about a named type
whose centroid falls short of the paper's description (``guan.misnamed``), and every claim of a smoke
run (``study.smoke``: ``not tested (quick run)``). With several models (fine-tuning seeds, or the pre-trained model
beside them) each gets its own verdict; the finding counts the ones that agree.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

RULE = (
    "**How a claim gets its verdict.** Each claim is a quantity on one side of a boundary (a paired difference of the"
    " main metric between two plans above 0, a stability above 0.95, ...), with an interval: a paired bootstrap CI "
    "(the tables' report settings) for differences of scores, a Wilson interval for a share of heads, Newcombe's for "
    "a difference of two shares, the conditional-MLE CI for an odds ratio, the range of the random orders for the "
    "prune curve, the point itself for a count (heads, layers). **holds**: the whole interval lies strictly on the "
    "claim's side of the boundary; **does not hold**: it lies strictly on the other side; **inconclusive**: it "
    "contains or touches the boundary (or is undefined). **not tested**: no stage of this study measured it, with the"
    " reason. With several models (seeds, or the pre-trained model beside them) each gets its verdict and the finding"
    " counts those that agree (`mixed` when they differ). Boundaries in points are of a 0-100 score (a GLUE metric in"
    " [0, 1] scales them by 1/100). The intervals are per claim, not adjusted for the number of claims. A difference "
    "against the unablated model reads its row of the table (the same CI and p-value, computed once); a difference "
    "between two plans is computed with the tables' resamples, seed and method. Beside each difference of scores is "
    "its permutation p-value of no difference: when the CI and p disagree about excluding 0 (the CI excludes 0 but p "
    ">= 1 - its confidence, or the other way round), the verdict is **inconclusive**, with the reason. A study's CIs "
    "and p-values come from at least 2000 bootstrap resamples and 2000 permutations (fewer is an error before any "
    "stage runs): a 95% CI's end is the 2.5% quantile of the resamples, whose tail probability has Monte Carlo "
    "standard error sqrt(0.025 x 0.975 / B), 0.0035 at 2000 (a seventh of the tail) and 0.011 at 200 (almost half). "
    "**Floor and ceiling.** A fine-tuned model is at its floor when the bootstrap CI of its unablated main metric on "
    "the tables' examples (in a study that ran no tables, the single-head sweep's baseline examples; the tables' "
    "resamples, seed and method) reaches chance (its low end at or below it), at its ceiling when it reaches the "
    "maximum (its high end at 100, or 1 for a GLUE metric). Chance is what a model that learned nothing scores: the "
    "accuracy of the majority class of the evaluated labels; a GLUE F1 of the better constant answer (all 1: 2p / (1 "
    "+ p)); SQuAD's exact match and F1 of the best constant answer over the evaluated questions (the empty answer, "
    "each gold answer or one of its words, scored by the official script); Matthews, Pearson and Spearman 0; a loss "
    "has no floor or ceiling and is not checked. The ablation claims (Tables 2 and 3, single heads, the prune curve: "
    "what removing heads costs the fine-tuned model) of a model at its floor or ceiling are **not tested**, with the "
    "reason (its heads have nothing to lose, or its drops cannot show), and so are those of a model with neither "
    "baseline in the run (nothing says it learned its task); the claim about what fine-tuning changed in the head "
    "types is not tested for a model at its floor (it learned nothing); the robustness section draws no conclusion "
    "for such a model (its tables stay; a smoke run's orderings are stated, to check the chain); the other claims "
    "(head types, syntax, roles: of the attention, not of the score) keep their verdicts. A claim about a named type "
    "is **not tested** on a model whose centroid of that type falls short of Guan et al.'s description of it (the "
    "profile rule named it, but e.g. its dense_vertical heads attend to long range less than its diagonal ones: the "
    "claim would be about other heads than the paper's). The prune curve's claim reads the split the curve was pruned"
    " by. A smoke run (`study=quick`, or `study.smoke=true`) checks the chain, not the science: every claim reads "
    "**not tested (quick run)**."
)
HOLDS, FAILS, INCONCLUSIVE, NOT_TESTED = "holds", "does not hold", "inconclusive", "not tested"
QUICK = "quick run"  # the reason of every claim of a smoke run
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


def checked_verdict(low: float, high: float, boundary: float, p: float, level: float,
                   above: bool = True) -> tuple[str, str]:
    """``(verdict, why it is inconclusive)`` of a difference with its CI at ``level`` and its permutation ``p`` (of
    no difference): ``verdict``'s, unless the CI and p disagree about excluding 0, then inconclusive with the
    reason."""
    found = verdict(low, high, boundary, above)
    if math.isnan(p) or found == INCONCLUSIVE:
        return found, ""
    excludes, significant = low > 0 or high < 0, p < 1 - level
    if excludes == significant:
        return found, ""
    ci = f"the {level:.0%} CI {'excludes' if excludes else 'contains'} 0"
    return INCONCLUSIVE, (f"{ci} while the permutation p = {p:.3g} is {'not ' if excludes else ''}below "
                          f"{1 - level:.2g}: they disagree about a difference from 0, so the interval is not trusted")


@dataclass(frozen=True)
class Claim:
    """A claim of the seeds: its sentence and where the paper makes it."""

    key: str  # study.json's key: "guan_table2_diagonal_vs_vertical_prune"
    text: str  # "Pruning diagonal heads costs more than pruning vertical heads"
    source: str  # "Guan et al. 2020, Table 2 (rows 3, 5)"
    ablation: bool = False  # about what removing heads costs a fine-tuned model: no verdict at a floor or ceiling
    learned: bool = False  # about what fine-tuning changed: no verdict from a model that learned nothing (its floor)


@dataclass(frozen=True)
class Evidence:
    """One model's numbers for a claim and their verdict."""

    model: str  # "seed0", "pretrained"
    verdict: str
    numbers: str  # "f1 +63.45 [+58.84, +67.78] (pruned vertical - pruned diagonal; boundary 0)"
    file: str  # the stage file, relative to the study folder
    values: dict = field(default_factory=dict)  # for study.json: value, low, high, boundary, ...
    note: str = ""  # why the verdict is inconclusive or not tested when the numbers alone do not say


@dataclass(frozen=True)
class Finding:
    """A claim with its evidence per model (none: ``reason`` says why it was not tested)."""

    claim: Claim
    evidence: tuple[Evidence, ...] = ()
    reason: str = ""  # why not tested (with evidence: why none of it gets a verdict)

    @property
    def verdict(self) -> str:
        """The models' common verdict; ``mixed`` when they differ."""
        found = {e.verdict for e in self.evidence}
        if not found:
            return NOT_TESTED
        return found.pop() if len(found) == 1 else "mixed"

    def counted(self) -> str:
        """``holds (2 of 2 models)``, ``mixed: holds in 2 of 3 seeds, inconclusive in 1``."""
        if not self.evidence or (self.reason and self.verdict == NOT_TESTED):
            return f"{NOT_TESTED} ({self.reason})" if self.reason.startswith(QUICK) else f"{NOT_TESTED}: {self.reason}"
        names = [e.model for e in self.evidence]
        unit = "seeds" if all(name.startswith("seed") for name in names) else "models"
        counts = Counter(e.verdict for e in self.evidence)
        if len(counts) == 1:
            return self.verdict if len(names) == 1 else f"{self.verdict} ({len(names)} of {len(names)} {unit})"
        parts = [f"{v} in {n}" for v, n in counts.most_common()]
        return f"mixed: {parts[0]} of {len(names)} {unit}, " + ", ".join(parts[1:])

    def as_json(self) -> dict:
        return {"claim": self.claim.text, "source": self.claim.source, "verdict": self.verdict,
                "summary": self.counted(), "ablation": self.claim.ablation,
                "evidence": [{"model": e.model, "verdict": e.verdict, "numbers": e.numbers, "file": e.file,
                              **({"note": e.note} if e.note else {}), **e.values} for e in self.evidence]}


def not_tested(claim: Claim, reason: str) -> Finding:
    return Finding(claim, (), reason)


def withheld(finding: Finding, reasons: dict[str, str]) -> Finding:
    """``finding`` with the evidence of each model in ``reasons`` (model -> why) not tested, its numbers kept; when
    none keeps a verdict, the finding's reason is theirs."""
    evidence = tuple(replace(e, verdict=NOT_TESTED, note=reasons[e.model]) if e.model in reasons else e
                     for e in finding.evidence)
    if not evidence or any(e.verdict != NOT_TESTED for e in evidence):
        return replace(finding, evidence=evidence)
    return replace(finding, evidence=evidence, reason="; ".join(dict.fromkeys(e.note for e in evidence)))


def quick_run(finding: Finding) -> Finding:
    """``finding`` of a smoke run: ``not tested (quick run)``, its numbers kept (they check the chain)."""
    evidence = tuple(replace(e, verdict=NOT_TESTED, note="") for e in finding.evidence)
    reason = QUICK if evidence or not finding.reason else f"{QUICK}; {finding.reason}"
    return replace(finding, evidence=evidence, reason=reason)


def interval(value: float, low: float, high: float, digits: int = 2, sign: bool = True) -> str:
    """``+63.45 [+58.84, +67.78]`` (``n/a`` for a NaN)."""
    spec = f"{'+' if sign else ''}.{digits}f"
    show = lambda x: "n/a" if math.isnan(x) else ("inf" if math.isinf(x) else format(x, spec))  # noqa: E731
    return f"{show(value)} [{show(low)}, {show(high)}]"
