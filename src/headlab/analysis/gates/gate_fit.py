"""One fit of head gates (or of optimal constants) on a job's fine-tuned model: a Lightning fit of ``gate_training``'s
(``constant_training``'s) module on the fit split, resumable after a kill.

A fit lives in a folder of its own (``fits/<name>/``): ``checkpoints/last.ckpt`` every ``gates.checkpoint_every``
steps (the gates, Adam's state, the random states and the loops' progress; the model's weights too only when they
train), then ``fit.json`` with the learned parameters once it ends. The fit's key (the job's hashed config but the
other fits' settings, and this fit's own) says whose a folder is: a rerun takes a finished fit of the same key as it
is, goes on from the checkpoint of an unfinished one (the hard concrete draws and the batches are the uninterrupted
fit's: the parameters come out bit-equal), and starts afresh over a folder of another key.
"""

from __future__ import annotations

import copy
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import OmegaConf
from rich.console import Console

from headlab.analysis.gates.constant_training import constant_module
from headlab.analysis.gates.gate_training import gated_module
from headlab.analysis.gates.schema import method_setting
from headlab.analysis.jobs.eval_job import EvalJob, estimation_task
from headlab.errors import UserError
from headlab.files import config_hash, read_json, write_json_atomic
from headlab.training.checkpoint_loading import load_checkpoint
from headlab.training.checkpoints import Checkpoint, tokenizer_config
from headlab.training.datamodule import TaskDataModule
from headlab.training.durable import RandomStates, readable_checkpoint
from headlab.training.epoch_order import ResumeMidEpoch
from headlab.training.finetune import make_trainer, save_final_weights

FIT_FILE = "fit.json"


@dataclass
class GateFit:
    """What one fit learned: the gates' parameters ``[layers, heads]``, its steps, and (``gates.train_model``) the
    weights trained with them, saved in ``model/`` of its folder."""

    parameters: np.ndarray
    steps: int
    key: str
    model: torch.nn.Module | None = None


def fit_settings(cfg: Any, name: str, **method: Any) -> dict[str, Any]:
    """What a fit named ``name`` learns with: the ``gates`` section's settings (the method's learning rate and steps
    where null) and the fit's own (``method``: its penalty)."""
    gates = cfg.gates
    return {"method": gates.method, "seed": cfg.seed, "train_model": gates.train_model, "init": gates.init,
            "split": gates.split, "max_examples": gates.max_examples, "lr": method_setting(gates, "lr"),
            "max_steps": method_setting(gates, "max_steps"), **method, "log_prefix": f"gates/{name}"}


def fit_key(job: EvalJob, settings: dict[str, Any]) -> str:
    """The job's hashed config and inputs without what no fit reads (the ``gates`` section, whose fit settings are in
    ``settings``, and the statistics' ``report`` settings), and this fit's ``settings``."""
    from headlab.analysis.jobs.identity import hashed_part

    hashed = {k: v for k, v in hashed_part(job.resolved).items() if k not in ("gates", "report")}
    inputs = {k: v for k, v in job.identity.inputs.items() if not k.startswith("gates.")}
    return config_hash({"config": hashed, "inputs": inputs, "fit": settings})


def fit_data(job: EvalJob) -> TaskDataModule:
    """The fit split's first ``gates.max_examples`` examples, in training batches of ``data.batch_size``."""
    cfg = job.cfg
    task = estimation_task(cfg.task, cfg.task.eval_splits[0])  # the eval split only: its features are cached
    task.train_split = cfg.task.train_split if cfg.gates.split == "train" else cfg.gates.split
    data_cfg = {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items()
                if k not in ("max_train_examples", "max_eval_examples")}
    data = TaskDataModule(task, tokenizer_config(job.checkpoint, cfg.model), unit=cfg.mask.unit, seed=cfg.seed,
                          max_train_examples=cfg.gates.max_examples, max_eval_examples=1, **data_cfg)
    data.setup()
    return data


def fit_trainer(job: EvalJob, steps: int, checkpoints: Path, logger: Any) -> pl.Trainer:
    """The job's trainer settings for ``steps`` steps without validation, a checkpoint every
    ``gates.checkpoint_every`` steps."""
    gates, trainer = job.cfg.gates, job.cfg.trainer
    arguments = OmegaConf.to_container(trainer, resolve=True) | {
        "max_steps": steps, "max_epochs": -1, "limit_val_batches": 0, "num_sanity_val_steps": 0,
        "val_check_interval": 1.0, "check_val_every_n_epoch": 1, "enable_model_summary": False,
        "log_every_n_steps": min(trainer.log_every_n_steps or 50, gates.checkpoint_every)}
    last = ModelCheckpoint(dirpath=checkpoints, filename="last", monitor=None, save_top_k=1,
                           enable_version_counter=False, every_n_train_steps=gates.checkpoint_every,
                           save_on_train_epoch_end=False)
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval")  # a small fit split
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")  # the frozen model, on purpose
    return make_trainer(OmegaConf.create(arguments), [last, ResumeMidEpoch(), RandomStates()], logger,
                        job.output_dir)


