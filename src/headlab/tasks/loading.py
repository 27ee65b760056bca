"""Raw task data through HF ``datasets``: from the hub by name, or local files in the same format.

A task config (``conf/task/*.yaml``) names the dataset, its text fields, labels and metrics.
``load_task_data`` returns a ``DatasetDict`` with the train split and every eval split, checked:
a missing or malformed file, an empty split or a label outside the task's range is a
``ValueError`` naming the file or split and what was expected. SQuAD answers whose text does
not stand in the context at ``answer_start`` are dropped from training splits with a logged count
(what the official preprocessing would mis-train on); in eval splits only the text is scored.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import datasets

from headlab.errors import UserError, not_a_file
from headlab.files import config_hash, file_digest
from headlab.tasks.hub_data import BUNDLED, bundled_offline, check_hub_dataset, not_found
from headlab.tasks.local_files import (
    check_label_kinds,
    file_rows,
    missing_columns,
    no_text,
    not_squad,
    squad_questions_error,
)
from headlab.tasks.registry import TASK_TYPES

log = logging.getLogger(__name__)

SQUAD_COLUMNS = ("id", "title", "context", "question", "answers")
_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".tsv": "csv"}


def task_splits(task: Any) -> list[str]:
    return [task.train_split, *task.eval_splits]


def load_task_data(task: Any, splits: list[str] | None = None) -> datasets.DatasetDict:
    """The task's splits (default: train and eval splits), validated."""
    if task.type not in TASK_TYPES:
        raise UserError(f"task {task.name}: unknown type {task.type!r}; valid types: {', '.join(TASK_TYPES)}")
    splits = splits or task_splits(task)
    if task.get("data_files"):
        data = datasets.DatasetDict({split: _load_local(task, split) for split in splits})
    elif task.get("dataset"):
        check_hub_dataset(task.name, task.dataset, task.get("subset"), splits)
        loaded = _load_hub_dataset(task)
        missing = [s for s in splits if s not in loaded]
        if missing:
            raise UserError(f"dataset {task.dataset} has no split(s) {missing}; it has {list(loaded)}")
        data = datasets.DatasetDict({split: loaded[split] for split in splits})
    else:
        raise UserError(f"task {task.name} names neither a hub dataset (task.dataset) nor task.data_files")
    for split, dataset in data.items():
        if len(dataset) == 0:
            raise UserError(f"task {task.name}: split {split!r} is empty")
        if task.type == "extractive_qa":
            data[split] = _check_answers(task, dataset, split, training=split == task.train_split)
        else:
            _check_labels(task, dataset, split)
    return data


def _load_hub_dataset(task: Any) -> datasets.DatasetDict:
    if bundled_offline(task.dataset, task.get("subset")):
        from headlab.tasks.squad_articles import DATA_DIR, development_set

        folder = DATA_DIR / BUNDLED[task.dataset][0]
        log.info("offline: task %s's validation split is the bundled development set (%s, both parts)", task.name,
                 folder)
        return datasets.DatasetDict({"validation": squad_dataset(development_set(folder), folder)})
    try:
        return datasets.load_dataset(task.dataset, task.get("subset"))
    except (ConnectionError, FileNotFoundError) as error:  # offline, unreachable, or no such dataset
        raise not_found(task.name, task.dataset, type(error).__name__) from None


def _load_local(task: Any, split: str) -> datasets.Dataset:
    files = task.data_files
    if split not in files:
        raise UserError(f"task {task.name}: data_files has no {split!r} file; it has {list(files)}")
    path = Path(files[split])
    if not path.is_file():
        raise UserError(f"task {task.name}: data file {str(path)!r} for split {split!r} {not_a_file(path)}")
    if task.type == "extractive_qa":
        return read_squad_json(path)
    builder = _BUILDERS.get(path.suffix)
    if builder is None:
        raise UserError(f"data file {str(path)!r}: unknown format {path.suffix!r}; expected {', '.join(_BUILDERS)}")
    options = {"delimiter": "\t", "quoting": 3} if path.suffix == ".tsv" else {}
    if not path.read_bytes().strip():
        raise UserError(f"task {task.name}: data file {str(path)!r} for split {split!r} is empty")
    if path.suffix == ".jsonl":
        check_label_kinds(path, file_rows(path), task.label_field)
    digest = file_digest(path)
    try:
        dataset = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=_content_cache(digest),
                                        **options)
    except Exception as error:  # the builders raise many kinds; the file is what matters here
        raise UserError(f"data file {str(path)!r} could not be read as {path.suffix}: {error}") from None
    # the fingerprint (what the features cache is keyed by) of the content, not of the path and its time
    dataset = dataset.remove_columns([], new_fingerprint=config_hash([dataset._fingerprint, digest]))
    error = missing_columns(path, task.name, [*task.text_fields, task.label_field], dataset.column_names)
    if error:
        raise error
    for field in task.text_fields:  # a row without the field (JSON lines) or an empty CSV field reads as None
        empty = next((row for row, text in enumerate(dataset[field]) if not isinstance(text, str)), None)
        if empty is not None:
            raise no_text(path, task.name, empty + 1, field, list(task.text_fields))
    return dataset


