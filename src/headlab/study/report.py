"""The study's report: ``study.md`` (GitHub markdown, figures by relative path), ``study.json``, a terminal summary.

Every number is read from a stage's files, named under the table or sentence that shows it: the fine-tuning's
``results.json``, the tables' ``report/`` (plan grids with paired CIs and adjusted p-values), the clusters'
and the comparison's ``results.json``, ``importance.json`` and ``agreement.csv``, ``prune_curve.csv``. A stage
that did not run is said to be missing, not left out silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console

from headlab.core.head_names import head_name
from headlab.files import read_json, write_json_atomic, write_text_atomic
from headlab.reporting.layouts import clark_layout, to_markdown
from headlab.study.stages import MARKER, TABLES, Study
from headlab.study.tables import table_report_folder

TABLE_TITLES = {
    "table2": "Table 2: heads of each type pruned (weights 0, ✗) or substituted (uniform 1/L)",
    "table3": "Table 3: intra- or inter-sentence attention of head types removed (renormalize=false)",
    "table3_renormalized": "Table 3 with renormalize=true (the other keys' scores renormalised by the softmax)",
}
TOP_HEADS = 10
COLLAPSE = 5  # files of this many sibling folders (a table's plans, a sweep's heads) are listed as one line


@dataclass
class StudyReport:
    """What the report says: markdown lines, the terminal's summary lines, and the numbers for ``study.json``."""

    study: Study
    markdown: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    images: dict[str, Path] = field(default_factory=dict)  # W&B key -> figure
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # W&B key -> table

    def path(self, *parts: str) -> Path:
        return self.study.folder.joinpath(*parts)

    def link(self, path: Path) -> str:
        return str(path.relative_to(self.study.folder))

    def section(self, title: str) -> None:
        self.markdown += ["", f"## {title}", ""]

    def missing(self, stage: str) -> None:
        self.markdown.append(f"_Not run: the {stage} stage has no results in this study's folder._")

    def sources(self, stage: str, file: str, names: list[str] | None = None) -> list[tuple[str, Path]]:
        """``(name, path)`` of each model's ``<stage>/<name>/<file>`` that exists and is a job of the stage's last
        run (its ``stage.json``: a job of another configuration in the folder, seed1 of an earlier two-seed run, is
        not this study's); none: the stage is said missing."""
        names = [name for name, _ in self.study.models] if names is None else names
        jobs = self.stage_jobs(stage)
        found = [(name, self.path(stage, name, file)) for name in names
                 if f"{stage}/{name}" in jobs and self.path(stage, name, file).is_file()]
        if not found:
            self.missing(stage)
        return found

    def stage_jobs(self, stage: str) -> set[str]:
        """The job folders (relative to the study) of ``stage``'s last finished run, from its marker."""
        path = self.path(stage, MARKER)
        return set(read_json(path, "stage marker").get("key", {}).get("jobs", {})) if path.is_file() else set()

    def figure(self, path: Path, alt: str) -> None:
        if path.is_file():
            self.markdown += ["", f"![{alt}]({self.link(path)})"]
            self.images[self.link(path).removesuffix(".png").replace("/", "_")] = path


def number(value: float) -> str:
    return f"{value:.4f}" if np.isfinite(value) else "n/a"


def main_metric(study: Study) -> str:
    return str(study.cfg.task.main_metric)


