"""Guan et al. 2020's claims, read from the cluster, tables and compare stages.

Table 2 and 3 claims compare two plans on the same examples: the paired difference of the main metric with its
paired bootstrap CI and permutation p-value (``headlab.reporting.statistics``). A plan against the unablated model is
a row of the table: the finding reads that row's CI and p-value, computed once by the tables' report; two plans are
compared with the same settings (the tables' resamples, seed and method). Stability gets a Wilson interval over the
heads (statsmodels); the change of types by layer, Newcombe's interval for a difference of two proportions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from headlab.analysis.types.clusters import TYPE_NAMES, name_margins
from headlab.files import read_json
from headlab.reporting.statistics import family_level, paired_tests
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import (
    NOT_TESTED,
    Claim,
    Evidence,
    Finding,
    checked_verdict,
    interval,
    not_tested,
    verdict,
)

GUAN = "Guan et al. 2020"
STABILITY = Claim("guan_stability", "Heads fall into stable distance types: over 95% of heads keep their type in "
                  "every clustering fit on half of the data", f"{GUAN}, Table 1")
FINE_TUNING = Claim("guan_finetuning_later_layers", "Fine-tuning changes the types of the later layers more than "
                    "those of the earlier layers", f"{GUAN}, Section 4 (Figure 4); Kovaleva et al. 2019", learned=True)


def plan_claims(files: StudyFiles) -> list[tuple[Claim, str, str, str, float]]:
    """``(claim, table, plan kept better, plan removing more, boundary)``: the claim holds when the metric under the
    first plan minus the metric under the second is above the boundary (``baseline`` for the unablated model)."""
    table2, table3 = f"{GUAN}, Table 2", f"{GUAN}, Table 3"
    claims = []
    for policy, rows in (("prune", "3 vs 5"), ("uniform", "9 vs 11")):
        verb = "Pruning" if policy == "prune" else "Substituting uniform attention for"
        claims.append((Claim(f"guan_table2_diagonal_vs_vertical_{policy}",
                             f"{verb} diagonal heads costs more than {verb.lower()} vertical heads",
                             f"{table2} (rows {rows})", ablation=True),
                       "table2", f"{policy}_vertical", f"{policy}_diagonal", 0.0))
    claims += [
        (Claim("guan_table2_dense_vs_vertical_prune", "Pruning dense heads costs more than pruning vertical heads",
               f"{table2} (rows 2 vs 5)", ablation=True), "table2", "prune_vertical", "prune_dense", 0.0),
        (Claim("guan_table2_vertical_prune_cheap", "Pruning the vertical heads costs less than 1.5 points",
               f"{table2} (row 5)", ablation=True), "table2", "prune_vertical", "baseline", -files.points(1.5)),
        (Claim("guan_table2_dense_uniform_cheap", "Substituting uniform attention for the dense heads costs less "
               "than 10 points (their attention values are trivial)", f"{table2} (row 8)", ablation=True),
         "table2", "uniform_dense", "baseline", -files.points(10)),
        (Claim("guan_table2_dense_vertical_uniform", "Substituting uniform attention for the dense&vertical heads "
               "costs more than for the dense heads", f"{table2} (rows 10 vs 8)", ablation=True),
         "table2", "uniform_dense", "uniform_dense_vertical", 0.0)]
    for table, note in (("table3", ""), ("table3_renormalized", ", renormalize=true")):
        claims += [
            (Claim(f"guan_{table}_diagonal_intra", f"Diagonal heads work within sentences: removing their "
                   f"intra-sentence attention costs more than removing their inter-sentence attention{note}",
                   f"{table3} (rows 12 vs 13)", ablation=True),
             table, "drop_inter_diagonal", "drop_intra_diagonal", 0.0),
            (Claim(f"guan_{table}_dense_vertical_inter", f"Dense&vertical heads carry information across sentences: "
                   f"removing their inter-sentence attention costs more than removing their intra-sentence "
                   f"attention{note}", f"{table3} (rows 14 vs 15)", ablation=True),
             table, "drop_intra_dense_vertical", "drop_inter_dense_vertical", 0.0)]
    return claims


@dataclass(frozen=True)
class Comparison:
    """One paired difference ``metric(kept) - metric(removed)``: its CI at ``level``, its permutation p-value."""

    delta: float
    low: float
    high: float
    p: float
    n: int
    level: float  # the CI's confidence
    file: str  # where it was read or computed from, relative to the study
    adjusted: float = math.nan  # the table's adjusted p-value (a row of a table only)
    note: str = ""  # the table's note on a missing statistic


def table_row(files: StudyFiles, table: str, model: str, plan: str) -> Comparison:
    """``plan - baseline`` as the row of ``plan`` in the table's report (``table.csv``); NaN, with a note, without."""
    report = files.report("tables", table, model)
    found = pd.DataFrame()
    if report is not None:
        frame = pd.read_csv(report / "table.csv", float_precision="round_trip")
        rows = frame[(frame["metric"] == files.metric) & (frame["split"] == files.split)]
        found = rows[rows["plan"] == plan]
    if not len(found):
        nan = math.nan
        return Comparison(nan, nan, nan, nan, 0, files.resampling.confidence, f"tables/{table}/{model}",
                          note=f"the tables' report of {model} has no row of {plan}: run the tables stage again")
    row = found.iloc[0]
    resampling = files.reports.get("tables", (files.resampling, ""))[0]
    level = family_level(resampling, int((rows["heads"] > 0).sum())).confidence  # simultaneous CIs: the family's
    note = row.get("note", "")
    return Comparison(float(row["delta"]), float(row["ci_low"]), float(row["ci_high"]), float(row["p_value"]),
                      int(row["n"]), level, files.link(report / "table.csv"), float(row["p_adjusted"]),
                      note if isinstance(note, str) else "")


