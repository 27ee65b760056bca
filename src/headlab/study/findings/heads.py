"""Clark et al.'s, Michel et al.'s and Pande et al.'s claims about single heads, read from the syntax, features,
sweep and prune-curve stages.

- Clark: ``syntax.csv`` (each relation's best head against the best offset, paired bootstrap CI, Holm-adjusted p).
- Michel: the sweep's report (each head pruned alone: its paired CI against the unablated model, read as an
  equivalence test at ``study.findings.margin``) and ``prune_curve.csv`` (the importance order ranked among the
  random orders).
- Pande: the sieve roles (``sieve_roles.csv`` of the features and syntax stages): the overlap of local and syntactic
  heads as an odds ratio with its conditional-MLE CI (``scipy.stats.contingency.odds_ratio``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats.contingency import odds_ratio

from headlab.files import read_json
from headlab.reporting.statistics import family_level
from headlab.reporting.value_intervals import area_difference_interval
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    Claim,
    Evidence,
    Finding,
    interval,
    not_tested,
    unchanged_bound,
    unit_name,
    verdict,
    zero_width,
)

CLARK, MICHEL, PANDE = "Clark et al. 2019", "Michel et al. 2019", "Pande et al. 2021"
RELATIONS = Claim("clark_relations", "Single heads track specific dependency relations better than the best "
                  "fixed offset", f"{CLARK}, Section 4 (heads for direct objects, determiners, ...)")
OVERALL = Claim("clark_overall", "No single head does syntax well overall: the best head on all words beats the "
                "best offset by less than 10 points", f"{CLARK}, Section 4 / Table 1")
REDUNDANT = Claim("michel_single_heads", "Most single heads can be removed alone at a loss smaller than the margin "
                  "(study.findings.margin): more than half the heads shown removable", f"{MICHEL}, Section 3 "
                  "(Table 1: most of BERT-base's 144 heads, one at a time, cost no significant loss)", ablation=True)
PRUNING = Claim("michel_importance_pruning", "Pruning by importance keeps the score longer than pruning in random "
                "orders", f"{MICHEL}, Section 5 (Figure 4)", ablation=True)
OVERLAP = Claim("pande_local_syntactic", "Local and syntactic roles overlap: more heads hold both than if the roles "
                "were independent", f"{PANDE}, question 1")
LAYERS = Claim("pande_syntactic_layers", "There are at least 3 syntactic heads in each layer (a quarter of a layer's "
               "heads; the paper's BERT-base has 12), with very few exceptions (at most a tenth of the layers)",
               f"{PANDE}, question 2 (\"at least 3 syntactic heads in each layer (except a very few exceptions)\")")
FEW_EXCEPTIONS = 0.1  # the share of layers "a very few exceptions" allows
SYNTACTIC_SIEVES = ("syntactic", "nsubj", "obj", "amod", "advmod")
NO_LEAD = 0.05  # Clark's relations claim fails when no relation's best head can lead its offset by 5 points


def clark_findings(files: StudyFiles) -> list[Finding]:
    job = files.job("syntax", "pretrained")
    if job is None:
        reason = "the syntax stage did not score the pre-trained model"
        return [not_tested(RELATIONS, reason), not_tested(OVERALL, reason)]
    table, link = pd.read_csv(job / "syntax.csv"), files.link(job / "syntax.csv")
    relations = table[table["relation"] != "all"]
    beaten = relations[(relations["difference"] > 0) & (relations["p_adjusted"] < files.alpha)]
    beaten = beaten.sort_values("difference", ascending=False)
    outcome = HOLDS if len(beaten) else FAILS if (relations["ci_high"] < NO_LEAD).all() else INCONCLUSIVE
    best = ", ".join(f"{row.relation} {row.head} "
                     f"{interval(100 * row.difference, 100 * row.ci_low, 100 * row.ci_high, 1)}"
                     for row in beaten.head(3).itertuples())
    numbers = (f"{len(beaten)} of {len(relations)} relations beat their best offset (Holm-adjusted p < "
               f"{files.alpha:g}){': ' + best if best else ''} (accuracy points; does not hold when every "
               f"relation's interval lies below +{100 * NO_LEAD:g})")
    relations_evidence = Evidence("pretrained", outcome, numbers, link, {"value": len(beaten),
                                                                         "relations": len(relations)})
    overall = table.set_index("relation").loc["all"]
    value, low, high = (100 * float(overall[key]) for key in ("difference", "ci_low", "ci_high"))
    numbers = (f"best head {overall['head']} {100 * overall['accuracy']:.1f}% vs offset "
               f"{100 * overall['baseline_accuracy']:.1f}%: {interval(value, low, high, 1)} points (boundary +10)")
    overall_evidence = Evidence("pretrained", verdict(low, high, 10.0, above=False), numbers, link,
                                {"value": value, "low": low, "high": high, "boundary": 10.0})
    return [Finding(RELATIONS, (relations_evidence,)), Finding(OVERALL, (overall_evidence,))]


def michel_findings(files: StudyFiles) -> list[Finding]:
    return [redundant_heads(files), importance_pruning(files)]


def redundant_heads(files: StudyFiles) -> Finding:
    """Michel's "most heads can be removed without a significant loss" as an equivalence claim: a head is removable
    when its CI (the sweep report's) lies above ``-margin``, costly when it lies below; the claim holds when the
    removable heads are more than half, does not hold when the costly ones are half or more, and is inconclusive in
    between (too few examples to show either)."""
    evidence = []
    margin = files.points(files.margin)
    for model in files.models:
        report = files.report("sweep", model)
        if report is None:
            continue
        table = pd.read_csv(report / "table.csv")
        rows = table[(table["metric"] == files.metric) & (table["split"] == files.split)]
        heads = len(rows)
        resampling = files.reports.get("sweep", (files.resampling, ""))[0]
        level = family_level(resampling, heads).confidence
        examples = int(rows["n"].iloc[0])
        units = int(rows["units"].iloc[0]) if "units" in rows else examples
        # a head that changed no unit has a zero-width interval: bounded by how few changes that many units show
        unchanged = zero_width(rows["ci_low"], rows["ci_high"]).to_numpy()
        low = np.where(unchanged, rows["delta"] - unchanged_bound(units, level, files.scale), rows["ci_low"])
        removable = int((low > -margin).sum())
        costly = int((rows["ci_high"] < -margin).sum())
        outcome = HOLDS if removable > heads / 2 else FAILS if costly >= heads / 2 else INCONCLUSIVE
        numbers = (f"{removable} of {heads} heads removable alone (CI above -{margin:g}; {int(unchanged.sum())} "
                   f"changed no prediction, bounded by {unchanged_bound(units, level, files.scale):.3g}), {costly} "
                   f"costly (CI below it), {heads - removable - costly} undecided; {100 * level:.4g}% CIs"
                   f"{', simultaneous over the heads' if resampling.intervals == 'simultaneous' else ''}, "
                   f"{examples} examples; boundary: more than half removable")
        values = {"value": removable / heads, "removable": removable, "costly": costly, "heads": heads,
                  "margin": margin, "confidence": level, "boundary": 0.5}
        note = ""
        if outcome == INCONCLUSIVE:
            half = float(((rows["ci_high"] - rows["ci_low"]) / 2).median())
            needed = math.ceil(units * (half / margin) ** 2) if half > margin else units
            note = (f"the median head's CI half-width is {half:.4g} against the margin {margin:g}: a head that costs "
                    f"nothing would be shown removable at about {needed:,} {unit_name(units, examples)} (this run: "
                    f"{units:,})")
            values |= {"half_width": half, "needed": needed}
        evidence.append(Evidence(model, outcome, numbers, files.link(report / "table.csv"), values, note=note))
    return Finding(REDUNDANT, tuple(evidence)) if evidence else not_tested(REDUNDANT, files.absent("sweep"))


def importance_pruning(files: StudyFiles) -> Finding:
    """The mean share of the baseline kept over the curve's steps, importance order against R random orders: the
    rank p-value ``(1 + #{random >= importance}) / (R + 1)`` (holds at or below alpha: an exact Monte Carlo test),
    and the other tail's (does not hold); with fewer than ``1 / alpha - 1`` orders (19 at 0.05) no rank decides."""
    evidence = []
    alpha = 1 - files.resampling.confidence
    for model, job in files.model_jobs("prune_curve", files.models):
        curve = pd.read_csv(job / "prune_curve.csv")
        if "split" in curve:  # a row per step, order and evaluated split: the split the curve was pruned by
            settings = read_json(job / "results.json", "prune curve results").get("settings", {})
            curve = curve[curve["split"] == settings.get("split", files.split)]
        curve = curve[curve["step"] > 0]
        by_order = {(order, seed): part.set_index("step")["relative"]
                    for (order, seed), part in curve.groupby(["order", "seed"], dropna=False, sort=False)}
        importance = next((v for (order, _), v in by_order.items() if order == "importance"), None)
        randoms = [v for (order, _), v in by_order.items() if order == "random"]
        if importance is None or not randoms:
            continue
        steps = importance.index.intersection(pd.Index(sorted(set.intersection(*(set(r.index) for r in randoms)))))
        ours = float(importance[steps].mean())
        others = np.array([float(r[steps].mean()) for r in randoms])
        orders = len(others)
        above = (1 + int((others >= ours).sum())) / (orders + 1)
        below = (1 + int((others <= ours).sum())) / (orders + 1)
        level = alpha * (1 + 1e-9)  # an exact Monte Carlo test: rank 1 of 20 is p = 1/20, significant at 0.05
        ranked = HOLDS if above <= level else FAILS if below <= level else INCONCLUSIVE
        area = area_interval(files, job, list(steps))
        value, low, high = area if area else (ours - float(others.mean()), math.nan, math.nan)
        outcome = ranked if ranked == verdict(low, high, 0.0) else INCONCLUSIVE
        numbers = (f"mean share of the baseline kept over {len(steps)} steps: importance {ours:.4f}, {orders} random "
                   f"orders {others.min():.4f}-{others.max():.4f}; rank p {above:.3g} (importance above them), "
                   f"{below:.3g} (below them), boundary p <= {alpha:.2g}, a statement about these examples; the "
                   f"area difference {interval(value, low, high, 4)} ({100 * files.resampling.confidence:.4g}% "
                   "paired bootstrap CI, examples resampled by their clusters: whether it carries over to others)")
        notes = []
        if ranked == INCONCLUSIVE and 1 / (orders + 1) > level:
            notes.append(f"with {orders} random orders the smallest rank p-value is 1/{orders + 1} = "
                         f"{1 / (orders + 1):.3g}, above {alpha:.2g}: at least {round(1 / alpha) - 1} orders are "
                         "needed (prune_curve.random_seeds)")
        if area is None:
            notes.append("the prune curve has no per-example records (a job from before they were written): its area "
                         "difference has no CI; run the prune_curve stage again")
        elif ranked != INCONCLUSIVE and outcome == INCONCLUSIVE:
            notes.append(f"the rank among the orders decides, but the area difference's CI reaches 0: on other "
                         f"examples the order might not matter (half-width {(high - low) / 2:.4f})")
        evidence.append(Evidence(model, outcome, numbers, files.link(job / "prune_curve.csv"),
                                 {"value": value, "low": low, "high": high, "p_value": above, "p_below": below,
                                  "boundary": alpha, "random_orders": orders}, note="; ".join(notes)))
    if evidence:
        return Finding(PRUNING, tuple(evidence))
    return not_tested(PRUNING, files.absent("prune_curve") if not files.jobs("prune_curve") else
                      "the prune curve has no random order (prune_curve.random_seeds=[])")


def area_interval(files: StudyFiles, job: Path, steps: list[int]) -> tuple[float, float, float] | None:
    """The area difference (importance minus the random orders' mean, over ``steps``) with its paired bootstrap CI,
    from the curve's ``records.parquet``; None without it."""
    path = job / "records.parquet"
    if not path.is_file():
        return None
    records = pd.read_parquet(path)
    part = lambda order, seed, step: records[(records["order"] == order) & (records["step"] == step) & (  # noqa: E731
        records["seed"].isna() if seed is None else records["seed"] == seed)].drop(
        columns=["order", "seed", "step"]).reset_index(drop=True)
    seeds = sorted(records.loc[records["order"] == "random", "seed"].dropna().unique())
    return area_difference_interval(files.metric, part("baseline", None, 0),
                                    [part("importance", None, step) for step in steps],
                                    [[part("random", seed, step) for step in steps] for seed in seeds],
                                    files.resampling)


def sieve_roles(files: StudyFiles, stage: str, model: str) -> pd.DataFrame | None:
    """``[head name x sieve]`` booleans of a features or syntax job's ``sieve_roles.csv``."""
    job = files.job(stage, model)
    if job is None or not (job / "sieve_roles.csv").is_file():
        return None
    roles = pd.read_csv(job / "sieve_roles.csv")
    if "beyond_offset" in roles:  # a role its fixed-offset pattern alone explains is none (the syntax stage's control)
        roles["role"] = roles["role"].astype(bool) & roles["beyond_offset"].fillna(False).astype(bool)
    return roles.pivot_table(index=["layer", "head", "name"], columns="sieve", values="role", aggfunc="first") \
        .astype(bool).reset_index()


def layers_evidence(files: StudyFiles, model: str, syntax: pd.DataFrame, sieves: list[str], link: str) -> Evidence:
    """Layers with fewer than a quarter of their heads syntactic, counted twice: with the roles as the syntax stage
    corrected them across heads and roles (Holm by default; fewer roles) and with none (Pande et al.'s own test; more
    roles). Holds when the corrected count has few enough exceptions, does not hold when even the uncorrected one
    has too many; in between the count depends on the correction, so inconclusive."""
    raw = pd.read_csv(files.folder / "syntax" / model / "sieve_roles.csv")
    raw = raw[raw["sieve"].isin(sieves)]
    alpha = read_json(files.folder / "syntax" / model / "results.json", "syntax results").get("config", {}).get(
        "syntax", {}).get("sieve_alpha", files.alpha)
    held = raw["p"] < alpha
    if "p_offset" in raw:  # beyond the fixed-offset pattern too, uncorrected
        held &= raw["p_offset"] < alpha
    uncorrected = raw.assign(role=held).groupby(["layer", "head"])["role"].any().groupby("layer").sum()
    heads_per_layer = int(syntax.groupby("layer").size().max())
    least = math.ceil(heads_per_layer / 4)  # 3 of BERT-base's 12
    corrected = syntax.groupby("layer")["any_syntactic"].sum()
    allowed = math.floor(FEW_EXCEPTIONS * len(corrected))
    exceptions, liberal = int((corrected < least).sum()), int((uncorrected < least).sum())
    outcome = HOLDS if exceptions <= allowed else FAILS if liberal > allowed else INCONCLUSIVE
    numbers = (f"{len(corrected) - exceptions} of {len(corrected)} layers have at least {least} heads with a "
               f"syntactic role ({', '.join(sieves)}; per layer {', '.join(str(int(n)) for n in corrected)}; without "
               f"the correction across heads {', '.join(str(int(n)) for n in uncorrected)}); boundary at most "
               f"{allowed} exceptions")
    note = "" if outcome != INCONCLUSIVE else (f"{exceptions} exceptions with the roles corrected across heads, "
                                               f"{liberal} without: the count depends on the correction")
    return Evidence(model, outcome, numbers, link, {"value": exceptions, "uncorrected": liberal, "boundary": allowed,
                                                   "least": least, "per_layer": [int(n) for n in corrected]},
                    note=note)


def pande_findings(files: StudyFiles) -> list[Finding]:
    overlap, layers = [], []
    for model in ["pretrained", *files.models]:
        syntax = sieve_roles(files, "syntax", model)
        if syntax is None:
            continue
        sieves = [s for s in SYNTACTIC_SIEVES if s in syntax.columns]
        syntax["any_syntactic"] = syntax[sieves].any(axis=1)
        link = files.link(files.folder / "syntax" / model / "sieve_roles.csv")
        layers.append(layers_evidence(files, model, syntax, sieves, link))
        local = sieve_roles(files, "features", model)
        if local is None or "local" not in local.columns:
            continue
        heads = syntax.merge(local[["name", "local"]], on="name")
        both = int((heads["local"] & heads["any_syntactic"]).sum())
        table = [[both, int((heads["local"] & ~heads["any_syntactic"]).sum())],
                 [int((~heads["local"] & heads["any_syntactic"]).sum()),
                  int((~heads["local"] & ~heads["any_syntactic"]).sum())]]
        result = odds_ratio(table)
        ci = result.confidence_interval(files.resampling.confidence)
        ratio = interval(result.statistic, ci.low, ci.high, 2, sign=False)
        numbers = (f"{both} of {int(heads['any_syntactic'].sum())} syntactic heads are local "
                   f"({int(heads['local'].sum())} local of {len(heads)}); odds ratio {ratio} (boundary 1)")
        overlap.append(Evidence(model, verdict(ci.low, ci.high, 1.0), numbers, link,
                                {"value": float(result.statistic), "low": float(ci.low), "high": float(ci.high),
                                 "boundary": 1.0, "table": table}))
    reason = files.absent("syntax")
    return [Finding(OVERLAP, tuple(overlap)) if overlap else
            not_tested(OVERLAP, reason if not layers else "the features stage has no sieve roles"),
            Finding(LAYERS, tuple(layers)) if layers else not_tested(LAYERS, reason)]
