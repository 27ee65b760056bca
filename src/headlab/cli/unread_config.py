"""A ``model.config`` override the job would not read: refused before anything loads.

``model.config`` holds the fields a random model is built with (``model.random_init=true``, and the ``.ckpt`` files
of one, which are built the same way). Weights loaded from a folder (``model.name_or_path``, or a train.py job or
``save_pretrained`` folder as ``ckpt_path``) come with their own ``config.json``: a typed override of another value
was recorded as the job's setting (another job folder, another hash) while the numbers were the saved config's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from headlab.cli.hydra_glue import FROM_JOBS, typed_overrides
from headlab.errors import UserError


def refuse_unread_model_config(cfg: Any) -> None:
    """A ``UserError`` when a typed ``model.config.*`` override differs from the config of the weights the job loads
    from a folder (an override equal to it, as a tiny model's shape given again, changes nothing and passes)."""
    typed = typed_overrides("model.config.")
    if not typed or cfg.get("mode") in FROM_JOBS:  # (those modes load no model)
        return
    from headlab.core.models import model_config  # (transformers: only when there is an override to check)
    from headlab.training.checkpoints import locate_checkpoint, weights_model_config

    ckpt = cfg.get("ckpt_path")
    if ckpt and Path(ckpt).is_dir():
        source, weights = f"ckpt_path={ckpt!r}", weights_model_config(locate_checkpoint(ckpt, cfg.model, cfg.task),
                                                                       cfg.model)
    elif not cfg.model.get("random_init"):  # (a .ckpt of such a model is built from its config.json too)
        source, weights = f"model.name_or_path={cfg.model.get('name_or_path')!r}", cfg.model
    else:  # built from model.config: a random model, or a .ckpt file of one
        return
    saved = model_config(OmegaConf.merge(weights, {"random_init": False})).to_dict()
    wanted = OmegaConf.to_container(cfg.model.config, resolve=True) if cfg.model.get("config") else {}
    for key in typed:
        field = key.removeprefix("model.config.")
        if key == "model.config" or saved.get(field) != wanted.get(field):
            shown = f"{key}={wanted.get(field)!r}" if key != "model.config" else "model.config"
            raise UserError(f"{shown}: {source} loads weights with their own config.json ({field}="
                            f"{saved.get(field)!r}), which model.config does not change (it sets the fields of a "
                            "random model, model.random_init=true, and of its .ckpt files); leave it out, or edit a "
                            "copy of that config.json")
