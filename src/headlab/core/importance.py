"""Head importance by gradients, first-order ablation estimates, gradients by key type (DESIGN.md section 4).

One forward and one backward pass per batch (``headlab.core.head_gradients``) give, per example b and head
(l, h), the gate gradient ``d loss_b / d gate[b, l, h]``, Michel et al.'s per-token terms, the first-order
estimate of every policy and the attention-weight gradients by key type; every estimator is a reduction of
those over examples (``HeadGradients``):

==========  ==========================================================================================
example     mean over examples of |d loss_b / d gate|  (Michel et al.'s definition; the default)
token       mean over examples of the sum over tokens of |g . z|  (Michel et al.'s code)
batch       sum over batches of |sum over the batch of d loss_b / d gate|, / examples  (after HF run_bertology,
            with the gradient zeroed per batch; depends on the batches' composition; HF sums batch-mean
            gradients, the same up to a constant only for batches of one size)
fisher      mean over examples of (d loss_b / d gate)^2
==========  ==========================================================================================

All four share one scale, so ``token >= example >= batch``. Normalisations (each optional): per layer, divide
by the L2 norm of the layer's scores (+1e-20); globally, min-max to [0, 1]. The first-order estimate of
ablating head (l, h) alone under a policy is the mean over examples of ``sum_t g . (z' - z)``; for ``prune``
(``z' = 0``) it is minus the gate gradient. For classification the loss is the model's own: HF's task heads average over
the batch, so ``loss * batch size`` is the sum whose gradient per example is that example's own. For SQuAD-style
tasks an example is a feature (one window of a question) and the loss the sum of ``headlab.core.losses.span_losses``
(each feature's softmax over its own positions; HF's QA loss lets the batch's padding in).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from headlab.core.families import family_of
from headlab.core.head_gradients import KEY_TYPES, BatchGradients, gradient_probe, key_type_masks
from headlab.core.losses import span_losses
from headlab.core.model_parts import MODEL_INPUTS
from headlab.core.patch.ablate import ablate
from headlab.core.patch.substitution import SOURCES
from headlab.core.plans import ESTIMABLE, ESTIMATED, GRANULARITIES, HeadPlan, check_unit
from headlab.errors import UserError, one_of

LABELS = (("labels",), ("start_positions", "end_positions"))  # classification / regression, extractive QA
PUNCTUATION = (".", ",")  # Clark et al. 2019: exactly these tokens


@dataclass
class HeadGradients:
    """Per-example values of an estimation set in example order, ``[examples, layers, heads]`` float64 each.

    ``batch_abs`` ``[layers, heads]``: the sum over batches of |the batch's summed gate gradient|.
    """

    order: np.ndarray  # [examples, 2]: (example index, position) keys the rows are sorted by
    gate: np.ndarray
    token_abs: np.ndarray
    estimates: dict[str, np.ndarray] = field(default_factory=dict)
    key_types: dict[str, np.ndarray] = field(default_factory=dict)
    batch_abs: np.ndarray | None = None
    settings: dict = field(default_factory=dict)  # policies, renormalize, unit, plan: what they were computed under

    @property
    def num_examples(self) -> int:
        return len(self.gate)

    def importance(self, granularity: str = "example") -> np.ndarray:
        """``[layers, heads]`` raw scores (module docstring)."""
        one_of("granularity", granularity, GRANULARITIES)
        if granularity == "batch":
            return self.batch_abs / self.num_examples
        per_example = {"example": np.abs(self.gate), "token": self.token_abs, "fisher": self.gate ** 2}[granularity]
        return per_example.mean(axis=0)

    def estimate(self, policy: str) -> np.ndarray:
        """``[layers, heads]``: first-order estimate of the mean loss change of ablating each head alone."""
        one_of("policy (estimated)", policy, list(self.estimates))
        return self.estimates[policy].mean(axis=0)

    def key_type_means(self) -> dict[str, np.ndarray]:
        """``{type: [layers, heads]}``: mean over the examples that have such a key (NaN if none has)."""
        means = {}
        for kind, values in self.key_types.items():
            present = ~np.isnan(values[:, 0, 0])
            means[kind] = values[present].mean(axis=0) if present.any() else np.full(values.shape[1:], np.nan)
        return means

    @classmethod
    def from_rows(cls, rows: list[tuple], batch_abs: np.ndarray, settings: dict) -> HeadGradients:
        """From ``(example index, position, gate, token_abs, {policy: estimate}, {type: value})`` rows, any order."""
        if not rows:
            raise UserError("the estimation data has no examples: importance needs at least one labelled example")
        rows = sorted(rows, key=lambda row: (row[0], row[1]))
        stack = lambda values: np.stack(values).astype(np.float64)  # noqa: E731
        return cls(np.array([row[:2] for row in rows]), stack([r[2] for r in rows]), stack([r[3] for r in rows]),
                   {p: stack([r[4][p] for r in rows]) for p in rows[0][4]},
                   {k: stack([r[5][k] for r in rows]) for k in rows[0][5]}, batch_abs, settings)


def normalize_importance(scores: np.ndarray, layer: bool = True, global_: bool = True) -> np.ndarray:
    """Per-layer L2 normalisation (exponent 2, +1e-20 as HF), then global min-max to [0, 1] (0 if all equal)."""
    scores = np.asarray(scores, dtype=np.float64)
    if layer:
        scores = scores / (np.sqrt((scores ** 2).sum(axis=-1, keepdims=True)) + 1e-20)
    if global_:
        low, high = scores.min(), scores.max()
        scores = (scores - low) / (high - low) if high > low else np.zeros_like(scores)
    return scores


def punctuation_ids(tokenizer) -> tuple[int, int, list[int]]:
    """([CLS] id, [SEP] id, ids of ``.`` and ``,``) of a tokenizer."""
    ids = [tokenizer.convert_tokens_to_ids(token) for token in PUNCTUATION]
    return tokenizer.cls_token_id, tokenizer.sep_token_id, [i for i in ids if i != tokenizer.unk_token_id]


def batch_size_of(batch: Mapping[str, torch.Tensor]) -> int:
    return int(batch["input_ids"].shape[0])


def score_batch(model: PreTrainedModel, batch: Mapping[str, torch.Tensor], probe, unit: str | None = None,
                key_ids: tuple | None = None) -> BatchGradients:
    """One forward (under the enclosing ``gradient_probe``) and one backward of a labelled batch."""
    labels = next((keys for keys in LABELS if all(k in batch for k in keys)), None)
    if labels is None:
        raise UserError(f"the batch has no labels (keys: {', '.join(batch)}); head importance needs 'labels' "
                        "(classification, regression) or 'start_positions' and 'end_positions' (extractive QA)")
    inputs = {k: batch[k] for k in (*MODEL_INPUTS, *labels) if k in batch}
    if any(p.startswith("drop_") for p in probe.policies):
        inputs["sentence_ids"] = _unit_ids(batch, unit)
    if "resample" in probe.policies:
        if SOURCES not in batch:
            raise UserError(f"the estimate of resample needs batches with {SOURCES} (headlab.resample_sources)")
        inputs[SOURCES] = batch[SOURCES]
    out = model(**inputs)
    if labels == LABELS[1] and hasattr(out, "start_logits"):  # QA: each feature's loss over its own positions
        total = span_losses(out.start_logits, out.end_logits, batch["start_positions"], batch["end_positions"],
                            batch["attention_mask"]).sum()
    elif getattr(out, "loss", None) is not None:
        total = out.loss * batch_size_of(batch)  # the model's mean loss: the sum of the examples' losses
    else:
        raise UserError(f"{type(model).__name__} returned no loss: head importance needs a model with a task head "
                        "(e.g. BertForSequenceClassification) and labelled batches")
    masks = None
    if key_ids is not None:
        masks = key_type_masks(batch["input_ids"], batch["attention_mask"], *key_ids)
    return probe.gradients(total, masks, batch["attention_mask"].bool())


def _unit_ids(batch: Mapping[str, torch.Tensor], unit: str | None) -> torch.Tensor:
    """``drop_*`` unit ids: the batch's ``sentence_ids``, or its segments (``token_type_ids``) for ``segment``."""
    if unit is not None:
        check_unit(unit)
    if unit == "segment":
        if "token_type_ids" not in batch:
            raise UserError("unit='segment' reads the segments from token_type_ids, which the batch does not have; "
                            "give it sentence_ids from headlab.unit_ids(encoding, texts, pairs, unit='segment')")
        return batch["token_type_ids"]
    if "sentence_ids" not in batch:
        raise UserError("drop_intra / drop_inter estimates need unit ids: batches with 'sentence_ids' "
                        "(headlab.unit_ids), or unit='segment' (from token_type_ids)")
    return batch["sentence_ids"]


