"""LightningModules: a HF BERT-family model with a task head, run under a head plan.

The plan (``mask`` config) applies in every forward pass, training included, so fine-tuning
with heads removed is the same switch as evaluating with them removed. Metrics are torchmetrics
objects per eval split (exact across processes); after each validation epoch the module logs
``{split}/{metric}`` and keeps the values in ``last_metrics`` and the number of examples
evaluated (over all processes) in ``last_counts``. The per-example helpers below (losses, gathering)
also serve evaluation under plans (``headlab.analysis.jobs.plan_evaluator``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import OmegaConf
from torchmetrics import MeanMetric, SumMetric
from transformers import get_linear_schedule_with_warmup

from headlab.core.losses import span_losses
from headlab.core.masks import plan_from_mask
from headlab.core.model_files import model_shape
from headlab.core.models import load_model_reporting, note_random_weights
from headlab.core.patch.ablate import ablate
from headlab.errors import UserError
from headlab.tasks.metrics import SquadMetric, glue_metrics
from headlab.tasks.squad import AnswerCollector, best_spans

log = logging.getLogger(__name__)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels", "start_positions", "end_positions")



class PerSplit(torch.nn.Module):
    """One metric module per evaluation split, read by the split's name: a ``ModuleList`` underneath, since a
    ``ModuleDict`` refuses names that are a module's attributes (``train``, ``eval``) and names with a dot."""

    def __init__(self, splits: list[str], make: Callable[[], torch.nn.Module]):
        super().__init__()
        self.index = {split: position for position, split in enumerate(splits)}
        self.per_split = torch.nn.ModuleList(make() for _ in splits)

    def __getitem__(self, split: str) -> torch.nn.Module:
        return self.per_split[self.index[split]]

