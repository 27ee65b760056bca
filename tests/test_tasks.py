"""Task configs and raw data loading from local files (no network), with the bad-input errors."""

from __future__ import annotations

import json
import logging

import pytest
from conftest import ROOT, compose_train
from hydra import compose, initialize_config_dir

from headlab.cli.schema import check_config, register_configs
from headlab.tasks.loading import load_task_data

register_configs()
GLUE = ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]


def task_cfg(name, *overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=[f"task={name}", *overrides]).task


@pytest.mark.parametrize("name", [*GLUE, "squad", "squad_v2", "demo_qa", "demo_pairs"])
def test_every_task_config_is_complete(name):
    task = task_cfg(name)
    assert task.name == name and task.main_metric in task.metrics
    assert task.type in ("classification", "regression", "extractive_qa")
    if task.type != "extractive_qa":
        assert 1 <= len(task.text_fields) <= 2
        assert (task.num_labels == 1) == (task.type == "regression")
    assert task.dataset or task.data_files
    if name == "mnli":
        assert list(task.eval_splits) == ["validation_matched", "validation_mismatched"]


def test_demo_tasks_load_from_the_package():
    qa = load_task_data(task_cfg("demo_qa"))
    assert set(qa) == {"train", "validation"} and qa["train"].column_names == ["id", "title", "context", "question",
                                                                                "answers"]
    pairs = load_task_data(task_cfg("demo_pairs"))
    assert len(pairs["train"]) == 3000 and set(pairs["validation"]["label"]) == {0, 1}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_local_glue_files_tsv_and_jsonl(tmp_path):
    rows = [{"sentence1": f"a {i}", "sentence2": f"b {i}", "label": i % 2} for i in range(6)]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    tsv = tmp_path / "dev.tsv"
    tsv.write_text("sentence1\tsentence2\tlabel\n" + "".join(f"x \"{i}\tY {i}\t{i % 2}\n" for i in range(4)))
    data = load_task_data(task_cfg("mrpc", f"task.data_files={{train: {train}, validation: {tsv}}}"))
    assert len(data["train"]) == 6 and data["validation"][0] == {"sentence1": 'x "0', "sentence2": "Y 0", "label": 0}


def test_bad_local_files(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ValueError, match=r"data file '.*nope.jsonl' for split 'train' does not exist"):
        load_task_data(task_cfg("rte", f"task.data_files={{train: {missing}, validation: {missing}}}"))
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"text": "a", "label": 0}])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['sentence1', 'sentence2'\]"):
        load_task_data(task_cfg("rte", f"task.data_files={{train: {wrong}, validation: {wrong}}}"))
    text = tmp_path / "data.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match=r"unknown format '.txt'"):
        load_task_data(task_cfg("rte", f"task.data_files={{train: {text}, validation: {text}}}"))
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": [{"paragraphs": [{"qas": [{"id": "1", "question": "q", "answers": []}]}]}]}')
    with pytest.raises(ValueError, match="is not SQuAD JSON .*KeyError.*context"):
        load_task_data(task_cfg("squad", f"task.data_files={{train: {broken}, validation: {broken}}}"))


def test_question_ids_are_unique(tmp_path):
    """Two questions with one id would share one answer in the predictions, gold answers and the official scripts:
    refused when the data loads (a hub split, a file) and before anything loads (a file, the task config)."""
    qa = {"id": "7", "question": "Who?", "answers": [{"text": "Ada", "answer_start": 0}]}
    paragraphs = [{"context": "Ada wrote it.", "qas": [qa, {**qa, "id": "8"}, {**qa, "id": 7}]}]
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
    expected = r"question id '7' is given to 2 questions \(questions 1 and 3\)"  # 7 and "7": one id to the scripts
    with pytest.raises(ValueError, match=r"task squad, split 'validation': " + expected):
        load_task_data(task_cfg("squad", f"task.data_files={{train: {twice}, validation: {twice}}}"), ["validation"])
    with pytest.raises(ValueError, match=r"data file '.*twice.json': " + expected):
        check_config(compose_train("task=demo_qa", f"task.data_files.validation={twice}"))
    paragraphs[0]["qas"][2]["id"] = "9"
    twice.write_text(json.dumps({"data": [{"title": "t", "paragraphs": paragraphs}]}))
    assert list(load_task_data(task_cfg("squad", f"task.data_files={{train: {twice}, validation: {twice}}}"),
                               ["validation"])["validation"]["id"]) == ["7", "8", "9"]