def comparison(files: StudyFiles, table: str, model: str, kept: str, removed: str) -> Comparison | None:
    """``kept - removed`` of ``model``: the table's row when ``removed`` is the unablated model, else computed from
    the two plans' records with the tables' settings; None when a plan's job is missing."""
    first, second = files.job("tables", table, model, kept), files.job("tables", table, model, removed)
    if first is None or second is None:
        return None
    if removed == "baseline":
        return table_row(files, table, model, kept)
    result = paired_tests(files.metric, [files.records(first)], files.records(second), files.resampling,
                          names=[kept])[0]
    return Comparison(result.delta, result.ci_low, result.ci_high, result.p_value, result.n,
                      files.resampling.confidence, f"{files.link(first.parent)}/{{{kept},{removed}}}/records.parquet")


def plan_finding(files: StudyFiles, claim: Claim, table: str, kept: str, removed: str, boundary: float) -> Finding:
    """The paired difference ``metric(kept) - metric(removed)`` per fine-tuned model against ``boundary``; inconclusive
    when its CI and permutation p disagree about a difference from 0 (``checked_verdict``)."""
    evidence = []
    digits = 2 if files.scale == 100 else 4
    for model in files.models:
        found = comparison(files, table, model, kept, removed)
        if found is None:
            continue
        p = f"p {found.p:.3g}" + ("" if math.isnan(found.adjusted) else f", adjusted {found.adjusted:.3g}")
        numbers = (f"{files.metric} {kept} - {removed}: {interval(found.delta, found.low, found.high, digits)} "
                   f"({100 * found.level:.4g}% CI; {p}; {found.n} examples; boundary {boundary:+.{digits}f})")
        outcome, why = checked_verdict(found.low, found.high, boundary, found.p, found.level)
        misfit = misnamed(files, model, (kept, removed))
        if misfit:
            outcome, why = NOT_TESTED, misfit
        evidence.append(Evidence(model, outcome, numbers, found.file,
                                 {"value": found.delta, "low": found.low, "high": found.high, "p_value": found.p,
                                  "confidence": found.level, "boundary": boundary, "examples": found.n},
                                 note=why or found.note))
    if evidence:
        return Finding(claim, tuple(evidence))
    if any(job.startswith(f"tables/{table}/") for job in files.jobs("tables")):
        return not_tested(claim, "the clusters are not Guan et al.'s four types (no plan of that type)")
    return not_tested(claim, f"the tables stage has no {table} jobs in this study")


