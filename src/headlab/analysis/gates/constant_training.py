"""The Lightning modules that learn optimal-ablation constants on a fine-tuned model (Li & Janson 2024).

Every head has a constant context vector (``constants`` ``[layers, heads, head_dim]``, the only trainable parameters;
the model is frozen and runs without dropout). In a training batch each row replaces one head by its constant (the
``optimal`` policy, per-row plans: one plan per head), the heads taken in turn across the rows and steps: row ``i`` of
step ``s`` on process ``r`` of ``w`` (batches of ``b`` rows each) replaces head ``(s * b * w + r + w * i) mod (layers x
heads)``, its place in the step's rows as the training sampler deals them round the processes, so that ``w``
processes pair each example with the head one process with batches of ``w * b`` does. The objective is the task's
loss over the batch, so each constant moves by the rows that replace its own head (a resumed fit assigns the same
heads: the step is restored). Adam at ``gates.lr``.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import OmegaConf

from headlab.core.head_names import head_name
from headlab.core.patch.ablate import ablate
from headlab.core.plans import HeadPlan
from headlab.training.modules import MODEL_INPUTS, ClassificationModule, QuestionAnsweringModule, TaskModule


class ConstantTask:
    """Mixin over a ``TaskModule``: one learned constant per head, from ``start`` (``[layers, heads, head_dim]``)."""

    def __init__(self, model: dict, task: dict, mask: dict, optim: dict, settings: dict,
                 weights: torch.nn.Module | None = None, start: torch.Tensor | None = None):
        super().__init__(model, task, mask, optim, weights)
        self.save_hyperparameters(ignore=["weights", "start"], logger=False)
        self.settings = OmegaConf.create(settings)
        self.constants = torch.nn.Parameter(torch.as_tensor(start, dtype=torch.float32).clone())
        self.model.requires_grad_(False)
        self.train(self.training)  # the task module put the model in training mode (Lightning keeps modes)
        self.strict_loading = False  # the frozen model's weights stay out of checkpoints
        layers, heads = self.constants.shape[:2]
        self.one_head = [HeadPlan.from_rules([{"heads": head_name(layer, head), "policy": "optimal"}], layers, heads)
                         for layer in range(layers) for head in range(heads)]  # plan k replaces head k alone
        self.prefix = self.settings.get("log_prefix", "optimal")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("model.")}

    def train(self, mode: bool = True) -> ConstantTask:
        super().train(mode)
        self.model.eval()  # frozen: no dropout while the constants train
        return self

    def plan_ids(self, rows: int) -> torch.Tensor:
        """``[rows]``: the head each row of this training batch replaces (module docstring)."""
        world, rank, batch = 1, 0, rows
        if self._trainer is not None:
            world, rank = self.trainer.world_size, self.trainer.global_rank
            # the loader's batch size: the last batch of an epoch may hold fewer rows (None: batches made outside)
            batch = getattr(self.trainer.train_dataloader, "batch_size", None) or rows
        return row_heads(self.global_step, batch, world, rank, rows, len(self.one_head)).to(self.constants.device)

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        if not self.training:
            raise RuntimeError("the constants' module trains only; the job evaluates them with mode=sweep_heads' code")
        inputs = {name: batch[name] for name in MODEL_INPUTS if name in batch}
        with ablate(self.model, self.one_head, self.mask.renormalize, constants=self.constants):
            return self.model(**inputs, plan_ids=self.plan_ids(len(batch["input_ids"])))

    def training_loss(self, batch: dict[str, torch.Tensor], out: Any) -> torch.Tensor:
        loss = super().training_loss(batch, out)
        self.log(f"{self.prefix}/task_loss", loss, batch_size=len(batch["input_ids"]))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam([self.constants], lr=self.settings.lr)


def row_heads(step: int, batch: int, world: int, rank: int, rows: int, heads: int) -> torch.Tensor:
    """``[rows]``: the head (of ``heads``, layer-major) that each row of process ``rank``'s batch at ``step``
    replaces: its place among the step's ``batch x world`` rows as ``DistributedSampler`` deals them, mod ``heads``."""
    return (step * batch * world + rank + world * torch.arange(rows)) % heads


class ConstantClassification(ConstantTask, ClassificationModule):
    """Constants over a sequence classification or regression model."""


class ConstantQuestionAnswering(ConstantTask, QuestionAnsweringModule):
    """Constants over an extractive QA model."""


CONSTANT = {"classification": ConstantClassification, "regression": ConstantClassification,
            "extractive_qa": ConstantQuestionAnswering}


def constant_module(model: Any, task: Any, mask: Any, optim: Any, settings: Any, weights: torch.nn.Module | None,
                    start: torch.Tensor) -> TaskModule:
    """The constants' module of the task's type, from config groups (OmegaConf or plain dicts)."""
    model, task, mask, optim, settings = (OmegaConf.to_container(c, resolve=True) if OmegaConf.is_config(c)
                                          else dict(c) for c in (model, task, mask, optim, settings))
    return CONSTANT[task["type"]](model, task, mask, optim, settings, weights, start)
