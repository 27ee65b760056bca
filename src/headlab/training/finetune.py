"""A fine-tuning run (``train.py``): checked config, trainer, data, module, checkpoints, results.json.

The job directory is a pure function of the command line (Hydra's run dir, see conf/train.yaml).
Rerunning a finished job prints its results and stops; rerunning a killed one resumes from its
``checkpoints/last.ckpt`` (never from another config's, ``checkpoints.json``). The final weights are saved with
``save_pretrained`` (and the tokenizer) in ``model/``, readable by any Hugging Face tool and by
``ablate.py ckpt_path=JOB_DIR``; then the checkpoints keep only what ``model/`` does not hold (``kept_files``).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from omegaconf import OmegaConf
from rich.console import Console

from headlab.core.models import apply_runtime_options, load_tokenizer
from headlab.errors import UserError
from headlab.files import (
    RESULT_NEUTRAL,
    file_stamp,
    input_stamps,
    relative_paths,
    share_files,
    without_added_keys,
    without_keys,
    write_json_atomic,
)
from headlab.files import job_hash as hash_of_job
from headlab.reporting.results import TrainResult, already_done, note_why_again, refuse_another_job, retire_results
from headlab.training.batches import check_val_check_interval
from headlab.training.checkpoints import FINAL_WEIGHTS, PLAN_KEY, check_lightning_checkpoint
from headlab.training.datamodule import TaskDataModule
from headlab.training.durable import AtomicCheckpointIO, RandomStates, readable_checkpoint, training_lock
from headlab.training.epoch_order import ResumeMidEpoch
from headlab.training.kept_files import checkpoint_step, has_training_state, keep_only, kept_checkpoints
from headlab.training.modules import task_module
from headlab.training.progress import NamedPassBar, ProgressLog
from headlab.training.signals import PlainSigterm
from headlab.training.tracking import build_logger, tracked_job

# Keys that do not change what a job computes: left out of its config hash (and headlab.files.RESULT_NEUTRAL).
RUNTIME_KEYS = ("ckpt_path", "keep_training_state", "logger", "experiment", "group", "paths_root")
# Local files the job reads: data regenerated at the same path makes a finished run train again (their size and
# content digest count in the hash; see headlab.analysis.jobs.identity for ablate.py's).
INPUT_KEYS = ("task.data_files",)
# beside checkpoints/ (Lightning warns about a checkpoint directory that is not empty): the config hash of the run
# that writes them
OWNER_FILE = "checkpoints.json"


def checkpoints_owner(checkpoint_dir: Path) -> str | None:
    """The config hash whose run wrote ``checkpoint_dir``: ``checkpoints.json``, else (checkpoints of an older headlab)
    the hash of the job directory's complete ``results.json``; None when neither says."""
    for path in (checkpoint_dir.parent / OWNER_FILE, checkpoint_dir.parent / "results.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and (path.name == OWNER_FILE or record.get("complete")):
            return record.get("config_hash")
    return None


def resume_checkpoint(cfg: Any, checkpoint_dir: Path, job_hash: str) -> str | None:
    """What ``trainer.fit`` resumes from: ``ckpt_path`` null -> this job's last.ckpt if this config wrote it; 'last';
    or a path (a readable checkpoint of this model and task, else a ``UserError``).

    Checkpoints of another config (an earlier run with other settings in the same ``hydra.run.dir``) are not resumed:
    the new run would start at their step, or train no step at all. An unreadable ``last.ckpt`` (a disk that filled
    while an older headlab wrote it) is said in a note; the run resumes from ``best.ckpt`` when that one is whole, or
    starts over."""
    ckpt_path = cfg.ckpt_path
    last = checkpoint_dir / "last.ckpt"
    if ckpt_path is None:
        if not last.is_file() or checkpoints_owner(checkpoint_dir) not in (None, job_hash):
            return None
        broken = readable_checkpoint(last)
        if broken is None:
            return str(last)
        best = checkpoint_dir / "best.ckpt"
        fallback = str(best) if best.is_file() and readable_checkpoint(best) is None else None
        Console().print(f"note: {last} is unreadable ({broken}): resuming from {best.name}" if fallback else
                        f"note: {last} is unreadable ({broken}) and no other checkpoint is whole: training starts "
                        "over", markup=False, soft_wrap=True)
        return fallback
    path = last if ckpt_path == "last" else Path(ckpt_path)
    if not path.is_file():
        raise UserError(f"ckpt_path={ckpt_path!r}: no checkpoint at {str(path)!r}" + (
            " (a finished run keeps it only with keep_training_state=true)" if path.name == "last.ckpt" else ""))
    broken = readable_checkpoint(path)
    if broken is not None:
        raise UserError(f"ckpt_path={ckpt_path!r} is not a readable Lightning checkpoint ({broken})")
    check_lightning_checkpoint(path, cfg.model, cfg.task)
    if not has_training_state(path):
        raise UserError(f"ckpt_path={ckpt_path!r} holds weights only (its run finished without "
                        "keep_training_state=true): training cannot continue from it; evaluate it with ablate.py "
                        "ckpt_path=PATH")
    return str(path)


def claim_checkpoints(checkpoint_dir: Path, job_hash: str, resume: str | None) -> None:
    """Right before training (rank zero): another config's checkpoints in this job's directory are removed, with a
    note (unless resumed from); ``checkpoints.json`` then says whose checkpoints the directory holds."""
    owner = checkpoints_owner(checkpoint_dir)
    resumed_here = resume is not None and Path(resume).parent == checkpoint_dir
    if owner not in (None, job_hash) and not resumed_here and any(checkpoint_dir.glob("*.ckpt")):
        Console().print(f"note: {checkpoint_dir} held the checkpoints of another config (an earlier run in this "
                        "directory): they are removed and this run starts afresh", markup=False, soft_wrap=True)
        shutil.rmtree(checkpoint_dir)
    write_json_atomic(checkpoint_dir.parent / OWNER_FILE, {"config_hash": job_hash})


def checkpoint_callbacks(checkpoint_dir: Path, monitor: str) -> tuple[ModelCheckpoint, ModelCheckpoint]:
    """``best.ckpt`` (the best ``monitor``) and ``last.ckpt`` (what a killed run resumes from), both written after
    each validation. ``last`` is its own callback: Lightning 2.6's ``save_last`` writes it only when the best one
    was written at the same step, so a run whose metric stopped improving resumed from its last improvement. Neither
    saves at an epoch's end: a run stopped before its first validation would warn that the metric was never logged.
    """
    best = ModelCheckpoint(dirpath=checkpoint_dir, filename="best", monitor=monitor, mode="max",
                           auto_insert_metric_name=False, save_on_train_epoch_end=False)
    last = ModelCheckpoint(dirpath=checkpoint_dir, filename="last", monitor=None, save_top_k=1,
                           enable_version_counter=False, save_on_train_epoch_end=False)
    return best, last


def make_trainer(trainer_cfg: Any, callbacks: list[Any], logger: Any, output_dir: Path,
                 inference_mode: bool = True, fitting: bool = True) -> pl.Trainer:
    """A Lightning Trainer from the ``trainer`` group, with callbacks, the logger and progress lines in the log.

    Lightning checks its arguments here (devices, strategy, accelerator ...): what it rejects is bad input.
    ``inference_mode=False`` for gradient scoring (Lightning validates under ``torch.inference_mode``).
    ``fitting=False``: a Trainer that only validates, without ``val_check_interval`` (Lightning would announce
    when "validation will run" in every evaluation job).
    """
    arguments = OmegaConf.to_container(trainer_cfg, resolve=True)
    if not fitting:
        arguments.pop("val_check_interval", None)
    bar = [NamedPassBar()] if arguments.get("enable_progress_bar", True) else []
    try:
        return pl.Trainer(**arguments, callbacks=[*callbacks, ProgressLog(), PlainSigterm(), *bar],
                          logger=logger or False, default_root_dir=output_dir, inference_mode=inference_mode,
                          plugins=[AtomicCheckpointIO()])
    except (ValueError, TypeError, MisconfigurationException) as error:
        raise UserError(f"trainer: {error}") from None


def run_finetuning(cfg: Any, output_dir: str | Path, model_and_task: list[str] | None = None) -> dict[str, Any]:
    """Fine-tune ``cfg.model`` on ``cfg.task`` under ``cfg.mask``; returns the results record.

    ``cfg`` is a config that passed ``headlab.cli.train.check_train_config``. One run per job directory at a time
    (``training_lock``). ``model_and_task``: the overrides that chose the model and task (``task=sst2``,
    ``task.data_files=...``), carried into the ``ablate.py`` command printed at the end.
    """
    output_dir = Path(output_dir)
    with training_lock(output_dir):
        return _finetune(cfg, output_dir, model_and_task)


def finetune_identity(cfg: Any, output_dir: Path | None = None) -> tuple[dict[str, Any], dict[str, Any],
                                                                          dict[str, Any], str]:
    """``(resolved config, computed part, input stamps, hash)`` of a fine-tuning run: its ``results.json`` is this
    run's when complete and of this hash. ``ckpt_path`` continues a run: the same job when that run had these settings
    (a killed run resumed), another when it had others (``started_from``); ``output_dir``: where ``ckpt_path=last``
    is."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    inputs = input_stamps({k: v for k, v in resolved.items() if k not in RUNTIME_KEYS}, INPUT_KEYS)
    computed = computed_part(resolved)
    job_hash = hash_of_job(computed, inputs)
    started = started_from(cfg.ckpt_path, output_dir, job_hash)
    if started is not None:
        inputs = {**inputs, "ckpt_path": started}
        job_hash = hash_of_job(computed, inputs)
    return resolved, computed, inputs, job_hash


def started_from(ckpt_path: str | None, output_dir: Path | None, job_hash: str) -> dict[str, Any] | None:
    """The training state a run continues when another config wrote it (``checkpoints.json``'s hash, or none said,
    and the file's stamp): the run's weights then depend on that run, so its hash must too; None when ``ckpt_path``
    resumes a run of these very settings, or names no file (``resume_checkpoint`` says why)."""
    if ckpt_path is None or (ckpt_path == "last" and output_dir is None):
        return None
    path = Path(output_dir) / "checkpoints/last.ckpt" if ckpt_path == "last" else Path(ckpt_path)
    if not path.is_file():
        return None
    owner = checkpoints_owner(path.parent)
    return None if owner == job_hash else {"trained_by": owner, "file": file_stamp(path)}


TRAINING_NEUTRAL = ("task.cluster_field",)  # read by the statistics of evaluations, not by training


def computed_part(resolved: dict[str, Any]) -> dict[str, Any]:
    """What of a resolved fine-tuning config is hashed: no runtime keys or ``RESULT_NEUTRAL`` settings, paths in a
    study's folder relative to it (a study's folder may move)."""
    kept = without_added_keys({k: v for k, v in resolved.items() if k not in RUNTIME_KEYS})
    return relative_paths(without_keys(kept, (*RESULT_NEUTRAL, *TRAINING_NEUTRAL)), resolved.get("paths_root"))


def _finetune(cfg: Any, output_dir: Path, model_and_task: list[str] | None) -> dict[str, Any]:
    refuse_another_job(output_dir / "results.json", "train", "train.py")
    resolved, computed, inputs, job_hash = finetune_identity(cfg, output_dir)
    checkpoint_dir = output_dir / "checkpoints"
    done = already_done(output_dir / "results.json", job_hash)
    if done is not None:
        keep_only(checkpoint_dir, done)  # a run killed while it removed them
        if cfg.keep_training_state and done.get("last_checkpoint") is None:
            Console().print(f"note: keep_training_state=true, but this run finished without it: its training state "
                            f"(checkpoints/last.ckpt) is gone and cannot come back; {FINAL_WEIGHTS}/ holds the final "
                            "weights. To continue training, fine-tune again with keep_training_state=true in another "
                            "hydra.run.dir", markup=False, soft_wrap=True)
        return done
    note_why_again(output_dir / "results.json", computed, inputs, computed_part)
    retire_results(output_dir / "results.json")
    resume = resume_checkpoint(cfg, checkpoint_dir, job_hash)
    monitor = f"{cfg.task.eval_splits[0]}/{cfg.task.main_metric}"

    pl.seed_everything(cfg.seed, workers=True)
    logger = build_logger(cfg.logger, run_id=job_hash, run_name=f"{cfg.task.name}-{cfg.model.name}-{job_hash[:6]}")
    with tracked_job():
        checkpoint, last = checkpoint_callbacks(checkpoint_dir, monitor)
        callbacks = [checkpoint, last, ResumeMidEpoch(), RandomStates(),
                     *([LearningRateMonitor("step")] if logger else [])]
        trainer = make_trainer(cfg.trainer, callbacks, logger, output_dir)
        data = TaskDataModule(cfg.task, cfg.model, unit=cfg.mask.unit, seed=cfg.seed,
                              **OmegaConf.to_container(cfg.data, resolve=True))
        data.setup()  # load, check and tokenise the data before the model
        check_val_check_interval(cfg.trainer, len(data.train_features), data.batch_size, trainer.world_size)
        module = task_module(cfg.model, cfg.task, cfg.mask, cfg.optim)
        apply_runtime_options(module.model, cfg)
        if logger:
            logger.log_hyperparams(resolved)
        if trainer.is_global_zero:
            claim_checkpoints(checkpoint_dir, job_hash, resume)
        resumed_step = checkpoint_step(Path(resume)) if resume is not None and trainer.is_global_zero else None
        trainer.fit(module, datamodule=data, ckpt_path=resume)
        if resumed_step is not None and trainer.global_step == resumed_step:
            Console().print(f"note: {resume} had finished its training (step {trainer.global_step}, trainer.max_* of "
                            "this config): this run trained no step; its weights are that checkpoint's", markup=False,
                            soft_wrap=True)
        validated_after = module.validated_step != trainer.global_step  # training ended between validations
        if validated_after:
            trainer.validate(module, datamodule=data, verbose=False)
        trainer.save_checkpoint(checkpoint_dir / "last.ckpt", weights_only=False)  # the metrics' weights, resumable
        final_weights = output_dir / FINAL_WEIGHTS
        # resumed from another directory's state, Lightning keeps that run's best path (not its score): not this run's
        ours = bool(checkpoint.best_model_path) and \
            Path(checkpoint.best_model_path).parent.resolve() == checkpoint_dir.resolve()
        best_path = checkpoint.best_model_path if ours else None
        best_score = float(checkpoint.best_model_score) if ours and checkpoint.best_model_score is not None else None
        final_score = module.last_metrics.get(cfg.task.eval_splits[0], {}).get(cfg.task.main_metric)
        if validated_after and final_score is not None and (best_score is None or final_score > best_score):
            # the validation after training is no checkpoint callback's: the final weights (last.ckpt) beat the best
            best_path, best_score = str(checkpoint_dir / "last.ckpt"), final_score
        best, last = kept_checkpoints(checkpoint_dir, best_path, trainer.global_step, final_weights,
                                      cfg.keep_training_state)
        result = TrainResult(
            task=cfg.task.name,
            model=cfg.model.name,
            seed=cfg.seed,
            plan=module.plan.to_dict(),
            metrics=module.last_metrics,
            main_metric=monitor,
            num_examples=data.num_examples,
            num_evaluated=module.last_counts,
            final_weights=str(final_weights),
            best_checkpoint=best,
            best_score=best_score,
            last_checkpoint=last,
            resumed_from=resume,
            global_step=trainer.global_step,
            config_hash=job_hash,
            config=resolved,
            inputs=inputs,
        )
        if trainer.is_global_zero:
            if not module.plan.is_identity:  # said in the weights' own config.json: analyses refuse them
                module.model.config.update({PLAN_KEY: module.plan.to_dict()})
            save_final_weights(module.model, load_tokenizer(cfg.model), final_weights)
            write_predictions(module, output_dir)
            result.write(output_dir / "results.json")
            keep_only(checkpoint_dir, asdict(result))
            _print_summary(result, output_dir, logger, model_and_task)
        return asdict(result)


def save_final_weights(model: Any, tokenizer: Any, folder: Path) -> Path:
    """``save_pretrained`` of the model and tokenizer into ``folder``, atomically (a full folder or none)."""
    staging = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    share_files(staging)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def write_predictions(module: Any, output_dir: Path) -> list[Path]:
    """``predictions_<split>.json`` (question id -> answer) of a QA module; call on rank 0 (answers are gathered)."""
    return [write_json_atomic(output_dir / f"predictions_{split}.json", answers)
            for split, answers in getattr(module, "predictions", {}).items()]


def _print_summary(result: TrainResult, output_dir: Path, logger: Any, model_and_task: list[str] | None) -> None:
    console = Console(soft_wrap=True)  # paths whole in logs
    for split, values in result.metrics.items():
        console.print(f"{split}: " + ", ".join(f"{name} {value:.4f}" for name, value in values.items()))
    console.print(f"results     {output_dir / 'results.json'}")
    console.print(f"weights     {result.final_weights} (the final weights, save_pretrained)")
    if result.best_checkpoint is None:
        console.print("best        none: no validation ran during training")
    else:
        where = "the final weights" if result.best_checkpoint == result.final_weights else result.best_checkpoint
        console.print(f"best        {result.main_metric} {result.best_score:.4f}: {where}")
    if result.last_checkpoint is not None:
        console.print(f"state       {result.last_checkpoint} (continue training with train.py ckpt_path=PATH)")
    if logger is not None:
        console.print(f"logs        {logger.save_dir} ({type(logger).__name__})")
    if result.plan.get("policies"):  # the analyses refuse weights fine-tuned under a plan (checkpoints.py)
        console.print("next        none: fine-tuned under a plan, these weights are not analysed (every analysis "
                      "takes each head whole); the metrics above are the model's under its plan")
        return
    chosen = [shlex.quote(o) for o in model_and_task] if model_and_task else [f"model={result.model}",
                                                                              f"task={result.task}"]
    console.print(f"next        python ablate.py mode=eval {' '.join(chosen)} "
                  f"{pasteable('ckpt_path', output_dir.absolute())} mask=prune mask.heads=L0", markup=False)


def pasteable(key: str, value: Any) -> str:
    """``key=value`` as one shell word that Hydra reads back as this very string (a folder of the user's own may hold
    ``=``, ``,`` or ``~``, which Hydra would take for a sweep or refuse unless the value is quoted)."""
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./+-]+", text):
        return f"{key}={text}"
    return shlex.quote(f'{key}="' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')

