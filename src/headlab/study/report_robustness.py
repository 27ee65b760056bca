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
  Shapley value, under prune, and whether it holds, is not separated or flips under mean and resample. Every
  comparison is the **paired** difference of the two types on the same examples (what removing one costs minus what
  removing the other costs; the difference of their per-example Shapley values), with its bootstrap interval: an
  ordering is stated only where that interval under prune excludes 0, "holds" under another method where its
  interval excludes 0 the same way, "flips" only where it excludes 0 the other way **and** the method x type
  interaction (the difference under prune minus the difference under the other method, per example) excludes 0,
  and "not separated" otherwise: an interval across 0 is not evidence of a tie. Pairs not separated under prune are
  listed in one line, not as conclusions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats

from headlab.files import read_json
from headlab.reporting.layouts import to_markdown
from headlab.study.findings import study_files
from headlab.study.findings.limits import limit_reasons
from headlab.study.report_base import StudyReport, number
from headlab.study.stages import LEARNED_REMOVAL, REMOVALS

MOVERS = 5  # heads listed whose rank moves most between methods


def robustness(report: StudyReport) -> None:
    jobs = report.stage_jobs("robustness")
    learned = any(job.startswith(f"robustness/sweep_{LEARNED_REMOVAL}/") for job in jobs)
    methods = ("prune, mean, resample and optimal ablation (the gates stage's constants)" if learned else
               "prune, mean and resample ablation")
    report.section(f"Robustness: do the conclusions hold under {methods}?")
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
    folders = {policy: report.path("robustness", f"{kind}_{policy}", name) for policy in (*REMOVALS, LEARNED_REMOVAL)}
    return {policy: folder for policy, folder in folders.items()
            if f"robustness/{kind}_{policy}/{name}" in jobs and (folder / file).is_file()}


def types_table(report: StudyReport, name: str, shapley: dict[str, Path], numbers: dict, limited: str | None = None
                ) -> None:
    """Each type removed alone and each type's Shapley value, per method; the conclusions they support, none when
    ``limited`` says why no ablation of the model can be read (``findings.limits``: its floor or ceiling)."""
    results = {policy: read_json(folder / "results.json", "shapley results") for policy, folder in shapley.items()}
    first = next(iter(results.values()))
    score, split = first["score"], next(iter(first["splits"]))
    confidence = first["config"]["shapley"]["confidence"]
    types = list(first["players"])
    removed, values, changes, phis, clusters = {}, {}, {}, {}, None
    for policy, folder in shapley.items():
        scores = pd.read_parquet(folder / "coalitions.parquet")
        scores = scores[scores["split"] == split]
        table = scores.pivot(index="example", columns="removed", values="score").sort_index()  # [examples, coalitions]
        if "cluster" in scores:  # the examples' unit of sampling (a question's pairs)
            clusters = scores.drop_duplicates("example").set_index("example")["cluster"].loc[table.index].to_numpy()
        for type_, phi in (example_shapley(table, types) or {}).items():  # none: not every coalition was scored
            phis[policy, type_] = phi
        for type_ in types:
            changes[policy, type_] = (table[type_] - table["none"]).to_numpy()
            removed[policy, type_] = _mean_interval(changes[policy, type_], confidence, clusters)
        for row in results[policy]["values"]:
            if row["split"] == split:
                values[policy, row["group"]] = (row["value"], row["ci_low"], row["ci_high"])
    rows = [{"type": type_,
             **{f"removed alone, {policy}": _cell(removed[policy, type_]) for policy in shapley},
             **{f"Shapley, {policy}": _cell(values[policy, type_]) for policy in shapley}} for type_ in types]
    links = ", ".join(f"`{report.link(folder / 'shapley.csv')}`" for folder in shapley.values())
    examples = len(next(iter(changes.values())))
    report.markdown += [f"{name}: Guan et al.'s Table 2 under each method (the change of the per-example {score} when "
                        f"a type's heads are removed alone, with a {confidence:.0%} paired bootstrap interval over "
                        f"the {examples} examples of {split}) and each type's exact Shapley value (its share of full "
                        f"minus every type removed; {links}):", "", to_markdown(pd.DataFrame(rows)), ""]
    sentences, held, unseparated = conclusions(types, changes, phis, list(shapley), score, confidence, clusters)
    if limited:
        sentences, held, unseparated = [], 0, []
        report.markdown += [f"No conclusion is drawn from these: {limited}.", ""]
    first = next(iter(shapley))
    report.markdown += [*(f"- {sentence}" for sentence in sentences), ""]
    if unseparated:
        report.markdown += [f"Not separated under {first} (the paired interval of what removing one costs minus what "
                            f"removing the other costs contains 0), so no conclusion: {'; '.join(unseparated)}.", ""]
    pairs = math.comb(len(types), 2)
    unit = "examples" if clusters is None else f"examples ({len(set(clusters))} clusters of them resampled whole)"
    report.markdown += [f"(Each comparison is the paired difference of two types on the same {examples} {unit}, "
                        f"with its bootstrap interval at {1 - (1 - confidence) / pairs:.2%}, simultaneous over the "
                        f"{pairs} pairs: an ordering is stated where it excludes 0 "
                        f"under {first}; under another method it holds where it excludes 0 the same way, flips where "
                        "it excludes 0 the other way and the method x type interaction excludes 0 too, and is not "
                        "separated otherwise. The findings' Table 2 claims read the tables stage's examples, with "
                        "their own intervals; these read the robustness stage's.)", ""]
    numbers |= {"score": score, "split": split, "examples": examples,
                "removed_alone": {f"{p}/{t}": removed[p, t][0] for p, t in removed},
                "shapley": {f"{p}/{t}": values[p, t][0] for p, t in values}, "conclusions": sentences,
                "not_separated": unseparated}
    stated = sum(not sentence.endswith(NO_ORDER) for sentence in sentences)
    report.console.append(f"robustness {name}: {held} of {stated} conclusions hold under {', '.join(shapley)}"
                          if stated else f"robustness {name}: no conclusion: {limited}" if limited else
                          f"robustness {name}: no conclusion: no two types are separated under {first} (every "
                          "paired interval contains 0)")


