"""Extractive QA (SQuAD v1.1 / v2.0): features of long contexts and answers from span logits.

Features follow the standard preprocessing of BERT on SQuAD (Devlin et al.; HF ``run_qa.py``):
question first, context second, the context cut into windows of ``max_length`` tokens that
overlap by ``doc_stride`` tokens, so one question can have several features. Every feature
carries the (first) answer's token span, or ``[CLS]`` (position 0) when the answer is not inside
the window (and for unanswerable v2 questions): the training target and the eval loss's.
Evaluation features also carry the index of their question and each token's character span in the
context (``[-1, -1]`` outside the context).

Post-processing (``best_spans`` + ``AnswerCollector``) merges the features of one question:

* candidates of a feature: the ``n_best`` highest start and the ``n_best`` highest end logits
  among its context tokens; a pair is valid when ``start <= end`` and it spans at most
  ``max_answer_length`` tokens; its score is ``start_logit + end_logit``;
* the answer is the best-scoring valid span over all features of the question;
* v2: the null score of the question is the smallest ``start_logit[0] + end_logit[0]`` ([CLS])
  over its features; the prediction is "" (no answer) when the null score beats the best span.

This equals HF's ``postprocess_qa_predictions`` except in two corners, both on purpose: HF ranks
the ``n_best`` over *all* positions and then drops non-context ones (so question or [SEP] tokens can
take candidate slots); and a question with no valid span at all gets "" here, "empty" there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import datasets
import torch

from headlab.core.units import unit_ids
from headlab.errors import UserError

OUTSIDE = [-1, -1]  # character span of a token outside the context


def _answer_tokens(context_offsets: list[list[int]], answers: dict) -> tuple[int, int]:
    """Token span of the first gold answer inside this window, or (0, 0) ([CLS]) if it is not inside."""
    if not answers["answer_start"]:
        return 0, 0
    start_char = answers["answer_start"][0]
    end_char = start_char + len(answers["text"][0])
    context = [i for i, span in enumerate(context_offsets) if span != OUTSIDE]
    if context_offsets[context[0]][0] > start_char or context_offsets[context[-1]][1] < end_char:
        return 0, 0
    start = max(i for i in context if context_offsets[i][0] <= start_char)
    end = min(i for i in context if context_offsets[i][1] >= end_char)
    return start, end


def encode_squad(batch, indices, tokenizer, max_length, doc_stride, unit, training) -> dict[str, list]:
    """``datasets.map`` function: SQuAD rows -> features (several per row for long contexts)."""
    if tokenizer.padding_side != "right":
        raise UserError(f"SQuAD features expect a tokenizer that pads on the right, got {tokenizer.padding_side!r}")
    questions = [q.lstrip() for q in batch["question"]]  # leading spaces only cost window room
    contexts = batch["context"]
    _check_window(tokenizer, questions, max_length, doc_stride)
    enc = tokenizer(questions, contexts, truncation="only_second", max_length=max_length, stride=doc_stride,
                    return_overflowing_tokens=True, return_offsets_mapping=True)
    units = unit_ids(enc, questions, contexts, unit=unit)  # [features, longest feature]
    samples = enc["overflow_to_sample_mapping"]
    out: dict[str, list] = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
    out["sentence_ids"] = [row[: len(ids)].tolist() for row, ids in zip(units, enc["input_ids"])]
    spans = [
        [list(offset) if segment == 1 else OUTSIDE for segment, offset in zip(enc.sequence_ids(row), offsets)]
        for row, offsets in enumerate(enc["offset_mapping"])
    ]
    positions = [_answer_tokens(span, batch["answers"][sample]) for span, sample in zip(spans, samples)]
    out["start_positions"] = [start for start, _ in positions]  # evaluation features too: the eval loss
    out["end_positions"] = [end for _, end in positions]
    if not training:
        out["example_index"] = [indices[sample] for sample in samples]
        out["context_offsets"] = spans
    return out


def _check_window(tokenizer, questions: list[str], max_length: int, doc_stride: int) -> None:
    """The context part of every window must be longer than the stride, or windows cannot advance."""
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"]]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    room = max_length - specials - lengths[longest]
    if room <= doc_stride:
        raise UserError(
            f"question {questions[longest]!r} has {lengths[longest]} tokens, which leaves {room} context tokens per "
            f"window (max_length {max_length}); that must exceed doc_stride {doc_stride}: raise task.max_length "
            "or lower task.doc_stride"
        )


@dataclass
class Spans:
    """Best span of each feature: ``score`` ``[features]`` (-inf if none is valid), its character
    ``start`` / ``end`` in the context (-1 if none), and the feature's null ([CLS]) score."""

    score: torch.Tensor
    start: torch.Tensor
    end: torch.Tensor
    null_score: torch.Tensor


