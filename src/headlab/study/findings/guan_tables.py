"""Guan et al. 2020's Tables 2 and 3, as the paper states its claims, read from the tables stage.

- **Orderings** ("pruning diagonal heads makes the model totally inoperative, compared with rows 2, 4, 5"): the
  paired difference ``metric(kept) - metric(removed)`` of two plans on the same examples, its paired bootstrap CI
  and permutation p-value (``headlab.reporting.statistics``; resampled by the task's clusters of examples). Each
  table's orderings are one family: their p-values are Holm-adjusted across it and their CIs simultaneous
  (Bonferroni, ``1 - alpha / m``), Table 3's with and without renormalisation counted as separate tries.
- **Costs at the paper's scale** (rows 5 and 8: "less than 1.5%", "less than 10%" of SQuAD exact match): a loss in
  points of another metric means something else on a model with another margin above chance, so the quantity is the
  change as a share of the model's headroom, ``(plan - baseline) / (baseline - chance)``, with its paired bootstrap
  CI, against the paper's stated bound as a share of its headroom (1.5 and 10 points over its baseline, whose
  chance is 0; its own losses, 1.43 and 8.17, lie within them).

A Table 2 ordering says the type it removes matters: it holds only when that type's removal also costs more than
random head sets of its size (``controls``). A plan whose predictions are constant (the model answers one class
whatever the input) is **collapsed**: the claims that rest on it say so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from headlab.analysis.types.clusters import TYPE_NAMES, name_margins
from headlab.files import read_json
from headlab.reporting.pooled import pooled_difference
from headlab.reporting.statistics import Resampling, adjust_p_values, paired_tests
from headlab.reporting.value_intervals import headroom_interval
from headlab.study.findings.controls import controlled
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.refits import RefitSpread, cost_spread, gated, ordering_spread
from headlab.study.findings.verdicts import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_TESTED,
    POOLED,
    Claim,
    Evidence,
    Finding,
    checked_verdict,
    family_resampling,
    interval,
    not_tested,
    unchanged_bound,
    undecided_note,
    unit_name,
    verdict,
    zero_width,
)
from headlab.tasks.chance import chance_level

GUAN = "Guan et al. 2020"
# Guan et al.'s Tables 2 and 3 (BERT-large on SQuAD v1.1 dev): plan -> (exact match, F1)
PAPER = {"baseline": (82.85, 89.68), "prune_dense": (79.92, 87.62), "prune_diagonal": (4.59, 7.55),
         "prune_dense_vertical": (73.33, 81.92), "prune_vertical": (81.42, 88.57), "uniform_dense": (74.68, 84.17),
         "uniform_diagonal": (1.27, 6.07), "uniform_dense_vertical": (9.13, 11.15), "uniform_vertical": (53.17, 59.09),
         "drop_intra_diagonal": (16.96, 25.29), "drop_inter_diagonal": (82.29, 89.91),
         "drop_intra_dense_vertical": (80.28, 87.76), "drop_inter_dense_vertical": (77.95, 85.86),
         "drop_intra_all_but_diagonal": (71.80, 80.22), "drop_inter_all_but_diagonal": (10.11, 15.57),
         "drop_intra_all_but_dense_vertical": (14.83, 23.55), "drop_inter_all_but_dense_vertical": (75.54, 84.10)}
ROWS = {"baseline": 1, "prune_dense": 2, "prune_diagonal": 3, "prune_dense_vertical": 4, "prune_vertical": 5,
        "uniform_dense": 8, "uniform_diagonal": 9, "uniform_dense_vertical": 10, "uniform_vertical": 11,
        "drop_intra_diagonal": 12, "drop_inter_diagonal": 13, "drop_intra_dense_vertical": 14,
        "drop_inter_dense_vertical": 15, "drop_intra_all_but_diagonal": 16, "drop_inter_all_but_diagonal": 17,
        "drop_intra_all_but_dense_vertical": 18, "drop_inter_all_but_dense_vertical": 19}


@dataclass(frozen=True)
class Ordering:
    """A claim that ``metric(kept) - metric(removed) > 0`` in ``table``; ``family``: the claims Holm adjusts
    together."""

    claim: Claim
    family: str
    table: str
    kept: str
    removed: str


@dataclass(frozen=True)
class Cost:
    """A claim that removing ``plan`` costs at most the paper's share of the headroom (``headroom_interval``)."""

    claim: Claim
    plan: str


