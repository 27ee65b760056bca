"""Clean and corrupted inputs of the same examples, tokenised alike and served as paired batches.

A paired data file is a task's data file whose rows also carry ``corrupt_<field>`` texts (the counterfactual source
of each example, for some of the task's text fields) and may carry ``corrupt_<label>``, the label the corrupted text
has. The corrupted rows are the clean ones with those fields replaced, tokenised by the same code and settings; each
example's two encodings must have the same length, since a patch moves an activation from a position of one run to
the same position of the other, and, for ``patch.positions=units``, the same unit layout (``sentence_ids``; at
``all`` and ``each`` the units play no part): otherwise a one-line error names the example. A paired SQuAD file's
questions carry ``corrupt_question`` and / or ``corrupt_context`` and ``corrupt_answers``; each question is scored on
one window, the first that holds both answers. ``PairedRows`` serves batches with the clean columns and the corrupted
ones as ``corrupt_<column>``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from headlab.core.models import load_tokenizer
from headlab.errors import UserError
from headlab.tasks.batches import PaddedRows, column_values
from headlab.tasks.encoding import tokenize_split

# what a corrupted batch adds, as corrupt_<column> (QA: the corrupted answer's span in each window)
PAIRED_COLUMNS = ("input_ids", "token_type_ids", "labels", "start_positions", "end_positions")
QA_FIELDS = ["question", "context"]  # the text fields of extractive QA


def corrupted_fields(columns: list[str], text_fields: list[str]) -> list[str]:
    return [field for field in text_fields if f"corrupt_{field}" in columns]


def corrupted_features(data: Any, split: str, model_cfg: Any, units: bool = False) -> tuple[Any, Any, bool]:
    """The clean and corrupted features of ``data``'s eval split (a ``TaskDataModule`` after ``setup``), the corrupted
    rows tokenised as the clean ones are and checked against them (module docstring; ``units``: their unit layouts
    too, for patches by unit), and whether they carry their own labels. Extractive QA: one window per question, the
    first holding both its answer and the corrupted answer (``corrupt_answers``), whose span scores the logit
    difference compares; questions without one are left out."""
    task, raw = data.task, data.eval_examples[split]
    qa = task.type == "extractive_qa"
    fields = corrupted_fields(raw.column_names, QA_FIELDS if qa else list(task.text_fields))
    if not fields:
        raise UserError(f"task {task.name}, split {split!r}: no corrupt_<field> column; patching needs the corrupted "
                        f"text of some of {', '.join(QA_FIELDS if qa else task.text_fields)} per example "
                        "(patch.pairs=FILE)")
    target = "answers" if qa else task.label_field
    label = f"corrupt_{target}"

    def corrupt(row: dict) -> dict:
        out = {field: row[f"corrupt_{field}"] for field in fields}
        return out | ({target: row[label]} if label in row else {})

    corrupted = raw.map(corrupt, desc=f"corrupted {task.name}/{split}")
    tokenizer = load_tokenizer(model_cfg)
    features = tokenize_split(corrupted, task, tokenizer, data.unit, data.cache_dir, f"{split}.corrupted", False,
                              data.tokenizer_digest)
    clean = data.eval_features[split]
    what = "question" if qa else "row"
    check_alike(clean, features, split, what, units)
    if qa:
        clean, features = answer_windows(clean, features, split)
    check_different(clean, features, split, what)
    return clean, features, label in raw.column_names


def answer_windows(clean: Any, corrupted: Any, split: str) -> tuple[Any, Any]:
    """Per question, its first window holding both the clean answer and the corrupted one (a span past [CLS] in
    both): the clean and corrupted features of those windows."""
    questions = column_values(clean, "example_index")
    starts, corrupted_starts = column_values(clean, "start_positions"), column_values(corrupted, "start_positions")
    chosen, seen = [], set()
    for row, (question, start, corrupted_start) in enumerate(zip(questions, starts, corrupted_starts)):
        if question not in seen and start > 0 and corrupted_start > 0:
            seen.add(question)
            chosen.append(row)
    if not chosen:
        raise UserError(f"split {split!r}: no question has a window holding both its answer and its corrupted answer "
                        "(answers past the window's end, or unanswerable questions); nothing to score")
    return clean.select(chosen), corrupted.select(chosen)


def check_alike(clean: Any, corrupted: Any, split: str, what: str = "row", units: bool = True) -> None:
    """One line naming the first example (``what`` N of the split, from 1) whose two encodings differ in their windows
    (SQuAD), length or (``units``) unit layout."""
    examples, other = column_values(clean, "example_index"), column_values(corrupted, "example_index")
    if examples != other:  # a SQuAD question cut into another number of windows
        feature = next((i for i, (a, b) in enumerate(zip(examples, other)) if a != b), min(len(examples), len(other)))
        first = min(x[feature] for x in (examples, other) if feature < len(x))  # the question whose windows differ
        counts = examples.count(first), other.count(first)
        raise UserError(f"split {split!r} {what} {first + 1}: the clean and corrupted inputs make {counts[0]} and "
                        f"{counts[1]} windows; position-wise patching needs the same windows (the same lengths)")
    for name in ("input_ids", "sentence_ids") if units else ("input_ids",):
        left, right = column_values(clean, name), column_values(corrupted, name)
        for feature, (a, b) in enumerate(zip(left, right)):
            where = f"split {split!r} {what} {examples[feature] + 1}"
            if len(a) != len(b):
                raise UserError(f"{where}: the clean and corrupted inputs tokenise to {len(a)} and {len(b)} tokens; "
                                "position-wise patching needs the same length (make the corrupted text's words "
                                "tokenise as the clean ones do)")
            if name == "sentence_ids" and a != b:
                token = next(t for t, (x, y) in enumerate(zip(a, b)) if x != y)
                raise UserError(f"{where}: the clean and corrupted inputs have another unit layout from token {token} "
                                f"on (unit {a[token]} against {b[token]}); patch.positions=units needs the same units "
                                "at the same positions (a text cut at task.max_length keeps its length but not its "
                                "units); patch.positions=all or each do not")


def check_different(clean: Any, corrupted: Any, split: str, what: str = "row") -> None:
    """One line naming the first example whose corrupted input (its scored window, SQuAD) tokenises as its clean one
    does: nothing to patch there, and its logit difference would be the same in every run."""
    left, right = column_values(clean, "input_ids"), column_values(corrupted, "input_ids")
    same = [i for i, (a, b) in enumerate(zip(left, right)) if a == b]
    if len(same) == len(left):
        raise UserError(f"split {split!r}: every example's corrupted text tokenises as its clean text does "
                        f"({len(left)} examples); there is no difference to patch (check the corrupt_<field> "
                        "columns)")
    if same:
        example = column_values(clean, "example_index")[same[0]]
        raise UserError(f"split {split!r} {what} {example + 1}: the corrupted text tokenises as the clean text does "
                        f"({len(same)} of {len(left)} examples do); nothing to patch there: correct or remove them")


class PairedRows(torch.utils.data.Dataset):
    """``PaddedRows`` of the clean rows, with the corrupted rows' ``PAIRED_COLUMNS`` as ``corrupt_<column>``; the
    same lengths, so one padding serves both. Use with ``collate_fn=batches.collated``."""

    def __init__(self, clean: Any, corrupted: Any, pad_token_id: int, regression: bool = False,
                 labelled: bool = False):
        """``labelled``: the corrupted rows carry their own labels (``corrupt_labels``)."""
        self.clean = PaddedRows(clean, pad_token_id, regression)
        columns = [c for c in PAIRED_COLUMNS if c in corrupted.column_names and (labelled or c != "labels")]
        self.corrupted = PaddedRows(corrupted.select_columns(columns), pad_token_id, regression)

    def __len__(self) -> int:
        return len(self.clean)

    def __getitems__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        batch = self.clean.__getitems__(rows)
        batch |= {f"corrupt_{name}": values for name, values in self.corrupted.__getitems__(rows).items()}
        return batch

    def units(self) -> int:
        """How many units the longest row has (unit ids count from 0; -1 marks special tokens)."""
        return int(self.clean.tokens["sentence_ids"].max()) + 1

    def lengths(self) -> np.ndarray:
        """Tokens per row (``[rows]``): batches of rows of similar lengths."""
        return np.diff(self.clean.offsets)
