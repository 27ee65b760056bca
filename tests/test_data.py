"""Tokenised classification data: cached, and every batch carries the right sentence_ids."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from test_tasks import task_cfg

from headlab.core.units import unit_ids
from headlab.tasks.batches import PaddedRows
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


def test_jobs_sharing_a_cache_wait_for_the_one_making_a_file(tokenizer, tmp_path, monkeypatch):
    """Two jobs of a parallel sweep tokenising one split: the second found the first's file written but its key not
    yet recorded, removed it, and the first's ``datasets`` read of the file it had just moved in failed
    (``FileNotFoundError``). Here the first job stops between writing its file and recording the key; the second,
    started then, must wait and read that file, not make its own."""
    import headlab.tasks.feature_cache as feature_cache

    task = task_cfg("demo_pairs")
    raw = load_task_data(task)["validation"].select(range(16))
    written, release = threading.Event(), threading.Event()
    record = feature_cache.write_json_atomic

    def first_job_pauses(path, value):
        if threading.current_thread().name == "first":
            written.set()
            release.wait(timeout=30)
        record(path, value)

    monkeypatch.setattr(feature_cache, "write_json_atomic", first_job_pauses)
    results = {}

    def job():
        results[threading.current_thread().name] = tokenize_split(raw, task, tokenizer, "sentence", tmp_path,
                                                                  "validation")

    first = threading.Thread(target=job, name="first")
    first.start()
    assert written.wait(timeout=60)
    (arrow,) = (tmp_path / "demo_pairs").glob("validation-*.arrow")
    inode = arrow.stat().st_ino
    second = threading.Thread(target=job, name="second")
    second.start()
    second.join(timeout=2)  # without the lock the second job removes the file and tokenises again by now
    assert arrow.exists() and arrow.stat().st_ino == inode
    release.set()
    first.join(timeout=60)
    second.join(timeout=60)
    assert arrow.stat().st_ino == inode and set(results) == {"first", "second"}
    assert results["second"].cache_files[0]["filename"] == str(arrow)
    assert list(results["second"]["input_ids"]) == list(results["first"]["input_ids"]) == _direct_ids(
        tokenizer, raw, task)


def test_regression_labels_are_float():
    batch = Collator(0, regression=True)([{"input_ids": [1, 2], "labels": 3.5}, {"input_ids": [1], "labels": 1.0}])
    assert batch["labels"].dtype == torch.float32 and batch["input_ids"].tolist() == [[1, 2], [1, 0]]


def _direct_ids(tokenizer, raw, task) -> list[list[int]]:
    """The input ids a plain call of ``tokenizer`` gives (no cache involved)."""
    return tokenizer(list(raw["sentence1"]), list(raw["sentence2"]), truncation=True,
                     max_length=task.max_length)["input_ids"]


def test_tokenizers_of_other_families_never_share_a_cache_file(tmp_path):
    """Every locally built tiny tokenizer has ``name_or_path=''``, and ALBERT's, DeBERTa's and XLM-R's have 202
    tokens: keyed on those, a job got another family's tokens (DeBERTa fed ALBERT's lower-cased text)."""
    from omegaconf import OmegaConf

    from headlab.core.models import load_tokenizer

    task = task_cfg("demo_pairs")
    raw = load_task_data(task)["validation"].select(range(12))
    shared = tmp_path / "shared"
    for family in ("tiny_albert", "tiny_deberta", "tiny_xlm_roberta", "tiny_distilbert", "tiny_random"):
        tokenizer = load_tokenizer(OmegaConf.load(f"conf/model/{family}.yaml"))
        cached = tokenize_split(raw, task, tokenizer, "sentence", shared, "validation")
        clean = tokenize_split(raw, task, tokenizer, "sentence", tmp_path / family, "validation")
        assert list(cached["input_ids"]) == list(clean["input_ids"]) == _direct_ids(tokenizer, raw, task), family
        assert ("token_type_ids" in cached.column_names) == ("token_type_ids" in tokenizer.model_input_names)


def test_a_tokenizer_changed_under_the_same_path_is_tokenised_again(tmp_path):
    """A saved tokenizer whose vocabulary file changes (same folder, same number of tokens) gets new features; and
    the cache records its key beside each file: a file whose record differs is made again, not trusted."""
    import json

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from headlab.core.models import load_tokenizer

    task = task_cfg("demo_pairs")
    raw = load_task_data(task)["validation"].select(range(12))
    folder, cache = tmp_path / "tokenizer", tmp_path / "cache"
    load_tokenizer(OmegaConf.load("conf/model/tiny_random.yaml")).save_pretrained(folder)
    before = AutoTokenizer.from_pretrained(folder)
    first = tokenize_split(raw, task, before, "sentence", cache, "validation")
    rules = json.loads((folder / "tokenizer.json").read_text())
    vocab = rules["model"]["vocab"]
    word = next(token for token, index in vocab.items() if index in first[0]["input_ids"] and token.isalpha()
                and len(token) > 1)
    vocab[word.upper()] = vocab.pop(word)  # its id now spells a token no lower-cased text has
    (folder / "tokenizer.json").write_text(json.dumps(rules))
    after = AutoTokenizer.from_pretrained(folder)
    assert after.name_or_path == before.name_or_path and len(after) == len(before)
    second = tokenize_split(raw, task, after, "sentence", cache, "validation")
    assert list(second["input_ids"]) == _direct_ids(after, raw, task) != list(first["input_ids"])

    path = Path(second.cache_files[0]["filename"])
    record = path.with_name(f"{path.stem}.key.json")
    assert json.loads(record.read_text())["unit"] == "sentence"
    record.write_text(record.read_text().replace('"sentence"', '"segment"'))
    mtime = path.stat().st_mtime_ns
    third = tokenize_split(raw, task, after, "sentence", cache, "validation")
    assert path.stat().st_mtime_ns != mtime and list(third["input_ids"]) == list(second["input_ids"])
    assert json.loads(record.read_text())["unit"] == "sentence"


@pytest.mark.parametrize("task_name,regression", [("demo_pairs", False), ("demo_qa", False), ("demo_pairs", True)])
def test_padded_rows_pad_each_column_as_the_definition_does(tokenizer, tmp_path, task_name, regression):
    """``PaddedRows`` batches against padding written here row by row: per-token columns to the longest row with
    their pad values, pairs ``[batch, seq, 2]``, per-row columns as ``torch.tensor`` makes them; any row order,
    repeated rows, one row, and a split seen through an index mapping (``select``)."""
    task = task_cfg(task_name)
    raw = load_task_data(task)["validation"].select(range(24))
    features = tokenize_split(raw, task, tokenizer, "sentence", tmp_path, "validation", False)
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "token_type_ids": 0, "sentence_ids": -1,
            "context_offsets": [-1, -1]}
    for data in (features, features.select([5, 3, 9, 1, 20, 2])):
        padded = PaddedRows(data, tokenizer.pad_token_id, regression)
        for rows in ([0], [4, 1, 3], [2, 2, 0, 5], list(range(len(data)))[::-1]):
            batch = padded.__getitems__(rows)
            longest = max(len(data[i]["input_ids"]) for i in rows)
            assert set(batch) == set(data.column_names)
            for name in data.column_names:
                values = [data[i][name] for i in rows]
                if name in pads:
                    expected = torch.tensor([list(v) + [pads[name]] * (longest - len(v)) for v in values])
                elif name == "labels":
                    expected = torch.tensor(values, dtype=torch.float32 if regression else torch.long)
                else:
                    expected = torch.tensor(values)
                assert batch[name].dtype == expected.dtype and torch.equal(batch[name], expected), name
    assert "context_offsets" in features.column_names or task_name != "demo_qa"


def test_a_data_file_rewritten_with_its_time_kept_is_read_anew(tmp_path):
    """``datasets`` knows a local file by its path, size and modification time: a file rewritten in place with those
    kept (``cp -p``, ``touch -r``, a sync) was read from its cache as the old rows, by a later command, and its
    features were the old ones too (the same fingerprint). Each command here is a process of its own, as a user's."""
    import json
    import os
    import sys

    from forked import run_script

    data = tmp_path / "validation.jsonl"
    script = tmp_path / "read.py"
    script.write_text(f"""
import json
from omegaconf import OmegaConf
from headlab.tasks.loading import load_task_data
task = OmegaConf.create({{"name": "mine", "type": "classification", "data_files": {{"validation": "{data}"}},
                         "text_fields": ["sentence1", "sentence2"], "label_field": "label", "num_labels": 2}})
rows = load_task_data(task, ["validation"])["validation"]
print(json.dumps([list(rows["label"]), rows._fingerprint]))
""")

    def read() -> list:
        result = run_script([sys.executable, str(script)], cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    def write(label: int) -> None:
        data.write_text("".join(json.dumps({"sentence1": f"s {i}", "sentence2": "t", "label": label}) + "\n"
                                for i in range(6)))

    write(0)
    labels, fingerprint = read()
    kept = data.stat()
    write(1)
    os.utime(data, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    assert data.stat().st_size == kept.st_size and data.stat().st_mtime_ns == kept.st_mtime_ns
    again, other = read()
    assert labels == [0] * 6 and again == [1] * 6 and other != fingerprint
