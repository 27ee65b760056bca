"""The study report's sections on single heads: syntax heads (Clark et al.), importance and the single-head sweep
(Michel et al.), the prune curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from headlab.analysis.importance.agreement import agreement_markdown, normalisation_label
from headlab.analysis.syntax.heads import left_out_sentence
from headlab.core.head_names import head_name
from headlab.files import read_json
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