def test_questions_that_cannot_be_scored_are_refused_when_the_data_loads(tmp_path):
    """A context without text (no context token to answer from: an IndexError deep in the features), and under v1.1
    a question without a gold answer (the official v1.1 script scores none: a ValueError after the whole
    evaluation); v2 takes the latter as unanswerable. The first answer only decides whether training keeps a
    question (the span it reads)."""
    qa = {"id": "1", "question": "Who?", "answers": [{"text": "Ada", "answer_start": 0}]}
    path = tmp_path / "data.json"

    def load(version, *qas, context="Ada wrote it.", split="validation"):
        path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": list(qas)}]}]}))
        files = f"task.data_files={{train: {path}, validation: {path}}}"
        task = task_cfg("squad_v2" if version == "v2" else "squad", files)
        return load_task_data(task, [split])[split]

    with pytest.raises(ValueError, match=r"split 'validation': question 1 \(id '1'\) has a context without text"):
        load("v2", qa | {"answers": []}, context=" \n ")
    with pytest.raises(ValueError, match=r"question 2 \(id '2'\) has no gold answer; SQuAD v1.1"):
        load("v1", qa, qa | {"id": "2", "answers": []})
    assert len(load("v2", qa, qa | {"id": "2", "answers": []})) == 2
    second_misplaced = qa | {"id": "2", "answers": [*qa["answers"], {"text": "Ada", "answer_start": 5}]}
    first_misplaced = qa | {"id": "3", "answers": [{"text": "Ada", "answer_start": 4}]}
    assert list(load("v1", qa, second_misplaced, first_misplaced, split="train")["id"]) == ["1", "2"]


def test_labels_out_of_range_and_empty_split(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [{"sentence": "a", "label": 1}])
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"sentence": "a", "label": 0}, {"sentence": "b", "label": 2}])
    with pytest.raises(ValueError, match=r"split 'validation': 1 label\(s\) outside 0..1, e.g. row 2 has label 2"):
        load_task_data(task_cfg("sst2", f"task.data_files={{train: {good}, validation: {bad}}}"))
    empty = tmp_path / "empty.json"
    empty.write_text('{"version": "1.1", "data": []}')
    squad_ok = ROOT / "src/headlab/tasks/data/demo_qa/validation.json"
    with pytest.raises(ValueError, match="split 'train' is empty"):
        load_task_data(task_cfg("squad", f"task.data_files={{train: {empty}, validation: {squad_ok}}}"))


