"""The claims the gates stage tests (``gates/l0``, ``gates/chg``, ``gates/optimal`` per model; docs/gates.md).

* Voita et al. 2019: most heads can be pruned at a small cost. Among the L0 penalties that prune more than half of
  the heads, the claim holds when one of them keeps the main metric within ``study.findings.margin`` of the full
  model's (the lower end of its paired CI above ``-margin``: an equivalence-side test of "no loss"), and does not hold
  when every one of them costs more (upper end below ``-margin``). The intervals are recomputed from the job's
  records at Bonferroni's level over those penalties (the best of several is chosen).
* Nam et al. 2025 (causal head gating): the heads it calls irrelevant can be removed together at no cost, as its
  ablations checked; the same test on the job's ``prune_irrelevant`` plan; the share of irrelevant heads and the
  classes' stability across fits are stated beside it.
* Li & Janson 2024: optimal ablation's gap is below mean ablation's for every head, on data the constants were not fit
  on. Holds when every head's paired difference (optimal - mean loss) is below 0 with its Holm-adjusted p-value below
  alpha; does not hold when some head's is above 0 so; inconclusive otherwise.
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
LI_JANSON = Claim("li_janson_optimal_below_mean", "Optimal ablation's gap is below mean ablation's for every head, on "
                  "held-out data", "Li & Janson 2024, optimal ablation", ablation=True)


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
        rows = table[table["split"] == files.split]
        total = int(rows["heads_kept"].iloc[0] + rows["heads_pruned"].iloc[0])
        many = rows[rows["heads_pruned"] > total / 2]
        name, link = model.removeprefix("l0/"), files.link(job / "gates.csv")
        if many.empty:
            most = int(rows["heads_pruned"].max())
            evidence.append(Evidence(name, NOT_TESTED, f"at most {most} of {total} heads pruned", link, note=(
                "no penalty closed more than half of the heads: add larger ones (gates.lambdas)")))
            continue
        tests = _simultaneous(files, job, list(many["lambda"]))
        outcomes = [no_loss(t.ci_low, t.ci_high, margin) for t in tests]
        best = max(range(len(tests)), key=lambda i: (outcomes[i] == HOLDS, many["heads_pruned"].iloc[i]))
        outcome = HOLDS if HOLDS in outcomes else FAILS if all(o == FAILS for o in outcomes) else INCONCLUSIVE
        test, row = tests[best], many.iloc[best]
        numbers = (f"lambda {row['lambda']:g}: {int(row['heads_pruned'])} of {total} heads pruned, {files.metric} "
                   f"change {interval(test.delta, test.ci_low, test.ci_high, 4)} ({len(tests)} penalties prune more "
                   f"than half: intervals simultaneous over them); boundary -{margin:g}")
        evidence.append(Evidence(name, outcome, numbers, link, {
            "value": test.delta, "low": test.ci_low, "high": test.ci_high, "boundary": -margin,
            "lambda": float(row["lambda"]), "heads_pruned": int(row["heads_pruned"]), "heads": total}))
    return Finding(VOITA, tuple(evidence)) if evidence else not_tested(VOITA, files.absent("gates"))


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
        share = (f"{counts['irrelevant']} of {total} heads irrelevant, {counts['facilitating']} facilitating, "
                 f"{counts['interfering']} interfering; {record['stability']:.1%} of the heads in the same class in "
                 f"every fit")
        rows = [r for r in record.get("pruned") or [] if r["plan"] == "prune_irrelevant" and r["split"] == files.split]
        if not rows:
            evidence.append(Evidence(name, NOT_TESTED, share, link, note="no head was called irrelevant"))
            continue
        row = rows[0]
        outcome = no_loss(row["ci_low"], row["ci_high"], margin)
        numbers = (f"{share}; pruning the irrelevant ones: {files.metric} change "
                   f"{interval(row['delta'], row['ci_low'], row['ci_high'], 4)}; boundary -{margin:g}")
        evidence.append(Evidence(name, outcome, numbers, link, {
            "value": row["delta"], "low": row["ci_low"], "high": row["ci_high"], "boundary": -margin,
            "irrelevant": counts["irrelevant"], "heads": total, "stability": record["stability"]}))
    return Finding(CHG, tuple(evidence)) if evidence else not_tested(CHG, files.absent("gates"))


def optimal_below_mean(files: StudyFiles) -> Finding:
    evidence = []
    for model, job in files.model_jobs("gates", [f"optimal/{m}" for m in files.models]):
        table = pd.read_csv(job / "heads.csv")
        rows = table[table["split"] == files.split]
        # Holm across the heads whatever report.correction the job used (the rule is stated with Holm's)
        significant = adjust_p_values(rows["p_value"].to_numpy(), "holm") < files.alpha
        below = int(((rows["difference"] < 0).to_numpy() & significant).sum())
        above = int(((rows["difference"] > 0).to_numpy() & significant).sum())
        heads = len(rows)
        outcome = FAILS if above else HOLDS if below == heads else INCONCLUSIVE
        numbers = (f"{below} of {heads} heads' optimal gap below the mean gap (Holm-adjusted p < {files.alpha:g}), "
                   f"{above} above, {heads - below - above} undecided; median difference "
                   f"{np.median(rows['difference']):+.4g} (loss)")
        evidence.append(Evidence(model.removeprefix("optimal/"), outcome, numbers, files.link(job / "heads.csv"),
                                 {"value": below / heads, "below": below, "above": above, "heads": heads}))
    return Finding(LI_JANSON, tuple(evidence)) if evidence else not_tested(LI_JANSON, files.absent("gates"))
