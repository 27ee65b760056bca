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
  inconclusive otherwise, and always when the permutations are too few for any head to pass Holm's correction
  (2 x heads / (permutations + 1) >= alpha).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd

from headlab.reporting.statistics import adjust_p_values, family_level, paired_tests
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_TESTED,
    Claim,
    Evidence,
    Finding,
    interval,
    not_tested,
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
MIN_STABLE = 0.8  # the share of the irrelevant heads irrelevant in every fit for the class to be reproducible


def gates_findings(files: StudyFiles) -> list[Finding]:
    return [most_heads_pruned(files), irrelevant_removable(files), optimal_below_mean(files)]


def no_loss(low: float, high: float, margin: float) -> str:
    """"No loss" within ``margin``: holds when the interval's lower end is above ``-margin``, fails when its upper
    end is below it. A zero-width interval (the plan changed no example's score) shows no loss on these examples
    only, not how large a loss more examples could show: inconclusive, never holds."""
    if low == high and low > -margin:
        return INCONCLUSIVE
    return HOLDS if low > -margin else FAILS if high < -margin else INCONCLUSIVE


def most_heads_pruned(files: StudyFiles) -> Finding:
    evidence, margin = [], files.points(files.margin)
    for model, job in files.model_jobs("gates", [f"l0/{m}" for m in files.models]):
        table = pd.read_csv(job / "gates.csv")
        rows = table[table["split"] == files.split].sort_values("heads_pruned", kind="stable")
        total = int(rows["heads_kept"].iloc[0] + rows["heads_pruned"].iloc[0])
        many = rows[rows["heads_pruned"] > total / 2]
        name, link = model.removeprefix("l0/"), files.link(job / "gates.csv")
        if many.empty:
            most = int(rows["heads_pruned"].max())
            pruned = f"at most {most} of {total} heads pruned" if most else f"no penalty pruned a head (of {total})"
            evidence.append(Evidence(name, NOT_TESTED, pruned, link, note=(
                "no penalty closed more than half of the heads: add larger ones (gates.lambdas)")))
            continue
        tests = _simultaneous(files, job, list(many["lambda"]))
        outcomes = [no_loss(t.ci_low, t.ci_high, margin) for t in tests]
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
        test, row = tests[best], many.iloc[best]
        numbers = (f"lambda {row['lambda']:g}: {int(row['heads_pruned'])} of {total} heads pruned, {files.metric} "
                   f"change {interval(test.delta, test.ci_low, test.ci_high, 4)} ({len(tests)} penalties prune more "
                   f"than half: intervals simultaneous over them); boundary -{margin:g}")
        evidence.append(Evidence(name, outcome, numbers, link, {
            "value": test.delta, "low": test.ci_low, "high": test.ci_high, "boundary": -margin,
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


def _simultaneous(files: StudyFiles, job, penalties: list[float]) -> list:
    """The paired tests of ``penalties`` from the job's records, each at Bonferroni's level over them."""
    records = pd.read_parquet(job / "records.parquet")
    baseline = records[records["penalty"].isna()].drop(columns=["penalty"])
    runs = [records[records["penalty"] == p].drop(columns=["penalty"]) for p in penalties]
    settings = files.reports.get("gates", (files.resampling, ""))[0]
    level = family_level(replace(settings, intervals="simultaneous"), len(penalties))
    return paired_tests(files.metric, [r.reset_index(drop=True) for r in runs], baseline.reset_index(drop=True),
                        level)


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
        row, note = rows[0], ""
        outcome = no_loss(row["ci_low"], row["ci_high"], margin)
        if outcome != INCONCLUSIVE:  # a class too small says nothing of a "no loss"; one not reproducible, of either
            note = _class_note(counts["irrelevant"], total, fits, stable, holds=outcome == HOLDS)
            outcome = INCONCLUSIVE if note else outcome
        numbers = (f"{share}; pruning the irrelevant ones: {files.metric} change "
                   f"{interval(row['delta'], row['ci_low'], row['ci_high'], 4)}; boundary -{margin:g}")
        evidence.append(Evidence(name, outcome, numbers, link, {
            "value": row["delta"], "low": row["ci_low"], "high": row["ci_high"], "boundary": -margin,
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
    if stable < MIN_STABLE:
        return (f"only {stable:.0%} of the irrelevant heads were irrelevant in every fit (fewer than "
                f"{MIN_STABLE:.0%}): the class is not reproducible; more steps (gates.max_steps) or fits")
    return ""


def optimal_below_mean(files: StudyFiles) -> Finding:
    evidence = []
    for model, job in files.model_jobs("gates", [f"optimal/{m}" for m in files.models]):
        table = pd.read_csv(job / "heads.csv")
        rows = table[table["split"] == files.split]
        # Holm across the heads whatever report.correction the job used (the rule is stated with Holm's); a head is
        # decided only when its CI agrees with its p-value
        significant = adjust_p_values(rows["p_value"].to_numpy(), "holm") < files.alpha
        below = int((significant & (rows["ci_high"] < 0).to_numpy()).sum())
        above = int((significant & (rows["ci_low"] > 0).to_numpy()).sum())
        heads = len(rows)
        outcome = FAILS if above else HOLDS if below > heads / 2 else INCONCLUSIVE
        permutations = files.reports.get("gates", (files.resampling, ""))[0].permutations
        floor = min(1.0, 2 * heads / (permutations + 1))  # the least Holm-adjusted two-sided permutation p
        if heads and floor >= files.alpha:
            outcome = INCONCLUSIVE
        numbers = (f"{below} of {heads} heads' optimal gap shown below the mean gap (Holm-adjusted p < "
                   f"{files.alpha:g}, CI below 0), {above} above, {heads - below - above} undecided; median "
                   f"difference {np.median(rows['difference']):+.4g} (loss); boundary: more than half below, none "
                   "above")
        note = "" if outcome != INCONCLUSIVE else (
            f"with {permutations} permutations no head of {heads} can be shown either way after Holm's correction "
            f"(the least adjusted p is {floor:.3g}): give at least {round(2 * heads / files.alpha)} "
            "(study.gates.report.permutations)" if floor >= files.alpha else
            f"{heads - below} heads' differences were not shown below 0: their gaps moved too little on these "
            "examples to tell (more eval examples, or gates.max_steps for the constants)")
        evidence.append(Evidence(model.removeprefix("optimal/"), outcome, numbers, files.link(job / "heads.csv"),
                                 {"value": below / heads, "below": below, "above": above, "heads": heads,
                                  "boundary": 0.5}, note=note))
    return Finding(LI_JANSON, tuple(evidence)) if evidence else not_tested(LI_JANSON, files.absent("gates"))
