"""study.md's section of the gates stage (when it ran): each model's L0 penalties against heads pruned (beside the
prune curve's orders when that stage ran too), causal head gating's classes and their cost, optimal ablation's gaps
against mean ablation's."""

from __future__ import annotations

import json

import pandas as pd

from headlab.reporting import plots
from headlab.reporting.layouts import to_markdown
from headlab.study.report_base import StudyReport


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
        metric = next(c for c in frame.columns if c not in ("lambda", "heads_kept", "heads_pruned", "split"))
        main = frame[frame["split"] == split]
        shown = main[["lambda", "heads_kept", "heads_pruned", metric, "baseline", "delta", "ci_low", "ci_high",
                      "p_adjusted"]].astype({"heads_kept": int, "heads_pruned": int})
        report.markdown += [f"L0 gates (Voita et al. 2019), {name}: the heads each penalty closes pruned, {split} "
                            f"(`{report.link(path)}`):", "", to_markdown(shown.round(4))]
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
