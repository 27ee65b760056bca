"""The study report's sections on head types and their ablation: the baseline, Guan et al.'s Tables 2 and 3, the
head types and what fine-tuning changes of them."""

from __future__ import annotations

import pandas as pd

from headlab.analysis.types.clusters import name_margins
from headlab.files import read_json
from headlab.reporting.head_plots import centroid_profiles
from headlab.reporting.layouts import to_markdown
from headlab.study.findings import study_files
from headlab.study.findings.caveats import NARROW
from headlab.study.findings.controls import controls_of, ordinal
from headlab.study.findings.verdicts import interval
from headlab.study.report_base import StudyReport, main_metric
from headlab.study.stage_reports import stage_report_folder
from headlab.study.stages import TABLES

GUAN_WORDS = {
    "dense": "dense attention patterns: \"the highest attention at long range windows and relatively small attention "
             "weights to the special tokens\".",
    "diagonal": "\"dominant diagonal patterns and a few vertical stripes\": \"large values in the short-range "
                "windows and medium values in the special tokens\".",
    "dense_vertical": "\"mixes the dense and vertical patterns\": \"large values at long range windows and special "
                      "tokens\".",
    "vertical": "\"mostly strong vertical patterns\": \"large values at special tokens, which are much higher than "
                "other types\".",
}
TABLE_TITLES = {
    "table2": "Table 2: heads of each type pruned (weights 0, ✗) or substituted (uniform 1/L)",
    "table3": "Table 3: intra- or inter-sentence attention of head types removed (renormalize=false)",
    "table3_renormalized": "Table 3 with renormalize=true (the other keys' scores renormalised by the softmax)",
}


def baseline(report: StudyReport) -> None:
    report.section("Baseline")
    if report.left_out("finetune"):
        return
    rows = []
    for name, _ in report.study.models:
        path = report.path("finetune", name, "results.json")
        if path.is_file():
            results = read_json(path, "results")
            metrics, counts = results["metrics"], results.get("num_evaluated") or {}
            source = report.link(path)
        elif "tables" in report.stale:
            continue
        else:  # study.checkpoint: the unablated evaluation of Table 2
            table = stage_report_folder(report.study, "tables", report.path("tables", "table2", name)) / "table.csv"
            if not table.is_file():
                continue
            frame = pd.read_csv(table)
            first = frame[frame["job"] == frame["job"].iloc[0]]
            metrics = {split: dict(zip(part["metric"], part["baseline"])) for split, part in first.groupby("split")}
            counts = {split: int(part["n"].iloc[0]) for split, part in first.groupby("split")}
            source = report.link(table) + " (baseline)"
        for split, values in metrics.items():  # the fine-tuning's own evaluation: its examples, not the tables'
            rows.append({"model": name, "split": split, "examples": counts.get(split, ""),
                         **{k: f"{v:.4f}" for k, v in values.items()}, "source": source})
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
        if report.left_out("tables"):
            continue
        found = False
        for name, _ in report.study.models:
            folder = stage_report_folder(report.study, "tables", report.path("tables", table, name))
            grids = sorted(folder.glob("plans_*.md"))
            for grid in grids:
                found = True
                caption, _, body = grid.read_text().partition("\n\n")
                report.markdown += [f"{caption} (`{report.link(grid)}`)", "", body.rstrip()]
                heading = grid_heading(TABLE_TITLES[table], name, grid.stem.removeprefix("plans_"), len(grids))
                report.console += [heading, *console_grid(body, metric)]
            if (folder / "table.csv").is_file():
                report.tables[f"{table}_{name}"] = pd.read_csv(folder / "table.csv")
            split = grids[0].stem.removeprefix("plans_") if grids else None
            if split:
                report.figure(folder / f"bars_{split}_{metric}.png", f"{table} {name}")
        seeds = stage_report_folder(report.study, "tables", report.path("tables", table)) / "seeds.md"
        if len(report.study.models) > 1 and seeds.is_file():
            report.markdown += ["", f"Across fine-tuning seeds (`{report.link(seeds)}`):", "",
                                seeds.read_text().rstrip()]
        elif len(report.study.models) > 1 and found:
            report.markdown += ["", "No table across seeds: some seed's clusters are not Guan et al.'s four types "
                                "named by their profiles (other clusters are numbered by their first head, so "
                                "cluster0 of one seed is not cluster0 of another)."]
        if not found:
            report.missing("tables")