def paper_numbers(*plans: str) -> str:
    """``EM 4.59 vs 79.92`` of the paper's rows of ``plans``."""
    return "EM " + " vs ".join(f"{PAPER[plan][0]:.2f}" for plan in plans)


# (key after guan_<table>_, claim, plan kept better, plan that costs more): each table's orderings, as the paper states
# them; the source cites the rows "costlier vs kept" with the paper's exact match of each
TABLE2_ORDERINGS = [
    ("diagonal_vs_dense_prune", "Pruning the diagonal heads costs more than pruning the dense heads",
     "prune_dense", "prune_diagonal"),
    ("diagonal_vs_dense_vertical_prune", "Pruning the diagonal heads costs more than pruning the dense&vertical heads",
     "prune_dense_vertical", "prune_diagonal"),
    ("diagonal_vs_vertical_prune", "Pruning the diagonal heads costs more than pruning the vertical heads",
     "prune_vertical", "prune_diagonal"),
    ("diagonal_vs_vertical_uniform", "Substituting uniform attention for the diagonal heads costs more than for the "
     "vertical heads", "uniform_vertical", "uniform_diagonal"),
    ("dense_vertical_uniform", "Substituting uniform attention for the dense&vertical heads costs more than for the "
     "dense heads", "uniform_dense", "uniform_dense_vertical"),
]
TABLE3_ORDERINGS = [
    ("diagonal_intra", "Diagonal heads work within sentences: removing their intra-sentence attention costs more "
     "than removing their inter-sentence attention", "drop_inter_diagonal", "drop_intra_diagonal"),
    ("dense_vertical_inter", "Dense&vertical heads carry information across sentences: removing their inter-sentence "
     "attention costs more than removing their intra-sentence attention", "drop_intra_dense_vertical",
     "drop_inter_dense_vertical"),
    ("diagonal_local_only", "The diagonal heads carry the model's local information: with only them attending within "
     "sentences the model scores more than with only the dense&vertical heads doing so",
     "drop_intra_all_but_diagonal", "drop_intra_all_but_dense_vertical"),
    ("dense_vertical_global_only", "The dense&vertical heads carry the model's global information: with only them "
     "attending across sentences the model scores more than with only the diagonal heads doing so",
     "drop_inter_all_but_dense_vertical", "drop_inter_all_but_diagonal"),
]


def orderings() -> list[Ordering]:
    found = []
    for family, table, note, specs in (("table2", "table2", "", TABLE2_ORDERINGS),
                                       ("table3", "table3", "", TABLE3_ORDERINGS),
                                       ("table3", "table3_renormalized", ", renormalize=true", TABLE3_ORDERINGS)):
        for key, text, kept, removed in specs:
            source = (f"{GUAN}, Table {family[-1]} (rows {ROWS[removed]} vs {ROWS[kept]}: "
                      f"{paper_numbers(removed, kept)})")
            found.append(Ordering(Claim(f"guan_{table}_{key}", text + note, source, ablation=True), family, table,
                                  kept, removed))
    return found


def costs() -> list[Cost]:
    table2 = f"{GUAN}, Table 2"
    return [Cost(Claim("guan_table2_vertical_prune_cheap", "Pruning the vertical heads costs less than the paper's "
                       "bound as a share of the headroom above chance (\"less than 1.5% accuracy loss\")",
                       f"{table2} (row 5 vs 1: {paper_numbers('prune_vertical', 'baseline')})", ablation=True),
                 "prune_vertical"),
            Cost(Claim("guan_table2_dense_uniform_cheap", "Substituting uniform attention for the dense heads costs "
                       "less than the paper's bound as a share of the headroom above chance (\"less than 10%\": "
                       "their attention values are trivial)",
                       f"{table2} (row 8 vs 1: {paper_numbers('uniform_dense', 'baseline')})", ablation=True),
                 "uniform_dense")]


STATED = {"prune_vertical": 1.5, "uniform_dense": 10.0}  # the paper's bound of the loss, in points of its score