def misnamed(files: StudyFiles, model: str, plans: tuple[str, ...]) -> str:
    """Why a claim about the types of ``plans`` (``prune_vertical``, ``uniform_dense_vertical``, ``baseline``) is not
    tested on ``model``: a type whose centroid contradicts Guan et al.'s description of it (its ``name_margins`` below
    0: the profile rule named it, the paper would not), else ""."""
    job = files.job("cluster", model)
    found = job is not None and (job / "clusters.json").is_file()
    clusters = read_json(job / "clusters.json", "clusters") if found else {}
    if not clusters.get("named") or clusters.get("named_by_hand") or "profiles" not in clusters:
        return ""
    margins = name_margins(clusters["profiles"])
    types = [next((name for name in sorted(TYPE_NAMES, key=len, reverse=True) if plan.endswith(f"_{name}")), None)
             for plan in plans]
    wrong = [f"{name} by {margins[name]:.3f}" for name in dict.fromkeys(types) if name and margins[name] < 0]
    if not wrong:
        return ""
    return (f"its centroid named {', '.join(wrong)} falls short of Guan et al.'s description of the type "
            f"(`{files.link(job / 'clusters.json')}`): the claim would be about other heads than the paper's")


def stability_finding(files: StudyFiles) -> Finding:
    """Each model's share of heads labelled alike in every fit, with a Wilson interval over its heads, above 0.95."""
    evidence = []
    for model, job in files.model_jobs("cluster", ["pretrained", *files.models]):
        result = read_json(job / "results.json", "cluster results")
        heads = sum(result["counts"].values())
        stable = round(result["stability"] * heads)
        low, high = proportion_confint(stable, heads, alpha=1 - files.resampling.confidence, method="wilson")
        numbers = (f"stability {interval(result['stability'], low, high, 4, sign=False)} ({stable} of {heads} heads, "
                   f"{result['config']['cluster']['stability_fits']} fits; boundary 0.95)")
        evidence.append(Evidence(model, verdict(low, high, 0.95), numbers, files.link(job / "results.json"),
                                 {"value": result["stability"], "low": low, "high": high, "boundary": 0.95,
                                  "heads": heads}))
    return Finding(STABILITY, tuple(evidence)) if evidence else not_tested(STABILITY, "the cluster stage did not run")


def fine_tuning_finding(files: StudyFiles) -> Finding:
    """The share of heads whose type changed in the later half of the layers minus the earlier half (the middle
    layer of an odd count left out), Newcombe's interval, above 0. Only between named types: numbered clusters of two
    fits are not the same types, so a change of label is not a change of type."""
    evidence, unnamed = [], []
    for model, job in files.model_jobs("compare", files.models):
        heads = pd.read_csv(job / "heads.csv")
        changed = next(column for column in heads.columns if column.startswith("changed/"))
        if heads[changed].isna().any():  # a run's clusters are numbered: cluster0 of one fit is not of another
            unnamed.append(model)
            continue
        layers = int(heads["layer"].max()) + 1
        half = layers // 2
        if not half:
            continue
        later = heads.loc[heads["layer"] >= layers - half, changed].astype(bool)
        earlier = heads.loc[heads["layer"] < half, changed].astype(bool)
        low, high = confint_proportions_2indep(int(later.sum()), len(later), int(earlier.sum()), len(earlier),
                                               method="newcomb", compare="diff",
                                               alpha=1 - files.resampling.confidence)
        value = later.mean() - earlier.mean()
        numbers = (f"type changed: {int(later.sum())} of {len(later)} heads in layers {layers - half}-{layers - 1} vs "
                   f"{int(earlier.sum())} of {len(earlier)} in layers 0-{half - 1}; difference "
                   f"{interval(value, float(low), float(high), 4)} (boundary 0)")
        evidence.append(Evidence(model, verdict(float(low), float(high), 0.0), numbers,
                                 files.link(job / "heads.csv"), {"value": float(value), "low": float(low),
                                                                 "high": float(high), "boundary": 0.0}))
    if evidence:
        return Finding(FINE_TUNING, tuple(evidence))
    if unnamed:
        return not_tested(FINE_TUNING, "the pre-trained or the fine-tuned model's heads did not separate into named "
                          f"types (compare/{', '.join(unnamed)}), and numbered clusters of two fits are not the same "
                          "types")
    return not_tested(FINE_TUNING, "the compare stage did not run" if not files.jobs("compare") else
                      "the model has a single layer")


def guan_findings(files: StudyFiles) -> list[Finding]:
    return [stability_finding(files), *(plan_finding(files, *spec) for spec in plan_claims(files)),
            fine_tuning_finding(files)]