def example_shapley(table: pd.DataFrame, types: list[str]) -> dict[str, np.ndarray] | None:
    """Each type's exact Shapley value per example, from the scores of every coalition (``table``: a column per
    removed set, ``none`` and ``a,b``): sum over the sets S of the other types kept of |S|! (n - |S| - 1)! / n! x
    (v(S + type) - v(S)), v(K) the score with every type outside K removed. Their means are the stage's values.
    None when a coalition was not scored (a sampled estimate's job)."""
    wanted = {",".join(sorted(gone)) or "none" for size in range(len(types) + 1)
              for gone in itertools.combinations(types, size)}
    if not wanted <= set(table.columns):
        return None

    def column(kept: frozenset) -> np.ndarray:
        gone = [t for t in sorted(types) if t not in kept]
        return table[",".join(gone) if gone else "none"].to_numpy()

    n = len(types)
    out = {}
    for type_ in types:
        others = [t for t in types if t != type_]
        phi = np.zeros(len(table))
        for size in range(n):
            weight = math.factorial(size) * math.factorial(n - size - 1) / math.factorial(n)
            for kept in itertools.combinations(others, size):
                phi += weight * (column(frozenset(kept) | {type_}) - column(frozenset(kept)))
        out[type_] = phi
    return out


NO_ORDER = "so no order is stated"  # ends the sentence of a ranking whose every pair is not separated


def conclusions(types: list[str], changes: dict, phis: dict, methods: list[str], score: str,
                confidence: float = 0.95, clusters: np.ndarray | None = None) -> tuple[list[str], int, list[str]]:
    """The orderings the first method separates, one sentence each with its verdict under every method (each pair of
    types by what removing them costs; the types by Shapley value); how many hold under every method; and the pairs
    not separated under the first method (no conclusion). ``changes`` and ``phis``: ``{(method, type): per-example
    array}`` of the score's change when the type is removed alone, and of the type's Shapley value; ``clusters``:
    the examples' units of sampling (resampled whole). Each family of pairs (costs; Shapley values) gets
    Bonferroni-simultaneous intervals, ``1 - (1 - confidence) / pairs`` each."""
    loss, first = score == "loss", methods[0]
    confidence = 1 - (1 - confidence) / max(math.comb(len(types), 2), 1)
    interval = lambda values: _mean_interval(values, confidence, clusters)  # noqa: E731
    sentences, held, unseparated = [], 0, []
    for a, b in itertools.combinations(types, 2):
        costs = {m: (changes[m, a] - changes[m, b]) * (1 if loss else -1) for m in methods}  # > 0: a costs more
        side = _side(interval(costs[first]))
        if not side:
            unseparated.append(f"{a} and {b}")
            continue
        if side < 0:
            a, b, costs = b, a, {m: -d for m, d in costs.items()}
        verdict, holds = _verdict(methods, {m: [_relation(costs, first, m, interval)] for m in methods})
        sentences.append(f"removing {a} heads costs more {score} than removing {b} heads, by "
                         f"{_cell(interval(costs[first]))} ({first}): {verdict}")
        held += holds
    if any((m, t) not in phis for m in methods for t in types):
        sentences.append(f"the types by Shapley value: not every coalition was scored (a sampled estimate), so no "
                         f"paired comparison of their values, {NO_ORDER}")
        return sentences, held, unseparated
    helps = {m: {(a, b): (phis[m, a] - phis[m, b]) * (-1 if loss else 1) for a, b in itertools.permutations(types, 2)}
             for m in methods}  # > 0: a is more helpful than b
    order = [(a, b) for a, b in itertools.combinations(types, 2) if _side(interval(helps[first][a, b]))]
    order = [(a, b) if _side(interval(helps[first][a, b])) > 0 else (b, a) for a, b in order]
    if not order:
        sentences.append(f"the types by Shapley value: no two are separated by their paired intervals under {first}, "
                         f"{NO_ORDER}")
        return sentences, held, unseparated
    relations = {m: [_relation({k: helps[k][a, b] for k in methods}, first, m, interval, f"{a} > {b}")
                     for a, b in order] for m in methods}
    verdict, holds = _verdict(methods, relations)
    sentences.append(f"the types by Shapley value, most helpful first, where their paired intervals separate them "
                     f"({first}: {', '.join(f'{a} > {b}' for a, b in order)}): {verdict}")
    return sentences, held + holds, unseparated


