"""What limits the run's numbers, computed from its files: a baseline at chance (its floor) or at the metric's
ceiling, small samples, one seed, head types that earn their names narrowly, per-comparison CIs beside adjusted
p-values."""

from __future__ import annotations

import pandas as pd

from headlab.analysis.types.clusters import name_margins
from headlab.files import read_json
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.limits import BOUNDED, Limit, baseline_limits

CEILING = 5.0  # points of a 0-100 score: a baseline this close to the maximum leaves little room to drop
SMALL = 30  # a CI from fewer examples (words, for a relation) is marked
NARROW = 0.05  # a type whose centroid earns its name by less (a share of attention) fits Guan et al.'s poorly


def baseline_value(files: StudyFiles, model: str) -> float | None:
    """The unablated main metric of ``model`` on the tables' examples (else the fine-tuning's evaluation)."""
    for parts in (("tables", "table2", model, "baseline"), ("finetune", model)):
        job = files.job(*parts)
        if job is not None:
            metrics = read_json(job / "results.json", "results")["metrics"]
            return metrics.get(files.split, {}).get(files.metric)
    return None


def floor(files: StudyFiles, limits: dict[str, Limit] | None = None) -> list[str]:
    """A model whose baseline's CI reaches chance (``headlab.study.findings.limits``); one whose chance is unknown."""
    lines = []
    for model, limit in (baseline_limits(files) if limits is None else limits).items():
        if limit.kind == "floor":
            lines.append(f"**Floor.** {model}'s unablated {limit.numbers()} reaches chance, "
                         f"{limit.chance:.{limit.digits}f} ({limit.chance_is}): the model has not learned the task "
                         "beyond what a model that learned nothing scores, so no plan can cost it anything, and every "
                         f"ablation claim of {model} is not tested (more fine-tuning, more training data or a stronger "
                         "model lifts it off the floor).")
        elif limit.chance is None and files.metric.endswith(BOUNDED):
            lines.append(f"**Floor.** Chance of {files.metric} on {model}'s examples could not be computed (the gold "
                         "answers of its questions could not be read): its floor was not checked.")
    return lines


def ceiling(files: StudyFiles, limits: dict[str, Limit] | None = None) -> list[str]:
    """A model whose baseline's CI reaches the maximum (its ablation claims are not tested), or whose baseline is
    within ``CEILING`` points of it (drops are compressed)."""
    if not files.metric.endswith(BOUNDED):
        return []
    limits = baseline_limits(files) if limits is None else limits
    lines = []
    for model in files.models:
        limit = limits.get(model)
        if limit is not None and limit.kind == "ceiling":
            lines.append(f"**Ceiling.** {model}'s unablated {limit.numbers()} reaches its maximum {limit.maximum:g}: "
                         "drops are compressed and gains cannot show, so every ablation claim of "
                         f"{model} is not tested (harder or more evaluation data lowers it from the ceiling).")
            continue
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
            table = pd.read_csv(report / "table.csv")
            n, units = int(table["n"].max()), int(table["units"].max()) if "units" in table else 0
            clusters = f" ({units} clusters of them resampled)" if units and units != n else ""
            lines.append(f"{what} ({model}): {n} examples per CI{clusters}" +
                         (f" (fewer than {SMALL}: wide, and BCa's corrections unreliable)" if n < SMALL else ""))
    for model in files.models:
        job = files.job("robustness", "shapley_prune", model)
        if job is not None and (job / "coalitions.parquet").is_file():
            n = pd.read_parquet(job / "coalitions.parquet", columns=["example"])["example"].nunique()
            lines.append(f"the robustness stage ({model}): {n} examples")
        job = files.job("prune_curve", model)
        if job is not None:
            timing = read_json(job / "results.json", "prune curve results").get("timing") or {}
            examples = timing.get("examples") or read_json(job / "results.json", "prune curve results").get(
                "config", {}).get("data", {}).get("max_eval_examples")
            if examples:
                lines.append(f"the prune curve ({model}): {examples} examples per point")
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
    given = files.models == ["checkpoint"]
    what = "one given checkpoint" if given else "one fine-tuning seed"
    run = ("Fine-tune three seeds instead of the given checkpoint (one model)" if given else
           "Run three (the stages done are reused)")
    return [f"**One seed.** The study ran {what}: the head types, the tables and every verdict above are untested "
            f"across fine-tuning seeds, whose types and effects can differ. {run}: "
            f"`{command} 'study.seeds=[0,1,2]'`."]


def type_names(files: StudyFiles) -> list[str]:
    """Clusters without Guan et al.'s names (``unseparated``), and named types that earn their names narrowly."""
    lines = []
    for model, job in files.model_jobs("cluster", ["pretrained", *files.models]):
        clusters = read_json(job / "clusters.json", "clusters")
        if clusters.get("named_by_hand"):
            continue
        if not clusters.get("named"):
            lines.append(unseparated(files, model, job, clusters))
            continue
        narrow = {name: margin for name, margin in name_margins(clusters["profiles"]).items() if margin < NARROW}
        if narrow:
            named = ", ".join(f"{name} by {margin:.3f}" for name, margin in narrow.items())
            untested = min(narrow.values()) < 0 and model in files.models  # guan.misnamed
            lines.append(f"**Type names.** {model}'s centroids earn the names {named} (below {NARROW:g} of the "
                         f"attention: `{files.link(job / 'clusters.json')}`): those types fit Guan et al.'s profiles "
                         "poorly, and claims about them read less of the paper's types than the names suggest"
                         + ("; below 0 a centroid falls short of the paper's description of its type, and the claims "
                            "about that type are not tested." if untested else "."))
    return lines


