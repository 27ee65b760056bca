"""Gradient scoring of heads as a LightningModule: ``Trainer.validate`` over an estimation split.

Each process scores its share of the examples (the exactly-once sampler), one forward and one backward per
batch under the plan (``headlab.core.importance``); at the end the per-example rows of every process are
gathered and sorted, so the estimators are sums in one order whatever the number of processes. The Trainer
must run with ``inference_mode=False`` (Lightning validates under ``torch.inference_mode`` otherwise).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from headlab.core.head_gradients import gradient_probe
from headlab.core.importance import GradientRows, HeadGradients, score_batch
from headlab.core.patch.ablate import ablate
from headlab.core.patch.substitution import SOURCES
from headlab.core.plans import HeadPlan
from headlab.training.stays_on_device import StaysOnDevice


class HeadScorer(StaysOnDevice):
    """Per-example head gradients of ``model`` over the validation dataloader; ``gradients`` after validate."""

    pass_name = "gradient scoring"  # in progress lines

    def __init__(self, model: torch.nn.Module, plan: HeadPlan, policies: tuple[str, ...], renormalize: bool,
                 unit: str, key_ids: tuple | None, substitutes: Any = None):
        super().__init__()
        self.model = model.eval()
        self.plan, self.policies, self.renormalize, self.unit, self.key_ids = plan, policies, renormalize, unit, key_ids
        self.substitutes, self.means = substitutes, None  # JobSubstitutes: mean / resample estimates
        self.gradients: HeadGradients | None = None
        self._reset()

    def _reset(self) -> None:
        shape = (self.model.config.num_hidden_layers, self.model.config.num_attention_heads)
        self._rows = GradientRows(*shape, offset=1_000_000_000 * self.global_rank)  # ranks' positions apart

    def on_validation_start(self) -> None:
        if self.substitutes is not None:  # the model is on its device now
            self.means = self.substitutes.means(self.model)
            data = self.trainer.datamodule
            self.split = data.eval_splits[0]
            self.substitutes.start_pass({self.split: data.eval_features[self.split]})

    def on_validation_epoch_start(self) -> None:
        self._reset()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        if "resample" in self.policies:  # the draws' sources (the estimate takes their mean)
            batch = {**batch, SOURCES: self.substitutes.sources(self.model, batch, self.split)}
        patched = nullcontext() if self.plan.is_identity else ablate(self.model, self.plan, self.renormalize,
                                                                     means=self.means)
        with torch.enable_grad(), patched, gradient_probe(self.model, self.policies, self.renormalize,
                                                          values=self.key_ids is not None, means=self.means) as probe:
            self._rows.add(score_batch(self.model, batch, probe, self.unit, self.key_ids), batch)

    def on_validation_epoch_end(self) -> None:
        rows, batch_abs = [self._rows.rows], [self._rows.batch_abs]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            rows, batch_abs = [None] * world, [None] * world
            torch.distributed.all_gather_object(rows, self._rows.rows)
            torch.distributed.all_gather_object(batch_abs, self._rows.batch_abs)
        settings = {"policies": list(self.policies), "renormalize": self.renormalize, "unit": self.unit,
                    "plan": self.plan.to_dict()}
        self.gradients = HeadGradients.from_rows([row for shard in rows for row in shard], sum(batch_abs), settings)
        self._reset()

    def configure_optimizers(self) -> Any:
        return None
