"""One pass over paired batches that scores every patch of ``mode=patch`` (a ``Trainer.validate`` module).

Per batch: one forward of the source run records every site's activation (``activation_sites.recorded``) and one of
the base run records each layer's input (noising: the clean run is the base, the corrupted one the source;
denoising the reverse). Each patch then reruns the base run with one site's activation taken from the source, at
every position, at one, or at the positions of one unit (``sentence_ids``): ``per_forward`` patches of the same
layer share a forward of the batch repeated (rows patch-major), which starts at that layer from the base run's input
to it, since the layers below would compute it again (not on a family whose depths share their modules, ALBERT:
whole forwards).

Attribution patching (Kramar et al. 2024; ``attribution=True``) estimates each patch to first order from one more
forward and backward of the base run: the patched logit difference is about the base run's plus
``sum over the patched positions and columns of (a_source - a_base) * dLD/da`` at the base run, every patch from the
same gradients (``exact=False``: no patched forwards at all).

Scores per example, of the clean and corrupted runs and of every patch: the logit difference (the clean label's
logit minus the corrupted label's: ``corrupt_labels`` where the data gives them, else the corrupted run's
prediction; for regression, the predicted score), the loss against the clean label, and the prediction. A patch at
a position or unit an example does not reach scores NaN there.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from headlab.core.activation_sites import Patch, Site, columns, patched, recorded
from headlab.core.families import family_of
from headlab.core.losses import example_losses, span_losses
from headlab.core.model_parts import head_width, layer_inputs, start_at_layer
from headlab.core.patch.first_token import last_layer_at_first_token, reads_first_token
from headlab.training.modules import gather_rows
from headlab.training.progress import ProgressLines
from headlab.training.stays_on_device import StaysOnDevice

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SCORES = ("logit_diff", "loss", "prediction")  # per example, of each run and patch


@dataclass(frozen=True)
class PatchSpec:
    """One patch: ``site`` at every position, at one ``position``, or at the positions of one ``unit``."""

    site: Site
    position: int | None = None
    unit: int | None = None

    @property
    def name(self) -> str:
        return self.site.name + ("" if self.position is None else f"@{self.position}") + (
            "" if self.unit is None else f"@u{self.unit}")

    def where(self, mask: torch.Tensor, units: torch.Tensor | None) -> torch.Tensor:
        """``[batch, seq]``: the valid positions (``mask``) the patch replaces; ``units``: the rows' unit ids."""
        if self.unit is not None:
            return mask & (units == self.unit)
        if self.position is None:
            return mask
        chosen = torch.zeros_like(mask)
        if self.position < mask.shape[1]:
            chosen[:, self.position] = mask[:, self.position]
        return chosen


def patch_specs(kinds: list[str], layers: int, heads: int, positions: int | None = None,
                units: int | None = None) -> list[PatchSpec]:
    """Every site of ``kinds`` in every layer (heads: each head), at every position, or at each of the first
    ``positions`` in turn, or at each of ``units`` units in turn; layer-major."""
    specs = []
    for layer in range(layers):
        for kind in kinds:
            sites = [Site(kind, layer, h) for h in range(heads)] if kind == "head" else [Site(kind, layer)]
            for site in sites:
                if positions is not None:
                    specs += [PatchSpec(site, position=p) for p in range(positions)]
                elif units is not None:
                    specs += [PatchSpec(site, unit=u) for u in range(units)]
                else:
                    specs.append(PatchSpec(site))
    return specs


def _span_scores(logits: torch.Tensor, spans: torch.Tensor, contrast: torch.Tensor, mask: torch.Tensor) -> tuple:
    """Extractive QA's (logit difference, loss, prediction) ``[batch]`` each: a span's score is its start token's start
    logit plus its end token's end logit, the difference that of the clean answer's span ``spans`` ``[batch, 2]`` minus
    the corrupted answer's ``contrast``; the loss the span loss against the clean answer; the prediction 1.0 where the
    highest start and end logits (over the row's tokens) are the clean answer's tokens, else 0.0."""
    start, end = logits[..., 0], logits[..., 1]  # [batch, seq] each

    def score(span: torch.Tensor) -> torch.Tensor:
        return start.double().gather(1, span[:, :1]).squeeze(1) + end.double().gather(1, span[:, 1:]).squeeze(1)

    losses = span_losses(start, end, spans[:, 0], spans[:, 1], mask)
    padding = ~mask.bool()
    best = [x.masked_fill(padding, float("-inf")).argmax(-1) for x in (start, end)]
    hit = (best[0] == spans[:, 0]) & (best[1] == spans[:, 1])
    return score(spans) - score(contrast), losses, hit.double()


