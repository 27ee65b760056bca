"""The checks of ``mode=gates``: no weights read, no torch imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.analysis.jobs.checks import check_evaluation
from headlab.errors import UserError
from headlab.files import read_json

HEAD_CLASSES = {"classification": "ForSequenceClassification", "regression": "ForSequenceClassification",
                "extractive_qa": "ForQuestionAnswering"}  # the task's head in a saved config's "architectures"


def check_gates(cfg: Any) -> None:
    """The settings (``check_gates_settings``), the full model, a checkpoint fine-tuned for the task, the prune
    curve to draw beside."""
    gates = cfg.gates
    check_gates_settings(cfg)
    if cfg.model.get("random_init") and cfg.ckpt_path is None and not cfg.allow_random_head:
        check_fine_tuned(cfg)  # the gates' refusal, not the evaluation's (which offers allow_random_head=true)
    plan = check_evaluation(cfg)
    if not plan.is_identity:
        raise UserError(f"mode=gates learns gates on the full model; the mask changes heads ({plan.describe()}): "
                        "use mask=none")
    if gates.prune_curve is not None:
        check_prune_curve_job(gates.prune_curve, cfg)
    check_fine_tuned(cfg)


def check_gates_settings(cfg: Any) -> None:
    """What the ``gates`` section and the task say alone (the study checks them before any stage runs): a method's
    own settings, a fit split of the task that is no evaluation split."""
    gates = cfg.gates
    if gates.method != "l0" and gates.train_model:
        raise UserError(f"gates.train_model=true is Voita et al.'s setting (gates.method=l0); gates.method="
                        f"{gates.method} learns its parameters on the frozen model")
    if gates.method != "l0" and gates.prune_curve is not None:
        raise UserError(f"gates.prune_curve is drawn beside L0 gates' curve (gates.method=l0); gates.method="
                        f"{gates.method} draws none")
    files = cfg.task.get("data_files")
    if files and gates.split not in files:  # a task of local files (a hub task's splits are checked as it loads)
        raise UserError(f"gates.split={gates.split}: task {cfg.task.name} has no such split (its files: "
                        f"{', '.join(files)}); fit the gates on {cfg.task.train_split}")
    if gates.split in cfg.task.eval_splits:
        instead = ("drop it from task.eval_splits" if gates.split == cfg.task.train_split else
                   f"fit them on {cfg.task.train_split}")
        raise UserError(f"gates.split={gates.split} is an evaluation split of task {cfg.task.name}: the gates would "
                        f"be scored on the examples they were fit on; {instead}")


def check_fine_tuned(cfg: Any) -> None:
    """Gates learn what a model fine-tuned for the task needs: weights without the task's head (the pre-trained
    model, ``allow_random_head`` or not) are refused before they load. A ``train.py`` job or ``.ckpt`` was checked
    to be of this task (``locate_checkpoint``); a folder or the model's own weights say it in ``architectures``."""
    from headlab.core.model_files import config_file
    from headlab.training.checkpoints import locate_checkpoint

    checkpoint = locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)
    if checkpoint.kind in ("lightning", "job"):
        return
    if cfg.model.get("random_init"):
        raise UserError(f"model {cfg.model.name} has random weights and ckpt_path=null: mode=gates needs a model "
                        f"fine-tuned for task {cfg.task.name} (train.py, then ckpt_path=JOB_DIR)")
    folder = checkpoint.path or cfg.model.name_or_path
    config = read_json(config_file(folder), "model config")
    wanted = HEAD_CLASSES[cfg.task.type]
    classes = config.get("architectures") if isinstance(config, dict) else None
    if classes and not any(str(name).endswith(wanted) for name in classes):
        raise UserError(f"{checkpoint.describe()} ({', '.join(map(str, classes))}) have no *{wanted} head: not "
                        f"fine-tuned for task {cfg.task.name}, and mode=gates learns which heads a fine-tuned model "
                        "needs; fine-tune first (train.py) and pass ckpt_path=JOB_DIR")


def check_prune_curve_job(source: str, cfg: Any) -> None:
    """``gates.prune_curve`` is a finished ``mode=prune_curve`` job of this model and task."""
    path = Path(source)
    results = path / "results.json" if path.is_dir() else path
    if not results.is_file() or not (path / "prune_curve.csv" if path.is_dir() else path.parent /
                                     "prune_curve.csv").is_file():
        raise UserError(f"gates.prune_curve={source!r}: not a finished mode=prune_curve job directory (it needs "
                        "results.json and prune_curve.csv)")
    record = read_json(results, "prune curve results")
    if not isinstance(record, dict) or record.get("kind") != "prune_curve" or not record.get("complete"):
        raise UserError(f"gates.prune_curve={source!r}: its results.json is not a finished mode=prune_curve job's")
    for key, ours in (("model", cfg.model.name), ("task", cfg.task.name)):
        if record.get(key) != ours:
            raise UserError(f"gates.prune_curve={source!r} is a curve of {key} {record.get(key)}; this job's {key} "
                            f"is {ours}")
    theirs = ((record.get("config") or {}).get("data") or {}).get("max_eval_examples")
    if theirs != cfg.data.max_eval_examples:  # one figure, one set of examples: the curves' scores compare
        raise UserError(f"gates.prune_curve={source!r} was scored on data.max_eval_examples={theirs}; this job "
                        f"scores {cfg.data.max_eval_examples}: give data.max_eval_examples={theirs}")
