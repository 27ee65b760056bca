"""What ``ckpt_path`` names (DESIGN.md section 6), checked before weights load (no torch imported but to read a
``.ckpt``); ``checkpoint_loading`` loads the model with those weights.

=====================  ==============================================================================
``null``               the model config's own weights (hub models that are already fine-tuned)
``*.ckpt``             a Lightning checkpoint written by ``train.py`` (its model and task must match)
a ``train.py`` job     its final weights (``model/``, saved with ``save_pretrained``; model and task must
                       match its ``results.json``)
a folder               saved with ``save_pretrained`` (``config.json`` and weights; its tokenizer if saved)
=====================  ==============================================================================
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from headlab.core.model_files import architecture, check_weights_folder, config_json, model_shape
from headlab.errors import UserError
from headlab.files import read_json

FINAL_WEIGHTS = "model"  # train.py saves its final weights (and tokenizer) in JOB_DIR/model
PLAN_KEY = "headlab_plan"  # in the saved config.json of weights fine-tuned under a plan: the plan (HeadPlan.to_dict)
KINDS = "a .ckpt from train.py, a train.py job directory, a save_pretrained directory, or null"


@dataclass(frozen=True)
class Checkpoint:
    """Where the weights come from: ``kind`` (model, lightning, job, pretrained) and ``path`` (None: the model's)."""

    kind: str
    path: str | None

    def describe(self) -> str:
        return "the model's own weights" if self.path is None else f"{self.kind} {self.path}"

    def trained_by(self) -> str | None:
        """The hash of the ``train.py`` job whose weights these are (a job folder's ``results.json``): the same
        wherever the folder was copied or moved; None for other kinds."""
        path = None if self.kind != "job" or self.path is None else Path(self.path).parent / "results.json"
        if path is None or not path.is_file():  # (a job's weights are its model/ folder)
            return None
        data = read_json(path, "train.py results")
        return data.get("config_hash") if isinstance(data, dict) else None

    def record(self, ckpt_path: str | None) -> dict[str, Any]:
        """What a job's ``results.json`` says of its weights (``same_weights`` reads it)."""
        return {"kind": self.kind, "path": self.path, "ckpt_path": ckpt_path, "trained_by": self.trained_by()}

    def same_weights(self, recorded: dict[str, Any]) -> bool:
        """Whether a ``record`` names these weights: the same ``train.py`` job (by its hash, so a study folder copied
        elsewhere still is), else the same path."""
        theirs, mine = recorded.get("trained_by"), self.trained_by()
        if theirs is not None and mine is not None:
            return theirs == mine
        path = recorded.get("path")
        return (path is None) == (self.path is None) and (path is None or Path(path).resolve() ==
                                                          Path(self.path).resolve())


def locate_checkpoint(ckpt_path: str | None, model_cfg: Any, task_cfg: Any) -> Checkpoint:
    """Classify ``ckpt_path`` and check it was trained for ``model_cfg`` and ``task_cfg`` (UserError if not).

    Reads no weights, except that a ``.ckpt`` file is read whole for its hyper-parameters.
    """
    if ckpt_path is None:
        return Checkpoint("model", None)
    path = Path(ckpt_path)
    if not path.exists():
        raise UserError(f"ckpt_path={ckpt_path!r}: no such file or directory; give {KINDS}")
    if path.is_file():
        if path.suffix != ".ckpt":
            raise UserError(f"ckpt_path={ckpt_path!r} is a file but not a .ckpt; give {KINDS}")
        hparams = check_lightning_checkpoint(path, model_cfg, task_cfg)
        refuse_plan_trained(ckpt_path, changed_heads_of_mask(hparams.get("mask")))
        return Checkpoint("lightning", str(path))
    if (path / "results.json").is_file():
        record = read_json(path / "results.json", "results")
        if record.get("kind") != "train" or not record.get("complete"):
            raise UserError(f"ckpt_path={ckpt_path!r}: its results.json is not a finished train.py job")
        _check_trained_for(ckpt_path, record.get("model"), record.get("task"), model_cfg, task_cfg)
        refuse_plan_trained(ckpt_path, changed_heads_of_plan(record.get("plan")))
        weights = path / FINAL_WEIGHTS
        if not (weights / "config.json").is_file():
            what = (f"its {FINAL_WEIGHTS}/ has no config.json (not saved whole)" if weights.is_dir() else
                    f"the job has no final weights in {FINAL_WEIGHTS}/ (trained before headlab saved them)")
            saved = [name for name in ("last.ckpt", "best.ckpt") if (path / "checkpoints" / name).is_file()]
            fix = f"pass its checkpoints/{saved[0]} instead" if saved else "train it again"
            raise UserError(f"ckpt_path={ckpt_path!r}: {what}; {fix}")
        check_weights_folder(weights, f"ckpt_path={ckpt_path!r}")
        check_same_shape(weights, model_cfg, ckpt_path)  # a folder of another model under the same model.name
        return Checkpoint("job", str(weights))
    if (path / "config.json").is_file():
        check_weights_folder(path, f"ckpt_path={ckpt_path!r}")
        job = path.parent / "results.json"  # a train.py job's model/: what the job records is checked as for the job
        if path.name == FINAL_WEIGHTS and job.is_file():
            record = read_json(job, "results")
            if isinstance(record, dict) and record.get("kind") == "train":
                _check_trained_for(ckpt_path, record.get("model"), record.get("task"), model_cfg, task_cfg)
        check_same_shape(path, model_cfg, ckpt_path)
        saved = read_json(path / "config.json", "model config")
        refuse_plan_trained(ckpt_path, changed_heads_of_plan(saved.get(PLAN_KEY) if isinstance(saved, dict) else None))
        return Checkpoint("pretrained", str(path))
    raise UserError(f"ckpt_path={ckpt_path!r} is a directory with neither results.json (a train.py job) nor "
                    f"config.json (save_pretrained); give {KINDS}")


def check_same_shape(folder: Path, model_cfg: Any, ckpt_path: str) -> None:
    """A ``UserError`` when the weights in ``folder`` are of another shape (layers x heads) than ``model_cfg``'s:
    the plan and every head name would be of the wrong model."""
    saved = config_json(OmegaConf.create({"name_or_path": str(folder)}))
    shape = saved["num_hidden_layers"], saved["num_attention_heads"]
    expected = model_shape(model_cfg)
    if shape != expected:
        raise UserError(f"ckpt_path={ckpt_path!r} holds a model of {shape[0]} layers x {shape[1]} heads, but "
                        f"model={model_cfg.get('name')} has {expected[0]} x {expected[1]}: give the model config the "
                        "weights were saved from")
    if not model_cfg.get("random_init"):  # (a random model's config names only the fields it sets)
        theirs, ours = architecture(OmegaConf.create({"name_or_path": str(folder)})), architecture(model_cfg)
        if theirs != ours:
            raise UserError(f"ckpt_path={ckpt_path!r} holds a {theirs} model, but model={model_cfg.get('name')} "
                            f"({model_cfg.get('name_or_path')}) is {ours}: give the model config the weights were "
                            "fine-tuned from (the job records it as that model)")


def check_lightning_checkpoint(path: Path, model_cfg: Any, task_cfg: Any) -> dict[str, Any]:
    """A ``UserError`` unless ``path`` is a readable ``train.py`` checkpoint of ``model_cfg`` on ``task_cfg``; returns
    its hyper-parameters."""
    hparams = _lightning_hparams(path)
    _check_trained_for(str(path), hparams["model"]["name"], hparams["task"]["name"], model_cfg, task_cfg)
    return hparams


def changed_heads_of_mask(mask: dict[str, Any] | None) -> str | None:
    """The rules of a ``train.py`` mask that change some head, as text; None when every head stays whole."""
    from headlab.core.masks import mask_rules

    rules = [rule for rule in mask_rules(mask or {}) if rule.get("policy") != "keep"]
    heads = lambda selector: selector if isinstance(selector, str) else ",".join(map(str, selector))  # noqa: E731
    return "; ".join(f"{rule['policy']} {heads(rule['heads'])}" for rule in rules) or None


def changed_heads_of_plan(plan: dict[str, Any] | None) -> str | None:
    """The heads a recorded plan (``HeadPlan.to_dict``) changes, as text; None when it changes none."""
    policies = (plan or {}).get("policies") or {}
    if not policies:
        return None
    by_policy: dict[str, list[str]] = {}
    for head, policy in policies.items():
        by_policy.setdefault(policy, []).append(head)
    return "; ".join(f"{policy} {','.join(heads[:8])}{' ...' if len(heads) > 8 else ''}"
                     for policy, heads in by_policy.items())


def refuse_plan_trained(ckpt_path: str, changed: str | None) -> None:
    """Weights fine-tuned under a plan are refused by every analysis (they take each head as whole)."""
    if changed is not None:
        raise UserError(f"ckpt_path={ckpt_path!r} was fine-tuned under a plan ({changed}): those heads never took "
                        "part whole in training, and headlab's analyses take every head whole; analyse a model "
                        "fine-tuned without mask (the run's own metrics under its plan are in its results.json)")


def _lightning_hparams(path: Path) -> dict[str, Any]:
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive: anything else fails before torch loads
        raise UserError(f"ckpt_path={str(path)!r} is not a readable Lightning checkpoint: not a zip archive as "
                        "torch.save writes")
    import torch  # a .ckpt's pickle holds tensors: only torch reads it

    try:
        hparams = torch.load(path, map_location="cpu", weights_only=False, mmap=True).get("hyper_parameters", {})
    except Exception as error:  # pickle, zip and torch errors alike: the file is not a checkpoint
        raise UserError(f"ckpt_path={str(path)!r} is not a readable Lightning checkpoint: {error}") from None
    if not {"model", "task"} <= set(hparams):
        raise UserError(f"ckpt_path={str(path)!r} is a checkpoint without headlab's model and task hyper-parameters "
                        "(not written by train.py)")
    return hparams


def _check_trained_for(ckpt_path: str, model: str | None, task: str | None, model_cfg: Any, task_cfg: Any) -> None:
    differs = [f"{what}={trained} (this config: {what}={wanted})"
               for what, trained, wanted in (("model", model, model_cfg.name), ("task", task, task_cfg.name))
               if trained != wanted]
    if differs:
        raise UserError(f"ckpt_path={ckpt_path!r} was trained with " + " and ".join(differs))


def weights_model_config(checkpoint: Checkpoint, model_cfg: Any) -> Any:
    """The model config to load the weights (and tokenizer) of ``checkpoint`` with."""
    if checkpoint.kind not in ("job", "pretrained"):
        return model_cfg
    return OmegaConf.merge(model_cfg, {"name_or_path": checkpoint.path, "random_init": False})


def tokenizer_config(checkpoint: Checkpoint, model_cfg: Any) -> Any:
    """The model config whose tokenizer goes with ``checkpoint``: its folder's own if it saved one."""
    saved = checkpoint.path is not None and (Path(checkpoint.path) / "tokenizer_config.json").is_file()
    return weights_model_config(checkpoint, model_cfg) if saved else model_cfg