def test_misaligned_squad_answers_are_skipped_and_counted(tmp_path, caplog):
    data = {"data": [{"title": "t", "paragraphs": [{"context": "Ada was born in Oslo.", "qas": [
        {"id": "1", "question": "Where?", "answers": [{"text": "Oslo", "answer_start": 16}]},
        {"id": "2", "question": "Who?", "answers": [{"text": "Ada", "answer_start": 3}]},
    ]}]}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        loaded = load_task_data(task_cfg("squad", f"task.data_files={{train: {path}, validation: {path}}}"))
    assert loaded["train"]["id"] == ["1"] and loaded["validation"]["id"] == ["1", "2"]
    assert "skipped 1 of 2 questions" in caplog.text


LOCAL_FILES = {  # name -> contents: files a user may hand a GLUE-style pair task
    "good.jsonl": '{"sentence1": "a", "sentence2": "b", "label": 0}\n\n'
                  '{"sentence1": "c", "sentence2": "", "label": 1}\n',
    "no_field.jsonl": '{"sentence1": "a", "sentence2": "b", "label": 0}\n{"sentence1": "c", "label": 1}\n',
    "null_text.jsonl": '{"sentence1": "a", "sentence2": null, "label": 0}\n',
    "number_text.jsonl": '{"sentence1": "a", "sentence2": 5, "label": 0}\n',
    "no_column.jsonl": '{"sentence1": "a", "label": 0}\n',
    "not_json.jsonl": '{"sentence1": "a", "sentence2": "b", "label": 0}\n{"sentence1": \n',
    "good.csv": 'sentence1,sentence2,label\na,"b, c",0\nd,e,1\n',
    "empty_field.csv": "sentence1,sentence2,label\na,b,0\nc,,1\n",
    "short_row.csv": "sentence1,sentence2,label\na,b,0\nc\n",
    "na_text.csv": "sentence1,sentence2,label\na,NA,0\n",  # pandas reads NA as missing: found after loading
    "good.tsv": 'sentence1\tsentence2\tlabel\nx "0\tY\t0\n\nz\tw\t1\n',
    "good_multiline.csv": 'sentence1,sentence2,label\n"two\nlines",b,0\n\nc,d,1\n',
    "no_column.tsv": "sentence1\tlabel\nx\t0\n",
    "empty_field.tsv": "sentence1\tsentence2\tlabel\nx\t\t0\n",
    "bool_beside_number.jsonl": '{"sentence1": "a", "sentence2": "b", "label": 0}\n'
                                '{"sentence1": "c", "sentence2": "d", "label": true}\n',
    "good_bom.csv": "\ufeffsentence1,sentence2,label\na,b,0\n",  # UTF-8 with a BOM: what spreadsheets write
    "good_bom.tsv": "\ufeffsentence1\tsentence2\tlabel\na\tb\t0\n",
}


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_a_file_with_a_byte_order_mark_loads_as_the_same_file_without(tmp_path, suffix):
    """The BOM was read as part of the first column's name: "lacks column sentence1", though ``datasets`` reads it
    (and JSON lines: "line 1: Unexpected UTF-8 BOM")."""
    sep = "," if suffix == ".csv" else "\t"
    text = f"sentence1{sep}sentence2{sep}label\nthe cat{sep}a dog{sep}1\n" if suffix != ".jsonl" else \
        '{"sentence1": "the cat", "sentence2": "a dog", "label": 1}\n'
    loaded = []
    for name, content in (("plain", text), ("bom", "\ufeff" + text)):
        path = tmp_path / f"{name}{suffix}"
        path.write_bytes(content.encode("utf-8"))
        loaded.append(load_task_data(task_cfg("rte", f"task.data_files={{train: {path}, validation: {path}}}"))["train"]
                      .to_list())
    assert loaded[0] == loaded[1] == [{"sentence1": "the cat", "sentence2": "a dog", "label": 1}]


@pytest.mark.parametrize("name", sorted(LOCAL_FILES))
def test_the_check_before_imports_refuses_a_local_file_only_as_loading_does(tmp_path, name):
    """``tasks/local_files.py`` (plain rows, before ``datasets`` loads) refuses a file with the very message the
    load through ``datasets`` gives, and refuses nothing that loads; what it cannot see (pandas' NA) the load finds."""
    from headlab.errors import UserError
    from headlab.tasks.local_files import check_text_file, count_rows

    path = tmp_path / name
    path.write_text(LOCAL_FILES[name])
    try:
        check_text_file(path, "rte", ["sentence1", "sentence2"], "label")
        early = None
    except UserError as error:
        early = str(error)
    try:
        loaded = load_task_data(task_cfg("rte", f"task.data_files={{train: {path}, validation: {path}}}"))
        late = None
        assert count_rows(path) == len(loaded["train"])  # what val_check_interval is checked against before loading
    except UserError as error:
        late = str(error)
    if name.startswith("good"):
        assert early is None and late is None, (early, late)
    elif name == "not_json.jsonl":
        assert "could not be read as .jsonl: line 2" in early and "could not be read as .jsonl" in late
    elif name == "na_text.csv":
        assert early is None and "row 1 has no text in 'sentence2'" in late
    else:
        assert early is not None and early == late, (early, late)


def test_squad_json_with_a_byte_order_mark_loads_and_checks_as_without(tmp_path):
    """A SQuAD JSON file with a BOM (some editors write one) was "not SQuAD JSON (Unexpected UTF-8 BOM)", as task data
    and as a paired file of patching; the same file without the BOM loads and checks the same."""
    from headlab.tasks.local_files import check_paired_squad, check_squad_file, count_questions

    source = ROOT / "src/headlab/tasks/data/demo_qa/validation.json"
    loaded = []
    for name, mark in (("plain", b""), ("bom", "\ufeff".encode())):
        path = tmp_path / f"{name}.json"
        path.write_bytes(mark + source.read_bytes())
        check_squad_file(path, "demo_qa", "v1")
        loaded.append(load_task_data(task_cfg("demo_qa", f"task.data_files={{train: {path}, validation: {path}}}"))
                      ["validation"].to_list())
        assert count_questions(path) == len(loaded[-1])
    assert loaded[0] == loaded[1] and len(loaded[0]) > 100
    pairs = ROOT / "src/headlab/tasks/data/demo_qa/patch.json"
    (tmp_path / "pairs_bom.json").write_bytes("\ufeff".encode() + pairs.read_bytes())
    assert check_paired_squad(tmp_path / "pairs_bom.json", "demo_qa") == check_paired_squad(pairs, "demo_qa")