def baseline(report: StudyReport) -> None:
    report.section("Baseline")
    rows = []
    for name, _ in report.study.models:
        path = report.path("finetune", name, "results.json")
        if path.is_file():
            metrics = read_json(path, "results")["metrics"]
            source = report.link(path)
        else:  # study.checkpoint: the unablated evaluation of Table 2
            table = table_report_folder(report.study, report.path("tables", "table2", name)) / "table.csv"
            if not table.is_file():
                continue
            frame = pd.read_csv(table)
            first = frame[frame["job"] == frame["job"].iloc[0]]
            metrics = {split: dict(zip(part["metric"], part["baseline"])) for split, part in first.groupby("split")}
            source = report.link(table) + " (baseline)"
        for split, values in metrics.items():
            rows.append({"model": name, "split": split, **{k: f"{v:.4f}" for k, v in values.items()},
                         "source": source})
            report.numbers.setdefault("baseline", {}).setdefault(name, {})[split] = values
            report.console.append(f"baseline {name} {split}: {main_metric(report.study)} "
                                  f"{values.get(main_metric(report.study), float('nan')):.4f}")
    if rows:
        report.markdown.append(to_markdown(pd.DataFrame(rows)))
    else:
        report.missing("finetune")


def tables(report: StudyReport) -> None:
    metric = main_metric(report.study)
    for table in TABLES:
        report.section(f"Guan et al. {TABLE_TITLES[table]}")
        found = False
        for name, _ in report.study.models:
            folder = table_report_folder(report.study, report.path("tables", table, name))
            grids = sorted(folder.glob("plans_*.md"))
            for grid in grids:
                found = True
                caption, _, body = grid.read_text().partition("\n\n")
                report.markdown += [f"{caption} (`{report.link(grid)}`)", "", body.rstrip()]
                report.console += [f"{TABLE_TITLES[table]}, {name}:", *console_grid(body, metric)]
            if (folder / "table.csv").is_file():
                report.tables[f"{table}_{name}"] = pd.read_csv(folder / "table.csv")
            split = grids[0].stem.removeprefix("plans_") if grids else None
            if split:
                report.figure(folder / f"bars_{split}_{metric}.png", f"{table} {name}")
        seeds = table_report_folder(report.study, report.path("tables", table)) / "seeds.md"
        if len(report.study.models) > 1 and seeds.is_file():
            report.markdown += ["", f"Across fine-tuning seeds (`{report.link(seeds)}`):", "",
                                seeds.read_text().rstrip()]
        elif len(report.study.models) > 1 and found:
            report.markdown += ["", "No table across seeds: some seed's clusters are not Guan et al.'s four types "
                                "named by their profiles (other clusters are numbered by their first head, so "
                                "cluster0 of one seed is not cluster0 of another)."]
        if not found:
            report.missing("tables")