def _content_cache(digest: str) -> str:
    """The ``datasets`` cache of a local file's content (its ``file_digest``): ``datasets`` knows a file by its path,
    size and modification time, so a file rewritten in place with its time kept (``cp -p``, ``touch -r``, a sync) was
    read from the cache as its old rows; a folder per content reads new content anew."""
    return str(Path(datasets.config.HF_DATASETS_CACHE) / "headlab-local-files" / digest)


def read_squad_json(path: str | Path) -> datasets.Dataset:
    """A SQuAD v1.1 / v2.0 JSON file as the hub's flat columns (id, title, context, question, answers)."""
    try:
        squad = json.loads(Path(path).read_text(encoding="utf-8-sig"))  # a BOM (some editors write one) is no JSON
    except json.JSONDecodeError as error:
        raise not_squad(path, error) from None
    return squad_dataset(squad, path)


def squad_dataset(squad: Any, path: str | Path) -> datasets.Dataset:
    """SQuAD JSON (read from ``path``) as the hub's flat columns; a paired file's questions (activation patching) also
    give ``corrupt_question``, ``corrupt_context`` and ``corrupt_answers`` where they have them."""
    try:
        articles = squad["data"]
        rows = [
            {
                "id": str(qa["id"]),
                "title": article.get("title", ""),
                "context": paragraph["context"],
                "question": qa["question"],
                "answers": _answers(qa["answers"]),
                **{name: qa[name] for name in ("corrupt_question", "corrupt_context") if name in qa},
                **({"corrupt_answers": _answers(qa["corrupt_answers"])} if "corrupt_answers" in qa else {}),
            }
            for article in articles
            for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise not_squad(path, error) from None
    answers = {"text": datasets.List(datasets.Value("string")),
               "answer_start": datasets.List(datasets.Value("int32"))}
    types = {"id": datasets.Value("string"), "title": datasets.Value("string"), "context": datasets.Value("string"),
             "question": datasets.Value("string"), "answers": answers, "corrupt_question": datasets.Value("string"),
             "corrupt_context": datasets.Value("string"), "corrupt_answers": answers}
    names = [name for name in types if name in SQUAD_COLUMNS or (rows and all(name in row for row in rows))]
    return datasets.Dataset.from_dict({name: [row[name] for row in rows] for name in names},
                                      features=datasets.Features({name: types[name] for name in names}))


def _answers(answers: list[dict]) -> dict[str, list]:
    return {"text": [a["text"] for a in answers], "answer_start": [int(a["answer_start"]) for a in answers]}


def _check_labels(task: Any, dataset: datasets.Dataset, split: str) -> None:
    labels = dataset[task.label_field]
    if task.type == "regression":
        return
    bad = [(i, label) for i, label in enumerate(labels) if label not in range(task.num_labels)]
    # GLUE's hub test splits carry label -1 (hidden); only labelled splits are loaded here.
    if bad:
        raise UserError(
            f"task {task.name}, split {split!r}: {len(bad)} label(s) outside 0..{task.num_labels - 1}, "
            f"e.g. row {bad[0][0] + 1} has label {bad[0][1]!r}"
        )


def _answer_matches(example: dict) -> bool:
    """Whether the first gold answer (the span training and the loss read) stands at its ``answer_start``."""
    context, answers = example["context"], example["answers"]
    if not answers["text"]:
        return True  # an unanswerable question (v2)
    text, start = answers["text"][0], answers["answer_start"][0]
    return context[start : start + len(text)] == text


def _check_answers(task: Any, dataset: datasets.Dataset, split: str, training: bool) -> datasets.Dataset:
    answered = [len(answers["text"]) > 0 for answers in dataset["answers"]]
    error = squad_questions_error(f"task {task.name}, split {split!r}", [str(i) for i in dataset["id"]],
                                  dataset["context"], answered, task.get("version", "v1"))
    if error:
        raise error
    matches = [_answer_matches(example) for example in dataset]
    bad = matches.count(False)
    if bad and training:
        log.warning("split %r: skipped %d of %d questions whose first answer text is not at its answer_start",
                    split, bad, len(dataset))
        return dataset.select([i for i, ok in enumerate(matches) if ok])
    if bad:
        log.warning("split %r: %d questions have a first answer text that is not at its answer_start (scored by "
                    "text; their loss reads the span at answer_start)",
                    split, bad)
    return dataset
