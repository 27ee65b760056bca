"""What each task type allows: metric names and SQuAD versions (no heavy imports: configs are checked with it)."""

from __future__ import annotations

METRICS = {
    "classification": ("accuracy", "f1", "matthews"),  # f1: of class 1, binary tasks only (MRPC, QQP)
    "regression": ("pearson", "spearman"),
    "extractive_qa": ("exact_match", "f1"),
}
TASK_TYPES = tuple(METRICS)
SQUAD_VERSIONS = ("v1", "v2")