def unseparated(files: StudyFiles, model: str, job, clusters: dict) -> str:
    """The heads of ``model`` did not separate into Guan et al.'s four types: why, and what is not tested."""
    k = len(clusters["names"])
    if clusters.get("profile_names"):
        separation = clusters.get("separation")
        shown = "n/a: a fit left a cluster empty" if separation is None else f"{separation:.2f}, named above 1"
        why = (f"its {k} centroids match the types' profiles but lie closer together than their spread across the "
               f"stability fits on halves of the data (separation {shown})")
    else:
        why = f"k = {k}" if k != 4 else "its centroids' profiles do not match dense / diagonal / dense_vertical / " \
            "vertical"
    return (f"**Head types.** {model}'s heads did not separate into Guan et al.'s types ({why}: "
            f"`{files.link(job / 'clusters.json')}`): its clusters are numbered cluster0..cluster{k - 1}, and the "
            "claims about named types (Tables 2 and 3) are not tested on them.")


def intervals(files: StudyFiles) -> list[str]:
    resampling, correction = files.reports.get("tables", (files.resampling, "holm"))
    if resampling.intervals == "simultaneous" or correction == "none":
        return []
    adjusted = {"holm": "Holm", "bh": "Benjamini-Hochberg"}.get(correction, correction)
    return [f"**Intervals and p-values.** The tables' CIs are per comparison ({resampling.confidence:g} each) while "
            f"their stars are {adjusted}-adjusted across the plans of a table: a CI that excludes 0 need not come "
            "with a star. `study.tables.report.ci=simultaneous` makes the intervals Bonferroni-adjusted too, so that "
            "the two agree. The findings compute their own: each table's orderings with simultaneous CIs and "
            "Holm-adjusted p-values across that table's claims, each cost with its own CI."]


def pretraining(files: StudyFiles, model: str, how: str | None) -> list[str]:
    """The checkpoint and how it was pre-trained, when that is not the papers' masked language modelling."""
    if not how or how.lower().startswith("masked"):
        return []
    return [f"**Model.** The study's model is {model}: {how}. Guan et al., Clark et al., Michel et al. and Pande et "
            "al. studied BERTs pre-trained by masked language modelling, so every claim about the pre-trained model "
            "(its head types, their stability, syntax, roles) describes this model's pre-training, not BERT's, and "
            "what fine-tuning changes starts from it."]


def stability(files: StudyFiles) -> list[str]:
    """A head-type stability below ``cluster.min_stability`` (the note the cluster stage printed)."""
    lines = []
    for model, job in files.model_jobs("cluster", ["pretrained", *files.models]):
        result = read_json(job / "results.json", "cluster results")
        threshold = result.get("config", {}).get("cluster", {}).get("min_stability")
        if threshold is not None and result["stability"] < threshold:
            lines.append(f"{model}'s {result['stability']:.1%} (`{files.link(job / 'results.json')}`)")
    if not lines:
        return []
    return [f"**Stability.** The head types' stability is below cluster.min_stability: {'; '.join(lines)} (Guan et "
            "al. report 94-96%): heads change type between fits on halves, so the tables' plans by type remove "
            "partly different heads under another fit (each Table 2 claim states how it fares under the bootstrap "
            "fits of the refits stage, when it ran)."]


def one_labelling(files: StudyFiles) -> list[str]:
    """Table 2's claims of a model with no bootstrap fits of its clusters measured (the refits stage)."""
    from headlab.study.findings.refits import fits_of

    bare = [model for model in files.models if files.job("tables", "table2", model, "prune_diagonal") is not None
            and not fits_of(files, model)[1]]
    if not bare:
        return []
    return [f"**One labelling.** The Table 2 claims of {', '.join(bare)} rest on one k-means labelling of the heads: "
            "the clustering's bootstrap fits were not measured (the refits stage did not run, or "
            "cluster.bootstrap_fits is 0), so how much each verdict depends on which heads that labelling typed "
            "which way is unknown. The default study runs 5 fits (`study.cluster.cluster.bootstrap_fits`)."]


def study_caveats(files: StudyFiles, command: str, model: str = "", how: str | None = None) -> list[str]:
    """Every caveat that applies to this run, one paragraph each (``model``, ``how``: the checkpoint and how it was
    pre-trained)."""
    limits = baseline_limits(files)
    return [*pretraining(files, model, how), *floor(files, limits), *ceiling(files, limits), *samples(files),
            *seeds(files, command), *type_names(files), *stability(files), *one_labelling(files), *intervals(files)]

