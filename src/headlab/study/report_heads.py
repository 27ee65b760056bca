"""The study report's sections on single heads: syntax heads (Clark et al.), importance and the single-head sweep
(Michel et al.), the prune curve, and (when the gates stage ran) the learned gates and constants: each model's L0
penalties against heads pruned (beside the prune curve's orders when that stage ran too), causal head gating's
classes and their cost, optimal ablation's gaps against mean ablation's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from headlab.analysis.importance.agreement import agreement_markdown, normalisation_label
from headlab.analysis.syntax.heads import left_out_sentence
from headlab.core.head_names import head_name
from headlab.files import read_json
from headlab.reporting import plots
from headlab.reporting.layouts import clark_layout, to_markdown
from headlab.study.report_base import StudyReport, main_metric, number

TOP_HEADS = 10


def syntax(report: StudyReport) -> None:
    report.section("Syntax heads (Clark et al.): the best head per dependency relation vs offset baselines")
    for name, path in report.sources("syntax", "syntax.csv", ["pretrained", *(n for n, _ in report.study.models)]):
        table = pd.read_csv(path)
        result = read_json(path.parent / "results.json", "syntax results")
        beaten = table[(table["relation"] != "all") & (table["difference"] > 0) & (table["p_adjusted"] < 0.05)]
        treebank = Path(result["treebank"])
        report.markdown += [f"{name}, {result['num_sentences']} sentences of `{treebank.parent.name}/{treebank.name}`: "
                            f"{len(beaten)} of {len(table) - 1} relations have a head that beats the best offset "
                            f"(Holm-adjusted p < 0.05; `{report.link(path)}`):", "",
                            to_markdown(clark_layout(table))]
        below = (result.get("left_out") or {}).get("relations")
        if below:
            report.markdown += [left_out_sentence(pd.Series(below, dtype=int), result["left_out"]["min_count"]), ""]
        if "roles" in result:
            roles = ", ".join(f"{role} {count}" for role, count in result["roles"].items())
            report.markdown += [f"Syntactic roles of {name}'s heads (Pande et al.'s sieves; "
                                f"`{report.link(path.parent / 'sieve_roles.csv')}`): {roles}.", ""]
        overall = table.set_index("relation").loc["all"]
        report.numbers.setdefault("syntax", {})[name] = {
            "all": {"head": overall["head"], "direction": overall["direction"], "accuracy": float(overall["accuracy"]),
                    "baseline": float(overall["baseline_accuracy"])},
            "relations_beaten": sorted(beaten["relation"]), "roles": result.get("roles")}
        report.console.append(f"syntax {name}: best single head {overall['head']} ({overall['direction']}) "
                              f"{100 * overall['accuracy']:.1f} vs offset {100 * overall['baseline_accuracy']:.1f}; "
                              f"{len(beaten)} of {len(table) - 1} relations beat their offset")
    report.figure(report.path("syntax", "pretrained", "syntax_examples.png"), "best syntax heads, pre-trained")


def importance(report: StudyReport) -> None:
    report.section("Head importance (Michel et al.) and its agreement with the single-head sweep")
    for name, path in report.sources("importance", "importance.json"):
        scores = read_json(path, "importance")
        values = np.asarray(scores["importance"], dtype=float)  # [layers, heads]
        order = np.argsort(-values, axis=None, kind="stable")[:TOP_HEADS]
        top = [(head_name(*divmod(int(i), values.shape[1])), float(values.flat[i])) for i in order]
        report.numbers.setdefault("importance", {})[name] = dict(top)
        settings = scores["settings"]
        granularity = settings["granularity"]
        label = normalisation_label(settings["normalize_layer"], settings["normalize_global"])
        report.markdown += [f"Top {len(top)} heads of {name} by the {granularity} estimator ({label}; "
                            f"`{report.link(path)}`):", "",
                            to_markdown(pd.DataFrame([{"head": h, "importance": f"{v:.4f}"} for h, v in top]))]
        report.console.append(f"top heads {name} ({granularity}, {label}): " +
                              ", ".join(f"{h} {v:.3f}" for h, v in top[:5]))
        agreement = path.parent / "agreement.csv"
        if agreement.is_file():
            agreement_lines(report, pd.read_csv(agreement), report.link(agreement), granularity, label)
        report.figure(path.parent / f"importance_{granularity}.png", f"importance, {name}")
        sweep_table(report, name)


def agreement_lines(report: StudyReport, frame: pd.DataFrame, link: str, granularity: str, label: str) -> None:
    """The agreement table; in the terminal, the ranking the top heads use (``label``) and the first-order
    estimates against both targets, the loss increase (what the estimates predict) and the main metric's drop."""
    report.markdown += [f"Spearman correlation of each estimator with the measured sweep (`{link}`; `scores` names "
                        "the normalisation: a per-layer one reorders heads across layers):", "",
                        agreement_markdown(frame, 4)]
    scores = frame["scores"] if "scores" in frame else pd.Series("raw", index=frame.index)  # an older agreement.csv
    shown = frame[((frame["estimator"] == granularity) & (scores == (label if (scores == label).any() else "raw")))
                  | frame["estimator"].str.startswith("estimate_")]
    for (policy, estimator, kind), rows in shown.assign(scores=scores).groupby(["policy", "estimator", "scores"],
                                                                               sort=False):
        targets = ", ".join(f"{row.target} {number(row.spearman)}" for row in rows.itertuples())
        report.console.append(f"  spearman {policy}/{estimator} ({kind}): {targets}")