def paper_bound(plan: str, metric: str) -> tuple[float, float]:
    """``(bound, own)``: the paper's stated bound of ``plan``'s loss and its own loss, each over its baseline (its
    chance 0), in exact match (its "Acc."), or in F1 where the study's main metric is an F1. Row 5: "less than
    1.5%": -1.5 / 82.85 = -0.0181, its own -1.43 / 82.85 = -0.0173; the paper's own numbers hold by its bound."""
    column = 1 if metric.endswith("f1") else 0
    base = PAPER["baseline"][column]
    return -STATED[plan] / base, (PAPER[plan][column] - base) / base


def collapsed(files: StudyFiles, table: str, model: str, plan: str) -> str:
    """``"prune_dense is collapsed: ..."`` when the plan's job predicts one answer for every example, else ""."""
    job = files.job("tables", table, model, plan)
    if job is None or not (job / "records.parquet").is_file():
        return ""
    predictions = files.records(job)["prediction"]
    if len(predictions) < 2 or predictions.nunique() > 1:
        return ""
    answer = predictions.iloc[0]
    answer = answer.item() if hasattr(answer, "item") else answer  # a numpy scalar: its plain value
    return (f"{plan} is collapsed: it predicts {answer!r} for every one of its {len(predictions)} "
            "examples, so the model is at chance under it and the difference measures how far the other plan is from "
            "chance")


def ordering_findings(files: StudyFiles) -> list[Finding]:
    """Every ordering claim, each table's family Holm-adjusted per model."""
    claims = orderings()
    evidence: dict[str, list[Evidence]] = {o.claim.key: [] for o in claims}
    for model in files.models:
        for family in dict.fromkeys(o.family for o in claims):
            present = [o for o in claims if o.family == family and files.job("tables", o.table, model, o.kept)
                       and files.job("tables", o.table, model, o.removed)]
            level = family_resampling(files.resampling, len(present))
            results = [paired_tests(files.metric, [files.records(files.job("tables", o.table, model, o.kept))],
                                    files.records(files.job("tables", o.table, model, o.removed)), level,
                                    names=[o.kept])[0] for o in present]
            adjusted = adjust_p_values([r.p_value for r in results], "holm")
            for o, result, p in zip(present, results, adjusted):
                evidence[o.claim.key].append(ordering_evidence(files, o, model, result, float(p), level.confidence,
                                                               len(present)))
    for o in claims:
        found = [e for e in evidence[o.claim.key] if e.verdict != NOT_TESTED]
        if len(files.models) > 1 and len(found) == len(files.models):
            evidence[o.claim.key].append(pooled_evidence(files, o, found))
    return [ordering_finding(files, o, evidence[o.claim.key]) for o in claims]


def pooled_evidence(files: StudyFiles, o: Ordering, per_seed: list[Evidence]) -> Evidence:
    """The seeds' differences pooled by a hierarchical bootstrap (``headlab.reporting.pooled``), at the family's
    simultaneous level: the finding's verdict, with the seeds' spread beside it; ``per_seed``: each seed's evidence
    (its level, its spread across the bootstrap fits)."""
    level = min(e.values["confidence"] for e in per_seed)
    pairs = [(files.records(files.job("tables", o.table, model, o.kept)),
              files.records(files.job("tables", o.table, model, o.removed))) for model in files.models]
    found = pooled_difference(files.metric, pairs, replace(files.resampling, confidence=level))
    digits = 2 if files.scale == 100 else 4
    seeds = ", ".join(f"{model} {value:+.{digits}f}" for model, value in zip(files.models, found.seeds))
    numbers = (f"{files.metric} {o.kept} - {o.removed} pooled over {len(pairs)} seeds: "
               f"{interval(found.value, found.low, found.high, digits)} ({100 * level:.4g}%: a hierarchical bootstrap"
               f" of the seeds, then clusters of examples, joined with Student's t over the seeds; the seeds' own "
               f"{seeds}, standard deviation "
               f"{found.between:.{digits}f}; boundary 0)")
    outcome = verdict(found.low, found.high, 0.0)
    note = "" if outcome != INCONCLUSIVE else f"half-width {(found.high - found.low) / 2:.{digits}f}; more seeds " \
        "narrow it where the seeds differ, more examples where each seed's own interval is wide"
    if o.family == "table2" and outcome == HOLDS:
        controls = [controlled(files, model, o.removed, HOLDS, [], {}) for model in files.models]
        if INCONCLUSIVE in controls:
            outcome, note = INCONCLUSIVE, (f"the pooled ordering holds, but {o.removed} does not cost more than "
                                           "random sets of its size on every seed (each seed's control beside it)")
    if o.family == "table2" and outcome in (HOLDS, FAILS):
        spreads = [RefitSpread.from_json(e.values["refits"], 0.0) for e in per_seed if "refits" in e.values]
        if any(not spread.agrees(outcome) for spread in spreads):
            outcome, note = INCONCLUSIVE, (f"the pooled ordering {outcome}, but on some seed fewer than half of the "
                                           "bootstrap fits of the clusters put the estimate on that side (each "
                                           "seed's spread beside it)")
    return Evidence(POOLED, outcome, numbers, f"tables/{o.table}/{{{','.join(files.models)}}}", {
        "value": found.value, "low": found.low, "high": found.high, "boundary": 0.0, "confidence": level,
        "seeds": list(found.seeds), "between_seeds_sd": found.between}, note=note)