def console_grid(markdown: str, metric: str) -> list[str]:
    """The plan and main-metric columns of a plan grid's markdown rows (the terminal's short form)."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    if len(lines) < 3:
        return []
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    keep = [header.index("plan"), header.index(metric)] if metric in header else [header.index("plan")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    width = max(len(row[keep[0]]) for row in rows)
    return [f"  {row[keep[0]]:<{width}}  {' '.join(row[k] for k in keep[1:])}" for row in rows]


def head_types(report: StudyReport) -> None:
    report.section("Head types (k-means of the distance features, Guan et al.)")
    rows = []
    for name, path in report.sources("cluster", "results.json", ["pretrained", *(n for n, _ in report.study.models)]):
        result = read_json(path, "cluster results")
        counts = ", ".join(f"{k} {v}" for k, v in result["counts"].items())
        rows.append({"model": name, "types": counts, "stability": f"{result['stability']:.4f}",
                     "silhouette": "n/a" if result["silhouette"] is None else f"{result['silhouette']:.4f}",
                     "source": report.link(path)})
        report.numbers.setdefault("clusters", {})[name] = {k: result[k] for k in ("counts", "stability", "silhouette")}
        report.console.append(f"head types {name}: {counts}; stability {result['stability']:.4f}")
    if not rows:
        return
    report.markdown += ["Stability: the share of heads labelled the same in every fit on random halves (Guan et al. "
                        "Table 1: 94-96%).", "", to_markdown(pd.DataFrame(rows))]
    for name, _ in report.study.models:
        report.figure(report.path("cluster", name, "types_per_layer.png"), f"head types per layer, {name}")


def comparison(report: StudyReport) -> None:
    report.section("Pre-trained vs fine-tuned")
    names = [n for n, _ in report.study.models]
    for name, path in report.sources("compare", "results.json", names + ["seeds"] * (len(names) > 1)):
        result = read_json(path, "compare results")
        pairs = "; ".join(f"{pair} {value:.4f}" for pair, value in result["ari"].items())
        changed = "; ".join(f"{run}: {count} heads" for run, count in result["changed"].items())
        report.markdown += [f"Adjusted Rand index: {pairs}. Heads whose type changed: {changed} "
                            f"(`{report.link(path)}`).", ""]
        report.numbers.setdefault("compare", {})[name] = {"ari": result["ari"], "changed": result["changed"]}
        report.console.append(f"compare {name}: ARI {pairs}; type changed: {changed}")
        transitions, roles = path.parent / "transitions.md", path.parent / "roles.md"
        if name != "seeds" and transitions.is_file():
            report.markdown += [f"Transitions (`{report.link(transitions)}`):", "", transitions.read_text().rstrip()]
        if result.get("roles"):  # heads per sieve role in each run, kept / gained / lost from the first
            report.markdown += ["", f"Heads per sieve role (`{report.link(roles)}`):", "", roles.read_text().rstrip()]
            report.numbers["compare"][name]["roles"] = result["roles"]
        report.figure(path.parent / "types_per_layer.png", f"head types per layer, {name}")


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
        granularity = scores["settings"]["granularity"]
        report.markdown += [f"Top {len(top)} heads of {name} by the {granularity} estimator (normalised; "
                            f"`{report.link(path)}`):", "",
                            to_markdown(pd.DataFrame([{"head": h, "importance": f"{v:.4f}"} for h, v in top]))]
        report.console.append(f"top heads {name}: " + ", ".join(f"{h} {v:.3f}" for h, v in top[:5]))
        agreement = path.parent / "agreement.csv"
        if agreement.is_file():
            frame = pd.read_csv(agreement)
            report.markdown += ["Spearman correlation of each estimator with the measured sweep "
                                f"(`{report.link(agreement)}`):", "", to_markdown(frame.round(4).astype(str))]
            main = frame[frame["target"] == f"{main_metric(report.study)} drop"]
            report.console += [f"  spearman {row.policy}/{row.estimator} vs {row.target}: {number(row.spearman)}"
                               for row in main.itertuples() if row.estimator == granularity or
                               row.estimator.startswith("estimate_")]
        report.figure(path.parent / f"importance_{granularity}.png", f"importance, {name}")
        sweep_table(report, name)


def sweep_table(report: StudyReport, name: str) -> None:
    """The single-head sweep's change of the main metric, layers x heads, with its baseline and data."""
    folder = report.path("sweep", name)
    if not (folder / "results.json").is_file():
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
    report.section("Pruning by importance vs random orders")
    for name, path in report.sources("prune_curve", "prune_curve.csv"):
        frame = pd.read_csv(path)
        metric = main_metric(report.study)
        rows = []
        for (order, seed), part in frame.groupby(["order", "seed"], dropna=False, sort=False):
            last = part.iloc[-1]
            label = order if pd.isna(seed) else f"{order} (seed {int(seed)})"
            rows.append({"order": label, "heads pruned": int(last["heads_pruned"]),
                         metric: f"{last[metric]:.4f}", "of the baseline": f"{last['relative']:.4f}"})
        report.markdown += [f"The last step of each order (`{report.link(path)}`):", "",
                            to_markdown(pd.DataFrame(rows))]
        report.console.append(f"prune curve {name}: " + "; ".join(
            f"{r['order']} {r['heads pruned']} heads -> {metric} {r[metric]}" for r in rows))
        report.figure(path.parent / "prune_curve.png", f"prune curve, {name}")


