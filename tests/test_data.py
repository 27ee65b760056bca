"""Tokenised classification data: cached, and every batch carries the right sentence_ids."""

from __future__ import annotations

import torch
from test_tasks import task_cfg

from headlab.core.units import unit_ids
from headlab.tasks.encoding import Collator, tokenize_split
from headlab.tasks.loading import load_task_data


def test_batches_carry_unit_ids_equal_to_direct_encoding(tokenizer, tmp_path):
    task = task_cfg("demo_pairs")
    raw = load_task_data(task)["validation"].select(range(8))
    for unit in ("sentence", "segment"):
        data = tokenize_split(raw, task, tokenizer, unit, tmp_path, "validation")
        batch = Collator(tokenizer.pad_token_id)([data[i] for i in range(8)])
        texts, pairs = list(raw["sentence1"]), list(raw["sentence2"])
        direct = tokenizer(texts, pairs, padding=True, truncation=True, max_length=task.max_length,
                           return_offsets_mapping=True, return_tensors="pt")
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            assert torch.equal(batch[name], direct[name]), name
        assert torch.equal(batch["sentence_ids"], unit_ids(direct, texts, pairs, unit=unit))
        assert batch["labels"].tolist() == list(raw["label"])
        assert batch["sentence_ids"].max() >= (2 if unit == "sentence" else 1)


def test_tokenisation_is_cached(tokenizer, tmp_path):
    task = task_cfg("demo_pairs")
    raw = load_task_data(task)["validation"].select(range(16))
    first = tokenize_split(raw, task, tokenizer, "sentence", tmp_path, "validation")
    files = list((tmp_path / "demo_pairs").glob("validation-*.arrow"))
    assert len(files) == 1 and first.cache_files[0]["filename"] == str(files[0])
    mtime = files[0].stat().st_mtime_ns
    second = tokenize_split(raw, task, tokenizer, "sentence", tmp_path, "validation")
    assert files[0].stat().st_mtime_ns == mtime and list(second["input_ids"]) == list(first["input_ids"])
    other_unit = tokenize_split(raw, task, tokenizer, "segment", tmp_path, "validation")
    assert len(list((tmp_path / "demo_pairs").glob("validation-*.arrow"))) == 2
    assert list(other_unit["sentence_ids"]) != list(first["sentence_ids"])


def test_regression_labels_are_float():
    batch = Collator(0, regression=True)([{"input_ids": [1, 2], "labels": 3.5}, {"input_ids": [1], "labels": 1.0}])
    assert batch["labels"].dtype == torch.float32 and batch["input_ids"].tolist() == [[1, 2], [1, 0]]