def best_spans(
    start_logits: torch.Tensor,  # [features, seq]
    end_logits: torch.Tensor,  # [features, seq]
    context_offsets: torch.Tensor,  # [features, seq, 2], -1 outside the context
    n_best: int = 20,
    max_answer_length: int = 30,
) -> Spans:
    """The best valid span of every feature (see the module docstring for the rule)."""
    dtype = torch.promote_types(start_logits.dtype, torch.float32)  # bf16 / fp16 logits: score in float32
    start_logits, end_logits = start_logits.to(dtype), end_logits.to(dtype)
    in_context = context_offsets[..., 0] >= 0  # [features, seq]
    k = min(n_best, start_logits.shape[1])
    starts = start_logits.masked_fill(~in_context, -torch.inf).topk(k, dim=1)  # values/indices [features, k]
    ends = end_logits.masked_fill(~in_context, -torch.inf).topk(k, dim=1)
    scores = starts.values[:, :, None] + ends.values[:, None, :]  # [features, k start, k end]
    length = ends.indices[:, None, :] - starts.indices[:, :, None]  # end - start, in tokens
    valid = (length >= 0) & (length < max_answer_length) & torch.isfinite(scores)
    flat = scores.masked_fill(~valid, -torch.inf).flatten(1)  # [features, k * k]
    score, best = flat.max(dim=1)
    start_token = starts.indices.gather(1, (best // k)[:, None])[:, 0]
    end_token = ends.indices.gather(1, (best % k)[:, None])[:, 0]
    rows = torch.arange(len(score))
    found = torch.isfinite(score)
    return Spans(
        score=score,
        start=torch.where(found, context_offsets[rows, start_token, 0], -1),
        end=torch.where(found, context_offsets[rows, end_token, 1], -1),
        null_score=start_logits[:, 0] + end_logits[:, 0],
    )


class AnswerCollector:
    """Merges the best spans of features into one answer per question (any order, any batches).

    ``add`` keeps a batch's tensors where they are (on a GPU: no host-device synchronisation per batch);
    ``answers`` reads them.
    """

    def __init__(self) -> None:
        self.best: dict[int, tuple[float, int, int]] = {}  # question -> (score, char start, char end)
        self.null: dict[int, float] = {}  # question -> smallest null score over its features
        self._batches: list[tuple[torch.Tensor, Spans]] = []

    def add(self, example_index: torch.Tensor, spans: Spans) -> None:
        self._batches.append((example_index, spans))

    def _merge(self) -> None:
        for example_index, spans in self._batches:
            rows = zip(example_index.tolist(), spans.score.tolist(), spans.start.tolist(), spans.end.tolist(),
                       spans.null_score.tolist())
            for example, score, start, end, null in rows:
                if example not in self.best or score > self.best[example][0]:
                    self.best[example] = (score, start, end)
                self.null[example] = min(null, self.null.get(example, torch.inf))
        self._batches = []

    def answers(self, contexts: Any, version: str = "v1") -> dict[int, str]:
        """Predicted text of every question seen; ``contexts[i]`` is question i's context."""
        self._merge()
        predictions = {}
        for example, (score, start, end) in self.best.items():
            no_answer = start < 0 or (version == "v2" and self.null[example] > score)
            predictions[example] = "" if no_answer else contexts[example][start:end]
        return predictions


def tokenize_squad(
    dataset: datasets.Dataset, tokenizer, task: Any, unit: str, training: bool, cache_file: str
) -> datasets.Dataset:
    """Features of a SQuAD-format split (see the module docstring), cached in ``cache_file``."""
    return dataset.map(
        encode_squad,
        batched=True,
        with_indices=True,
        remove_columns=dataset.column_names,
        fn_kwargs={"tokenizer": tokenizer, "max_length": task.max_length, "doc_stride": task.doc_stride,
                   "unit": unit, "training": training},
        cache_file_name=cache_file,
        load_from_cache_file=True,
        desc=f"tokenizing {task.name} ({'training' if training else 'evaluation'} features)",
    )