class GradientRows:
    """Per-example rows (for ``HeadGradients.from_rows``) and the ``batch`` granularity's sum, batch by batch.

    ``offset``: added to stream positions (a process's share under DDP), which order a question's features.
    """

    def __init__(self, num_layers: int, num_heads: int, offset: int = 0):
        self.rows: list[tuple] = []
        self.batch_abs = np.zeros((num_layers, num_heads))
        self.offset, self.position = offset, 0

    def add(self, grads: BatchGradients, batch: Mapping[str, torch.Tensor]) -> None:
        start, size = self.offset + self.position, len(grads.gate)
        index = batch["example_index"].tolist() if "example_index" in batch else list(range(start, start + size))
        self.rows += [(index[b], start + b, grads.gate[b].numpy(), grads.token_abs[b].numpy(),
                       {p: e[b].numpy() for p, e in grads.estimates.items()},
                       {k: v[b].numpy() for k, v in grads.key_types.items()}) for b in range(size)]
        self.batch_abs += grads.gate.sum(0).abs().numpy()
        self.position += size


def head_gradients(model: PreTrainedModel, batches: Iterable[Mapping[str, torch.Tensor]], *,
                   policies: Iterable[str] = ESTIMATED, renormalize: bool = False, unit: str | None = None,
                   plan: HeadPlan | None = None, tokenizer=None, means: Any = None) -> HeadGradients:
    """Every per-example quantity of the module docstring over ``batches``, one forward + backward per batch.

    ``plan``: score the heads under this plan (heads it prunes get 0). ``tokenizer``: also the gradients by
    key type ([CLS], [SEP], ``.``/``,``, other). The model runs in eval mode (no dropout) and is restored.
    ``mean`` estimates need ``means`` (``headlab.head_means``), ``resample`` ones batches with ``head_sources``.
    """
    policies = tuple(policies)
    if unit == "segment" and not family_of(model).segment_ids:
        raise UserError(f"unit='segment' reads the segments from token_type_ids, which a {model.config.model_type} "
                        "tokenizer gives as all 0 (every token one unit); give the batches sentence_ids from "
                        "headlab.unit_ids(encoding, texts, pairs, unit='segment') instead")
    key_ids = None if tokenizer is None else punctuation_ids(tokenizer)
    rows, training = GradientRows(model.config.num_hidden_layers, model.config.num_attention_heads), model.training
    patched = nullcontext() if plan is None or plan.is_identity else ablate(model, plan, renormalize)
    try:
        model.eval()
        with torch.enable_grad(), patched, gradient_probe(model, policies, renormalize, values=key_ids is not None,
                                                          means=means) as probe:
            for batch in batches:
                rows.add(score_batch(model, batch, probe, unit, key_ids), batch)
    finally:
        model.train(training)
    settings = {"policies": list(policies), "renormalize": renormalize, "unit": unit,
                "plan": None if plan is None else plan.to_dict()}
    return HeadGradients.from_rows(rows.rows, rows.batch_abs, settings)


