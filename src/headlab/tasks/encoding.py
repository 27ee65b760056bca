"""Tokenised task data and batches: every batch carries ``sentence_ids`` for the configured unit.

Tokenisation runs once per split, tokenizer (by content) and encoding settings: ``datasets.map`` writes its
result to an Arrow file under ``cache_dir`` named by a hash of those (``headlab.tasks.feature_cache``), and a second
run loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import torch

from headlab.core.units import UNITS_VERSION, unit_ids
from headlab.tasks.feature_cache import FEATURES_VERSION, features_file, tokenizer_digest
from headlab.tasks.squad import tokenize_squad


def _encode_texts(batch, indices, tokenizer, text_fields, label_field, max_length, unit):
    texts = batch[text_fields[0]]
    pairs = batch[text_fields[1]] if len(text_fields) == 2 else None
    enc = tokenizer(texts, pairs, truncation=True, max_length=max_length, return_offsets_mapping=True)
    units = unit_ids(enc, texts, pairs, unit=unit)  # [rows, longest row], -1 past each row's end
    out = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}
    out["sentence_ids"] = [row[: len(ids)].tolist() for row, ids in zip(units, enc["input_ids"])]
    out["labels"] = batch[label_field]
    out["example_index"] = indices  # the row of the split (per-example records)
    return out


def tokenize_split(
    dataset: datasets.Dataset, task: Any, tokenizer, unit: str, cache_dir: str | Path, split: str,
    training: bool = True, digest: str | None = None,
) -> datasets.Dataset:
    """Model inputs and ``sentence_ids`` of one split, cached on disk (``digest``: the tokenizer's
    ``tokenizer_digest``, when the caller has it).

    Classification / regression: one row per example with ``labels`` and ``example_index``.
    Extractive QA (``headlab.tasks.squad``): features with ``start_positions`` / ``end_positions``;
    evaluation features also with ``example_index`` and ``context_offsets``.
    """
    qa = task.type == "extractive_qa"
    layout = ({"doc_stride": task.doc_stride, "training": training} if qa else
              {"text_fields": list(task.text_fields), "label_field": task.label_field})
    key = {"version": FEATURES_VERSION, "task": task.name, "type": task.type, "split": split,
           "data": dataset._fingerprint, "tokenizer": digest or tokenizer_digest(tokenizer), "unit": unit,
           "units": UNITS_VERSION,
           "max_length": task.max_length, "layout": layout}
    with features_file(cache_dir, task.name, split, key) as path:
        return tokenize_squad(dataset, tokenizer, task, unit, training, str(path)) if qa else _encode_split(
            dataset, task, tokenizer, unit, str(path), split)


def _encode_split(dataset: datasets.Dataset, task: Any, tokenizer, unit: str, path: str, split: str):
    return dataset.map(
        _encode_texts,
        batched=True,
        with_indices=True,
        remove_columns=dataset.column_names,
        fn_kwargs={"tokenizer": tokenizer, "text_fields": list(task.text_fields), "label_field": task.label_field,
                   "max_length": task.max_length, "unit": unit},
        cache_file_name=path,
        load_from_cache_file=True,
        desc=f"tokenizing {task.name}/{split}",
    )


# Per-token columns and their padding values; every other column holds one number per row.
PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0, "sentence_ids": -1, "context_offsets": [-1, -1]}


@dataclass
class Collator:
    """Pads a list of tokenised rows to the longest one (dynamic padding).

    Per-token columns become ``[batch, seq]`` tensors: ``input_ids``, ``attention_mask``,
    ``token_type_ids`` (0 on padding), ``sentence_ids`` (-1 on padding), and for QA evaluation
    ``context_offsets`` ``[batch, seq, 2]`` (-1 on padding). Per-row columns (``labels``,
    ``start_positions``, ``example_index``, ...) become ``[batch]``; ``labels`` are float for
    regression.
    """

    pad_token_id: int
    regression: bool = False

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = max(len(row["input_ids"]) for row in rows)
        pad_values = {"input_ids": self.pad_token_id, **PAD_VALUES}
        batch = {}
        for name in rows[0]:
            if name in pad_values:
                pad = [pad_values[name]] * length
                batch[name] = torch.tensor([list(row[name]) + pad[len(row[name]) :] for row in rows])
            elif name == "labels":
                batch[name] = torch.tensor([row[name] for row in rows],
                                           dtype=torch.float32 if self.regression else torch.long)
            else:
                batch[name] = torch.tensor([row[name] for row in rows])
        return batch
