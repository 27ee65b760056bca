"""The model with the weights a checked ``ckpt_path`` names (``checkpoints.locate_checkpoint``)."""

from __future__ import annotations

from typing import Any

import torch

from headlab.core.models import load_model_reporting, note_random_weights
from headlab.errors import UserError
from headlab.training.checkpoints import Checkpoint, weights_model_config
from headlab.training.modules import task_head


def load_checkpoint(checkpoint: Checkpoint, model_cfg: Any, task_cfg: Any, allow_random_head: bool = False,
                    seed: int = 0) -> torch.nn.Module:
    """The HF model with ``task_cfg``'s head and ``checkpoint``'s weights, in eval mode.

    An untrained task head (weights without one, or a random model) is a UserError unless ``allow_random_head``.
    Weights the checkpoint lacks are drawn from ``seed`` (the job's), not from the process's random state: every job
    of a sweep, and a rerun of a killed one, gets the same random head.
    """
    head, overrides = task_head(task_cfg)
    weights = weights_model_config(checkpoint, model_cfg)
    model, missing = load_model_reporting(weights, head, overrides, quiet=True, seed=seed)
    if checkpoint.kind == "lightning":
        state = torch.load(checkpoint.path, map_location="cpu", weights_only=False)["state_dict"]
        trained = {name.removeprefix("model."): value for name, value in state.items() if name.startswith("model.")}
        try:
            model.load_state_dict(trained)
        except RuntimeError as error:
            raise UserError(f"ckpt_path={checkpoint.path!r} does not fit model {model_cfg.name} with the "
                            f"{task_cfg.name} head: {' '.join(str(error).split())[:300]}") from None
        missing = []
    untrained = [name for name in missing if not name.startswith(model.base_model_prefix + ".")]
    if untrained and not allow_random_head:
        raise UserError(f"{checkpoint.describe()} has no trained {head} head for task {task_cfg.name} (randomly "
                        f"initialised: {', '.join(untrained[:4])}); fine-tune first (train.py) and pass ckpt_path, "
                        "or set allow_random_head=true")
    note_random_weights(missing, weights)
    return model.eval()
