"""The study's stages, what each needs, and the jobs each runs, in the study folder's layout::

    finetune/seed0/                      train.py job (results.json, model/, checkpoints/)
    features/pretrained/, features/seed0/    mode=features of the pre-trained and the fine-tuned model
    cluster/pretrained/, cluster/seed0/      mode=cluster (k = 4, Guan et al.'s names) of those features
    syntax/pretrained/, syntax/seed0/        mode=syntax: the best head per dependency relation (Clark et al.)
    compare/seed0/                       mode=compare: pre-trained vs fine-tuned (with the syntax jobs' roles when
                                         they ran); compare/seeds/: between seeds
    tables/table2/seed0/<plan>/          mode=eval of each plan of Guan et al.'s Table 2 (prune, uniform by type)
    tables/table3/seed0/<plan>/          ... of Table 3 (drop_intra / drop_inter by type), renormalize=false
    tables/table3_renormalized/seed0/    ... and renormalize=true; each table's report/ beside its plans
    controls/prune/seed0/                mode=sweep_heads, family random: sets of the size of each type Table 2 says
                                         matters (controls/uniform/)
    refits/seed0/<plan>-<digest>/        mode=eval of Table 2's type plans under each bootstrap fit of the clusters
                                         (cluster/seed0/refits.json, ``headlab.study.refit_plans``), the baseline
    sweep/seed0/                         mode=sweep_heads: every head pruned alone
    gates/l0/seed0/                      mode=gates: L0 gates at each penalty (gates/chg/, gates/optimal/: causal head
                                         gating, optimal ablation's constants); not in the default study
    robustness/sweep_prune/seed0/        mode=sweep_heads under prune (sweep_mean/, sweep_resample/, sweep_optimal/ with
                                         the gates stage's constants): on its examples
    robustness/shapley_prune/seed0/      mode=shapley over the head types under prune (shapley_mean/, ...)
    importance/seed0/                    mode=importance, with its agreement with the sweep
    prune_curve/seed0/                   mode=prune_curve: importance-guided pruning vs random orders
    study.md, study.json                 the report

``seed0`` is the model fine-tuned with seed 0 (``checkpoint`` when ``study.checkpoint`` gives the model). Each
stage's jobs are built when the stage starts: they read the files of the stages before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.errors import UserError
from headlab.files import read_json
from headlab.study.configs import analysis_config, train_config
from headlab.study.refit_plans import refit_plans

STAGES = ("finetune", "features", "cluster", "syntax", "compare", "tables", "controls", "refits", "sweep",
          "gates", "robustness", "importance", "prune_curve", "report")
OPTIONAL_STAGES = ("gates",)  # off unless study.stages names them (the default study's first run stays short)
READS = {  # stage -> the stages whose files its jobs read: the study's one stage graph (each input runs before)
    "finetune": (), "features": ("finetune",), "cluster": ("features",), "syntax": ("finetune",),
    "compare": ("cluster", "syntax"), "tables": ("finetune", "cluster"), "controls": ("finetune", "cluster"),
    "refits": ("finetune", "cluster"), "sweep": ("finetune",), "robustness": ("finetune", "cluster", "gates"),
    "gates": ("finetune",), "importance": ("finetune", "sweep", "gates"), "prune_curve": ("finetune",), "report": ()}
READ_WHEN_THERE = {"compare": ("syntax",), "robustness": ("gates",),
                   "importance": ("sweep", "gates")}  # inputs read only when they ran
NEEDS = {stage: tuple(need for need in reads if need not in READ_WHEN_THERE.get(stage, ()))
         for stage, reads in READS.items()}  # what a stage cannot run without
ABOUT = {
    "finetune": "fine-tune the model on the task",
    "features": "attention features of the pre-trained and the fine-tuned model",
    "cluster": "head types (k-means of the distance features) and their stability",
    "compare": "head types of the pre-trained vs the fine-tuned model",
    "syntax": "the best head per dependency relation of a treebank vs offset baselines (Clark et al.)",
    "tables": "Guan et al.'s Tables 2 and 3: plans by head type, paired CIs and p-values",
    "controls": "random head sets of the size of each type Table 2 says matters (the types' controls)",
    "refits": "Table 2's type plans under each bootstrap fit of the clusters (the clustering's randomness)",
    "sweep": "every head pruned alone",
    "robustness": "Table 2, the single-head sweep and the head types' Shapley values under prune, mean and resample "
                  "(and optimal, with the gates stage's constants)",
    "gates": "learned per-head parameters: L0 gates, causal head gating, optimal ablation's constants",
    "importance": "gradient head importance and its agreement with the sweep",
    "prune_curve": "heads pruned by importance vs random orders",
    "report": "study.md",
}
STAGE_MODES = {"features": "features", "cluster": "cluster", "compare": "compare", "syntax": "syntax",
               "tables": "eval", "controls": "sweep_heads", "refits": "eval", "sweep": "sweep_heads",
               "robustness": "shapley", "gates": "gates", "importance": "importance",
               "prune_curve": "prune_curve"}  # ablate.py modes
STAGE_RUNS = {**{stage: (mode,) for stage, mode in STAGE_MODES.items()},
              "robustness": ("sweep_heads", "shapley")}  # every mode a stage's jobs run
TABLES = ("table2", "table3", "table3_renormalized")
MARKER = "stage.json"  # <study>/<stage>/stage.json: the stage's jobs (their hashes) and files when it last finished
GUAN_TYPES = ("dense", "diagonal", "dense_vertical", "vertical")
REMOVALS = ("prune", "mean", "resample")  # the robustness stage's ways to take a head away
LEARNED_REMOVAL = "optimal"  # and with the gates stage's constants (optimal ablation) when it ran
CONTROL_POLICIES = ("prune", "uniform")  # Table 2's: a type's removal beside random sets of its size
CONTROLLED = {"prune": ("diagonal",), "uniform": ("diagonal", "dense_vertical")}  # the types Table 2 says matter
PRESETS = {"table2": "guan2020_table2", "table3": "guan2020_table3", "table3_renormalized": "guan2020_table3"}


@dataclass(frozen=True)
class Job:
    """One job of a stage: its folder, its config (``train.py``'s or an ``ablate.py`` mode's) and its kind."""

    folder: Path
    cfg: Any
    kind: str  # "train" or the ablate.py mode


@dataclass(frozen=True)
class Study:
    """The study's config, folder and W&B group; the fine-tuned models it analyses."""

    cfg: Any
    folder: Path
    group: str

    @property
    def models(self) -> list[tuple[str, str]]:
        """``[(name, ckpt_path)]`` of the fine-tuned models: ``seed<N>`` jobs of the finetune stage, or the given
        checkpoint."""
        if self.cfg.study.checkpoint is not None:
            return [("checkpoint", str(self.cfg.study.checkpoint))]
        return [(f"seed{seed}", str(self.folder / "finetune" / f"seed{seed}")) for seed in self.cfg.study.seeds]

    def stage_dir(self, stage: str) -> Path:
        return self.folder / stage

    def analysis(self, stage: str, mode: str, ckpt_path: str | None, **fields: Any) -> Any:
        """The config of a stage's job; the paths inside the study folder are hashed relative to it (``paths_root``):
        a study folder moved or copied elsewhere is still done."""
        return analysis_config(self.cfg, stage, mode, ckpt_path, self.group, paths_root=str(self.folder.absolute()),
                               **fields)


