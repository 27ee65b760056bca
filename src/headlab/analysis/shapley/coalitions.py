"""Coalitions of head groups as plans, and their evaluation as per-row plans, many per batch.

A coalition keeps some groups of heads and removes the others under one policy (``coalition_plan``).
``CoalitionEvaluator`` scores many coalitions in one pass over the data: coalitions run as per-row plans,
``per_forward`` of them in a forward of the batch repeated; the coalitions of a forward start at the lowest layer any
of them changes, from that layer's unablated input (the layers below would compute the unablated states again; not on
a family whose depths share their modules, ALBERT). Per batch, one unablated forward records those inputs, as far up
as a forward starts (and serves the full model when it is among the coalitions; none runs when neither is needed).
Records are those of ``PlanEvaluator``: the same as ``mode=eval`` jobs give.
"""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from headlab.analysis.jobs.plan_evaluator import PlanEvaluator, Variant
from headlab.core.families import family_of
from headlab.core.head_names import head_name
from headlab.core.model_parts import encoder_layers, layer_inputs, start_at_layer
from headlab.core.patch.ablate import ablate
from headlab.core.patch.substitution import SOURCES
from headlab.core.plans import HeadPlan, Rule


def coalition_plan(groups: list[list[tuple[int, int]]], kept: int, policy: str, shape: tuple[int, int]) -> HeadPlan:
    """The plan of the coalition whose bit ``i`` of ``kept`` says group ``i`` keeps its heads; the others' heads get
    ``policy``."""
    policies = np.full(shape, "keep", dtype=object)
    removed = [head for i, group in enumerate(groups) if not (kept >> i) & 1 for head in group]
    for layer, head in removed:
        policies[layer, head] = policy
    rules = [Rule(",".join(head_name(*h) for h in removed), policy)] if removed else []
    return HeadPlan(policies, rules)


def first_changed_layer(plan: HeadPlan) -> int:
    """The lowest layer where ``plan`` changes a head (its number of layers when it changes none)."""
    changed = [layer for layer in range(plan.num_layers) if set(plan.layer_groups(layer)) != {"keep"}]
    return changed[0] if changed else plan.num_layers


class CoalitionEvaluator(PlanEvaluator):
    """Scores coalition plans (``variants``) as per-row plans, ``per_forward`` per forward (module docstring)."""

    pass_name = "coalitions"

    def __init__(self, model, task, variants: list[Variant], examples: dict[str, Any], per_forward: int = 0,
                 substitutes: Any = None, constants: Any = None):
        super().__init__(model, task, variants, examples, substitutes, constants)
        self.per_forward = per_forward  # 0: chosen by device when validation starts
        self.prefix = not family_of(model).shared  # ALBERT's depths share modules: every forward starts at layer 0
        self.renormalize = variants[0].renormalize

    def on_validation_start(self) -> None:
        super().on_validation_start()
        if not self.per_forward:
            self.per_forward = len(self.variants) if self.device.type == "cuda" else 1
        ordered = sorted((v for v in self.variants if not v.plan.is_identity),
                         key=lambda v: first_changed_layer(v.plan))
        self.chunks = [ordered[i : i + self.per_forward] for i in range(0, len(ordered), self.per_forward)]
        self.starts = [min(first_changed_layer(v.plan) for v in chunk) if self.prefix else 0 for chunk in self.chunks]

    @torch.no_grad()
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.splits[dataloader_idx]
        inputs = self.model_inputs(batch)
        hidden = self._unablated(inputs, batch, split)  # [batch, seq, hidden] entering the layers forwards start at
        draws = self.substitutes.draws if self.resampled else 1
        sources = self.substitutes.sources(self.model, batch, split) if self.resampled else None
        size = len(batch["input_ids"])
        for chunk, start in zip(self.chunks, self.starts):
            copies = len(chunk) * draws  # rows: coalition-major, then draw, then example
            rows = {name: t.repeat(copies, *[1] * (t.dim() - 1)) for name, t in inputs.items()}
            plans = chunk[0].plan  # one coalition: its plan (no per-row tables)
            if len(chunk) > 1:
                plans = [v.plan for v in chunk]
                rows["plan_ids"] = torch.arange(len(chunk), device=self.device).repeat_interleave(draws * size)
            if sources is not None:
                rows[SOURCES] = sources.repeat(1, len(chunk), 1, 1, 1)
            skipped = start_at_layer(self.model, start, hidden[start].repeat(copies, 1, 1)) if start else nullcontext()
            with ablate(self.model, plans, self.renormalize, means=self.means, constants=self.constants), skipped:
                out = self.model(**rows)
            block = draws * size
            for i, variant in enumerate(chunk):
                mine = SimpleNamespace(**{name: value[i * block : (i + 1) * block] for name, value in out.items()
                                          if isinstance(value, torch.Tensor) and value.dim() > 0})
                self._pending.setdefault((variant.name, split), []).append(self._batch_rows(mine, batch, draws))

    def _unablated(self, inputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], split: str) -> list:
        """The unablated inputs of the layers up to the highest a forward starts at (the full model's records too
        when it is a coalition: then the whole forward runs). Every forward starting at layer 0 (ALBERT's always do):
        no layer inputs are recorded, so no layer list is needed."""
        full = [v for v in self.variants if v.plan.is_identity]
        highest = max(self.starts, default=0)
        hidden: list = []
        if not highest:
            out = self.model(**inputs) if full else None
        else:
            with layer_inputs(self.model) as hidden:
                # nothing above the highest start is needed: stop there (a hook after the one that records its input)
                stop = None if full else encoder_layers(self.model)[1][highest].register_forward_pre_hook(_stop)
                try:
                    out = self.model(**inputs)
                except _Stopped:
                    pass
                finally:
                    if stop is not None:
                        stop.remove()
        for variant in full:
            self._pending.setdefault((variant.name, split), []).append(self._batch_rows(out, batch))
        return hidden


class _Stopped(Exception):
    """Raised once the highest layer input a forward starts from is recorded."""


def _stop(module, args) -> None:
    raise _Stopped