def controls(report: StudyReport) -> None:
    """Each type's removal beside random head sets of its size (``findings/controls.py``)."""
    report.section("Controls: each type's removal beside random head sets of its size")
    if report.left_out("controls"):
        return
    files = study_files(report.study, report.stale)
    types = sorted({t for name, _ in report.study.models for t in _types(report, name)})
    found = controls_of(files, types)
    if not found:
        report.missing("tables" if "tables" in report.stale else "controls")
        return
    digits = 2 if files.scale == 100 else 4
    metric = main_metric(report.study)
    rows = [{"model": c.model, "policy": c.policy, "type": c.type, "heads": c.size, metric: f"{c.value:.{digits}f}",
             "random sets": f"{len(c.random)}: {min(c.random):.{digits}f} to {max(c.random):.{digits}f}",
             "percentile": f"{c.percentile:.0f}", "rank p": f"{c.p_value:.3g}",
             "excess": "n/a" if c.excess is None else interval(*c.excess, 4), "examples": c.examples,
             "source": f"`{c.file}`"} for c in found]
    report.markdown += [f"A type's removal costs more the more heads it has. Each type's {metric} with its heads "
                        "removed, beside as many heads drawn at random (uniformly, without replacement) under the "
                        "same policy on the same examples; the percentile is the share of the random sets it costs "
                        "more than (ties counting half), the rank p-value (1 + #{random costs at least as much}) / "
                        "(R + 1), exact for these examples; the excess is (the type's score - the sets' mean) / the "
                        "baseline's, with its paired bootstrap CI (by clusters of examples), for other examples. A "
                        "Table 2 ordering holds only when the type it removes also costs more than the random sets "
                        "by both.", "",
                        to_markdown(pd.DataFrame(rows))]
    report.numbers["controls"] = [{"model": c.model, "policy": c.policy, "type": c.type, "heads": c.size,
                                   "value": c.value, "random": list(c.random), "percentile": c.percentile,
                                   "p_value": c.p_value, "excess": c.excess, "examples": c.examples,
                                   "file": c.file} for c in found]
    report.console += [f"control {c.model}: {c.policy}_{c.type} at the {ordinal(c.percentile)} percentile of "
                       f"{len(c.random)} random sets of {c.size} heads (rank p {c.p_value:.3g})" for c in found]


def refits(report: StudyReport) -> None:
    """Each Table 2 claim under the bootstrap fits of the clusters (``findings/refits.py``), from the findings."""
    report.section("Refits: Table 2's claims under bootstrap fits of the head types")
    if report.left_out("refits"):
        return
    rows = []
    for key, finding in report.numbers.get("findings", {}).items():
        for evidence in finding.get("evidence", []):
            spread = evidence.get("refits")  # study.json's evidence: its values beside its verdict
            if spread:
                known = [v for v in spread["values"] if v == v]  # NaN: a fit whose type had no heads
                rows.append({"claim": f"`{key}`", "model": evidence["model"],
                             "main fit": "n/a" if evidence["value"] != evidence["value"] else
                                         f"{evidence['value']:+.4f}",
                             "fits": ", ".join("n/a" if v != v else f"{v:+.4f}" for v in spread["values"]),
                             "same types": f"{spread['same_types']} of {spread['fits']}",
                             "claim's side / other / holds": f"{spread['claim_side']} / {spread['other_side']} / "
                                                             f"{spread['holds']}",
                             "range": f"{min(known):+.4f} to {max(known):+.4f}" if known else "n/a",
                             "verdict": evidence["verdict"]})
    if not rows:
        report.markdown.append("_No Table 2 claim was measured under bootstrap fits: the refits stage did not run, "
                               "cluster.bootstrap_fits is 0, or the clusters are not Guan et al.'s four types._")
        return
    report.markdown += ["The heads clustered again on bootstrap resamples of the sequences (the cluster job's "
                        "`refits.json`; a fit whose own profiles name its clusters otherwise is left out and counts "
                        "against), Table 2's plans run under each fit's types (`refits/`), each claim's quantity "
                        "under each fit. The verdict of the main fit stands when at least half of the fits put the "
                        "estimate on its side of the boundary.", "", to_markdown(pd.DataFrame(rows))]
    report.console += [f"refits {row['model']}: {row['claim'].strip('`')} {row['main fit']} under the main fit, "
                       f"{row['range']} under {row['same types']} bootstrap fits ({row['verdict']})" for row in rows]