def ordering_evidence(files: StudyFiles, o: Ordering, model: str, result, p: float, level: float,
                      family: int) -> Evidence:
    digits = 2 if files.scale == 100 else 4
    alpha = 1 - files.resampling.confidence
    # the CI is Bonferroni's (1 - alpha / family): checked against the p-value adjusted alike, not Holm's (smaller)
    bonferroni = min(1.0, family * result.p_value)
    numbers = (f"{files.metric} {o.kept} - {o.removed}: {interval(result.delta, result.ci_low, result.ci_high, digits)}"
               f" ({100 * level:.4g}% CI, simultaneous over the {family} claims of {o.family}; p {result.p_value:.3g}, "
               f"Bonferroni-adjusted {bonferroni:.3g} (the CI's level), Holm-adjusted {p:.3g}; {result.units} "
               f"{unit_name(result.units, result.n)}; boundary 0)")
    permutations = 0 if 2 ** min(result.units, 62) <= files.resampling.permutations else files.resampling.permutations
    outcome, why = checked_verdict(result.ci_low, result.ci_high, 0.0, bonferroni, alpha, permutations,
                                   result.p_value)
    values = {"value": result.delta, "low": result.ci_low, "high": result.ci_high, "p_value": result.p_value,
              "p_adjusted": p, "p_bonferroni": bonferroni, "confidence": level, "family": o.family,
              "family_size": family, "boundary": 0.0, "examples": result.n, "units": result.units}
    notes = [why] if why else []
    misfit = misnamed(files, model, (o.kept, o.removed))
    if misfit:
        outcome, notes = NOT_TESTED, [misfit]
    elif outcome == INCONCLUSIVE and not why:
        note, more = undecided_note(result.delta, result.ci_low, result.ci_high, 0.0, result.units,
                                    unit_name(result.units, result.n), digits)
        notes.append(note)
        values |= more
    marks = {plan: collapsed(files, o.table, model, plan) for plan in (o.kept, o.removed)}
    notes += [mark for mark in marks.values() if mark]
    values["collapsed"] = [plan for plan, mark in marks.items() if mark]
    if o.family == "table2" and outcome != NOT_TESTED:
        outcome = controlled(files, model, o.removed, outcome, notes, values)
        spread = ordering_spread(files, model, o.kept, o.removed, family_resampling(files.resampling, family))
        outcome = gated(spread, outcome, notes, values, digits)
    file = f"tables/{o.table}/{model}/{{{o.kept},{o.removed}}}/records.parquet"
    return Evidence(model, outcome, numbers, file, values, note="; ".join(notes))


def ordering_finding(files: StudyFiles, o: Ordering, evidence: list[Evidence]) -> Finding:
    if evidence:
        return Finding(o.claim, tuple(evidence))
    if any(job.startswith(f"tables/{o.table}/") for job in files.jobs("tables")):
        return not_tested(o.claim, "the clusters are not Guan et al.'s four types (no plan of that type)")
    return not_tested(o.claim, files.absent("tables") if "tables" in files.stale else
                      f"the tables stage has no {o.table} jobs in this study")