def sweep_table(report: StudyReport, name: str) -> None:
    """The single-head sweep's change of the main metric, layers x heads, with its baseline and data."""
    folder = report.path("sweep", name)
    if "sweep" in report.stale or not (folder / "results.json").is_file():
        return
    summary = read_json(folder / "results.json", "sweep results")
    limit = summary["config"]["data"]["max_eval_examples"]
    examples = "every example" if limit is None else f"the first {limit} examples"
    for path in sorted(folder.glob("deltas_*.csv")):
        split = path.stem.removeprefix("deltas_")
        frame = pd.read_csv(path, index_col=0)
        base = summary["tables"][split][main_metric(report.study)]["baseline"]
        report.markdown += ["", f"Each head pruned alone: {frame.index.name} against the unablated "
                            f"{base:.4f}, on {examples} of {split} (`{report.link(path)}`):", "",
                            to_markdown(frame.map(lambda v: f"{v:+.4f}"), index=True)]
        worst = frame.stack().sort_values().head(3)
        report.console.append(f"sweep {name} ({path.stem.removeprefix('deltas_')}): largest drops " + ", ".join(
            f"{layer}{head} {value:+.4f}" for (layer, head), value in worst.items()))


def prune_curve(report: StudyReport) -> None:
    """Each order's last step that kept the score at the threshold (the importance order's is ``final_mask.json``, with
    its measured speed-up), not the step that fell below it."""
    report.section("Pruning by importance vs random orders")
    for name, path in report.sources("prune_curve", "prune_curve.csv"):
        settings = read_json(path.parent / "results.json", "prune curve results")["settings"]
        metric, threshold = settings["metric"], float(settings["threshold"])
        frame = pd.read_csv(path)
        frame = frame[frame["split"] == settings["split"]]
        final = read_json(path.parent / "final_mask.json", "final mask")
        speed = speed_text(final.get("timing") or {})
        rows = []
        for (order, seed), part in frame.groupby(["order", "seed"], dropna=False, sort=False):
            kept = last_kept(part, metric, threshold)
            label = order if pd.isna(seed) else f"{order} (seed {int(seed)})"
            faster = speed if order == "importance" and kept is not None else ""
            rows.append({"order": label, "heads pruned": "none kept" if kept is None else int(kept["heads_pruned"]),
                         metric: "" if kept is None else f"{kept[metric]:.4f}",
                         "of the baseline": "" if kept is None else f"{kept['relative']:.4f}", "speed-up": faster})
        report.markdown += [f"The last step of each order whose {metric} stayed at or above {threshold:.4g} "
                            f"(the curve stops at {settings['stopped']}; `{report.link(path)}`; the importance order's "
                            "pruned plan and its measured speed-up: "
                            f"`{report.link(path.parent / 'final_mask.json')}`):", "",
                            to_markdown(pd.DataFrame(rows))]
        report.numbers.setdefault("prune_curve", {})[name] = rows
        report.console.append(f"prune curve {name}: {metric} >= {threshold:.4g} kept up to " + "; ".join(
            f"{r['order']} {r['heads pruned']} heads" + (f" ({metric} {r[metric]}; speed {r['speed-up']})"
                                                           if r["speed-up"] else "") for r in rows))
        report.figure(path.parent / "prune_curve.png", f"prune curve, {name}")


def speed_text(timing: dict) -> str:
    """The pruned model's speed against the full model's from ``final_mask.json``'s timing: the median of the rounds'
    ratios, said to be no measured change when the rounds fall on both sides of 1x, and no measurement from one round
    (a single round's ratio is noise: 0.62x "faster")."""
    full, pruned = (timing.get("seconds") or {}).get("full") or [], (timing.get("seconds") or {}).get("pruned") or []
    ratios = [a / b for a, b in zip(full, pruned) if b > 0]
    if not ratios:
        return ""
    median = timing.get("speedup", ratios[0])
    if len(ratios) == 1:
        return f"{median:.2f}x the full model's (one timing round: noise, not a measurement)"
    spread = f"{len(ratios)} rounds {min(ratios):.2f}-{max(ratios):.2f}x"
    if min(ratios) <= 1 <= max(ratios):
        return f"no measured change ({median:.2f}x; {spread})"
    return f"{median:.2f}x {'faster' if median > 1 else 'slower'} ({spread})"


