"""Evaluation under head plans: per-example records of several plans from one pass over the data.

``PlanEvaluator`` is a LightningModule for ``Trainer.validate``: every batch runs once per plan
(``Variant``), and each (variant, eval split) gets one record per example, gathered from every
process in example order (the data module's sampler gives each process whole examples, once).
The records hold what the task's metrics need (``headlab.tasks.record_metrics``), so results are
computed from them, on all examples or, by the statistics, on any subset.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from headlab.core.losses import example_losses, span_losses
from headlab.core.patch.ablate import ablate
from headlab.core.patch.first_token import last_layer_at_first_token, plan_at_first_token, reads_first_token
from headlab.core.plans import HeadPlan
from headlab.core.units import SHARED
from headlab.tasks.batches import column_values
from headlab.tasks.metrics import squad_scores
from headlab.tasks.squad import AnswerCollector, best_spans
from headlab.training.modules import gather_rows, question_losses
from headlab.training.stays_on_device import StaysOnDevice

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
RECORDS_VERSION = 4  # in the cached baselines' key: raised when records change (2: QA losses without the padding;
                     # 3: batches of rows of similar lengths, which pad less and so move the last bits; 4: clusters)


@dataclass(frozen=True)
class Variant:
    """One way to run the model: a plan and its ``renormalize`` (``name`` keys its records)."""

    name: str
    plan: HeadPlan
    renormalize: bool = False

    @property
    def uses_units(self) -> bool:
        return any(count and policy.startswith("drop_") for policy, count in self.plan.counts().items())


class PlanEvaluator(StaysOnDevice):
    """Scores ``model`` (a HF model with the task's head) under each variant on the eval splits.

    ``examples[split]``: the raw eval rows (ids; SQuAD contexts and gold answers). After
    ``Trainer.validate``, ``records[(variant name, split)]`` holds one dict per example.
    """

    pass_name = "evaluation"  # in progress lines

    def __init__(self, model: torch.nn.Module, task: Any, variants: list[Variant], examples: dict[str, Any],
                 substitutes: Any = None, constants: Any = None):
        super().__init__()
        self.model = model.eval()
        self.task, self.variants = task, list(variants)
        self.splits = list(task.eval_splits)
        self.ids = {split: example_ids(examples[split]) for split in self.splits}
        cluster_field = task.get("cluster_field")  # each example's unit of sampling (a question of its pairs)
        self.clusters = {split: [str(v) for v in column_values(examples[split], cluster_field)]
                         for split in self.splits} if cluster_field else None
        if task.type == "extractive_qa":  # contexts and gold answer texts, read once
            self.contexts = {split: column_values(examples[split], "context") for split in self.splits}
            self.golds = {split: [a["text"] for a in column_values(examples[split], "answers")]
                          for split in self.splits}
        self.task_type = task.type  # read per batch (an OmegaConf attribute costs ~70 us)
        self.task_spans = (task.n_best, task.max_answer_length) if task.type == "extractive_qa" else None
        self.uses_units = any(v.uses_units for v in self.variants)
        # a head that reads [CLS] alone: the last layer at that position only, for the plans it can run
        # (``core/patch/first_token.py``); ``drop_*`` in the last layer also needs [CLS] to be a special token
        self.first_token = task.type != "extractive_qa" and reads_first_token(model)
        self.substitutes = substitutes  # JobSubstitutes: what mean / resample heads take (None: no such head)
        self.resampled = any(v.plan.counts()["resample"] for v in self.variants)
        self.means = None  # the reference set's means, on the model's device once validation starts
        self.constants = constants  # what optimal heads take (HeadMeans of a constants file; None: no such head)
        self.records: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self._pending: dict[tuple[str, str], list] = {}

    def on_validation_start(self) -> None:
        if self.substitutes is not None:  # the model is on its device now
            self.means = self.substitutes.means(self.model)
            self.substitutes.start_pass(self.trainer.datamodule.eval_features)

    def model_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        inputs = {name: batch[name] for name in MODEL_INPUTS if name in batch}
        if self.uses_units:
            inputs["sentence_ids"] = batch["sentence_ids"]
        return inputs

    @torch.no_grad()
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.splits[dataloader_idx]
        inputs = self.model_inputs(batch)
        sources = self.substitutes.sources(self.model, batch, split) if self.resampled else None  # one forward
        special_first = not self.uses_units or bool((inputs["sentence_ids"][:, 0] == SHARED).all())
        for variant in self.variants:
            draws = 1
            if self.resampled and variant.plan.counts()["resample"]:  # the batch once per draw, with its sources
                draws = self.substitutes.draws
                outer = {name: t.repeat(draws, *[1] * (t.dim() - 1)) for name, t in inputs.items()}
                outer["head_sources"] = sources
            else:
                outer = inputs
            patched = nullcontext() if variant.plan.is_identity else ablate(self.model, variant.plan,
                                                                            variant.renormalize, means=self.means,
                                                                            constants=self.constants)
            with patched, self._first_token(variant, outer["attention_mask"], special_first):
                out = self.model(**outer)
            self._pending.setdefault((variant.name, split), []).append(self._batch_rows(out, batch, draws))

    def _first_token(self, variant: Variant, key_mask: torch.Tensor, special_first: bool) -> Any:
        """The last layer at the first token under ``variant`` where it gives the same output, else nothing."""
        plan = variant.plan
        last = plan.num_layers - 1
        drops = any(plan.policy_of(last, h).startswith("drop_") for h in range(plan.num_heads))
        if not self.first_token or not plan_at_first_token(plan) or (drops and not special_first):
            return nullcontext()
        return last_layer_at_first_token(self.model, key_mask, plan=plan)

    def _batch_rows(self, out: Any, batch: dict[str, torch.Tensor], draws: int = 1) -> Any:
        """What one batch contributes: per-example columns (classification) or per-feature spans and losses (QA).
        ``draws``: ``out`` holds the batch's rows once per resample draw (draw-major): each example's loss is the
        mean of its draws' losses, its prediction that of the draws' mean output (class probabilities, score, span
        logits).

        Tensors on the model's device, read when the epoch ends: no host-device synchronisation per batch.
        """
        size = len(batch["input_ids"])
        per_draw = lambda t: t.reshape(draws, size, *t.shape[1:])  # noqa: E731  [draws, batch, ...]
        repeated = lambda t: t.repeat(draws) if draws > 1 else t  # noqa: E731
        mean_of_draws = lambda t: per_draw(t).mean(0) if draws > 1 else t  # noqa: E731
        if self.task_type == "extractive_qa":  # start_logits, end_logits: [draws * batch, seq]
            losses = span_losses(out.start_logits, out.end_logits, repeated(batch["start_positions"]),
                                 repeated(batch["end_positions"]), batch["attention_mask"].repeat(draws, 1))
            start, end = mean_of_draws(out.start_logits), mean_of_draws(out.end_logits)
            spans = best_spans(start, end, batch["context_offsets"], *self.task_spans)
            return batch["example_index"], spans, mean_of_draws(losses)
        regression = self.task_type == "regression"
        logits = out.logits  # [draws * batch, labels]
        labels = batch["labels"]
        losses = mean_of_draws(example_losses(logits, repeated(labels), regression))
        if draws == 1:
            prediction = logits[:, 0].double() if regression else logits.argmax(dim=-1)
        elif regression:
            prediction = per_draw(logits[:, 0].double()).mean(0)
        else:
            prediction = per_draw(logits.float().softmax(-1)).mean(0).argmax(dim=-1)
        return batch["example_index"], labels, prediction, losses

    def on_validation_epoch_end(self) -> None:
        for (name, split), batches in self._pending.items():
            rows = self._qa_rows(batches, split) if self.task.type == "extractive_qa" else [
                row for batch in batches for row in zip(*(column.tolist() for column in batch))]
            records = self._records(gather_rows(rows), split)
            if any(v.name == name and v.plan.counts()["resample"] for v in self.variants):
                drawn = self.substitutes.drawn(split)  # [draws, examples]: each example's source per draw
                for record in records:
                    record["sources"] = drawn[:, record["example"]].tolist()
            self.records[(name, split)] = records
        self._pending = {}

    def _qa_rows(self, batches: list, split: str) -> list[tuple]:
        """``(question, answer, mean feature loss)`` of this process's questions."""
        collector, losses = AnswerCollector(), []
        for example_index, spans, feature_losses in batches:
            collector.add(example_index, spans)
            losses += zip(example_index.tolist(), feature_losses.tolist())
        answers = collector.answers(self.contexts[split], self.task.version)
        loss = question_losses(losses)
        return [(question, text, loss[question]) for question, text in answers.items()]

    def _records(self, rows: list[tuple], split: str) -> list[dict[str, Any]]:
        ids = self.ids[split]
        if self.task.type != "extractive_qa":
            records = [{"example": i, "id": ids[i], "label": label, "prediction": prediction, "loss": loss}
                       for i, label, prediction, loss in rows]
            if self.clusters is not None:
                for record in records:
                    record["cluster"] = self.clusters[split][record["example"]]
            return records
        records = []
        for i, text, loss in rows:
            golds = self.golds[split][i]
            exact, f1 = squad_scores(text, golds, self.task.version)
            records.append({"example": i, "id": ids[i], "prediction": text, "exact_match": exact, "f1": f1,
                            "has_answer": len(golds) > 0, "loss": loss})
        return records


def example_ids(rows: Any) -> list[str]:
    """Each example's id: the data's ``id`` or ``idx`` column, else its row number in the split."""
    for column in ("id", "idx"):
        if column in rows.column_names:
            return [str(value) for value in column_values(rows, column)]
    return [str(i) for i in range(len(rows))]
