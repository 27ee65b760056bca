"""The checks of ``mode=patch``: no weights read, no torch imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from headlab.analysis.jobs.checks import check_evaluation
from headlab.core.model_files import model_shape
from headlab.core.plans import select_heads
from headlab.errors import UserError, not_a_file
from headlab.tasks.local_files import CHECKED, check_paired_file, check_paired_squad


def check_patch(cfg: Any) -> None:
    """The full model (no plan), and paired data: a classification or regression file with corrupt_<field> texts, or
    SQuAD JSON whose questions carry their corrupted texts and answers."""
    plan = check_evaluation(cfg)
    task = cfg.task
    qa = task.type == "extractive_qa"
    if not plan.is_identity:
        raise UserError(f"mode=patch patches the full model's activations; the mask changes heads "
                        f"({plan.describe()}): use mask=none")
    pairs = cfg.patch.pairs
    wanted = "SQuAD JSON with corrupt_question / corrupt_context and corrupt_answers per question" if qa else \
        f"a data file in the task's format with corrupt_{task.text_fields[-1]}"
    if pairs is None:
        split, files = task.eval_splits[0], task.get("data_files")
        if not files or split not in files:
            raise UserError(f"mode=patch needs paired data: task {task.name}'s split {split!r} has no corrupted texts "
                            f"(a hub dataset); give patch.pairs=FILE, {wanted} (docs/patching.md)")
        pairs = files[split]
    path = Path(pairs)
    if not path.is_file():
        raise UserError(f"patch.pairs={str(pairs)!r} {not_a_file(path)}; give {wanted}")
    if qa:
        if path.suffix != ".json":
            raise UserError(f"patch.pairs={str(pairs)!r}: task {task.name} is extractive QA, whose paired file is "
                            f"SQuAD JSON (.json); got {path.suffix!r}")
        check_paired_squad(path, task.name, str(task.get("version", "v1")))
        if cfg.patch.path.senders is not None:
            raise UserError(f"patch.path: path patching scores classification and regression tasks; task {task.name} "
                            "is extractive QA (patch its heads, sites and positions instead)")
        return
    if path.suffix not in CHECKED:
        raise UserError(f"patch.pairs={str(pairs)!r}: a paired file is JSON lines, CSV or TSV ({', '.join(CHECKED)}); "
                        f"got {path.suffix!r}")
    check_paired_file(path, task.name, list(task.text_fields), task.label_field,
                      None if task.type == "regression" else task.num_labels)
    if cfg.patch.path.senders is not None:
        path_heads(cfg.patch, *model_shape(cfg.model))


def path_heads(options: Any, layers: int, heads: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]] | None]:
    """Path patching's ``(senders, receivers)`` as ``(layer, head)`` lists (receivers None: the model's output),
    checked: path patches act at every position, exactly, and each sender has a receiver in a later layer."""
    path = options.path
    if options.positions != "all" or options.method != "exact":
        raise UserError(f"patch.path: path patching acts at every position and runs every patch exactly; got "
                        f"patch.positions={options.positions}, patch.method={options.method} (use all, exact)")
    senders = _selected("senders", path.senders, layers, heads)
    if path.receivers == "output":
        return senders, None
    receivers = _selected("receivers", path.receivers, layers, heads)
    for layer, head in senders:
        if not any(receiver_layer > layer for receiver_layer, _ in receivers):
            raise UserError(f"patch.path: sender L{layer}H{head} has no receiver in a later layer "
                            f"(patch.path.receivers={_shown(path.receivers)}); its paths reach only later heads")
    return senders, receivers


def _selected(key: str, selector: Any, layers: int, heads: int) -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs ``patch.path.<key>`` selects (at least one), its errors naming the key."""
    also = "; or output (the model's output, the default)" if key == "receivers" else ""
    try:
        chosen = [tuple(map(int, h)) for h in np.argwhere(select_heads(selector, layers, heads))]
    except UserError as error:
        raise UserError(f"patch.path.{key}={_shown(selector)}: {error}{also}") from None
    if not chosen:
        raise UserError(f"patch.path.{key}={_shown(selector)} selects no head")
    return chosen


def _shown(selector: Any) -> str:
    return repr(selector if isinstance(selector, str) else list(selector))