class PatchEvaluator(StaysOnDevice):
    """Scores the clean run, the corrupted run and each patch of ``specs`` on paired batches (module docstring).
    After ``Trainer.validate``, ``scores[run]`` (run: ``"clean"``, ``"corrupted"``, a spec's index, or
    ``("estimate", index)`` for its first-order estimate) holds ``{example, logit_diff, loss, prediction}`` arrays
    over the examples, in example order (an estimate's loss and prediction NaN), and ``scores["labels"]``
    ``{example, label}``, the clean labels. Estimates need gradients: a Trainer without inference mode."""

    def __init__(self, model: torch.nn.Module, task_type: str, specs: list[PatchSpec], direction: str,
                 per_forward: int = 0, exact: bool = True, attribution: bool = False):
        super().__init__()
        self.exact, self.attribution = exact, attribution
        self.model = model.eval()
        self.regression, self.qa = task_type == "regression", task_type == "extractive_qa"
        self.specs, self.noising, self.per_forward = list(specs), direction == "noising", per_forward
        self.prefix = not family_of(model).shared  # ALBERT: every forward starts at layer 0
        self.first_token = reads_first_token(model)  # a head that reads [CLS] alone: patches below the last layer
        self.last = model.config.num_hidden_layers - 1  # run it at that position only (core/patch/first_token.py)
        self.sites = list(dict.fromkeys(spec.site for spec in self.specs))
        self.by_layer: dict[int, list[int]] = {}
        for index, spec in enumerate(self.specs):
            self.by_layer.setdefault(spec.site.layer, []).append(index)
        self.scores: dict[Any, dict[str, np.ndarray]] = {}
        self._pending: dict[Any, list[tuple]] = {}
        self.progress, self.patched_done = None, 0  # a line per minute in the job's log: one batch may take minutes

    def on_validation_start(self) -> None:
        if not self.per_forward:  # as the sweeps: on CPUs a bigger batch is not faster per row; GPUs gain
            self.per_forward = max(map(len, self.by_layer.values()), default=1) if self.device.type == "cuda" else 1
        if self.exact and self.specs and self.trainer.is_global_zero:
            self.progress = ProgressLines("patching", len(self.specs) * sum(self.trainer.num_val_batches), "patches")

    def count_patched(self, patches: int) -> None:
        """``patches`` more patched runs of a batch done (the progress line)."""
        self.patched_done += patches
        if self.progress is not None:
            self.progress.update(self.patched_done)

    @torch.no_grad()
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        base, source = self._runs(batch)
        mask, units = base["attention_mask"].bool(), batch.get("sentence_ids")  # [batch, seq] each
        with recorded(self.model, self.sites) as activations:
            source_logits = self.logits(self.model(**source))
        with layer_inputs(self.model) if self.prefix else nullcontext([]) as entering:
            base_logits = self.logits(self.model(**base))
        labels, contrast, examples = self._keep_runs(batch, base_logits, source_logits, mask)
        if self.attribution:
            self._estimated(base, activations, labels, contrast, mask, units, examples)
        for layer, indices in self.by_layer.items() if self.exact else ():
            for start in range(0, len(indices), self.per_forward):
                chunk = indices[start : start + self.per_forward]
                wheres = [self.specs[index].where(mask, units) for index in chunk]  # [batch, seq] each
                logits = self._patched(chunk, layer, base, activations, entering, wheres)  # [copies * batch, labels]
                self.count_patched(len(chunk))
                for copy, (index, where) in enumerate(zip(chunk, wheres)):
                    scores = self._scored(logits[copy * len(labels) : (copy + 1) * len(labels)], labels, contrast,
                                          mask)
                    spec = self.specs[index]
                    if spec.position is not None or spec.unit is not None:  # rows it does not reach: no score
                        scores = tuple(torch.where(where.any(-1), s.double(), torch.nan) for s in scores)
                    self._keep(index, examples, scores)

    def _runs(self, batch: dict[str, torch.Tensor]) -> tuple[dict, dict]:
        """The model inputs of the base run and of the source run (noising: clean and corrupted; denoising: the
        reverse); both have the same attention mask."""
        clean = {name: batch[name] for name in MODEL_INPUTS if name in batch}
        corrupted = clean | {name: batch[f"corrupt_{name}"] for name in MODEL_INPUTS if f"corrupt_{name}" in batch}
        return (clean, corrupted) if self.noising else (corrupted, clean)

    def _keep_runs(self, batch: dict[str, torch.Tensor], base_logits, source_logits, mask) -> tuple:
        """Keep the clean labels and the clean and corrupted runs' scores; ``(labels, contrast, examples)``: the
        clean labels, the corrupted ones (``corrupt_labels``, else the corrupted run's predictions; None for
        regression) and the examples' indices, ``[batch]`` each. Extractive QA: the clean and the corrupted answers'
        spans ``[batch, 2]`` (start, end token), and label 1 for every example (``_scored``'s prediction)."""
        clean_logits, corrupted_logits = (base_logits, source_logits) if self.noising else (source_logits,
                                                                                            base_logits)
        examples = batch["example_index"]
        if self.qa:
            labels = torch.stack([batch["start_positions"], batch["end_positions"]], 1)
            contrast = torch.stack([batch["corrupt_start_positions"], batch["corrupt_end_positions"]], 1)
            self._keep("labels", examples, (torch.ones_like(examples),))
        else:
            labels = batch["labels"]
            contrast = None if self.regression else batch.get("corrupt_labels", corrupted_logits.argmax(-1))
            self._keep("labels", examples, (labels,))
        self._keep("clean", examples, self._scored(clean_logits, labels, contrast, mask))
        self._keep("corrupted", examples, self._scored(corrupted_logits, labels, contrast, mask))
        return labels, contrast, examples

    def _patched(self, chunk: list[int], layer: int, base: dict, activations: dict, entering: list,
                 wheres: list[torch.Tensor]) -> torch.Tensor:
        """The logits of the base run repeated once per patch of ``chunk`` (all at ``layer``), each copy patched at
        its ``wheres`` (``[batch, seq]`` each)."""
        copies = len(chunk)
        rows = {name: t.repeat(copies, *[1] * (t.dim() - 1)) for name, t in base.items()}
        sources = {key: value.repeat(copies, 1, 1) for key, value in activations.items() if key[1] == layer}
        patches = []
        for copy, (index, chosen) in enumerate(zip(chunk, wheres)):
            spec = self.specs[index]
            where = torch.zeros(copies, *chosen.shape, dtype=torch.bool, device=chosen.device)  # [copies, batch, seq]
            where[copy] = chosen
            patches.append(Patch(spec.site, sources[(spec.site.kind, layer)], where.flatten(0, 1)))
        start = start_at_layer(self.model, layer, entering[layer].repeat(copies, 1, 1)) if self.prefix \
            else nullcontext()
        first = last_layer_at_first_token(self.model, rows["attention_mask"]) if self.first_token and \
            layer < self.last else nullcontext()
        with patched(self.model, patches), start, first:
            return self.logits(self.model(**rows))

    def _estimated(self, base: dict, activations: dict, labels, contrast, mask, units, examples) -> None:
        """Every patch's first-order estimate (module docstring) from one forward and backward of the base run."""
        with torch.enable_grad(), recorded(self.model, self.sites) as found:
            logit_diff = self._scored(self.logits(self.model(**base)), labels, contrast, mask)[0]  # [batch], float64
            keys = list(found)
            gradients = dict(zip(keys, torch.autograd.grad(logit_diff.sum(), [found[key] for key in keys])))
        width, nothing = head_width(self.model), torch.full_like(logit_diff, torch.nan).detach()
        for index, spec in enumerate(self.specs):
            key, cols = (spec.site.kind, spec.site.layer), columns(spec.site, width)
            change = (activations[key] - found[key].detach())[..., cols] * gradients[key][..., cols]  # [batch, seq, c]
            where = spec.where(mask, units)  # [batch, seq]
            estimate = logit_diff.detach() + (change.sum(-1).double() * where).sum(-1)
            if spec.position is not None or spec.unit is not None:
                estimate = torch.where(where.any(-1), estimate, torch.nan)
            self._keep(("estimate", index), examples, (estimate, nothing, nothing))

    def logits(self, out: Any) -> torch.Tensor:
        """The model output's logits: ``[batch, labels]``; extractive QA ``[batch, seq, 2]`` (start, end)."""
        return torch.stack([out.start_logits, out.end_logits], -1) if self.qa else out.logits

    def _scored(self, logits: torch.Tensor, labels: torch.Tensor, contrast: torch.Tensor | None,
                mask: torch.Tensor) -> tuple:
        """(logit difference, loss, prediction) ``[batch]`` each (module docstring); ``mask`` ``[batch, seq]``: the
        rows' tokens (QA: the span loss and the prediction read no padding)."""
        if self.qa:
            return _span_scores(logits, labels, contrast, mask)
        losses = example_losses(logits, labels, self.regression)
        if self.regression:
            score = logits[:, 0].double()
            return score, losses, score
        picked = logits.double().gather(1, torch.stack([labels, contrast], 1))  # [batch, 2]
        return picked[:, 0] - picked[:, 1], losses, logits.argmax(-1)

    def _keep(self, run: Any, examples: torch.Tensor, scores: tuple) -> None:
        self._pending.setdefault(run, []).append((examples, *scores))

    def on_validation_epoch_end(self) -> None:
        for run, batches in self._pending.items():
            rows = gather_rows([row for batch in batches for row in zip(*(column.tolist() for column in batch))])
            names = ("example", "label") if run == "labels" else ("example", *SCORES)
            by_column = list(zip(*rows)) if rows else [[] for _ in names]
            self.scores[run] = {name: np.asarray(values, dtype=np.float64) for name, values in zip(names, by_column)}
        self._pending = {}