def last_kept(curve: pd.DataFrame, metric: str, threshold: float) -> pd.Series | None:
    """The last step before the first that fell below ``threshold`` (None: even the first step did)."""
    kept = None
    for _, step in curve.sort_values("step").iterrows():
        if step[metric] < threshold:
            break
        kept = step
    return kept


def gates(report: StudyReport) -> None:
    """The section, or nothing when the gates stage did not run (it is not in the default study)."""
    if not report.stage_jobs("gates"):
        return
    report.section("Learned gates, causal head gating, optimal ablation")
    report.markdown += ["Parameters learned per head on the training split, scored on the held-out examples "
                        "(docs/gates.md); their claims are in the findings above.", ""]
    for name, _ in report.study.models:
        _l0(report, name)
        _chg(report, name)
        _optimal(report, name)


def _l0(report: StudyReport, name: str) -> None:
    for _, path in report.sources("gates", "gates.csv", [f"l0/{name}"]):
        frame = pd.read_csv(path)
        split = frame["split"].iloc[0]
        metric = main_metric(report.study)  # the paired statistics' metric (gates.csv has every metric)
        main = frame[frame["split"] == split]
        counts = [c for c in ("heads_kept", "heads_pruned", "fractional") if c in main]
        shown = main[["lambda", *counts, metric, "baseline", "delta", "ci_low", "ci_high", "p_adjusted"]].astype(
            dict.fromkeys(counts, int))
        text = shown.round(4).astype(object).rename(columns={"baseline": f"{metric} baseline",
                                                             "delta": f"{metric} change"})
        report.markdown += [f"L0 gates (Voita et al. 2019), {name}: the heads each penalty closes pruned, {split} "
                            f"(`{report.link(path)}`; fractional: kept heads whose gate ended between 0 and 1, kept "
                            "whole by the pruned model):", "", to_markdown(text)]
        report.numbers.setdefault("gates_l0", {})[name] = shown.to_dict("records")
        report.console.append(f"L0 gates {name}: " + "; ".join(
            f"lambda {r['lambda']:g} prunes {int(r['heads_pruned'])} heads, {metric} {r['delta']:+.4f}"
            for r in shown.to_dict("records")))
        curve = report.path("prune_curve", name, "prune_curve.csv")
        if f"prune_curve/{name}" in report.stage_jobs("prune_curve") and curve.is_file():
            rows = pd.read_csv(curve)
            points = main.assign(ci_low=main["baseline"] + main["ci_low"], ci_high=main["baseline"] + main["ci_high"])
            image = plots.gates_curve(points, metric, f"{name}: L0 gates beside pruning by importance and at random",
                                      path.parent / "with_prune_curve", ("png",), rows[rows["split"] == split])[0]
            report.figure(image, f"L0 gates and the prune curve, {name}")
        else:
            report.figure(path.parent / "gates_curve.png", f"L0 gates, {name}")


def _chg(report: StudyReport, name: str) -> None:
    for _, path in report.sources("gates", "chg.json", [f"chg/{name}"]):
        record = json.loads(path.read_text())
        counts = ", ".join(f"{c} {n}" for c, n in record["classes"].items() if n or c != "inconsistent")
        report.markdown += ["", f"Causal head gating (Nam et al. 2025), {name}: {counts}; {record['stability']:.1%} of "
                            f"the heads in the same class in every fit (`{report.link(path.parent / 'heads.csv')}`)."]
        table = path.parent / "chg.csv"
        if table.is_file():
            report.markdown += ["", "Each class pruned:", "", to_markdown(pd.read_csv(table).round(4))]
        report.numbers.setdefault("gates_chg", {})[name] = {"classes": record["classes"],
                                                            "stability": record["stability"]}
        report.console.append(f"CHG {name}: {counts}; stability {record['stability']:.1%}")
        report.figure(path.parent / "chg_heads.png", f"causal head gating, {name}")


def _optimal(report: StudyReport, name: str) -> None:
    for _, path in report.sources("gates", "optimal.json", [f"optimal/{name}"]):
        record = json.loads(path.read_text())
        line = (f"optimal ablation's gap at most mean ablation's for {record['below_mean']:.1%} of the heads, "
                f"significantly below for {record['significantly_below_mean']:.1%}")
        report.markdown += ["", f"Optimal ablation (Li & Janson 2024), {name}: {line} "
                            f"(`{report.link(path.parent / 'heads.csv')}`; constants: "
                            f"`{report.link(path.parent / 'constants.json')}`)."]
        report.numbers.setdefault("gates_optimal", {})[name] = {
            "below_mean": record["below_mean"], "significantly_below_mean": record["significantly_below_mean"]}
        report.console.append(f"optimal ablation {name}: {line}")
        report.figure(path.parent / "optimal_gaps.png", f"optimal vs mean ablation's gaps, {name}")
