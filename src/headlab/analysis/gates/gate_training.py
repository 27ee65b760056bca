"""The Lightning modules that learn head gates on a fine-tuned model (shared by the gate methods).

A gated module is the task's own module (``training.modules``: its data, loss, metrics and evaluation) whose forward
multiplies each head's context by a gate (``ablate(gates=)``, after the plan of ``mask``), with one learned parameter
per head (``gate_logits`` ``[layers, heads]``). The model is frozen and runs without dropout (the gates are all that
trains, by Adam) unless ``gates.train_model`` (Voita et al.'s setting: the model trains with its gates, AdamW as in
fine-tuning, dropout on). The method (``gates.method``) says what a parameter gives in training and in evaluation and
what the objective adds to the task loss:

* ``l0`` (Voita et al. 2019): the logit is a hard concrete gate's ``log_alpha`` (``hard_concrete``): a draw per head
  per optimizer step, the deterministic gate in evaluation; the objective adds ``gates.l0_lambda`` x the expected
  number of open gates. The draw's uniform noise comes from ``(gates.seed, step)`` alone: every DDP process draws the
  noise one process with all of the step's rows draws (two processes of batch b fit what one of batch 2b fits), and
  a resumed fit the uninterrupted one's.
* ``chg`` (causal head gating, Nam et al. 2025): the gate is ``sigmoid(logit)`` in training and evaluation; the
  objective subtracts ``gates.chg_lambda`` x the mean over heads of the logits clipped to [-4, 4] (a positive weight
  pushes every gate toward 1, a negative one toward 0, 0 adds nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from headlab.analysis.gates import hard_concrete
from headlab.core.model_files import model_shape
from headlab.training.modules import ClassificationModule, QuestionAnsweringModule, TaskModule

CHG_CLIP = 4.0  # the regulariser's logits are clipped to [-4, 4] (gates 0.018 .. 0.982): beyond, the task decides


class GatedTask:
    """Mixin over a ``TaskModule``: one learned logit per head. ``start``: the logits to start from (``[layers,
    heads]``; default ``gates.init`` everywhere)."""

    def __init__(self, model: dict, task: dict, mask: dict, optim: dict, gates: dict,
                 weights: torch.nn.Module | None = None, start: torch.Tensor | None = None):
        super().__init__(model, task, mask, optim, weights)
        self.save_hyperparameters(ignore=["weights", "start"], logger=False)
        self.gates = OmegaConf.create(gates)
        shape = model_shape(self.model_cfg)
        first = torch.full(shape, float(self.gates.get("init", 0.0))) if start is None else \
            torch.as_tensor(start, dtype=torch.float32).reshape(shape)
        self.gate_logits = torch.nn.Parameter(first.clone())
        self.model.requires_grad_(bool(self.gates.train_model))
        self.train(self.training)  # the task module put the model in training mode (Lightning keeps modes)
        self.strict_loading = bool(self.gates.train_model)  # a frozen model's weights stay out of checkpoints
        self.prefix = self.gates.get("log_prefix", "gates")  # one fit's curves among a job's several
        self.l0 = self.gates.method == "l0"

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """A frozen model is the job's checkpoint, loaded again on resume: its checkpoints hold the gates only."""
        if not self.gates.train_model:
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("model.")}

    def train(self, mode: bool = True) -> GatedTask:
        """A frozen model runs without dropout while its gates train (``self.training`` still says which)."""
        super().train(mode)
        if not self.gates.train_model:
            self.model.eval()
        return self

    def head_gates(self) -> torch.Tensor:
        """``[layers, heads]``: L0, a hard concrete draw while training, the deterministic gates otherwise; CHG, the
        sigmoid of the logits."""
        if not self.l0:
            return torch.sigmoid(self.gate_logits)
        if self.training:
            return hard_concrete.sample(self.gate_logits, self.step_noise())
        return hard_concrete.deterministic(self.gate_logits)

    def step_noise(self) -> torch.Tensor:
        """``[layers, heads]``: L0's uniform noise of this optimizer step, from ``(gates.seed, step)`` alone (drawn
        on the CPU in float64: the same on every process and device)."""
        state = np.random.SeedSequence([int(self.gates.get("seed", 0)), self.global_step]).generate_state(2)
        generator = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        u = torch.rand(self.gate_logits.shape, generator=generator, dtype=torch.float64)
        u = u * (1 - 2 * hard_concrete.EPSILON) + hard_concrete.EPSILON
        return u.to(self.gate_logits)

    def expected_open(self) -> torch.Tensor:
        """L0: the expected number of open gates (the penalty before its weight)."""
        return hard_concrete.open_probability(self.gate_logits).sum()

    def penalty(self) -> torch.Tensor:
        """What the objective adds to the task loss (the method's regulariser, weighted)."""
        if self.l0:
            return self.gates.l0_lambda * self.expected_open()
        return -self.gates.chg_lambda * self.gate_logits.clamp(-CHG_CLIP, CHG_CLIP).mean()

    def training_loss(self, batch: dict[str, torch.Tensor], out: Any) -> torch.Tensor:
        """The task's loss plus the method's penalty; the parts and the gates logged per step."""
        task_loss = super().training_loss(batch, out)
        objective = task_loss + self.penalty()
        size = len(batch["input_ids"])
        self.log(f"{self.prefix}/objective", objective, batch_size=size)
        self.log(f"{self.prefix}/task_loss", task_loss, batch_size=size)
        if self.l0:
            self.log(f"{self.prefix}/expected_open", self.expected_open(), batch_size=size)
            self.log(f"{self.prefix}/open", (hard_concrete.deterministic(self.gate_logits) > 0).sum().float(),
                     batch_size=size)
        else:
            self.log(f"{self.prefix}/mean_gate", torch.sigmoid(self.gate_logits).mean(), batch_size=size)
        return objective

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The model's groups (when it trains) and the gates' own, at ``gates.lr`` without weight decay."""
        return [*super().parameter_groups(), {"params": [self.gate_logits], "weight_decay": 0.0, "lr": self.gates.lr}]

    def configure_optimizers(self) -> Any:
        if self.gates.train_model:  # the fine-tuning recipe (AdamW, warm-up and decay) for the weights and the gates
            return super().configure_optimizers()
        return torch.optim.Adam([self.gate_logits], lr=self.gates.lr)


class GatedClassification(GatedTask, ClassificationModule):
    """Gates over a sequence classification or regression model."""


class GatedQuestionAnswering(GatedTask, QuestionAnsweringModule):
    """Gates over an extractive QA model."""


GATED = {"classification": GatedClassification, "regression": GatedClassification,
         "extractive_qa": GatedQuestionAnswering}


def gated_module(model: Any, task: Any, mask: Any, optim: Any, gates: Any, weights: torch.nn.Module | None = None,
                 start: torch.Tensor | None = None) -> TaskModule:
    """The gated module of the task's type, from config groups (OmegaConf or plain dicts); ``weights``: the
    fine-tuned model, already loaded (else the weights ``model`` names); ``start``: the logits to start from."""
    model, task, mask, optim, gates = (OmegaConf.to_container(c, resolve=True) if OmegaConf.is_config(c) else dict(c)
                                       for c in (model, task, mask, optim, gates))
    return GATED[task["type"]](model, task, mask, optim, gates, weights, start)
