"""The sequences ``mode=features`` reads: a seeded random sample of a task split's examples, or a text file's lines.

A text file holds one sequence per line, or a pair per line (two non-blank texts separated by one tab); blank
lines are skipped; any other line is an error that names it. Sequences longer than ``max_length`` tokens are
truncated and counted. Batches are padded per batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headlab.analysis.types.checks import read_text_lines
from headlab.core.families import family_for
from headlab.errors import UserError
from headlab.tasks.encoding import tokenize_split
from headlab.tasks.loading import load_task_data


@dataclass
class Sequences:
    """Token ids (and segment ids) per sequence, where each came from, and how many were truncated."""

    input_ids: list[list[int]]
    token_type_ids: list[list[int]]
    source: list[int]  # the line number (1-based) or the split's example index
    truncated: int = 0
    max_length: int | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def batches(self, batch_size: int, pad_id: int) -> Iterator[dict[str, torch.Tensor]]:
        """Padded ``input_ids``, ``token_type_ids`` and ``attention_mask`` ``[batch, longest]``, in order."""
        for start in range(0, len(self), batch_size):
            ids, types = self.input_ids[start:start + batch_size], self.token_type_ids[start:start + batch_size]
            length = max(map(len, ids))
            yield {"input_ids": torch.tensor([_padded(row, pad_id, length) for row in ids]),
                   "token_type_ids": torch.tensor([_padded(row, 0, length) for row in types]),
                   "attention_mask": torch.tensor([_padded([1] * len(row), 0, length) for row in ids])}


def _padded(row: list[int], value: int, length: int) -> list[int]:
    return list(row) + [value] * (length - len(row))


def sample(count: int, limit: int | None, seed: int) -> list[int]:
    """Sorted indices of a seeded random sample of ``limit`` out of ``count`` (all of them when ``limit`` is None)."""
    if limit is None or limit >= count:
        return list(range(count))
    return sorted(np.random.default_rng(seed).choice(count, size=limit, replace=False).tolist())


def text_file_sequences(path: str | Path, tokenizer, max_length: int, limit: int | None, seed: int) -> Sequences:
    """The file's lines (a seeded sample of ``limit``), tokenised with [CLS]/[SEP], truncated to ``max_length``."""
    lines = read_text_lines(path)
    chosen = sample(len(lines), limit, seed)
    pair_line = next((lines[i][0] for i in chosen if len(lines[i][1]) == 2), None)
    needed = None if pair_line is None else tokenizer.num_special_tokens_to_add(pair=True) + 2
    if needed is not None and max_length < needed:  # (truncation left a text of the pair without a token)
        raise UserError(f"features.max_length={max_length} is too short for the pairs of features.text_file="
                        f"{str(path)!r} (line {pair_line}): a pair needs {needed} tokens, its special tokens and one "
                        "of each text")
    input_ids, token_type_ids, truncated = [], [], 0
    for texts in (lines[i][1] for i in chosen):
        text, pair = texts[0], texts[1] if len(texts) == 2 else None
        full = tokenizer(text, pair)["input_ids"]
        encoded = tokenizer(text, pair, truncation=True, max_length=max_length, return_token_type_ids=True)
        truncated += len(full) > max_length
        input_ids.append(encoded["input_ids"])
        token_type_ids.append(encoded["token_type_ids"])
    return Sequences(input_ids, token_type_ids, [lines[i][0] for i in chosen], truncated, max_length)


def task_sequences(task: Any, split: str, tokenizer, limit: int | None, seed: int, cache_dir: str) -> Sequences:
    """A seeded random sample of ``limit`` examples of the task's ``split``, tokenised as the task does (SQuAD:
    every window of an example; other tasks: truncated to ``task.max_length``, and counted)."""
    data = load_task_data(task, [split])[split]
    chosen = sample(len(data), limit, seed)
    data = data.select(chosen)
    features = tokenize_split(data, task, tokenizer, "segment", cache_dir, split, training=False)
    ids = features["input_ids"]
    types = features["token_type_ids"] if "token_type_ids" in features.column_names else [[0] * len(r) for r in ids]
    source = [chosen[i] for i in features["example_index"]]
    return Sequences(ids, types, source, _longer_than(data, task, tokenizer), task.max_length)


def _longer_than(data: Any, task: Any, tokenizer) -> int:
    """How many examples are longer than ``task.max_length`` tokens untruncated (0 for SQuAD: windows cover them)."""
    if task.type == "extractive_qa":
        return 0
    fields = list(task.text_fields)
    texts, pairs = list(data[fields[0]]), list(data[fields[1]]) if len(fields) == 2 else None
    lengths = map(len, tokenizer(texts, pairs, verbose=False)["input_ids"])
    return sum(length > task.max_length for length in lengths)


def model_max_length(tokenizer, config) -> int:
    """The longest sequence the model takes: its position embeddings, or the tokenizer's limit if lower."""
    limit = family_for(config.model_type).positions(config.to_dict())
    return tokenizer.model_max_length if limit is None else min(limit, tokenizer.model_max_length)
