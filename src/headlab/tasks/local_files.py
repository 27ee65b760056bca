"""A task's local data file checked before anything heavy loads. GLUE-style (JSON lines, CSV, TSV), read as plain
rows: the columns the task names and a text in every row, with the messages that ``loading`` gives after ``datasets``
has read the file; what ``datasets`` would refuse beyond this (labels, values pandas reads as missing such as ``NA``)
is still found there, and nothing refused here would load there. SQuAD JSON: its fields and questions that can be
scored (unique ids, a context, a gold answer under v1.1)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from headlab.errors import UserError

CHECKED = (".jsonl", ".csv", ".tsv")


def missing_columns(path: Path, task_name: str, expected: list[str], columns: list[str]) -> UserError | None:
    missing = [c for c in expected if c not in columns]
    if not missing:
        return None
    return UserError(f"data file {str(path)!r} lacks column(s) {missing}; task {task_name} expects columns {expected}, "
                     f"the file has {columns}")


def no_text(path: Path, task_name: str, row: int, field: str, text_fields: list[str]) -> UserError:
    return UserError(f"data file {str(path)!r} row {row} has no text in {field!r} (task {task_name} needs "
                     f"{', '.join(text_fields)} in every row)")


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    """``(columns, rows)``; a field a row lacks, or an empty CSV/TSV field (pandas: missing), is absent."""
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise UserError(f"data file {str(path)!r} could not be read as .jsonl: line {number}: "
                                    f"{error.msg}") from None
                if not isinstance(row, dict):
                    raise UserError(f"data file {str(path)!r} could not be read as .jsonl: line {number} is not an "
                                    "object")
                rows.append(row)
        columns = list(dict.fromkeys(key for row in rows for key in row))
        return columns, rows
    records = [values for values in _csv_rows(path) if values]  # pandas skips blank lines
    columns = records[0] if records else []
    return columns, [{key: value for key, value in zip(columns, values) if value != ""} for values in records[1:]]


def _csv_rows(path: Path) -> list[list[str]]:
    options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if path.suffix == ".tsv" else {}
    with path.open(newline="", encoding="utf-8-sig") as file:  # a BOM (spreadsheets write one) is not a column
        return list(csv.reader(file, **options))


def check_text_file(path: str | Path, task_name: str, text_fields: list[str], label_field: str,
                    cluster_field: str | None = None) -> None:
    """The file's columns (``cluster_field`` too, when given) and texts, for the suffixes in ``CHECKED`` (others are
    left to ``datasets``)."""
    path = Path(path)
    if path.suffix not in CHECKED:
        return
    try:
        columns, rows = _rows(path)
    except (UnicodeDecodeError, csv.Error) as error:
        raise UserError(f"data file {str(path)!r} could not be read as {path.suffix}: {error}") from None
    if not rows:
        raise UserError(f"data file {str(path)!r} has no rows; task {task_name} needs rows with "
                        f"{', '.join([*text_fields, label_field])}")
    error = missing_columns(path, task_name, [*text_fields, label_field, *([cluster_field] if cluster_field else [])],
                            columns)
    if error:
        raise error
    for field in text_fields:
        empty = next((number for number, row in enumerate(rows, start=1) if not isinstance(row.get(field), str)), None)
        if empty is not None:
            raise no_text(path, task_name, empty, field, text_fields)
    check_label_kinds(path, rows, label_field)
    missing = next((number for number, row in enumerate(rows, start=1) if row.get(cluster_field) in (None, "")),
                   None) if cluster_field else None
    if missing is not None:  # its rows would all read as one cluster ("None"): every interval too narrow or wide
        raise UserError(f"data file {str(path)!r} row {missing} has no value in {cluster_field!r} "
                        f"(task.cluster_field: the rows sampled together share one; every row needs it)")


def check_label_kinds(path: Path, rows: list[dict], label_field: str) -> None:
    """A ``UserError`` naming the first row whose label (or ``corrupt_<label>``) is a JSON boolean beside numbers,
    or a number beside booleans: ``datasets`` reads such a column as text, which fails in the first batch."""
    for field in (label_field, f"corrupt_{label_field}"):
        kinds = [isinstance(row.get(field), bool) for row in rows if field in row]
        if any(kinds) and not all(kinds):
            number = next(n for n, row in enumerate(rows, start=1) if field in row and
                          isinstance(row[field], bool) != kinds[0])
            raise UserError(f"data file {str(path)!r} row {number}: {field}={rows[number - 1][field]!r} beside "
                            f"rows whose {field} is {'a boolean' if kinds[0] else 'a number'}: write every label as "
                            "a class number (0, 1, ...)")


def check_paired_file(path: str | Path, task_name: str, text_fields: list[str], label_field: str,
                      num_labels: int | None) -> list[str]:
    """A paired file of activation patching (``check_text_file``, plus ``corrupt_<field>`` texts for some text field
    in every row, and a ``corrupt_<label>`` that is a label of the task where given; ``num_labels`` None: regression,
    a number): the corrupted fields, in the task's order."""
    path = Path(path)
    check_text_file(path, task_name, text_fields, label_field)
    columns, rows = _rows(path)
    known = [f"corrupt_{field}" for field in (*text_fields, label_field)]
    unknown = [column for column in columns if column.startswith("corrupt_") and column not in known]
    if unknown:  # a misspelt field would leave that text clean, and the effects of another corruption
        raise UserError(f"data file {str(path)!r} has column(s) {unknown}, which name no field of task {task_name}; "
                        f"the corrupted texts and label are {', '.join(known)}")
    corrupted = [field for field in text_fields if f"corrupt_{field}" in columns]
    if not corrupted:
        raise UserError(f"data file {str(path)!r} has no corrupt_<field> column; patching needs, per example, the "
                        f"corrupted text of some of task {task_name}'s fields "
                        f"({', '.join('corrupt_' + f for f in text_fields)}); the file has {columns}")
    for field in corrupted:
        empty = next((n for n, row in enumerate(rows, start=1) if not isinstance(text := row.get(f"corrupt_{field}"),
                                                                                str) or not text.strip()), None)
        if empty is not None:
            raise no_text(path, task_name, empty, f"corrupt_{field}", [f"corrupt_{f}" for f in corrupted])
    label = f"corrupt_{label_field}"
    for number, row in enumerate(rows, start=1):
        if label in columns and not _is_label(row.get(label), num_labels):
            allowed = f"a class 0..{num_labels - 1}" if num_labels else "a number"
            raise UserError(f"data file {str(path)!r} row {number}: {label}={row.get(label)!r} is not {allowed} of "
                            f"task {task_name} (the label of the corrupted text; leave the column out to contrast with "
                            "the class the model predicts on it)")
        if label in columns and num_labels and _same_class(row.get(label), row.get(label_field)):
            raise UserError(f"data file {str(path)!r} row {number}: {label}={row.get(label)!r} is the row's "
                            f"{label_field}; the logit difference of a class against itself is 0 in every run (give "
                            "the corrupted text's own label, or leave the column out)")
    return corrupted