def check_stages(cfg: Any, done: set[str]) -> list[str]:
    """``study.stages`` in run order; a ``UserError`` for an unknown stage, or for one whose input stage is left out
    (unless that stage's results are there, ``done``, or ``study.checkpoint`` stands for the fine-tuning)."""
    stages = list(cfg.study.stages)
    if not stages:
        raise UserError(f"study.stages=[] names no stage: give one or more of {', '.join(STAGES)} (e.g. "
                        "study.stages=[report] to write the report again)")
    for stage in stages:
        if stage not in STAGES:
            raise UserError(f"study.stages: {stage!r} is not a stage; stages: {', '.join(STAGES)}")
    twice = sorted({stage for stage in stages if stages.count(stage) > 1})
    if twice:
        raise UserError(f"study.stages names {', '.join(twice)} twice: each stage runs once, in the study's order "
                        f"({', '.join(STAGES)})")
    for stage in stages:
        for need in NEEDS[stage]:
            if need in stages or need in done or (need == "finetune" and cfg.study.checkpoint is not None):
                continue
            hint = " or give study.checkpoint=DIR" if need == "finetune" else ""
            raise UserError(f"study.stages: {stage} needs the results of {need}, which is left out and has not run "
                            f"in this study's folder: add {need}{hint}")
    return [stage for stage in STAGES if stage in stages]


