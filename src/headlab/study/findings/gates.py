"""The claims the gates stage tests (``gates/l0``, ``gates/chg``, ``gates/optimal`` per model; docs/gates.md).

* Voita et al. 2019: most heads can be pruned at a small cost. Among the L0 penalties that prune more than half of
  the heads, the claim holds when one of them keeps the main metric within ``study.findings.margin`` of the full
  model's (the lower end of its paired CI above ``-margin``: an equivalence-side test of "no loss"). It does not hold
  when every one of them costs more (upper end below ``-margin``) and the one pruning the fewest heads prunes at most
  ``NEAR_HALF`` of them: a grid that jumps from half the heads to most of them says nothing of the heads between.
  The intervals are recomputed from the job's records at Bonferroni's level over those penalties (the best of
  several is chosen).
* Nam et al. 2025 (causal head gating): the heads it calls irrelevant can be removed together at no cost, as its
  ablations checked; the same test on the job's ``prune_irrelevant`` plan. A "no loss" holds only for a class that
  is one: at least ``MIN_IRRELEVANT`` of the heads, and, over at least two fits, at least ``MIN_STABLE`` of its heads
  irrelevant in every fit; else inconclusive. A loss does not hold whatever the class's size, but only for a class
  reproduced over two or more fits.
* Li & Janson 2024: optimal ablation's gap is below mean ablation's, on data the constants were not fit on. A head is
  shown below (above) when its paired difference (optimal - mean loss) has its Holm-adjusted p-value below alpha and
  its CI below (above) 0. The claim does not hold when some head is shown above; holds when none is and more than
  half are shown below (a universal is never proved: the heads left undecided moved too little to tell);
  inconclusive otherwise. A head that Holm rejects only with the raw p-values moved ``MONTE_CARLO`` Monte Carlo
  standard errors down, not up, is undecided (``holm_decisions``; it keeps "holds" away when its CI lies above 0);
  so are all heads when the permutations are too few for one at the least p a permutation test gives to pass Holm's
  correction (``holm_floor``).
* A "no loss" of a plan that changed fewer than ``RARE_CHANGES`` units' predictions has its lower end bounded by
  what more units could hide (``rare_change_bound``).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import scipy.stats

from headlab.reporting.statistics import PairedResult, Resampling, adjust_p_values, paired_tests
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    MONTE_CARLO,
    NOT_TESTED,
    Claim,
    Evidence,
    Finding,
    family_resampling,
    interval,
    monte_carlo_error,
    not_tested,
    unchanged_bound,
)

VOITA = Claim("voita_most_heads_pruned", "Most heads can be pruned at a small cost: L0 gates close more than half of "
              "them with the score within the margin of the full model's", "Voita et al. 2019, pruning by L0 gates",
              ablation=True)
CHG = Claim("chg_irrelevant_removable", "The heads causal head gating calls irrelevant can be removed together at no "
            "cost", "Nam et al. 2025, causal head gating (its ablations)", ablation=True)
LI_JANSON = Claim("li_janson_optimal_below_mean", "Optimal ablation's gap is below mean ablation's on held-out data: "
                  "more than half of the heads shown below, none above", "Li & Janson 2024, optimal ablation",
                  ablation=True)
NEAR_HALF = 0.6  # a failing penalty that prunes at most this share of the heads stands for "just over half"
MIN_IRRELEVANT = 0.1  # the share of the heads an irrelevant class needs for its "no loss" to say more than Michel's
RARE_CHANGES = 10  # fewer changed units than this: the bootstrap cannot bound what more units could hide
MIN_STABLE = 0.8  # the share of the irrelevant heads irrelevant in every fit for the class to be reproducible


def gates_findings(files: StudyFiles) -> list[Finding]:
    return [most_heads_pruned(files), irrelevant_removable(files), optimal_below_mean(files)]


def no_loss(test: PairedResult, changed: int, confidence: float, margin: float, scale: float) -> tuple[str, float]:
    """"No loss" within ``margin`` and the interval's lower end it was judged by: holds when that end is above
    ``-margin``, fails when the upper end is below it. When fewer than ``RARE_CHANGES`` units changed their
    prediction (``changed``), the bootstrap sees too few changes to bound how many more those units could hide: the
    lower end is at most the change less the loss of the further share of units Clopper-Pearson allows to have
    changed unseen, each losing the whole ``scale`` (``rare_change_bound``; with none changed, a zero-width interval,
    the bound Michel's single-head finding uses)."""
    low = test.ci_low
    if changed < RARE_CHANGES:
        low = min(low, test.delta - rare_change_bound(changed, test.units, confidence, scale))
    return (HOLDS if low > -margin else FAILS if test.ci_high < -margin else INCONCLUSIVE), low


def rare_change_bound(changed: int, units: int, confidence: float, scale: float) -> float:
    """``scale`` times the share of ``units`` beyond the ``changed`` seen that could have changed: the one-sided
    Clopper-Pearson upper bound of ``changed / units`` at the interval's lower tail, less ``changed / units``
    (``unchanged_bound`` when none changed)."""
    if changed == 0:
        return unchanged_bound(units, confidence, scale)
    upper = float(scipy.stats.beta.ppf(1 - (1 - confidence) / 2, changed + 1, units - changed)) \
        if changed < units else 1.0
    return scale * (upper - changed / units)


def changed_units(run: pd.DataFrame, baseline: pd.DataFrame) -> int:
    """The sampled units (the records' clusters, else their examples) with an example whose prediction the plan
    changed; the records are the same examples in the same order."""
    changed = np.asarray(run["prediction"]).astype(str) != np.asarray(baseline["prediction"]).astype(str)
    units = np.asarray(run["cluster"]).astype(str) if "cluster" in run else np.arange(len(run))
    return len(set(units[changed]))


def most_heads_pruned(files: StudyFiles) -> Finding:
    evidence, margin = [], files.points(files.margin)
    for model, job in files.model_jobs("gates", [f"l0/{m}" for m in files.models]):
        table = pd.read_csv(job / "gates.csv")
        rows = table[table["split"] == files.split].sort_values("heads_pruned", kind="stable")
        name, link = model.removeprefix("l0/"), files.link(job / "gates.csv")
        if rows.empty:
            evidence.append(Evidence(name, NOT_TESTED, "", link, note=f"the job scored no {files.split} examples"))
            continue
        total = int(rows["heads_kept"].iloc[0] + rows["heads_pruned"].iloc[0])
        many = rows[rows["heads_pruned"] > total / 2]
        if many.empty:
            most = int(rows["heads_pruned"].max())
            pruned = f"at most {most} of {total} heads pruned" if most else f"no penalty pruned a head (of {total})"
            evidence.append(Evidence(name, NOT_TESTED, pruned, link, note=(
                "no penalty closed more than half of the heads: add larger ones (gates.lambdas)")))
            continue
        tests, changed, level = _simultaneous(files, job, list(many["lambda"]))
        judged = [no_loss(t, k, level.confidence, margin, files.scale) for t, k in zip(tests, changed)]
        outcomes = [outcome for outcome, _ in judged]
        fewest = int(many["heads_pruned"].iloc[0])
        note = ""
        if HOLDS in outcomes:  # the holding penalty that prunes the most heads
            best, outcome = max(i for i, o in enumerate(outcomes) if o == HOLDS), HOLDS
        else:  # the penalty nearest half the heads decides a loss
            best = 0
            outcome = FAILS if all(o == FAILS for o in outcomes) else INCONCLUSIVE
            if outcome == FAILS and fewest > NEAR_HALF * total:
                outcome = INCONCLUSIVE
                note = _grid_note(rows, total, fewest)
        test, row, low, few = tests[best], many.iloc[best], judged[best][1], changed[best]
        numbers = (f"lambda {row['lambda']:g}: {int(row['heads_pruned'])} of {total} heads pruned, {files.metric} "
                   f"change {interval(test.delta, low, test.ci_high, 4)}{_rare(few, test.units)} ({len(tests)} "
                   f"penalties prune more than half: intervals simultaneous over them); boundary -{margin:g}")
        evidence.append(Evidence(name, outcome, numbers, link, {
            "value": test.delta, "low": low, "high": test.ci_high, "boundary": -margin,
            "lambda": float(row["lambda"]), "heads_pruned": int(row["heads_pruned"]), "heads": total}, note=note))
    return Finding(VOITA, tuple(evidence)) if evidence else not_tested(VOITA, files.absent("gates"))


def _grid_note(rows: pd.DataFrame, total: int, fewest: int) -> str:
    """Why a loss at every penalty past half the heads does not refute the claim: the grid skipped the heads between
    half and ``fewest``; the penalty to add (between the largest pruning at most half and the smallest past it)."""
    below = rows[rows["heads_pruned"] <= total / 2]
    above = rows[rows["heads_pruned"] == fewest]["lambda"].min()
    if below.empty:
        add = f"a penalty below {above:g}"
    else:
        low = below["lambda"].max()
        add = f"a penalty between {low:g} and {above:g} (e.g. {float(np.sqrt(low * above)):.3g})"
    return (f"every penalty past half the heads costs more than the margin, but the fewest it prunes is {fewest} of "
            f"{total} (over {NEAR_HALF:.0%}): pruning just over half was not tried; add {add} to gates.lambdas")


def _rare(changed: int, units: int) -> str:
    return (f" ({changed} of {units} units changed a prediction: the lower end bounds what that many could hide)"
            if changed < RARE_CHANGES else "")


def _simultaneous(files: StudyFiles, job, penalties: list[float], column: str = "penalty"
                  ) -> tuple[list[PairedResult], list[int], Resampling]:
    """The paired tests of the plans ``penalties`` (the records' ``column``; the baseline's is empty) from the job's
    records at the gates stage's report settings, each at Bonferroni's level over them with resamples enough for
    its tails (``family_resampling``); the units each plan changed (``changed_units``); and that level."""
    records = pd.read_parquet(job / "records.parquet")
    baseline = records[records[column].isna()].drop(columns=[column]).reset_index(drop=True)
    runs = [records[records[column] == p].drop(columns=[column]).reset_index(drop=True) for p in penalties]
    level = family_resampling(files.reports.get("gates", (files.resampling, ""))[0], len(penalties))
    return (paired_tests(files.metric, runs, baseline, level), [changed_units(r, baseline) for r in runs], level)


def irrelevant_removable(files: StudyFiles) -> Finding:
    evidence, margin = [], files.points(files.margin)
    for model, job in files.model_jobs("gates", [f"chg/{m}" for m in files.models]):
        record = json.loads((job / "chg.json").read_text())
        counts, total = record["classes"], sum(record["classes"].values())
        name, link = model.removeprefix("chg/"), files.link(job / "chg.csv" if (job / "chg.csv").is_file() else
                                                                 job / "chg.json")
        fits, stable = len(record.get("fits") or []), _irrelevant_stability(job)
        share = (f"{counts['irrelevant']} of {total} heads irrelevant, {counts['facilitating']} facilitating, "
                 f"{counts['interfering']} interfering; {record['stability']:.1%} of the heads in the same class in "
                 f"every fit ({fits} fits; of the irrelevant ones {stable:.1%})")
        rows = [r for r in record.get("pruned") or [] if r["plan"] == "prune_irrelevant" and r["split"] == files.split]
        if not rows:
            evidence.append(Evidence(name, NOT_TESTED, share, link, note="no head was called irrelevant"))
            continue
        if not (job / "records.parquet").is_file():  # a job of before the records were written
            evidence.append(Evidence(name, NOT_TESTED, share, link, note=(
                "the job has no per-example records (records.parquet): run it again")))
            continue
        (test,), (changed,), level = _simultaneous(files, job, ["prune_irrelevant"], column="plan")
        outcome, low = no_loss(test, changed, level.confidence, margin, files.scale)
        note = ""
        if outcome != INCONCLUSIVE:  # a class too small says nothing of a "no loss"; one not reproducible, of either
            note = _class_note(counts["irrelevant"], total, fits, stable, holds=outcome == HOLDS)
            outcome = INCONCLUSIVE if note else outcome
        numbers = (f"{share}; pruning the irrelevant ones: {files.metric} change "
                   f"{interval(test.delta, low, test.ci_high, 4)}{_rare(changed, test.units)}; boundary -{margin:g}")
        evidence.append(Evidence(name, outcome, numbers, link, {
            "value": test.delta, "low": low, "high": test.ci_high, "boundary": -margin,
            "irrelevant": counts["irrelevant"], "heads": total, "stability": record["stability"], "fits": fits,
            "irrelevant_stability": stable}, note=note))
    return Finding(CHG, tuple(evidence)) if evidence else not_tested(CHG, files.absent("gates"))


def _irrelevant_stability(job) -> float:
    """The share of the heads classed irrelevant (from the fits' mean gates) that every fit called irrelevant."""
    heads = pd.read_csv(job / "heads.csv")
    irrelevant = heads[heads["class"] == "irrelevant"]
    return float(irrelevant["stable"].astype(bool).mean()) if len(irrelevant) else float("nan")


def _class_note(irrelevant: int, total: int, fits: int, stable: float, holds: bool) -> str:
    """Why the irrelevant heads' "no loss" (``holds``) or loss decides nothing; empty when it decides."""
    if holds and irrelevant < MIN_IRRELEVANT * total:
        return (f"only {irrelevant} of {total} heads were called irrelevant (fewer than {MIN_IRRELEVANT:.0%}): "
                "removing so few at no cost shows no more than single-head removals do")
    if fits < 2:
        return "one fit: whether the irrelevant class comes out again is not measured (gates.chg_fits >= 2)"
    if not stable >= MIN_STABLE:  # NaN (no irrelevant head in heads.csv) is not reproducible either
        return (f"only {stable:.0%} of the irrelevant heads were irrelevant in every fit (fewer than "
                f"{MIN_STABLE:.0%}): the class is not reproducible; more steps (gates.max_steps) or fits")
    return ""


def optimal_below_mean(files: StudyFiles) -> Finding:
    evidence = []
    permutations = files.reports.get("gates", (files.resampling, ""))[0].permutations
    for model, job in files.model_jobs("gates", [f"optimal/{m}" for m in files.models]):
        table = pd.read_csv(job / "heads.csv")
        rows = table[table["split"] == files.split]
        name, link, heads = model.removeprefix("optimal/"), files.link(job / "heads.csv"), len(rows)
        if not heads:
            evidence.append(Evidence(name, NOT_TESTED, "", link, note=f"the job scored no {files.split} examples"))
            continue
        # Holm across the heads whatever report.correction the job used (the rule is stated with Holm's); a head is
        # decided only when its CI agrees with its p-value and that p-value is clear of alpha's Monte Carlo error
        significant, near = holm_decisions(rows["p_value"].to_numpy(), permutations, files.alpha)
        below = int((significant & (rows["ci_high"] < 0).to_numpy()).sum())
        above = int((significant & (rows["ci_low"] > 0).to_numpy()).sum())
        near_above = int((near & (rows["ci_low"] > 0).to_numpy()).sum())  # could be shown above with more draws
        outcome = FAILS if above else HOLDS if below > heads / 2 and not near_above else INCONCLUSIVE
        floor = holm_floor(heads, permutations)
        if floor >= files.alpha:
            outcome = INCONCLUSIVE
        numbers = (f"{below} of {heads} heads' optimal gap shown below the mean gap (Holm-adjusted p < "
                   f"{files.alpha:g}, CI below 0), {above} above, {heads - below - above} undecided"
                   f"{f' ({int(near.sum())} with p within Monte Carlo error of alpha)' if near.any() else ''}; "
                   f"median difference {np.median(rows['difference']):+.4g} (loss); boundary: more than half below, "
                   "none above")
        note = "" if outcome != INCONCLUSIVE else _undecided_heads(heads, below, near_above, floor, permutations,
                                                                    files.alpha)
        evidence.append(Evidence(name, outcome, numbers, link, {
            "value": below / heads, "below": below, "above": above, "near_alpha": int(near.sum()), "heads": heads,
            "boundary": 0.5}, note=note))
    return Finding(LI_JANSON, tuple(evidence)) if evidence else not_tested(LI_JANSON, files.absent("gates"))


def holm_decisions(raw: np.ndarray, permutations: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Which tests Holm's correction rejects at ``alpha`` whatever their Monte Carlo error, and which it may or may
    not: Holm run on every raw p moved ``MONTE_CARLO`` standard errors up, and again moved down (a head's adjusted
    p may be another head's, whose error is then the one that counts). Significant: rejected even moved up; near:
    rejected only moved down."""
    error = np.array([monte_carlo_error(q, permutations) for q in raw])
    high = adjust_p_values(np.clip(raw + MONTE_CARLO * error, 0.0, 1.0), "holm")
    low = adjust_p_values(np.clip(raw - MONTE_CARLO * error, 0.0, 1.0), "holm")
    return high < alpha, (low < alpha) & (high >= alpha)


def holm_floor(heads: int, permutations: int) -> float:
    """The least Holm-adjusted two-sided permutation p of ``heads`` tests, each of ``permutations`` random swaps
    (``2 / (permutations + 1)`` times ``heads``), plus ``MONTE_CARLO`` of its Monte Carlo standard errors: no head
    is decided unless this is below alpha."""
    raw = 2 / (permutations + 1)
    adjusted = min(1.0, heads * raw)
    return adjusted + MONTE_CARLO * monte_carlo_error(adjusted, permutations, raw)


def permutations_needed(heads: int, alpha: float) -> int:
    """The fewest permutations (to within 1%) at which ``holm_floor`` of ``heads`` tests is below ``alpha``."""
    needed = math.ceil(heads * (2 + MONTE_CARLO * math.sqrt(2)) / alpha)  # the floor's terms at large counts
    while holm_floor(heads, needed) >= alpha:
        needed = math.ceil(needed * 1.01)
    return needed


def _undecided_heads(heads: int, below: int, near_above: int, floor: float, permutations: int, alpha: float) -> str:
    """Why Li & Janson's claim is inconclusive: too few permutations for Holm, a head that may be above, or heads
    whose differences moved too little."""
    if floor >= alpha:
        return (f"with {permutations} permutations no head of {heads} can be shown either way after Holm's "
                f"correction (the least adjusted p, {MONTE_CARLO} Monte Carlo standard errors above it, is "
                f"{floor:.3g}): give at least {permutations_needed(heads, alpha)} (study.gates.report.permutations)")
    if near_above:
        return (f"{near_above} heads' gaps lie above the mean's with a p-value within {MONTE_CARLO} Monte Carlo "
                f"standard errors of {alpha:g}: more permutations (study.gates.report.permutations) decide them")
    return (f"{heads - below} heads' differences were not shown below 0: their gaps moved too little on these "
            "examples to tell (more eval examples, or gates.max_steps for the constants)")