def head_importance(model: PreTrainedModel, batches: Iterable[Mapping[str, torch.Tensor]], *,
                    granularity: str = "example", normalize_layer: bool = True, normalize_global: bool = True,
                    plan: HeadPlan | None = None) -> torch.Tensor:
    """``[layers, heads]`` gradient importance of every head (module docstring) over labelled ``batches``."""
    one_of("granularity", granularity, GRANULARITIES)
    scores = head_gradients(model, batches, policies=(), plan=plan).importance(granularity)
    return torch.from_numpy(normalize_importance(scores, normalize_layer, normalize_global))


def ablation_estimate(model: PreTrainedModel, batches: Iterable[Mapping[str, torch.Tensor]], policy: str, *,
                      unit: str | None = None, renormalize: bool = False, per_example: bool = False,
                      plan: HeadPlan | None = None, means: Any = None) -> torch.Tensor:
    """First-order estimate of the loss change of ablating each head alone under ``policy``.

    ``[layers, heads]`` (the mean over examples), or ``[examples, layers, heads]`` with ``per_example=True``.
    ``unit``: ``segment`` takes the units from ``token_type_ids`` (not RoBERTa's: all 0); otherwise batches carry
    ``sentence_ids`` (``headlab.unit_ids``: any unit, any family). ``mean``: the heads' ``means``
    (``headlab.head_means``); ``resample``: batches with ``head_sources`` (``headlab.resample_sources``).
    """
    one_of("policy", policy, ESTIMABLE)
    grads = head_gradients(model, batches, policies=(policy,), renormalize=renormalize, unit=unit, plan=plan,
                           means=means)
    return torch.from_numpy(grads.estimates[policy] if per_example else grads.estimate(policy))


def key_type_gradients(model: PreTrainedModel, tokenizer, batches: Iterable[Mapping[str, torch.Tensor]], *,
                       plan: HeadPlan | None = None) -> dict[str, torch.Tensor]:
    """``{type: [layers, heads]}``: mean |d loss / d attention weight| to [CLS], [SEP], ``.``/``,`` and other keys
    (Clark et al. 2019), per example over its valid queries and keys of the type, then over examples."""
    grads = head_gradients(model, batches, policies=(), plan=plan, tokenizer=tokenizer)
    return {kind: torch.from_numpy(grads.key_type_means()[kind]) for kind in KEY_TYPES}