def fit_gates(job: EvalJob, data: TaskDataModule, folder: Path, settings: dict[str, Any], logger: Any,
              start: np.ndarray | None = None, start_key: str | None = None) -> GateFit:
    """The gates of ``settings`` (``fit_settings``) learned on ``data``'s training split, or the finished fit in
    ``folder`` when its key is this fit's. ``start``: the logits to start from (``start_key`` says what made them:
    its part of the fit's key); default ``gates.init`` everywhere."""
    key = fit_key(job, {**settings, "start": start_key})
    done = folder / FIT_FILE
    record = _record(done, key, job.is_global_zero)
    if record.get("key") == key and record.get("complete"):
        return _finished(job, folder, record)
    checkpoints = folder / "checkpoints"
    last = checkpoints / "last.ckpt"
    resume = str(last) if record.get("key") == key and last.is_file() and readable_checkpoint(last) is None else None
    if resume is None and job.is_global_zero:  # another key's (or a broken) fit: started afresh
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        write_json_atomic(done, {"key": key, "complete": False})
    elif resume is not None:
        Console().print(f"resuming the gate fit in {folder} from {last.name}", markup=False, soft_wrap=True)
    cfg = job.cfg
    pl.seed_everything(cfg.seed, workers=True)
    weights = copy.deepcopy(job.model) if settings["train_model"] else job.model  # the job's model stays as loaded
    first = None if start is None else torch.as_tensor(start)
    if settings["method"] == "optimal":  # constants [layers, heads, head_dim], not gates
        module = constant_module(cfg.model, cfg.task, cfg.mask, cfg.optim, settings, weights, first)
    else:
        module = gated_module(cfg.model, cfg.task, cfg.mask, cfg.optim, settings, weights, first)
    trainer = fit_trainer(job, settings["max_steps"], checkpoints, logger)
    trainer.fit(module, datamodule=data, ckpt_path=resume)
    learned = module.constants if settings["method"] == "optimal" else module.gate_logits
    parameters = learned.detach().cpu().double().numpy()
    if job.is_global_zero:
        if settings["train_model"]:
            save_final_weights(module.model, _tokenizer(job), folder / "model")
        finished = {"key": key, "complete": True, "settings": settings, "steps": trainer.global_step,
                    "parameters": parameters.tolist()}
        write_json_atomic(done, finished | {"digest": config_hash(finished)})
        shutil.rmtree(checkpoints, ignore_errors=True)  # fit.json holds what a finished fit learned
    module.model.eval()
    return GateFit(parameters, trainer.global_step, key, module.model if settings["train_model"] else None)


def _record(path: Path, key: str, say: bool) -> dict[str, Any]:
    """A fit folder's ``fit.json``; empty (the fit runs afresh, with a note) when it is not one a fit wrote: not
    JSON, or a finished fit's parameters not what its digest says (edited by hand)."""
    if not path.is_file():
        return {}
    try:
        record = read_json(path, "gate fit")
    except UserError:
        record = None
    if isinstance(record, dict) and not record.get("complete"):
        return record  # a fit under way: its checkpoint says where it stopped
    if isinstance(record, dict) and record.get("digest") == config_hash(
            {k: v for k, v in record.items() if k != "digest"}):
        return record
    if say and (not isinstance(record, dict) or record.get("key") == key):
        Console().print(f"note: {path} is not the file its fit wrote (unreadable, or edited since): the fit runs "
                        "again", markup=False, soft_wrap=True)
    return {}


def _finished(job: EvalJob, folder: Path, record: dict[str, Any]) -> GateFit:
    model = None
    if record["settings"]["train_model"]:
        model = load_checkpoint(Checkpoint("pretrained", str(folder / "model")), job.cfg.model, job.cfg.task)
    return GateFit(np.array(record["parameters"], dtype=float), record["steps"], record["key"], model)


def _tokenizer(job: EvalJob) -> Any:
    from headlab.core.models import load_tokenizer

    return load_tokenizer(tokenizer_config(job.checkpoint, job.cfg.model))
