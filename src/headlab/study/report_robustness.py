"""The study report's robustness section: do its conclusions survive the choice of ablation?

Guan et al. and Michel et al. take a head away by zeroing it; the circuits literature replaces it by its mean over
a reference set or by its output on another input, and the choice can change which heads look important (Zhang and
Nanda 2024). The robustness stage runs, on one set of examples, the single-head sweep and the head types' Shapley
values under ``prune``, ``mean`` and ``resample``; this section reads them:

* Table 2 side by side: each type removed alone (a Shapley job's coalition), the change of the score with a paired
  bootstrap interval over the examples, and each type's Shapley value with its interval, per method;
* the single-head sweeps: Spearman correlation of the heads' changes between methods, and the heads whose rank
  moves most;
* one sentence per conclusion: each ordering of two types by what removing them costs, and the types' order by
  Shapley value, under prune, and whether it holds, ties or flips under mean and resample. An ordering is stated
  only where the intervals of Table 2 separate the two values (removed alone: the pairs; Shapley: the order);
  under another method it holds where they are separated the same way, ties where they overlap, flips where they
  are separated the other way. Pairs tied under prune are listed in one line, not as conclusions.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats

from headlab.files import read_json
from headlab.reporting.layouts import to_markdown
from headlab.study.findings import study_files
from headlab.study.findings.limits import limit_reasons
from headlab.study.report_base import StudyReport, number
from headlab.study.stages import REMOVALS

MOVERS = 5  # heads listed whose rank moves most between methods


def robustness(report: StudyReport) -> None:
    report.section("Robustness: do the conclusions hold under prune, mean and resample ablation?")
    jobs = report.stage_jobs("robustness")
    found, limited = False, None  # limited: model -> why no ablation of it can be read (its floor, ceiling, none)
    for name, _ in report.study.models:
        shapley = _jobs(report, jobs, "shapley", name, "coalitions.parquet")
        sweeps = _jobs(report, jobs, "sweep", name, "results.json")
        if not shapley and not sweeps:
            continue
        found = True
        numbers = report.numbers.setdefault("robustness", {}).setdefault(name, {})
        if shapley:
            limited = limits_of(report) if limited is None else limited
            types_table(report, name, shapley, numbers, limited.get(name))
        if len(sweeps) > 1:
            sweep_agreement(report, name, sweeps, numbers)
    if not found:
        report.missing("robustness")


def limits_of(report: StudyReport) -> dict[str, str]:
    """``model -> why no ablation of it can be read`` (``findings.limits``); none in a smoke run, whose orderings
    check the chain (its findings all read not tested)."""
    files = study_files(report.study)
    return {} if files.smoke else limit_reasons(files)


def _jobs(report: StudyReport, jobs: set[str], kind: str, name: str, file: str) -> dict[str, Path]:
    """``{policy: job folder}`` of this model's ``kind`` jobs (shapley, sweep) of the stage's last run."""
    folders = {policy: report.path("robustness", f"{kind}_{policy}", name) for policy in REMOVALS}
    return {policy: folder for policy, folder in folders.items()
            if f"robustness/{kind}_{policy}/{name}" in jobs and (folder / file).is_file()}


def types_table(report: StudyReport, name: str, shapley: dict[str, Path], numbers: dict, limited: str | None = None
                ) -> None:
    """Each type removed alone and each type's Shapley value, per method; the conclusions they support, none when
    ``limited`` says why no ablation of the model can be read (``findings.limits``: its floor or ceiling)."""
    results = {policy: read_json(folder / "results.json", "shapley results") for policy, folder in shapley.items()}
    first = next(iter(results.values()))
    score, split = first["score"], next(iter(first["splits"]))
    types = list(first["players"])
    removed, values = {}, {}
    for policy, folder in shapley.items():
        scores = pd.read_parquet(folder / "coalitions.parquet")
        scores = scores[scores["split"] == split]
        full = scores[scores["removed"] == "none"].sort_values("example")["score"].to_numpy()
        confidence = results[policy]["config"]["shapley"]["confidence"]
        for type_ in types:
            alone = scores[scores["removed"] == type_].sort_values("example")["score"].to_numpy()
            removed[policy, type_] = _mean_interval(alone - full, confidence)
        for row in results[policy]["values"]:
            if row["split"] == split:
                values[policy, row["group"]] = (row["value"], row["ci_low"], row["ci_high"])
    rows = [{"type": type_,
             **{f"removed alone, {policy}": _cell(removed[policy, type_]) for policy in shapley},
             **{f"Shapley, {policy}": _cell(values[policy, type_]) for policy in shapley}} for type_ in types]
    links = ", ".join(f"`{report.link(folder / 'shapley.csv')}`" for folder in shapley.values())
    report.markdown += [f"{name}: Guan et al.'s Table 2 under each method (the change of the per-example {score} when "
                        f"a type's heads are removed alone, with a {confidence:.0%} paired bootstrap interval over "
                        f"the examples of {split}) and each type's exact Shapley value (its share of full minus every "
                        f"type removed; {links}):", "", to_markdown(pd.DataFrame(rows)), ""]
    sentences, held, tied = conclusions(types, removed, values, list(shapley), score)
    if limited:
        sentences, held, tied = [], 0, []
        report.markdown += [f"No conclusion is drawn from these: {limited}.", ""]
    first = next(iter(shapley))
    report.markdown += [*(f"- {sentence}" for sentence in sentences), ""]
    if tied:
        report.markdown += [f"Tied under {first} (their removed-alone intervals overlap), so no conclusion: "
                            f"{'; '.join(tied)}.", ""]
    report.markdown += [f"(An ordering is stated only where the two values' intervals above do not overlap under "
                        f"{first}; under another method it holds where they are separated the same way, ties where "
                        "they overlap and flips where they are separated the other way.)", ""]
    numbers |= {"score": score, "split": split,
                "removed_alone": {f"{p}/{t}": removed[p, t][0] for p, t in removed},
                "shapley": {f"{p}/{t}": values[p, t][0] for p, t in values}, "conclusions": sentences,
                "tied": tied}
    stated = sum(not sentence.endswith(NO_ORDER) for sentence in sentences)
    report.console.append(f"robustness {name}: {held} of {stated} conclusions hold under {', '.join(shapley)}"
                          if stated else f"robustness {name}: no conclusion: {limited}" if limited else
                          f"robustness {name}: no conclusion: every pair of types ties under {first} "
                          "(their intervals overlap)")


NO_ORDER = "so no order is stated"  # ends the sentence of a ranking whose every pair ties (not a conclusion)


def conclusions(types: list[str], removed: dict, values: dict, methods: list[str],
                score: str) -> tuple[list[str], int, list[str]]:
    """The orderings the first method's intervals separate, one sentence each with its verdict under every method
    (each pair of types by what removing them costs: the ``removed alone`` intervals; the types by Shapley value: the
    Shapley intervals); how many hold under every method; and the pairs whose removed-alone intervals overlap under
    the first method (ties: no conclusion). ``removed`` and ``values``: ``{(method, type): (value, low, high)}``."""
    loss, first = score == "loss", methods[0]
    sentences, held, tied = [], 0, []
    for a, b in itertools.combinations(types, 2):
        side = _side(removed[first, a], removed[first, b], larger=loss)  # 1: removing a costs more
        if not side:
            tied.append(f"{a} and {b}")
            continue
        a, b = (a, b) if side > 0 else (b, a)
        shown = {m: f"{_cell(removed[m, a])} vs {_cell(removed[m, b])}" for m in methods}
        verdict, holds = _verdict(methods, {m: [(_side(removed[m, a], removed[m, b], larger=loss), shown[m])]
                                            for m in methods})
        sentences.append(f"removing {a} heads costs more {score} than removing {b} heads ({first}: {shown[first]}): "
                         f"{verdict}")
        held += holds
    helpful = not loss  # a type that helps has a positive value, a negative one for the loss
    ranked = sorted(types, key=lambda t: -values[first, t][0] if helpful else values[first, t][0])
    order = [(a, b) if side > 0 else (b, a) for i, a in enumerate(ranked) for b in ranked[i + 1:]
             if (side := _side(values[first, a], values[first, b], larger=helpful))]
    if not order:
        sentences.append(f"the types by Shapley value: no two are separated by their intervals under {first} (every "
                         f"pair ties), {NO_ORDER}")
        return sentences, held, tied
    verdict, holds = _verdict(methods, {m: [(_side(values[m, a], values[m, b], larger=helpful), f"{a} > {b}")
                                            for a, b in order] for m in methods})
    sentences.append(f"the types by Shapley value, most helpful first, where their intervals separate them ({first}: "
                     f"{', '.join(f'{a} > {b}' for a, b in order)}): {verdict}")
    return sentences, held + holds, tied


def _side(a: tuple[float, float, float], b: tuple[float, float, float], larger: bool) -> int:
    """1 when the interval of ``a`` lies wholly past that of ``b`` on the stated side (above it when ``larger``,
    below it otherwise), -1 when wholly past it on the other side, 0 when they overlap (a tie)."""
    (_, low_a, high_a), (_, low_b, high_b) = a, b
    side = 1 if low_a > high_b else -1 if low_b > high_a else 0
    return side if larger else -side


def _verdict(methods: list[str], relations: dict[str, list[tuple[int, str]]]) -> tuple[str, bool]:
    """``holds under`` the methods that separate every relation as the first does, then ``ties under`` / ``flips
    under`` the methods whose intervals overlap / separate it the other way, with those relations; and whether it
    holds under every method. ``relations``: per method, ``(side, shown)`` of each relation (``_side``)."""
    held = [m for m in methods if all(side > 0 for side, _ in relations[m])]
    parts = [f"holds under {', '.join(held)}"]
    for word, wanted in (("ties", 0), ("flips", -1)):
        chosen = [f"{m} ({', '.join(shown for side, shown in relations[m] if side == wanted)})" for m in methods
                  if any(side == wanted for side, _ in relations[m])]
        if chosen:
            parts.append(f"{word} under {', '.join(chosen)}")
    return "; ".join(parts), len(held) == len(methods)


def sweep_agreement(report: StudyReport, name: str, sweeps: dict[str, Path], numbers: dict) -> None:
    """Spearman between the methods' single-head changes, and the heads whose rank moves most."""
    deltas = {}
    for policy, folder in sweeps.items():
        path = sorted(folder.glob("deltas_*.csv"))[0]
        frame = pd.read_csv(path, index_col=0)
        deltas[policy] = frame.stack()  # (layer, head) -> change of the main metric
    split, metric = path.stem.removeprefix("deltas_"), frame.index.name
    table = pd.DataFrame(deltas)
    pairs = [{"methods": f"{a} vs {b}", "spearman": scipy.stats.spearmanr(table[a], table[b]).statistic}
             for a, b in itertools.combinations(sweeps, 2)]
    ranks = table.rank(ascending=True, method="average")  # 1: the head whose removal lowers the metric most
    spread = (ranks.max(axis=1) - ranks.min(axis=1))[(table != 0).any(axis=1)]  # heads no method moves: ties only
    moved = spread[spread > 0].sort_values(ascending=False, kind="stable").head(MOVERS)
    movers = [{"head": f"{layer}{head}", **{f"{p} change": f"{table.loc[(layer, head), p]:+.4f}" for p in sweeps},
               **{f"{p} rank": int(ranks.loc[(layer, head), p]) for p in sweeps}} for layer, head in moved.index]
    report.markdown += [f"{name}: each head removed alone under each method ({metric} on {split}; "
                        + ", ".join(f"`{report.link(folder)}`" for folder in sweeps.values()) + "): Spearman "
                        "correlation of the heads' changes between methods, and the heads whose rank (1: the most "
                        "harmful removal) moves most:", "",
                        to_markdown(pd.DataFrame(pairs).assign(spearman=lambda f: f["spearman"].map(number))), "",
                        to_markdown(pd.DataFrame(movers)), ""]
    numbers["sweep_spearman"] = {row["methods"]: float(row["spearman"]) for row in pairs}
    numbers["moved_most"] = [row["head"] for row in movers]
    report.console.append(f"robustness {name}: single-head sweeps, Spearman " + ", ".join(
        f"{row['methods']} {number(row['spearman'])}" for row in pairs))


def _mean_interval(differences: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """The mean per-example change and its BCa bootstrap interval (resampling the examples; seed 0)."""
    mean = float(differences.mean())
    if len(differences) < 2 or np.all(differences == differences[0]):
        return mean, mean, mean
    result = scipy.stats.bootstrap((differences,), np.mean, method="BCa", confidence_level=confidence,
                                   n_resamples=2000, random_state=np.random.default_rng(0))
    return mean, float(result.confidence_interval.low), float(result.confidence_interval.high)


def _cell(value: tuple[float, float, float]) -> str:
    mean, low, high = value
    return f"{mean:+.4g} [{low:+.4g}, {high:+.4g}]"
