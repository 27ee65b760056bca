"""The per-example score whose mean over examples is a coalition's value (no torch: checked before anything loads).

A Shapley value is a sum of differences of coalition values; with a value that is a mean over examples, each
Shapley value is the mean of per-example values, and the bootstrap resamples examples. So the score must be a mean
over examples: ``accuracy`` (an example's prediction is right: 1, else 0), SQuAD's ``exact_match`` and ``f1``
(per question, 0-100, as the official scripts average them), or ``loss`` (the example's loss; lower is better, so a
head that helps has a negative value). F1 of class 1, Matthews and the correlations are not means over examples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headlab.errors import UserError

WHOLE_SCORES = ("accuracy", "exact_match")  # per-example scores that are whole numbers (0/1, 0/100)
PER_EXAMPLE = {"classification": ("accuracy", "loss"), "regression": ("loss",),
               "extractive_qa": ("exact_match", "f1", "loss")}


def shapley_score(task: Any, score: str | None) -> str:
    """``shapley.score``, or the task's main metric when it is a mean over examples (else its loss)."""
    allowed = PER_EXAMPLE[task.type]
    if score is None:
        return task.main_metric if task.main_metric in allowed else "loss"
    if score not in allowed:
        raise UserError(f"shapley.score={score!r} is not a per-example score of task {task.name} ({task.type}); "
                        f"choose one of: {', '.join(allowed)}")
    return score


def example_scores(records: Any, score: str) -> np.ndarray:
    """``[examples]`` float64 per-example scores from a records frame (in example order)."""
    records = records.sort_values("example")
    if score == "accuracy":
        return (records["prediction"].to_numpy() == records["label"].to_numpy()).astype(np.float64)
    if score in ("exact_match", "f1"):
        return 100.0 * records[score].to_numpy(dtype=np.float64)
    return records["loss"].to_numpy(dtype=np.float64)
