"""The checks of ``mode=study`` that need no weights, before any stage runs: the seeds, the stages and their settings,
the task's splits, the model and the checkpoint the study is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.errors import UserError
from headlab.study.schema import FindingsConfig, check_stage_sections, check_statistics
from headlab.study.stages import MARKER, STAGES, check_stages
from headlab.training.processes import several_processes


def done_stages(folder: Path) -> set[str]:
    """The stages whose ``stage.json`` is in ``folder`` (finished once, for some config)."""
    return {stage for stage in STAGES if (folder / stage / MARKER).is_file()}


TRAIN_SPLIT_STAGES = {"finetune", "robustness", "gates", "importance", "prune_curve"}  # read the training split


def check_study(cfg: Any, folder: str | Path) -> list[str]:
    """Everything about ``study`` that needs no weights; returns the stages to run, in order."""
    check_seeds(cfg)
    FindingsConfig(margin=float(cfg.study.findings.margin))  # its checks: the study section is not instantiated
    check_whole_model_one_process(cfg)
    check_stage_sections(cfg)
    stages = check_stages(cfg, done_stages(Path(folder)))
    check_statistics(cfg)
    if cfg.task.train_split in cfg.task.eval_splits:  # train.py refuses it too; the study's stages all score there
        raise UserError(f"task.train_split={cfg.task.train_split} is also in task.eval_splits="
                        f"{list(cfg.task.eval_splits)}: the study would fine-tune on the examples it scores; give "
                        "evaluation splits of other examples")
    if "gates" in stages:  # its fit split and methods' settings, before the stages ahead of it run
        from headlab.analysis.gates.checks import check_gates_settings
        from headlab.study.configs import analysis_config

        try:
            check_gates_settings(analysis_config(cfg, "gates", "gates", None, "preview"))
        except UserError as error:  # named as the study's setting
            raise UserError(f"study.gates.{error}" if str(error).startswith("gates.") else str(error)) from None
    if set(stages) & TRAIN_SPLIT_STAGES and not cfg.task.get("data_files"):  # offline, a hub task may lack it
        from headlab.tasks.hub_data import check_hub_dataset

        check_hub_dataset(cfg.task.name, cfg.task.dataset, cfg.task.get("subset"), [cfg.task.train_split])
    from headlab.core.model_files import model_shape  # torch and transformers load only once the config is sane

    model_shape(cfg.model)  # a hub model that cannot be reached fails here, before any stage
    if cfg.study.checkpoint is not None:
        check_study_checkpoint(cfg)
    return stages


def check_seeds(cfg: Any) -> None:
    """One or more different seeds; one only when ``study.checkpoint`` gives the fine-tuned model."""
    seeds = list(cfg.study.seeds)
    if not seeds:
        raise UserError("study.seeds=[] names no fine-tuning seed: give one or more, e.g. study.seeds=[0,1,2]")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"study.seeds={seeds} names a seed twice")
    if cfg.study.checkpoint is not None and len(seeds) > 1:
        raise UserError(f"study.seeds={seeds} with study.checkpoint: the checkpoint is one fine-tuned model; give "
                        "one seed, or leave study.checkpoint out to fine-tune a model per seed")


def check_whole_model_one_process(cfg: Any) -> None:
    """No mask or plan (the study makes its own), and a trainer of one process (DDP would rerun the study in
    each of its processes)."""
    if cfg.mask.rules or cfg.mask.policy or cfg.mask.heads or cfg.plan is not None:
        raise UserError("mode=study analyses the whole model and makes its own plans (Tables 2 and 3, the sweep): "
                        "leave mask and plan out, or give a mode that takes one (mode=eval)")
    trainer = cfg.trainer
    if several_processes(trainer):
        raise UserError(f"mode=study runs its stages in one process on one device; trainer.devices="
                        f"{trainer.devices}, trainer.strategy={trainer.strategy} would start processes that each run "
                        "the study: use trainer=gpu (one GPU), or run the stages' own commands with trainer=ddp")


def check_study_checkpoint(cfg: Any) -> None:
    """``study.checkpoint`` is a ``train.py`` job (or its ``.ckpt``) of this model on this task."""
    from headlab.training.checkpoints import locate_checkpoint

    try:
        found = locate_checkpoint(cfg.study.checkpoint, cfg.model, cfg.task)
    except UserError as error:
        raise UserError(str(error).replace("ckpt_path=", "study.checkpoint=", 1)) from None
    if found.kind not in ("job", "lightning"):
        raise UserError(f"study.checkpoint={cfg.study.checkpoint!r} is not a headlab checkpoint (a train.py job "
                        f"directory or its .ckpt) of {cfg.model.name} on {cfg.task.name}")


def check_stage_alone(stage: str, stage_cfg: Any) -> None:
    """The checks of ``stage``'s config that need no earlier stage's files (the clusters' k against the model's
    heads; the syntax stage's treebank), before any stage runs: they failed only once the stages before had run."""
    if stage == "cluster":
        from headlab.analysis.types.checks import check_k
        from headlab.core.model_files import model_shape

        layers, heads = model_shape(stage_cfg.model)
        check_k(stage_cfg.cluster.k, layers * heads)
    elif stage == "syntax":
        from headlab.analysis.syntax.checks import check_syntax

        check_syntax(stage_cfg)
