"""How a number becomes a verdict, and what a finding holds.

The rule (docs/study.md, "How a claim gets its verdict"): each claim is a quantity on one side of a boundary
(``pruned vertical - pruned diagonal > 0``, ``stability > 0.95``). With the quantity's interval ``[low, high]``
(a CI, or the point itself for an exact count):

- **holds** when the whole interval lies strictly on the claim's side of the boundary;
- **does not hold** when the whole interval lies strictly on the other side;
- **inconclusive** when the interval contains the boundary (touching it counts) or is undefined (NaN).

A difference of scores also has a permutation p-value (of no difference): when the interval and the p-value
disagree about excluding 0 (the interval excludes it but ``p >= alpha``, or the other way), or the p-value lies
within ``MONTE_CARLO`` standard errors of alpha, the verdict is **inconclusive**, with the reason; an inconclusive
interval says what would decide it (``undecided_note``). A claim no stage of the study measured is **not tested**,
with the reason; so is every ablation claim (``Claim.ablation``) of a model at its floor or ceiling (``limits``), a
claim about a named type whose centroid falls short of the paper's description (``guan_tables.misnamed``), and
every claim of a smoke run (``study.smoke``: ``not tested (quick run)``). With several models (fine-tuning seeds,
or the pre-trained model beside them) each gets its own verdict; the finding counts the ones that agree.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace

from headlab.reporting.statistics import Resampling

RULE = (
    "**How a claim gets its verdict.** Each claim is one the paper makes (its direction; where the paper bounds "
    "a cost, its bound at the paper's scale): a quantity on one side of a boundary, with an interval. **holds**: "
    "the whole interval lies strictly on the claim's side of the boundary; **does not hold**: it lies strictly "
    "on the other side; **inconclusive**: it contains or touches the boundary (or is undefined), and the finding "
    "then gives the interval's half-width and the number of examples (or clusters of them) at which an effect of "
    "the observed size would be decided. **not tested**: no stage of this study measured it, with the reason. "
    "The quantities: an **ordering** of two plans (Tables 2 and 3: pruning the diagonal heads costs more than "
    "pruning the dense ones) is the paired difference of the main metric on the same examples, with a paired "
    "bootstrap CI and a permutation p-value; each table's orderings are one family (Table 3 with and without "
    "renormalisation counted as separate tries): their p-values are Holm-adjusted across it and their CIs "
    "simultaneous (Bonferroni, 1 - alpha / m each). A Table 2 ordering says the type it removes matters, and a "
    "type's removal costs more the more heads it has: the ordering holds only when that type's removal also costs "
    "more than **random head sets of its size** under the same policy on the same examples (the controls stage, 20 "
    "sets by default): its rank p = (1 + #{random sets costing at least as much}) / (R + 1) at alpha, an exact "
    "test of these examples (fewer than 19 sets cannot decide at 0.05), and the paired bootstrap CI of its excess, "
    "(metric(type removed) - the sets' mean) / baseline, below 0, so that it carries over to other examples; all "
    "the tests must hold, so none is adjusted for the others (nor are a table's few distinct controls adjusted "
    "across each other); the type's percentile among the sets is stated. "
    "**The clustering is a sample too**: the heads are clustered again on bootstrap resamples of the sequences "
    "(the refits stage, `cluster.bootstrap_fits`: 5 fits by default), a fit whose own centroid profiles name its "
    "clusters otherwise left out, Table 2's plans run under each fit's types, and each Table 2 claim gets the "
    "same interval under each fit: its spread is stated, and the main fit's verdict (holds or does not hold) "
    "stands only when at least half of the fits made put the estimate on its side of the boundary (the sign: one "
    "fit alone has the power of one fit), else it rests on one labelling of the heads and is inconclusive. "
    "A **cost the paper bounds** (\"less than 1.5%\") is the change "
    "as a share of the model's headroom above chance, (plan - baseline) / (baseline - chance), with its paired "
    "bootstrap CI (simultaneous over the two bounded costs), against the paper's bound as a share of its own "
    "baseline (its chance is 0; the CI alone decides, the p-value of no change beside it does not test the "
    "bound): a loss in points of another metric, on a model with another margin above "
    "chance, would mean something else. A **\"no loss\" claim** is an equivalence claim: a head is removable when "
    "its CI lies above -margin (`study.findings.margin`, default 1 point of a 0-100 score), costly when it lies "
    "below; the claim holds when the removable heads are more than half and does not hold when the costly ones "
    "are half or more (absence of a significant loss is not evidence of none: at a few examples nothing is "
    "significant). A plan that changed no example has a zero-width bootstrap interval, which proves nothing: its "
    "lower end is then the largest loss still consistent with no change among that many units (Clopper-Pearson: "
    "80 unchanged units at 95% allow 4.5% of them to have changed). The **prune curve** is ranked among R random "
    "orders: p = (1 + #{random >= importance}) / (R + 1), an exact Monte Carlo test of these examples (the "
    "orders are resampled, not the examples), so fewer than 19 orders cannot decide at 0.05; whether it carries "
    "over to other examples is the paired bootstrap CI (by clusters) of the difference between its area (the "
    "mean share of the baseline kept over the steps) and the random orders' mean area, which must lie on the "
    "rank's side of 0 as well. Clark's relations "
    "claim holds when a relation's best head beats its offset (allowing for the choice of head, Holm across "
    "relations) and does not hold when no relation's interval reaches +5 points. A head's syntactic role (Pande) "
    "counts only where its score on the role's arcs is also above what its fixed-offset pattern gives (its mean on "
    "the sentence's other pairs at each arc's offset) by the role's own bar, tau - 1 (a head that attends to the "
    "next word, or barely beyond it, earns none). "
    "Pande's layer count is taken "
    "with the roles corrected across heads (holds if it holds then) and uncorrected (does not hold only if it "
    "fails even then). The stability of the head types is Guan et al.'s procedure (the share of heads labelled "
    "alike in 10 fits on random halves of the heads) run 21 times, its range against 0.94, the low end of Table "
    "1; a difference of two shares of heads gets Newcombe's interval, an odds ratio the conditional-MLE CI, a "
    "count (heads, layers) the point itself. **The unit that was sampled is resampled**: a task that draws its "
    "examples in clusters names them (`task.cluster_field`; `qnli_articles`: a question's two pairs), and the "
    "bootstrap draws, and the permutation test swaps, whole clusters. Beside each difference of scores is its "
    "permutation p-value of no difference, adjusted as its interval is (Bonferroni across an ordering's family; "
    "Holm's, never larger, is stated beside it): when the CI and p disagree about excluding 0, or p lies within 3 "
    "Monte Carlo standard errors (sqrt(p (1 - p) / B) of B permutations, scaled as an adjustment scales p) of "
    "alpha, the verdict is **inconclusive**, with the reason. A plan whose predictions are constant is "
    "**collapsed** (the model answers one class whatever the input), and the claims resting on it say so. With "
    "several fine-tuning seeds, an ordering's verdict is that of the seeds **pooled**: the mean of the seeds' "
    "differences with the union of a hierarchical bootstrap interval (the seeds resampled, then each drawn "
    "seed's clusters of examples) and Student's t over the seeds (a bootstrap of two or three seeds alone is far "
    "too narrow), each seed's own verdict and the seeds' spread beside it, not a vote; the other claims give "
    "each model (seeds, or the pre-trained model beside them) its verdict and count those that agree (`mixed` "
    "when they differ). A study's CIs and p-values come from at least 2000 bootstrap resamples and 2000 "
    "permutations (fewer is an error before any stage runs). **Floor and ceiling.** A fine-tuned model is at its "
    "floor when the bootstrap CI of its unablated main metric on the tables' examples (in a study that ran no "
    "tables, the single-head sweep's baseline examples, else the gates jobs'; the tables' resamples, seed and "
    "method) reaches chance "
    "(its low end at or below it), at its ceiling when it reaches the maximum (its high end at 100, or 1 for a "
    "GLUE metric). Chance is what a model that learned nothing scores: the accuracy of the majority class of the "
    "evaluated labels; a GLUE F1 of the better constant answer (all 1: 2p / (1 + p)); SQuAD's exact match and F1 "
    "of the best constant answer over the evaluated questions (the empty answer, each gold answer or one of its "
    "words, scored by the official script); Matthews, Pearson and Spearman 0; a loss has no floor or ceiling and "
    "is not checked. The ablation claims (Tables 2 and 3, single heads, the prune curve: what removing heads "
    "costs the fine-tuned model) of a model at its floor or ceiling are **not tested**, with the reason (its "
    "heads have nothing to lose, or its drops cannot show), and so are those of a model with neither baseline in "
    "the run (nothing says it learned its task); the claim about what fine-tuning changed in the head types is "
    "not tested for a model at its floor (it learned nothing); the robustness section draws no conclusion for "
    "such a model (its tables stay; a smoke run's orderings are stated, to check the chain); the other claims "
    "(head types, syntax, roles: of the attention, not of the score) keep their verdicts. A claim about a named "
    "type is **not tested** on a model whose centroid of that type falls short of Guan et al.'s description of "
    "it (the profile rule named it, but e.g. its dense_vertical heads attend to long range less than its "
    "diagonal ones: the claim would be about other heads than the paper's). The prune curve's claim reads the "
    "split the curve was pruned by. A smoke run (`study=quick`, or `study.smoke=true`) checks the chain, not the "
    "science: every claim reads **not tested (quick run)**."
)
HOLDS, FAILS, INCONCLUSIVE, NOT_TESTED = "holds", "does not hold", "inconclusive", "not tested"
POOLED = "pooled"  # the evidence of every seed pooled (``headlab.reporting.pooled``): it decides the finding
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


def checked_verdict(low: float, high: float, boundary: float, p: float, alpha: float, permutations: int = 0,
                    raw_p: float = math.nan) -> tuple[str, str]:
    """``(verdict, why it is inconclusive)`` of a difference with its CI and its permutation ``p`` (of no
    difference; adjusted for the claim's family when ``raw_p`` is the unadjusted one): ``verdict``'s, unless the CI
    and ``p < alpha`` disagree about excluding 0, or ``p`` lies within ``MONTE_CARLO`` standard errors of ``alpha``
    (``permutations`` random swaps; 0: exact, no such error): then inconclusive, with the reason."""
    found = verdict(low, high, boundary)
    if math.isnan(p) or found == INCONCLUSIVE:
        return found, ""
    excludes, significant = low > 0 or high < 0, p < alpha
    if excludes != significant:
        ci = f"the CI {'excludes' if excludes else 'contains'} 0"
        return INCONCLUSIVE, (f"{ci} while the permutation p = {p:.3g} is {'not ' if excludes else ''}below "
                              f"{alpha:.2g}: they disagree about a difference from 0, so the interval is not trusted")
    error = monte_carlo_error(p, permutations, raw_p)
    if abs(p - alpha) < MONTE_CARLO * error:
        return INCONCLUSIVE, (f"p = {p:.3g} lies within {MONTE_CARLO} Monte Carlo standard errors ({error:.2g}, "
                              f"{permutations} permutations) of {alpha:.2g}: more permutations decide it")
    return found, ""


MONTE_CARLO = 3  # a p-value this many Monte Carlo standard errors from alpha or closer decides nothing


def monte_carlo_error(p: float, permutations: int, raw_p: float = math.nan) -> float:
    """The standard error of a permutation p-value from ``permutations`` random swaps, ``sqrt(q (1 - q) / B)`` of
    the unadjusted ``q`` (``raw_p``, else ``p``) scaled as the adjustment scaled it; 0 for an exact test."""
    if not permutations:
        return 0.0
    q = p if math.isnan(raw_p) else raw_p
    scale = 1.0 if math.isnan(raw_p) or raw_p <= 0 else p / raw_p
    return scale * math.sqrt(max(q * (1 - q), 1 / permutations) / permutations)


def decided_at(value: float, low: float, high: float, boundary: float, units: int) -> tuple[float, int | None]:
    """``(half-width, units needed)``: the interval's half-width, and the number of sampled units (examples or
    their clusters) at which an interval around ``value`` would just clear ``boundary``, its width shrinking as
    1/sqrt(units); None when the value sits on the boundary (no sample size decides it)."""
    half = (high - low) / 2
    gap = abs(value - boundary)
    if not (math.isfinite(half) and math.isfinite(gap)) or gap == 0 or units <= 0:
        return half, None
    return half, max(units, math.ceil(units * (half / gap) ** 2))


def unchanged_bound(units: int, confidence: float, scale: float) -> float:
    """The largest loss still consistent with no one of ``units`` having changed, where the bootstrap sees none and
    gives a zero-width interval: the share of units that could have changed unseen (Clopper-Pearson, one-sided at
    the interval's lower tail, ``1 - ((1 - confidence) / 2) ** (1 / units)``), each losing the whole ``scale``. 80
    unchanged units at 95% allow 4.5% of them to have changed: a zero-width interval is no proof of no loss."""
    return scale * (1 - ((1 - confidence) / 2) ** (1 / max(units, 1)))


def zero_width(low, high):
    """Whether an interval (or each of arrays of them) has no width: the bootstrap saw no unit change."""
    return high - low <= 0


def family_resampling(resampling: Resampling, size: int) -> Resampling:
    """The settings of one CI of a family of ``size`` simultaneous ones: Bonferroni's ``1 - alpha / size``, with
    resamples enough that each tail of the interval rests on at least ``TAIL_DRAWS`` of them."""
    alpha = (1 - resampling.confidence) / max(size, 1)
    return replace(resampling, confidence=1 - alpha,
                   resamples=max(resampling.resamples, math.ceil(2 * TAIL_DRAWS / alpha)))


TAIL_DRAWS = 50  # bootstrap resamples beyond each end of an interval, at the least


def unit_name(units: int, examples: int) -> str:
    """What a statistic resampled: ``examples``, or ``clusters of examples`` (a question's pairs)."""
    return "examples" if units == examples else "clusters of examples"


def undecided_note(value: float, low: float, high: float, boundary: float, units: int, unit: str,
                   digits: int = 2) -> tuple[str, dict]:
    """What an inconclusive interval would need: its half-width and ``decided_at``'s sample size, as a note and as
    study.json's values."""
    half, needed = decided_at(value, low, high, boundary, units)
    if needed is None:
        return (f"half-width {half:.{digits}f}; the estimate sits on the boundary, so no number of {unit} decides it",
                {"half_width": half, "needed": None})
    return (f"half-width {half:.{digits}f}; an effect of this size would be decided at about {needed:,} {unit} "
            f"(this run: {units:,})", {"half_width": half, "needed": needed})


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
    def pooled(self) -> Evidence | None:
        """The evidence pooled over the seeds (``POOLED``), which decides the finding; None without one, or when it
        is withheld (a seed at its floor: the seeds are then counted)."""
        return next((e for e in self.evidence if e.model == POOLED and e.verdict != NOT_TESTED), None)

    @property
    def verdict(self) -> str:
        """The pooled verdict where the seeds were pooled, else the models' common verdict (``mixed`` when they
        differ)."""
        if self.pooled is not None:
            return self.pooled.verdict
        found = {e.verdict for e in self.evidence if e.model != POOLED}
        if not found:
            return NOT_TESTED
        return found.pop() if len(found) == 1 else "mixed"

    def counted(self) -> str:
        """``holds (2 of 2 models)``, ``mixed: holds in 2 of 3 seeds, inconclusive in 1``, ``holds (pooled over 3
        seeds; each seed: holds in 2, inconclusive in 1)``."""
        if not self.evidence or (self.reason and self.verdict == NOT_TESTED):
            return f"{NOT_TESTED} ({self.reason})" if self.reason.startswith(QUICK) else f"{NOT_TESTED}: {self.reason}"
        evidence = [e for e in self.evidence if e.model != POOLED]
        names = [e.model for e in evidence]
        unit = "seeds" if all(name.startswith("seed") for name in names) else "models"
        counts = Counter(e.verdict for e in evidence)
        parts = [f"{v} in {n}" for v, n in counts.most_common()]
        if self.pooled is not None:
            return f"{self.verdict} (pooled over {len(names)} {unit}; each: {', '.join(parts)})"
        if len(counts) == 1:
            return self.verdict if len(names) == 1 else f"{self.verdict} ({len(names)} of {len(names)} {unit})"
        return f"mixed: {parts[0]} of {len(names)} {unit}, " + ", ".join(parts[1:])

    def as_json(self) -> dict:
        return {"claim": self.claim.text, "source": self.claim.source, "verdict": self.verdict,
                "summary": self.counted(), "ablation": self.claim.ablation,
                "evidence": [{"model": e.model, "verdict": e.verdict, "numbers": e.numbers, "file": e.file,
                              **({"note": e.note} if e.note else {}), **e.values} for e in self.evidence]}


def not_tested(claim: Claim, reason: str) -> Finding:
    return Finding(claim, (), reason)


def withheld(finding: Finding, reasons: dict[str, str]) -> Finding:
    """``finding`` with the evidence of each model in ``reasons`` (model -> why) not tested, its numbers kept (and
    the pooled evidence when any seed's is); when none keeps a verdict, the finding's reason is theirs."""
    held = [reasons[e.model] for e in finding.evidence if e.model in reasons]
    if held:
        reasons = {**reasons, POOLED: f"a seed's ablation cannot be read, so neither can the seeds pooled: {held[0]}"}
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
