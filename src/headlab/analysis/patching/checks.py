"""The checks of ``mode=patch``: no weights read, no torch imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headlab.analysis.jobs.checks import check_evaluation
from headlab.errors import UserError
from headlab.tasks.local_files import CHECKED, check_paired_file


def check_patch(cfg: Any) -> None:
    """The full model (no plan), a classification or regression task, and paired data with corrupt_<field> texts."""
    plan = check_evaluation(cfg)
    task = cfg.task
    if not plan.is_identity:
        raise UserError(f"mode=patch patches the full model's activations; the mask changes heads "
                        f"({plan.describe()}): use mask=none")
    if task.type == "extractive_qa":
        raise UserError(f"mode=patch scores classification and regression tasks; task {task.name} is extractive QA, "
                        "whose span scores it does not patch yet")
    pairs = cfg.patch.pairs
    if pairs is None:
        split, files = task.eval_splits[0], task.get("data_files")
        if not files or split not in files:
            raise UserError(f"mode=patch needs paired data: task {task.name}'s split {split!r} has no corrupt_<field> "
                            "columns (a hub dataset); give patch.pairs=FILE, a data file in the task's format with "
                            f"corrupt_{task.text_fields[-1]} (docs/patching.md)")
        pairs = files[split]
    path = Path(pairs)
    if not path.is_file():
        raise UserError(f"patch.pairs={str(pairs)!r} does not exist; give a data file in task {task.name}'s format "
                        "with corrupt_<field> columns")
    if path.suffix not in CHECKED:
        raise UserError(f"patch.pairs={str(pairs)!r}: a paired file is JSON lines, CSV or TSV ({', '.join(CHECKED)}); "
                        f"got {path.suffix!r}")
    check_paired_file(path, task.name, list(task.text_fields), task.label_field)
