"""Clark et al.'s, Michel et al.'s and Pande et al.'s claims about single heads, read from the syntax, features,
sweep and prune-curve stages.

- Clark: ``syntax.csv`` (each relation's best head against the best offset, paired bootstrap CI, Holm-adjusted p).
- Michel: the sweep's report (each head pruned alone: paired CI and Holm-adjusted p against the unablated model) and
  ``prune_curve.csv`` (importance order against random orders: their range is the interval, not a CI).
- Pande: the sieve roles (``sieve_roles.csv`` of the features and syntax stages): the overlap of local and syntactic
  heads as an odds ratio with its conditional-MLE CI (``scipy.stats.contingency.odds_ratio``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats.contingency import odds_ratio

from headlab.files import read_json
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
    verdict,
)

CLARK, MICHEL, PANDE = "Clark et al. 2019", "Michel et al. 2019", "Pande et al. 2021"
RELATIONS = Claim("clark_relations", "Single heads track specific dependency relations better than the best "
                  "fixed offset", f"{CLARK}, Section 4 (heads for direct objects, determiners, ...)")
OVERALL = Claim("clark_overall", "No single head does syntax well overall: the best head on all words beats the "
                "best offset by less than 10 points", f"{CLARK}, Section 4 / Table 1")
REDUNDANT = Claim("michel_single_heads", "Most single heads can be removed without a significant loss",
                  f"{MICHEL}, Section 3 (Table 1)", ablation=True)
PRUNING = Claim("michel_importance_pruning", "Pruning by importance keeps the score longer than pruning in random "
                "orders", f"{MICHEL}, Section 5 (Figure 4)", ablation=True)
OVERLAP = Claim("pande_local_syntactic", "Local and syntactic roles overlap: more heads hold both than if the roles "
                "were independent", f"{PANDE}, question 1")
LAYERS = Claim("pande_syntactic_layers", "Syntactic heads are in most layers", f"{PANDE}, question 2")
SYNTACTIC_SIEVES = ("syntactic", "nsubj", "obj", "amod", "advmod")


def clark_findings(files: StudyFiles) -> list[Finding]:
    job = files.job("syntax", "pretrained")
    if job is None:
        reason = "the syntax stage did not score the pre-trained model"
        return [not_tested(RELATIONS, reason), not_tested(OVERALL, reason)]
    table, link = pd.read_csv(job / "syntax.csv"), files.link(job / "syntax.csv")
    relations = table[table["relation"] != "all"]
    beaten = relations[(relations["difference"] > 0) & (relations["p_adjusted"] < files.alpha)]
    beaten = beaten.sort_values("difference", ascending=False)
    outcome = HOLDS if len(beaten) else FAILS if (relations["ci_high"] < 0).all() else INCONCLUSIVE
    best = ", ".join(f"{row.relation} {row.head} "
                     f"{interval(100 * row.difference, 100 * row.ci_low, 100 * row.ci_high, 1)}"
                     for row in beaten.head(3).itertuples())
    numbers = (f"{len(beaten)} of {len(relations)} relations beat their best offset (Holm-adjusted p < "
               f"{files.alpha:g}){': ' + best if best else ''} (accuracy points)")
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
    """The share of heads whose removal alone costs no significant loss (an exact count), above one half."""
    evidence = []
    for model in files.models:
        report = files.report("sweep", model)
        if report is None:
            continue
        table = pd.read_csv(report / "table.csv")
        rows = table[(table["metric"] == files.metric) & (table["split"] == files.split)]
        costly = int(((rows["delta"] < 0) & (rows["p_adjusted"] < files.alpha)).sum())
        share = 1 - costly / len(rows)
        numbers = (f"{len(rows) - costly} of {len(rows)} heads ({100 * share:.0f}%) pruned alone without a "
                   f"significant {files.metric} loss (Holm-adjusted p < {files.alpha:g}, {int(rows['n'].iloc[0])} "
                   "examples; boundary half)")
        evidence.append(Evidence(model, verdict(share, share, 0.5), numbers, files.link(report / "table.csv"),
                                 {"value": share, "boundary": 0.5, "heads": len(rows), "costly": costly}))
    return Finding(REDUNDANT, tuple(evidence)) if evidence else not_tested(REDUNDANT, "the sweep stage did not run")


def importance_pruning(files: StudyFiles) -> Finding:
    """The mean share of the baseline kept over the curve's steps, importance order minus each random order: the
    interval is the range over the random orders."""
    evidence = []
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
        low, high = ours - others.max(), ours - others.min()
        numbers = (f"mean share of the baseline kept over {len(steps)} steps: importance {ours:.4f}, random orders "
                   f"{others.min():.4f}-{others.max():.4f} ({len(randoms)}); difference {low:+.4f} to {high:+.4f} "
                   "(the random orders' range; boundary 0)")
        evidence.append(Evidence(model, verdict(low, high, 0.0), numbers, files.link(job / "prune_curve.csv"),
                                 {"value": ours - float(others.mean()), "low": low, "high": high, "boundary": 0.0,
                                  "random_orders": len(randoms)}))
    if evidence:
        return Finding(PRUNING, tuple(evidence))
    return not_tested(PRUNING, "the prune_curve stage did not run" if not files.jobs("prune_curve") else
                      "the prune curve has no random order (prune_curve.random_seeds=[])")


def sieve_roles(files: StudyFiles, stage: str, model: str) -> pd.DataFrame | None:
    """``[head name x sieve]`` booleans of a features or syntax job's ``sieve_roles.csv``."""
    job = files.job(stage, model)
    if job is None or not (job / "sieve_roles.csv").is_file():
        return None
    roles = pd.read_csv(job / "sieve_roles.csv")
    return roles.pivot_table(index=["layer", "head", "name"], columns="sieve", values="role", aggfunc="first") \
        .astype(bool).reset_index()


def pande_findings(files: StudyFiles) -> list[Finding]:
    overlap, layers = [], []
    for model in ["pretrained", *files.models]:
        syntax = sieve_roles(files, "syntax", model)
        if syntax is None:
            continue
        sieves = [s for s in SYNTACTIC_SIEVES if s in syntax.columns]
        syntax["any_syntactic"] = syntax[sieves].any(axis=1)
        link = files.link(files.folder / "syntax" / model / "sieve_roles.csv")
        per_layer = syntax.groupby("layer")["any_syntactic"].any()
        share = float(per_layer.mean())
        numbers = (f"{int(per_layer.sum())} of {len(per_layer)} layers have a head with a syntactic role "
                   f"({', '.join(sieves)}; boundary half)")
        layers.append(Evidence(model, verdict(share, share, 0.5), numbers, link, {"value": share, "boundary": 0.5}))
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
    reason = "the syntax stage did not run"
    return [Finding(OVERLAP, tuple(overlap)) if overlap else
            not_tested(OVERLAP, reason if not layers else "the features stage has no sieve roles"),
            Finding(LAYERS, tuple(layers)) if layers else not_tested(LAYERS, reason)]