class TaskModule(pl.LightningModule):
    """Shared by all tasks: the model under the plan, AdamW with linear warm-up and decay.

    ``model``, ``task``, ``mask`` and ``optim`` are the plain-dict config groups (saved in
    checkpoints as hyper-parameters, so ``load_from_checkpoint`` rebuilds the module). ``weights``: a model already
    loaded (an analysis's checkpoint) instead of the one ``model`` names.
    """

    def __init__(self, model: dict, task: dict, mask: dict, optim: dict, weights: torch.nn.Module | None = None):
        super().__init__()
        self.save_hyperparameters(ignore=["weights"])
        self.model_cfg, self.task, self.mask, self.optim = (OmegaConf.create(c) for c in (model, task, mask, optim))
        if weights is None:
            self.model, missing = load_model_reporting(self.model_cfg, *task_head(self.task), quiet=True)
            note_random_weights(missing, self.model_cfg)  # the new task head: one note, not transformers' table
        else:
            self.model = weights
        self.model.train()  # Lightning keeps modes
        self.plan = plan_from_mask(self.mask, *model_shape(self.model_cfg))
        self.uses_units = any(count and policy.startswith("drop_") for policy, count in self.plan.counts().items())
        self.eval_splits = list(self.task.eval_splits)
        self.evaluated = PerSplit(self.eval_splits, SumMetric)  # examples seen
        self.last_metrics: dict[str, dict[str, float]] = {}
        self.last_counts: dict[str, int] = {}
        self.validated_step = -1  # global step of the last full validation
        self._pending: dict[str, list[tuple[torch.Tensor, ...]]] = {split: [] for split in self.eval_splits}

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        inputs = {name: batch[name] for name in MODEL_INPUTS if name in batch}
        if self.uses_units:
            inputs["sentence_ids"] = batch["sentence_ids"]
        gates = self.head_gates()
        patched = nullcontext() if self.plan.is_identity and gates is None else ablate(
            self.model, self.plan, self.mask.renormalize, gates=gates)
        with patched:
            return self.model(**inputs)

    def head_gates(self) -> torch.Tensor | None:
        """What multiplies each head's context in this forward, ``[layers, heads]`` (None: nothing; learned gates
        override it, ``headlab.analysis.gates``)."""
        return None

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.training_loss(batch, self(batch))
        # In the progress bar only when there is one: Lightning turns progress-bar values into numbers after every
        # step, bar or no bar, and on a GPU that is a host-device synchronisation per step (Lightning issue 21232).
        shown = self.trainer.progress_bar_callback is not None
        self.log("train/loss", loss, batch_size=len(batch["input_ids"]), prog_bar=shown)
        return loss

    def training_loss(self, batch: dict[str, torch.Tensor], out: Any) -> torch.Tensor:
        """The mean loss of a training batch (the model's own)."""
        return out.loss

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The optimizer's groups: no weight decay on biases and LayerNorm weights (the 1-d parameters), as BERT."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": self.optim.weight_decay},
                {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = torch.optim.AdamW(self.parameter_groups(), lr=self.optim.lr, eps=self.optim.adam_eps)
        total = int(self.trainer.estimated_stepping_batches)
        warmup = self.optim.get("warmup_steps") or math.ceil(self.optim.warmup_ratio * total)
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _keep(self, split: str, *columns: torch.Tensor) -> None:
        """Per-example values of one batch, kept on the device until the epoch ends (no host sync per batch)."""
        self._pending[split].append(tuple(c.detach() for c in columns))

    def _take(self, split: str) -> list[tuple]:
        """This process's kept rows of ``split`` (tuples, one value per column), and forget them."""
        batches, self._pending[split] = self._pending[split], []
        return [row for batch in batches for row in zip(*(c.tolist() for c in batch))]

    def _log_split_metrics(self, split: str, values: dict[str, torch.Tensor]) -> None:
        self.last_counts[split] = int(self.evaluated[split].compute())
        self.evaluated[split].reset()
        self.last_metrics[split] = {name: float(value) for name, value in values.items()}
        if not self.trainer.sanity_checking:
            self.validated_step = self.global_step
            if self.trainer.state.fn == "fit":  # a line per validation, for logs without a progress bar (SLURM)
                self._log_progress(split)
        self.log_dict({f"{split}/{name}": float(value) for name, value in values.items()}, add_dataloader_idx=False)

    def _log_progress(self, split: str) -> None:
        if self.trainer.is_global_zero:
            values = ", ".join(f"{name} {value:.4f}" for name, value in self.last_metrics[split].items())
            log.info(f"step {self.global_step} (epoch {self.current_epoch}): {split} {values}")


class ClassificationModule(TaskModule):
    """Sequence classification (GLUE) and regression (STS-B: one output, MSE loss)."""

    def __init__(self, model: dict, task: dict, mask: dict, optim: dict, weights: torch.nn.Module | None = None):
        super().__init__(model, task, mask, optim, weights)
        self.regression = self.task.type == "regression"
        self.metrics = PerSplit(self.eval_splits, lambda: glue_metrics(list(self.task.metrics), self.task.num_labels))
        self.eval_loss = PerSplit(self.eval_splits, MeanMetric)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.eval_splits[dataloader_idx]
        out = self(batch)
        logits = out.logits  # [batch, labels]
        if self.regression:  # metrics in float64
            predictions, labels = logits[:, 0].double(), batch["labels"].double()
        else:
            predictions, labels = logits.argmax(dim=-1), batch["labels"]
        self.metrics[split].update(predictions, labels)
        self.eval_loss[split].update(out.loss.float(), weight=len(predictions))
        self.evaluated[split].update(len(predictions))

    def on_validation_epoch_end(self) -> None:
        for split in self.eval_splits:
            values = {**self.metrics[split].compute(), "loss": self.eval_loss[split].compute()}
            self.metrics[split].reset()
            self.eval_loss[split].reset()
            self._log_split_metrics(split, values)

    test_step = validation_step
    on_test_epoch_end = on_validation_epoch_end


class QuestionAnsweringModule(TaskModule):
    """Extractive QA (SQuAD v1.1 / v2.0): span logits merged per question by ``headlab.tasks.squad``.

    Needs the data module's ``eval_examples`` (contexts and gold answers); ``predictions[split]``
    holds the last predicted answer of every question id, gathered from all processes.
    """

    def __init__(self, model: dict, task: dict, mask: dict, optim: dict, weights: torch.nn.Module | None = None):
        super().__init__(model, task, mask, optim, weights)
        self.metrics = PerSplit(self.eval_splits, lambda: SquadMetric(self.task.version))
        self.collectors = {split: AnswerCollector() for split in self.eval_splits}
        self.eval_loss = PerSplit(self.eval_splits, MeanMetric)
        self.predictions: dict[str, dict[str, str]] = {}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.eval_splits[dataloader_idx]
        out = self(batch)  # start_logits, end_logits: [batch, seq]
        spans = best_spans(out.start_logits, out.end_logits, batch["context_offsets"], self.task.n_best,
                           self.task.max_answer_length)
        self.collectors[split].add(batch["example_index"], spans)
        losses = span_losses(out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"],
                             batch["attention_mask"])  # [batch]
        self._keep(split, batch["example_index"], losses)

    def training_loss(self, batch: dict[str, torch.Tensor], out: Any) -> torch.Tensor:
        """The mean span loss of the batch's features, each over its own positions (``headlab.core.losses``; the
        model's own loss lets padding into the softmax)."""
        return span_losses(out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"],
                           batch["attention_mask"]).mean()

    def on_validation_epoch_end(self) -> None:
        examples = self.trainer.datamodule.eval_examples
        for split in self.eval_splits:
            rows = examples[split]
            answers = self.collectors[split].answers(list(rows["context"]), self.task.version)
            gold = list(rows["answers"])
            golds = [gold[i]["text"] for i in answers]
            losses = question_losses(self._take(split))  # question -> mean loss of its features
            self.metrics[split].update(list(answers.values()), golds)
            self.eval_loss[split].update(torch.tensor([losses[i] for i in answers], dtype=torch.float64))
            self.evaluated[split].update(len(answers))
            values = {**self.metrics[split].compute(), "loss": self.eval_loss[split].compute()}
            self._log_split_metrics(split, values)
            self.metrics[split].reset()
            self.eval_loss[split].reset()
            ids = list(rows["id"])
            self.predictions[split] = {ids[i]: text for i, text in gather_rows(list(answers.items()))}
            self.collectors[split] = AnswerCollector()

    test_step = validation_step
    on_test_epoch_end = on_validation_epoch_end


def question_losses(rows: list[tuple[int, float]]) -> dict[int, float]:
    """Mean loss of each question's features, from ``(question, feature loss)`` rows."""
    totals: dict[int, list[float]] = {}
    for question, loss in rows:
        totals.setdefault(question, []).append(loss)
    return {question: math.fsum(losses) / len(losses) for question, losses in totals.items()}


def gather_rows(rows: list[tuple]) -> list[tuple]:
    """Every process's rows (tuples starting with an example index), sorted; each example exactly once."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        shards: list[list[tuple] | None] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(shards, rows)
        rows = [row for shard in shards for row in shard]
    if len({row[0] for row in rows}) != len(rows):
        raise RuntimeError("an example was evaluated twice; the evaluation sampler must shard examples")
    return sorted(rows, key=lambda row: row[0])


def task_head(task: Any) -> tuple[str, dict[str, Any]]:
    """The model head a task needs (``headlab.core.models.HEADS``) and its config fields."""
    if task.type == "extractive_qa":
        return "question_answering", {}
    if task.type == "regression":
        return "sequence_classification", {"num_labels": 1, "problem_type": "regression"}
    return "sequence_classification", {"num_labels": task.num_labels, "problem_type": "single_label_classification"}


MODULES = {"classification": ClassificationModule, "regression": ClassificationModule,
           "extractive_qa": QuestionAnsweringModule}


def task_module(model: Any, task: Any, mask: Any, optim: Any) -> TaskModule:
    """The module for the task's type, from config groups (OmegaConf or plain dicts)."""
    model, task, mask, optim = (OmegaConf.to_container(c, resolve=True) if OmegaConf.is_config(c) else dict(c)
                                for c in (model, task, mask, optim))
    if task["type"] not in MODULES:
        raise UserError(f"task {task['name']}: unknown type {task['type']!r}; valid types: {', '.join(MODULES)}")
    return MODULES[task["type"]](model, task, mask, optim)