def stage_jobs(study: Study, stage: str) -> list[Job]:
    """The jobs of ``stage`` (the report stage has none: ``headlab.study.report`` writes it)."""
    return {"finetune": _finetune, "features": _features, "cluster": _cluster, "compare": _compare,
            "syntax": _syntax, "tables": _tables, "controls": _controls, "refits": _refits, "sweep": _sweep,
            "robustness": _robustness, "gates": _gates, "importance": _importance, "prune_curve": _prune_curve,
            "report": lambda _: []}[stage](study)


def _finetune(study: Study) -> list[Job]:
    if study.cfg.study.checkpoint is not None:
        return []
    return [Job(Path(path), train_config(study.cfg, seed, study.group), "train")
            for seed, (_, path) in zip(study.cfg.study.seeds, study.models)]


def _features(study: Study) -> list[Job]:
    folder = study.stage_dir("features")
    return [Job(folder / name, study.analysis("features", "features", ckpt), "features")
            for name, ckpt in [("pretrained", None), *study.models]]


def _cluster(study: Study) -> list[Job]:
    features, folder = study.stage_dir("features"), study.stage_dir("cluster")
    return [Job(folder / name, study.analysis("cluster", "cluster", None, **{"cluster.features": str(features / name)}),
                "cluster") for name, _ in [("pretrained", None), *study.models]]


def _compare(study: Study) -> list[Job]:
    def fields(names: list[str], labels: list[str]) -> dict[str, Any]:
        syntax = [study.stage_dir("syntax") / name for name in names]
        done = all((job / "results.json").is_file() for job in syntax)  # the syntax stage ran: its roles too
        return {"compare.runs": [str(study.stage_dir("cluster") / name) for name in names], "compare.names": labels,
                **({"compare.syntax": [str(job) for job in syntax]} if done else {})}

    folder = study.stage_dir("compare")
    jobs = [Job(folder / name, study.analysis("compare", "compare", None, **fields(["pretrained", name],
                                                                                   ["pre-trained", "fine-tuned"])),
                "compare") for name, _ in study.models]
    if len(study.models) > 1:
        names = [name for name, _ in study.models]
        jobs.append(Job(folder / "seeds", study.analysis("compare", "compare", None, **fields(names, names)),
                        "compare"))
    return jobs


def _syntax(study: Study) -> list[Job]:
    folder = study.stage_dir("syntax")
    return [Job(folder / name, study.analysis("syntax", "syntax", ckpt), "syntax")
            for name, ckpt in [("pretrained", None), *study.models]]