def _same_class(left, right) -> bool:
    """Whether two labels (``0``, ``0.0``, ``"0"``) name one class."""
    try:
        return float(left) == float(right)
    except (TypeError, ValueError):
        return False


def _is_label(value, num_labels: int | None) -> bool:
    """A class in ``0..num_labels - 1`` (a JSON number or a CSV field that reads as a whole one: ``1.0`` is class 1,
    as the task's own labels read), or for ``num_labels`` None a finite number."""
    if isinstance(value, bool) or value is None:
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    if num_labels is None:
        return math.isfinite(number)
    return number.is_integer() and 0 <= number < num_labels


def file_rows(path: str | Path) -> list[dict]:
    """The rows of a JSON-lines, CSV or TSV file as ``datasets`` reads them (blank lines skipped)."""
    return _rows(Path(path))[1]


def count_rows(path: str | Path) -> int | None:
    """The rows ``datasets`` reads from a JSON-lines, CSV or TSV file (blank lines skipped); None for others."""
    path = Path(path)
    if path.suffix not in CHECKED:
        return None
    return len(file_rows(path))


def count_questions(path: str | Path) -> int | None:
    """The questions of a SQuAD JSON file (``loading.read_squad_json``'s rows, before a training split drops those
    whose answer is not at its start); None for a file that is not SQuAD JSON (its loading says why)."""
    try:
        articles = json.loads(Path(path).read_text(encoding="utf-8-sig"))["data"]
        return sum(len(paragraph["qas"]) for article in articles for paragraph in article["paragraphs"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        return None


SQUAD_SHAPE = ('{"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": '
               '[{"text", "answer_start"}]}]}]}]}')


def not_squad(path: str | Path, error: Exception) -> UserError:
    return UserError(f"data file {str(path)!r} is not SQuAD JSON ({type(error).__name__}: {error}); expected "
                     f"{SQUAD_SHAPE}")


def check_squad_file(path: str | Path, task_name: str, version: str) -> None:
    """A SQuAD JSON data file before anything heavy loads: the fields ``loading.squad_dataset`` reads, a question at
    least, and questions that can be scored (``squad_questions_error``)."""
    try:
        articles = json.loads(Path(path).read_text(encoding="utf-8-sig"))["data"]
        questions = [(paragraph["context"], qa) for article in articles for paragraph in article["paragraphs"]
                     for qa in paragraph["qas"]]
        ids = [str(qa["id"]) for _, qa in questions]
        for context, qa in questions:  # what squad_dataset reads of each question (KeyError, TypeError, ValueError)
            qa["question"], [(answer["text"], int(answer["answer_start"])) for answer in qa["answers"]]
            if not isinstance(context, str):
                raise TypeError(f"a context is {type(context).__name__}, not text")
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise not_squad(path, error) from None
    if not ids:
        raise UserError(f"data file {str(path)!r} has no question; task {task_name} expects {SQUAD_SHAPE}")
    error = squad_questions_error(f"data file {str(path)!r}", ids, [context for context, _ in questions],
                                  [len(qa["answers"]) > 0 for _, qa in questions], version)
    if error:
        raise error


def squad_questions_error(where: str, ids: list[str], contexts: list[str], answered: list[bool],
                          version: str) -> UserError | None:
    """The first thing that keeps a split's questions from being scored, as an error naming ``where`` (the data they
    are from), or None: an id two questions share (predictions, gold answers and the official scripts key questions
    by id, so they would share one answer); a context without text (nothing to answer from); under SQuAD v1.1 a
    question without a gold answer (the official v1.1 script scores each against its answers; v2 takes them as
    unanswerable)."""
    first: dict[str, int] = {}
    for number, question_id in enumerate(ids, start=1):
        if question_id in first:
            count = ids.count(question_id)
            return UserError(f"{where}: question id {question_id!r} is given to {count} questions (questions "
                             f"{first[question_id]} and {number}{' and more' if count > 2 else ''}); each question "
                             "needs an id of its own (answers are keyed by id, as in the official SQuAD scripts)")
        first[question_id] = number
    for number, (question_id, context, has_answer) in enumerate(zip(ids, contexts, answered), start=1):
        if not context.strip():
            return UserError(f"{where}: question {number} (id {question_id!r}) has a context without text; a "
                             "question is answered from its context")
        if version == "v1" and not has_answer:
            return UserError(f"{where}: question {number} (id {question_id!r}) has no gold answer; SQuAD v1.1 scores "
                             "each question against its answers (task.version=v2 takes unanswerable questions)")
    return None


PAIRED_SQUAD_FIELDS = ("corrupt_question", "corrupt_context")  # a paired SQuAD question's corrupted texts


def check_paired_squad(path: str | Path, task_name: str, version: str = "v1") -> list[str]:
    """A paired SQuAD JSON file of activation patching: every question has an answer in its context, the same
    ``corrupt_question`` and / or ``corrupt_context`` fields as the others, and ``corrupt_answers`` whose first answer
    is where it says in the corrupted context (the span the corrupted run's score is read at). The corrupted fields.
    Under ``version="v2"`` a question without answers is SQuAD v2's unanswerable one: no span to score, so the job
    leaves it out with a note (``paired_data.answer_windows``); its corrupted texts are still checked."""
    path = Path(path)
    try:
        questions = [(paragraph["context"], qa) for article in json.loads(path.read_text(encoding="utf-8-sig"))["data"]
                     for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise UserError(f"data file {str(path)!r} is not SQuAD JSON ({type(error).__name__}: {error}); a paired "
                        "file is SQuAD JSON whose questions also carry corrupt_question and / or corrupt_context and "
                        "corrupt_answers") from None
    if not questions:
        raise UserError(f"data file {str(path)!r} has no question")
    fields = [field for field in PAIRED_SQUAD_FIELDS if field in questions[0][1]]
    if not fields:
        raise UserError(f"data file {str(path)!r} question 1 (id {questions[0][1].get('id')!r}) has no corrupted text; "
                        "patching needs SQuAD JSON with corrupt_question / corrupt_context and corrupt_answers per "
                        f"question (task {task_name}; docs/patching.md)")
    known = (*PAIRED_SQUAD_FIELDS, "corrupt_answers")
    for number, (context, qa) in enumerate(questions, start=1):
        where = f"data file {str(path)!r} question {number} (id {qa.get('id')!r})"
        unknown = [key for key in qa if str(key).startswith("corrupt_") and key not in known]
        if unknown:  # a misspelt field would leave that text clean
            raise UserError(f"{where} has {unknown}, which name no field of a paired SQuAD question; the corrupted "
                            f"fields are {', '.join(known)}")
        mine = [field for field in PAIRED_SQUAD_FIELDS if field in qa]
        if not mine or mine != fields:
            raise UserError(f"{where} has corrupted fields {mine}, the first question {fields}; patching needs the "
                            f"same of {', '.join(PAIRED_SQUAD_FIELDS)} on every question (task {task_name})")
        empty = next((field for field in mine if not isinstance(qa[field], str) or not qa[field].strip()), None)
        if empty:
            raise UserError(f"{where} has no text in {empty!r}")
        if version == "v2" and not qa.get("answers"):
            continue  # unanswerable: left out of the scores, with a note
        spans = []
        for name, text in (("answers", context), ("corrupt_answers", qa.get("corrupt_context", context))):
            answer = _first_answer(qa.get(name))
            if answer is None:
                raise UserError(f"{where} has no {name} (a list of {{text, answer_start}}); patching reads the clean "
                                "answer's span score against the corrupted answer's")
            start, said = answer
            if text[start : start + len(said)] != said:
                which = "corrupted" if name == "corrupt_answers" else "clean"
                raise UserError(f"{where}: {name} {said!r} is not at character {start} of the {which} context (it "
                                f"reads {text[start : start + len(said)]!r})")
            spans.append((start, start + len(said)))
        if spans[0] == spans[1]:
            raise UserError(f"{where}: corrupt_answers is at the clean answer's characters {spans[0][0]}..{spans[0][1]}"
                            "; the logit difference compares two spans' scores and would be 0 in every run (give the "
                            "answer the corrupted input has, elsewhere in the context)")
    return fields


def _first_answer(answers) -> tuple[int, str] | None:
    """``(answer_start, text)`` of a SQuAD answer list's first answer, or None if it has none (or is malformed)."""
    try:
        first = answers[0]
        start, text = int(first["answer_start"]), first["text"]
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    return (start, text) if isinstance(text, str) and text and start >= 0 else None