def cost_findings(files: StudyFiles) -> list[Finding]:
    """Each bounded cost per model, the two claims one family: CIs at ``1 - alpha / 2`` each, the permutation
    p-values of their changes Holm-adjusted across them."""
    claims = costs()
    evidence: dict[str, list[Evidence]] = {cost.claim.key: [] for cost in claims}
    for model in files.models:
        base = files.job("tables", "table2", model, "baseline")
        present = [c for c in claims if base is not None and files.job("tables", "table2", model, c.plan)]
        level = family_resampling(files.resampling, len(present))
        baseline = files.records(base) if present else None
        tests = [paired_tests(files.metric, [files.records(files.job("tables", "table2", model, c.plan))], baseline,
                              level, names=[c.plan])[0] for c in present]
        adjusted = adjust_p_values([t.p_value for t in tests], "holm")
        for cost, test, p in zip(present, tests, adjusted):
            evidence[cost.claim.key].append(cost_evidence(files, cost, model, baseline, test, float(p), level))
    return [cost_finding(files, cost, evidence[cost.claim.key]) for cost in claims]


def cost_evidence(files: StudyFiles, cost: Cost, model: str, baseline, test, p: float,
                  level: Resampling) -> Evidence:
    """``(plan - baseline) / (baseline - chance)`` against the paper's bound, its CI at the family's ``level``; the
    change's permutation ``p`` (of no change, Holm-adjusted) is stated beside it: it does not test the bound."""
    boundary, own = paper_bound(cost.plan, files.metric)
    ablated = files.records(files.job("tables", "table2", model, cost.plan))
    golds = files.gold_answers(list(baseline["id"])) if "exact_match" in baseline else None
    chance = chance_level(files.metric, baseline, golds, files.version)
    file = f"tables/table2/{model}/{{{cost.plan},baseline}}/records.parquet"
    if chance is None:
        return Evidence(model, NOT_TESTED, f"{files.metric}: chance unknown", file,
                        note="the chance level of the baseline's examples could not be computed")
    value, low, high = headroom_interval(files.metric, ablated, baseline, chance[0], level)
    headroom = test.baseline - chance[0]
    if zero_width(low, high) and headroom > 0:  # no unit changed: the bootstrap says nothing of how few that shows
        low = value - unchanged_bound(test.units, level.confidence, files.scale) / headroom
    units = test.units
    numbers = (f"({files.metric} {cost.plan} - baseline) / (baseline - chance {chance[0]:.4g}): "
               f"{interval(value, low, high, 4)} ({100 * level.confidence:.4g}% CI, simultaneous over the "
               f"{len(costs())} bounded costs; p of no change {test.p_value:.3g}, Holm-adjusted {p:.3g}; {units} "
               f"{unit_name(units, test.n)}; boundary the paper's bound {boundary:+.4f}, its own {own:+.4f})")
    outcome, why = verdict(low, high, boundary), ""  # the change's p tests no change, not the paper's bound
    values = {"value": value, "low": low, "high": high, "boundary": boundary, "paper": own, "chance": chance[0],
              "confidence": level.confidence, "p_value": test.p_value, "p_adjusted": p, "examples": test.n,
              "units": units}
    notes = [why] if why else []
    misfit = misnamed(files, model, (cost.plan,))
    if misfit:
        outcome, notes = NOT_TESTED, [misfit]
    elif outcome == INCONCLUSIVE and not why:
        note, more = undecided_note(value, low, high, boundary, units, unit_name(units, test.n), 4)
        notes.append(note)
        values |= more
    notes += [c for c in (collapsed(files, "table2", model, cost.plan),) if c]
    if outcome != NOT_TESTED:
        outcome = gated(cost_spread(files, model, cost.plan, boundary, level), outcome, notes, values, 4)
    return Evidence(model, outcome, numbers, file, values, note="; ".join(notes))


def cost_finding(files: StudyFiles, cost: Cost, evidence: list[Evidence]) -> Finding:
    if evidence:
        return Finding(cost.claim, tuple(evidence))
    if any(job.startswith("tables/table2/") for job in files.jobs("tables")):
        return not_tested(cost.claim, "the clusters are not Guan et al.'s four types (no plan of that type)")
    return not_tested(cost.claim, files.absent("tables") if "tables" in files.stale else
                      "the tables stage has no table2 jobs in this study")


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