def _tables(study: Study) -> list[Job]:
    jobs = []
    for name, ckpt in study.models:
        clusters = study.stage_dir("cluster") / name / "clusters.json"
        types = list(read_json(clusters, "clusters")["names"])
        for table in TABLES:
            fields = {"mask.clusters": str(clusters), "mask.unit": "sentence",
                      "mask.renormalize": table == "table3_renormalized"}
            plans = table_plans(table, types)
            for plan in plans:
                cfg = study.analysis("tables", "eval", ckpt, plan=plan, plans=plans, **fields)
                jobs.append(Job(study.stage_dir("tables") / table / name / plan, cfg, "eval"))
    return jobs


def table_plans(table: str, types: list[str]) -> dict[str, Any]:
    """The plans of ``table``: the paper's (``conf/experiment/guan2020_*``) when the clusters carry Guan et al.'s four
    names, else the same design over the clusters there are (prune / uniform each type; drop_intra / drop_inter
    each type)."""
    if sorted(types) == sorted(GUAN_TYPES):
        from hydra import compose
        from omegaconf import OmegaConf

        preset = compose(config_name="ablate", overrides=[f"experiment={PRESETS[table]}"])
        return OmegaConf.to_container(preset.plans, resolve=True)
    rule = lambda name, policy: {"rules": [{"heads": f"cluster:{name}", "policy": policy}]}  # noqa: E731
    if table == "table2":
        return {"baseline": {"rules": []}, **{f"prune_{t}": rule(t, "prune") for t in types},
                **{f"uniform_{t}": rule(t, "uniform") for t in types}}
    return {f"{policy}_{t}": rule(t, policy) for t in types for policy in ("drop_intra", "drop_inter")}


def _controls(study: Study) -> list[Job]:
    """Per model and policy of Table 2, ``sweep.draws`` random head sets of the size of each type Table 2's orderings
    say matters (``CONTROLLED``; every type's when the clusters are not Guan et al.'s): what that type's removal costs
    beside as many heads taken at random."""
    jobs = []
    for name, ckpt in study.models:
        clusters = read_json(study.stage_dir("cluster") / name / "clusters.json", "clusters")
        counts = clusters["counts"]
        for policy in CONTROL_POLICIES:
            types = CONTROLLED[policy] if sorted(counts) == sorted(GUAN_TYPES) else list(counts)
            sizes = sorted({int(counts[t]) for t in types if counts.get(t)})
            if sizes:
                jobs.append(Job(study.stage_dir("controls") / policy / name, study.analysis(
                    "controls", "sweep_heads", ckpt, **{"mask.policy": policy, "sweep.family": "random",
                                                        "sweep.sizes": sizes}), "sweep_heads"))
    return jobs


def _refits(study: Study) -> list[Job]:
    """Per model, Table 2's type plans under each bootstrap fit of its clusters (``cluster.bootstrap_fits``), a job
    per distinct head set, and the baseline on the same examples; none when the clusters are not Guan et al.'s."""
    jobs = []
    for name, ckpt in study.models:
        path = study.stage_dir("cluster") / name / "refits.json"
        fits = refit_plans(read_json(path, "bootstrap fits")) if path.is_file() else []
        plans = {"baseline": {"rules": []}} if fits else {}  # job folder -> its plan
        for fit in fits:
            plans |= {plan.folder: plan.rules for plan in fit.values()}
        for folder, rules in plans.items():
            cfg = study.analysis("refits", "eval", ckpt, plan=folder, plans={folder: rules})
            jobs.append(Job(study.stage_dir("refits") / name / folder, cfg, "eval"))
    return jobs


def _sweep(study: Study) -> list[Job]:
    return [Job(study.stage_dir("sweep") / name, study.analysis(
        "sweep", "sweep_heads", ckpt, **{"mask.policy": "prune", "sweep.family": "single_head"}), "sweep_heads")
        for name, ckpt in study.models]