def _types(report: StudyReport, model: str) -> list[str]:
    path = report.path("cluster", model, "clusters.json")
    return list(read_json(path, "clusters")["names"]) if path.is_file() else []


def grid_heading(title: str, model: str, split: str, grids: int) -> str:
    """The terminal's line above a plan grid: the split's name too where the model has a grid per split."""
    return f"{title}, {model}{f', split {split}' if grids > 1 else ''}:"


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
    type_profiles(report)
    for name, _ in report.study.models:
        report.figure(report.path("cluster", name, "types_per_layer.png"), f"head types per layer, {name}")


def type_profiles(report: StudyReport) -> None:
    """What the types are: each centroid's short-range, long-range and special-token attention (and the bins they sum),
    how clearly it earns its name, a sentence per type in Guan et al.'s words, and a figure of the centroids."""
    centroids, rows = {}, []
    for name in ["pretrained", *(n for n, _ in report.study.models)]:
        path = report.path("cluster", name, "clusters.json")
        if f"cluster/{name}" not in report.stage_jobs("cluster") or not path.is_file():
            continue
        clusters = read_json(path, "clusters")
        bins = list(clusters["bins"])
        centroids[name] = clusters["centroids"]
        margins = name_margins(clusters["profiles"]) if clusters.get("named") and \
            not clusters.get("named_by_hand") else {}
        for kind, profile in clusters["profiles"].items():
            values = dict(zip(bins, clusters["centroids"][kind]))
            rows.append({"model": name, "type": kind, "heads": clusters["counts"][kind],
                         **{part: f"{profile[part]:.3f}" for part in ("short", "long", "special")},
                         **{f"[{b.upper()}]" if b in ("cls", "sep") else b: f"{values[b]:.3f}"
                            for b in ("self", "cls", "sep") if b in values},
                         "name margin": f"{margins[kind]:.3f}" if kind in margins else "n/a",
                         "source": report.link(path)})
    if not rows:
        return
    report.markdown += ["", "What the types are: each type's mean attention (its centroid) in the short range (self "
                        "and windows 0-1), the long range (windows 2-15) and on special tokens ([CLS], [SEP], commas, "
                        "periods); the name margin is how far the centroid is from the edge of the rule that names it "
                        f"(below {NARROW:g}: fits Guan et al.'s profile poorly).", "", to_markdown(pd.DataFrame(rows)),
                        "", "In Guan et al.'s words (Section 4):", "",
                        *(f"- **{kind}**: {words}" for kind, words in GUAN_WORDS.items())]
    figure = report.path("type_profiles")
    centroid_profiles(centroids, bins, "head types: mean distance features of each type", figure)
    report.figure(figure.with_suffix(".png"), "centroid profiles of the head types")


def comparison(report: StudyReport) -> None:
    report.section("Pre-trained vs fine-tuned")
    names = [n for n, _ in report.study.models]
    for name, path in report.sources("compare", "results.json", names + ["seeds"] * (len(names) > 1)):
        result = read_json(path, "compare results")
        pairs = "; ".join(f"{pair} {value:.4f}" for pair, value in result["ari"].items())
        changed = "; ".join(f"{run}: {count} heads" if count is not None else
                            f"{run}: not compared (numbered clusters are not the same types)"
                            for run, count in result["changed"].items())
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
