"""What limits the run's numbers, computed from its files: a baseline at the metric's ceiling, small samples, one
seed, head types that earn their names narrowly, per-comparison CIs beside adjusted p-values."""

from __future__ import annotations

import pandas as pd

from headlab.analysis.types.clusters import name_margins
from headlab.files import read_json
from headlab.study.findings.inputs import StudyFiles

CEILING = 5.0  # points of a 0-100 score: a baseline this close to the maximum leaves little room to drop
SMALL = 30  # a CI from fewer examples (words, for a relation) is marked
NARROW = 0.05  # a type whose centroid earns its name by less (a share of attention) fits Guan et al.'s poorly
BOUNDED = ("accuracy", "f1", "exact_match", "matthews", "pearson", "spearman")  # metrics whose maximum is the scale


def baseline_value(files: StudyFiles, model: str) -> float | None:
    """The unablated main metric of ``model`` on the tables' examples (else the fine-tuning's evaluation)."""
    for parts in (("tables", "table2", model, "baseline"), ("finetune", model)):
        job = files.job(*parts)
        if job is not None:
            metrics = read_json(job / "results.json", "results")["metrics"]
            return metrics.get(files.split, {}).get(files.metric)
    return None


def ceiling(files: StudyFiles) -> list[str]:
    if not files.metric.endswith(BOUNDED):
        return []
    lines = []
    for model in files.models:
        value = baseline_value(files, model)
        if value is not None and value >= files.scale - files.points(CEILING):
            lines.append(f"**Ceiling.** {model}'s unablated {files.metric} is {value:.4g}, within {CEILING:g} points "
                         f"of its maximum {files.scale:g}: drops are compressed and gains cannot show, so the sizes "
                         "of effect here understate those of a model below its ceiling (harder or more evaluation "
                         "data shows them better).")
    return lines


def samples(files: StudyFiles) -> list[str]:
    """Examples per CI of each stage's statistics; fewer than ``SMALL`` said."""
    lines = []
    for parts, what in ((("tables", "table2"), "Tables 2 and 3"), (("sweep",), "the sweep")):
        for model in files.models:
            report = files.report(*parts, model)
            if report is None:
                continue
            n = int(pd.read_csv(report / "table.csv")["n"].max())
            lines.append(f"{what} ({model}): {n} examples per CI" +
                         (f" (fewer than {SMALL}: wide, and BCa's corrections unreliable)" if n < SMALL else ""))
    for model, job in files.model_jobs("syntax", ["pretrained", *files.models]):
        table = pd.read_csv(job / "syntax.csv")
        small = table[(table["relation"] != "all") & (table["count"] < SMALL)]
        if len(small):
            lines.append(f"syntax ({model}): {len(small)} of {len(table) - 1} relations have fewer than {SMALL} words "
                         f"({', '.join(small['relation'])}): their CIs are wide")
    return [f"**Sample sizes.** {'; '.join(lines)}."] if lines else []


def seeds(files: StudyFiles, command: str) -> list[str]:
    if len(files.models) > 1:
        return []
    what = "one given checkpoint" if files.models == ["checkpoint"] else "one fine-tuning seed"
    return [f"**One seed.** The study ran {what}: the head types, the tables and every verdict above are untested "
            "across fine-tuning seeds, whose types and effects can differ. Run three "
            f"(the stages done are reused): `{command} 'study.seeds=[0,1,2]'`."]


def type_names(files: StudyFiles) -> list[str]:
    lines = []
    for model, job in files.model_jobs("cluster", ["pretrained", *files.models]):
        clusters = read_json(job / "clusters.json", "clusters")
        if not clusters.get("named") or clusters.get("named_by_hand"):
            continue
        narrow = {name: margin for name, margin in name_margins(clusters["profiles"]).items() if margin < NARROW}
        if narrow:
            named = ", ".join(f"{name} by {margin:.3f}" for name, margin in narrow.items())
            lines.append(f"**Type names.** {model}'s centroids earn the names {named} (below {NARROW:g} of the "
                         f"attention: `{files.link(job / 'clusters.json')}`): those types fit Guan et al.'s profiles "
                         "poorly, and claims about them read less of the paper's types than the names suggest.")
    return lines


def intervals(files: StudyFiles) -> list[str]:
    resampling, correction = files.reports.get("tables", (files.resampling, "holm"))
    if resampling.intervals == "simultaneous" or correction == "none":
        return []
    adjusted = {"holm": "Holm", "bh": "Benjamini-Hochberg"}.get(correction, correction)
    return [f"**Intervals and p-values.** The tables' CIs are per comparison ({resampling.confidence:g} each) while "
            f"their stars are {adjusted}-adjusted across the plans of a table: a CI that excludes 0 need not come "
            "with a star. `study.tables.report.ci=simultaneous` makes the intervals Bonferroni-adjusted too, so that "
            "the two agree. The findings' CIs are per claim."]


def study_caveats(files: StudyFiles, command: str) -> list[str]:
    """Every caveat that applies to this run, one paragraph each."""
    return [*ceiling(files), *samples(files), *seeds(files, command), *type_names(files), *intervals(files)]

