"""The ``study`` section of ``conf/ablate.yaml`` (``mode=study``; sizes in ``conf/study/``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from headlab.errors import UserError
from headlab.reporting.settings import MIN_RESAMPLES, MIN_RESAMPLES_WHY
from headlab.study.stages import OPTIONAL_STAGES, STAGE_MODES, STAGE_RUNS, STAGES


@dataclass
class FindingsConfig:
    """How the findings read the stages' numbers (docs/study.md, "How a claim gets its verdict")."""

    margin: float = 1.0  # points of a 0-100 score (0.01 of a GLUE metric): a loss below it counts as none

    def __post_init__(self) -> None:
        if not 0 < self.margin < 100:
            raise UserError(f"study.findings.margin={self.margin} must be above 0 and below 100 (points of a 0-100 "
                            "score: 1 is one point of accuracy, 0.01 of a GLUE metric in [0, 1])")


@dataclass
class StudyConfig:
    """Which stages run, on which fine-tuned models, and each stage's settings.

    A stage's settings are config fields laid over that stage's config: ``finetune`` over ``conf/train.yaml``
    (``{trainer: {max_epochs: 5}, optim: {lr: 1e-4}}``), the others over ``ablate.py``'s for their mode
    (``features: {features: {max_sequences: 300}}``, ``tables: {data: {max_eval_examples: 200}}``).
    """

    checkpoint: str | None = None  # a train.py job directory (or .ckpt) of this model and task: no fine-tuning
    smoke: bool = False  # a run that checks the chain, not the science (study=quick): no claim gets a verdict
    seeds: list[int] = field(default_factory=lambda: [0])  # a fine-tuned model per seed
    stages: list[str] = field(default_factory=lambda: [s for s in STAGES if s not in OPTIONAL_STAGES])  # in order
    finetune: dict[str, Any] = field(default_factory=dict)
    features: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)
    compare: dict[str, Any] = field(default_factory=dict)
    syntax: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, Any] = field(default_factory=dict)
    controls: dict[str, Any] = field(default_factory=dict)
    refits: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, Any] = field(default_factory=dict)
    robustness: dict[str, Any] = field(default_factory=dict)
    gates: dict[str, Any] = field(default_factory=dict)
    importance: dict[str, Any] = field(default_factory=dict)
    prune_curve: dict[str, Any] = field(default_factory=dict)
    findings: FindingsConfig = field(default_factory=FindingsConfig)


# study.<stage>.<key>...=VALUE, as written (no +, ++ or ~ before it)
_STAGE_SETTING = re.compile(r"^study\.(?:" + "|".join(stage for stage in STAGES if stage != "report") + r")\.[\w.]+=")


def is_stage_setting(argument: str) -> bool:
    """Whether a command-line argument is a ``study.<stage>.KEY=VALUE`` setting."""
    return _STAGE_SETTING.match(argument) is not None


def open_stage_settings(arguments: list[str]) -> list[str]:
    """Command-line ``study.<stage>.KEY=VALUE`` overrides as ``++study.<stage>.KEY=VALUE``: a stage's settings are
    any field of that stage's config (``study.syntax.syntax.conllu=FILE``), most of which ``conf/study/`` does not
    list, and Hydra refuses a key it does not list unless it is forced in (its error asked for ``+``)."""
    return [f"++{argument}" if is_stage_setting(argument) else argument for argument in arguments]


def check_stage_sections(study_cfg: Any) -> None:
    """A ``UserError`` for a ``study.<stage>.<section>`` that none of the stage's modes reads
    (``study.refits.cluster.bootstrap_fits=5``: the refits stage evaluates plans; the fits are the cluster stage's),
    naming the stage that does read it."""
    from headlab.analysis.jobs.identity import SECTION_MODES

    for stage, modes in STAGE_RUNS.items():
        for section in study_cfg.study.get(stage) or {}:
            readers = SECTION_MODES.get(section)
            if readers is not None and not set(modes) & set(readers):
                owners = [other for other, runs in STAGE_RUNS.items() if set(runs) & set(readers)]
                where = f"; set it on the stage that does: study.{owners[0]}.{section}" if owners else ""
                raise UserError(f"study.{stage}.{section}: the {stage} stage runs mode={'/'.join(modes)}, which reads "
                                f"no {section} settings, so they would change nothing{where}")


# The settings of the resampled intervals and p-values the verdicts read (docs/study.md, "How a claim gets its verdict")
VERDICT_STATISTICS = {"tables": ("report.resamples", "report.permutations"),
                      "sweep": ("report.resamples", "report.permutations"), "syntax": ("syntax.resamples",),
                      "robustness": ("shapley.resamples",)}  # the Shapley intervals decide its orderings


def check_statistics(study_cfg: Any) -> None:
    """A ``UserError`` when a stage whose intervals or p-values the verdicts read has fewer than ``MIN_RESAMPLES``
    resamples or permutations (its ``study.<stage>`` settings laid over the study's), before any stage runs."""
    from omegaconf import OmegaConf

    from headlab.study.configs import analysis_config

    for stage, keys in VERDICT_STATISTICS.items():
        cfg = analysis_config(study_cfg, stage, STAGE_MODES[stage], None, "preview")
        for key in keys:
            value = OmegaConf.select(cfg, key)
            if value is not None and value < MIN_RESAMPLES:
                raise UserError(f"study.{stage}.{key}={value} is below {MIN_RESAMPLES}: {MIN_RESAMPLES_WHY}; give "
                                f"study.{stage}.{key}={MIN_RESAMPLES} or more")