def _relation(differences: dict[str, np.ndarray], first: str, method: str,
              interval: Callable[[np.ndarray], tuple[float, float, float]], shown: str | None = None
              ) -> tuple[int, str]:
    """``(side, shown)`` of the claim "the difference is above 0" under ``method``: 1 when its ``interval`` lies
    above 0, -1 when it lies below and the interaction with ``first`` (their per-example difference) excludes 0 too
    (a flip), 0 otherwise (not separated)."""
    found = interval(differences[method])
    side = _side(found)
    if side < 0 and not _side(interval(differences[first] - differences[method])):
        side = 0  # the other way, but not differently from the first method: no evidence of a flip
    return side, shown or _cell(found)


def _side(value: tuple[float, float, float]) -> int:
    """1 when the interval lies above 0, -1 when below, 0 when it contains 0."""
    _, low, high = value
    return 1 if low > 0 else -1 if high < 0 else 0


def _verdict(methods: list[str], relations: dict[str, list[tuple[int, str]]]) -> tuple[str, bool]:
    """``holds under`` the methods that separate every relation as the first does, then ``not separated under`` /
    ``flips under`` the methods that do not separate it / reverse it (``_relation``), with those relations; and
    whether it holds under every method. ``relations``: per method, ``(side, shown)`` of each relation."""
    held = [m for m in methods if all(side > 0 for side, _ in relations[m])]
    parts = [f"holds under {', '.join(held)}"]
    for word, wanted in (("not separated", 0), ("flips", -1)):
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
    pairs = [{"methods": f"{a} vs {b}", "spearman": spearman(table[a], table[b])}
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


def spearman(left: pd.Series, right: pd.Series) -> float:
    """Spearman's correlation; NaN (shown n/a), without scipy's warning, when either side is constant (every head's
    change 0 in a smoke run): no ranking to correlate."""
    if left.nunique() < 2 or right.nunique() < 2:
        return float("nan")
    return float(scipy.stats.spearmanr(left, right).statistic)


def _mean_interval(differences: np.ndarray, confidence: float, clusters: np.ndarray | None = None
                   ) -> tuple[float, float, float]:
    """The mean per-example change and its BCa bootstrap interval (seed 0), resampling the examples, or their
    ``clusters`` (the examples' unit of sampling: the mean of the drawn clusters' sums over their sizes)."""
    mean = float(differences.mean())
    if len(differences) < 2 or np.all(differences == differences[0]):
        return mean, mean, mean
    if clusters is None:
        data, statistic = (differences,), np.mean
    else:
        _, groups = np.unique(clusters, return_inverse=True)
        data = (np.bincount(groups, weights=differences), np.bincount(groups).astype(np.float64))  # sums, sizes
        statistic = lambda sums, sizes, axis=-1: sums.sum(axis) / sizes.sum(axis)  # noqa: E731
        if len(data[0]) < 2:
            return mean, mean, mean
    result = scipy.stats.bootstrap(data, statistic, paired=True, method="BCa", confidence_level=confidence,
                                   n_resamples=2000, random_state=np.random.default_rng(0))
    return mean, float(result.confidence_interval.low), float(result.confidence_interval.high)


def _cell(value: tuple[float, float, float]) -> str:
    mean, low, high = value
    return f"{mean:+.4g} [{low:+.4g}, {high:+.4g}]"