def files(report: StudyReport) -> None:
    """Every file the study wrote (W&B's offline runs as one line; a folder of many alike, a sweep's plans, as one)."""
    report.section("Files")
    lines, runs = [], set()
    for path in sorted(report.study.folder.rglob("*")):
        parts = path.relative_to(report.study.folder).parts
        if not path.is_file() or any(part.startswith(".") for part in parts):
            continue
        if parts[0] == "wandb":
            runs |= {parts[1]} if parts[1].startswith("offline-run-") else set()
            continue
        lines.append(report.link(path))
    lines = sorted({*lines, "study.md", "study.json"})  # the report's own files, written after this list
    wandb = [f"wandb/{{{len(runs)} offline runs: upload with wandb sync}}/"] if runs else []
    report.markdown += [f"{len(lines)} files under `{report.study.folder}`:", "", "```", *collapse(lines), *wandb,
                        "```"]


def collapse(paths: list[str]) -> list[str]:
    """Paths whose folders differ only by a plan's name (``sweep/seed0/L3H7/results.json``) shown once per pattern
    when ``COLLAPSE`` or more folders share it."""
    groups: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        parts = path.split("/")
        key = ("/".join(parts[:-2]), parts[-1]) if len(parts) >= 3 else (path, "")
        groups.setdefault(key, []).append(parts[-2] if len(parts) >= 3 else "")
    lines = []
    for (parent, name), folders in groups.items():
        if not name:
            lines.append(parent)
        elif len(folders) < COLLAPSE:
            lines += [f"{parent}/{folder}/{name}" for folder in folders]
        else:
            lines.append(f"{parent}/{{{len(folders)} folders: {folders[0]} ... {folders[-1]}}}/{name}")
    return lines


def write_study_report(study: Study, console: Console, inputs: dict[str, Any],
                       stale: list[str] | None = None) -> dict[str, Any]:
    """``study.md`` and ``study.json`` (with ``inputs``: what the stages' markers said) in the study folder; the
    summary printed to ``console``. ``stale``: stages left out of this run whose files are of other settings."""
    report = StudyReport(study)
    cfg = study.cfg
    names = ", ".join(name for name, _ in study.models)
    report.markdown += [f"# headlab study: {cfg.model.name} on {cfg.task.name}", "",
                        f"Fine-tuned model(s): {names}. Every number is read from the stage file named beside it; "
                        f"paths are relative to `{study.folder}`."]
    if stale:
        warning = (f"Not this command's settings: the files of {', '.join(stale)} were computed with other settings "
                   "(or inputs) and were left out of this run; run those stages again to update them.")
        report.markdown += ["", f"**{warning}**"]
        report.console.append(f"note: {warning}")
    for part in (baseline, tables, head_types, comparison, syntax, importance, prune_curve, files):
        part(report)
    write_text_atomic(study.folder / "study.md", "\n".join(report.markdown) + "\n")
    summary = {"model": cfg.model.name, "task": cfg.task.name, "models": names.split(", "), **report.numbers,
               "inputs": inputs}
    write_json_atomic(study.folder / "study.json", summary)
    for line in report.console:
        console.print(line, markup=False)
    log_report(study, report, inputs)
    return summary


def log_report(study: Study, report: StudyReport, inputs: dict[str, Any]) -> None:
    """The report's tables and figures in the study's last W&B run (``job_type=report``, the study's group)."""
    from omegaconf import OmegaConf

    from headlab.files import config_hash
    from headlab.training.tracking import build_logger, log_artifacts, tracked_job

    logger_cfg = study.cfg.logger
    if logger_cfg is None or "WandbLogger" not in str(logger_cfg.get("_target_")):
        return
    logger_cfg = OmegaConf.merge(logger_cfg, {"group": study.group, "job_type": "report"})
    run_id = config_hash({"study": str(study.folder.absolute()), "inputs": inputs})
    with tracked_job():
        logger = build_logger(logger_cfg, run_id=run_id, run_name=f"report-{study.group}")
        log_artifacts(logger, report.tables, report.images)
        logger.finalize("success")