def _robustness(study: Study) -> list[Job]:
    """Per model, on the stage's examples: the single-head sweep and the head types' exact Shapley values under prune,
    mean and resample, and optimal with the gates stage's constants when it learned them (the Shapley jobs'
    coalitions hold Table 2's single-type removals)."""
    folder, jobs = study.stage_dir("robustness"), []
    for name, ckpt in study.models:
        constants = study.stage_dir("gates") / LEARNED_REMOVAL / name / "constants.json"
        policies = {policy: {} for policy in REMOVALS}
        if constants.is_file():
            policies[LEARNED_REMOVAL] = {"mask.constants": str(constants)}
        for policy, extra in policies.items():
            jobs.append(Job(folder / f"sweep_{policy}" / name, study.analysis(
                "robustness", "sweep_heads", ckpt, **{"mask.policy": policy, "sweep.family": "single_head"}, **extra),
                "sweep_heads"))
        clusters = str(study.stage_dir("cluster") / name / "clusters.json")
        for policy, extra in policies.items():
            jobs.append(Job(folder / f"shapley_{policy}" / name, study.analysis(
                "robustness", "shapley", ckpt, **{"mask.clusters": clusters, "shapley.over": "types",
                                                  "shapley.policy": policy}, **extra), "shapley"))
    return jobs


GATE_METHODS = ("l0", "chg", "optimal")  # the gates stage's jobs, per model


def _gates(study: Study) -> list[Job]:
    """Per model, a ``mode=gates`` job of each method (its settings: ``study.gates``)."""
    return [Job(study.stage_dir("gates") / method / name, study.analysis("gates", "gates", ckpt,
                                                                          **{"gates.method": method}), "gates")
            for name, ckpt in study.models for method in GATE_METHODS]


def _importance(study: Study) -> list[Job]:
    jobs = []
    for name, ckpt in study.models:
        sweep = study.stage_dir("sweep") / name
        fields = {"importance.sweep": str(sweep)} if (sweep / "results.json").is_file() else {}
        learned = [str(study.stage_dir("gates") / method / name) for method in GATE_METHODS]
        learned = [job for job in learned if (Path(job) / "results.json").is_file()]
        if fields and learned:  # the learned measures beside the estimators, against the sweep
            fields["importance.learned"] = learned
        jobs.append(Job(study.stage_dir("importance") / name,
                        study.analysis("importance", "importance", ckpt, **fields), "importance"))
    return jobs


def _prune_curve(study: Study) -> list[Job]:
    return [Job(study.stage_dir("prune_curve") / name, study.analysis("prune_curve", "prune_curve", ckpt),
                "prune_curve") for name, ckpt in study.models]


def check_reference(study_cfg: Any, stages: list[str]) -> None:
    """The robustness stage's reference set (its mean and resample jobs) against its data files, before any stage
    runs (``headlab.analysis.jobs.checks``)."""
    if "robustness" in stages:
        from headlab.analysis.jobs.checks import check_reference_size

        cfg = analysis_config(study_cfg, "robustness", STAGE_MODES["robustness"], None, "preview")
        check_reference_size(cfg, {"mean", "resample"} & set(REMOVALS))


def preview_configs(study_cfg: Any, stages: list[str]) -> list[tuple[str, Any]]:
    """``(stage, config)`` per stage with its ``study.<stage>`` settings laid over, for the checks that need no inputs
    (the configs the stages run read the files of the stages before them)."""
    configs = [("finetune", train_config(study_cfg, seed, "preview")) for seed in study_cfg.study.seeds] \
        if "finetune" in stages else []
    return configs + [(stage, analysis_config(study_cfg, stage, STAGE_MODES[stage], None, "preview"))
                      for stage in stages if stage in STAGE_MODES]


def stage_setting_error(stage: str, message: str) -> str:
    """A stage config's error as the study's setting: ``sweep.draws=0 ...`` -> ``study.controls.sweep.draws=0 ...``
    (another message: ``study.controls: ...``)."""
    return f"study.{stage}.{message}" if re.match(r"[a-z_]+\.[\w.]+[=:]", message) else f"study.{stage}: {message}"
