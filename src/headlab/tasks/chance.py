"""Chance: the score of a model that learned nothing of the task, per main metric, on the evaluated examples.

- accuracy: the majority class's share of the evaluated labels (every example given the most frequent label);
- a GLUE F1 (binary, of class 1): the better constant answer, all 1 (``2p / (1 + p)``, ``p`` the share of
  positives) or all 0 (F1 0);
- Matthews, Pearson, Spearman: 0 (a constant answer has no correlation: MCC 0, r undefined);
- SQuAD's exact match and F1: the best score of one answer given to every evaluated question, over the empty answer
  (v2: right on every unanswerable question), each gold answer and each word of one (normalised as the official
  script does), each scored exactly as the official script scores it. A constant answer of several words that is no
  gold answer could score more, so this is chance from below, never above;
- a loss: none. A loss has no floor (the loss of the class prior depends on the task's labels and the model's
  calibration, not on what it learned), so a study whose main metric is a loss gets no floor check.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

import numpy as np

CORRELATIONS = ("matthews", "pearson", "spearman")


def chance_level(metric: str, records: Mapping, golds: Sequence[Sequence[str]] | None = None,
                 version: str = "v1") -> tuple[float, str] | None:
    """``(chance, what it is)`` of ``metric`` on ``records`` (one split's, as ``records.parquet``) in the metric's own
    scale (SQuAD's: percent); ``golds``: each record's gold answers (SQuAD; else its ``label`` column is read).
    None: the metric has no chance level (a loss) or its inputs are missing."""
    if metric in CORRELATIONS:
        return 0.0, f"{metric} 0 (a constant answer)"
    if metric in ("exact_match", "f1") and "exact_match" in records:
        if golds is None:
            return None
        answer, score = best_constant_answer(golds, version)[metric]
        return 100 * score, f"the best constant answer, {answer!r} to every question"
    if metric in ("accuracy", "f1") and "label" in records:
        labels = np.asarray(records["label"])
        values, counts = np.unique(labels, return_counts=True)
        if metric == "accuracy":
            majority = values[counts.argmax()]
            return float(counts.max() / len(labels)), f"the majority class ({majority}) for every example"
        positive = float(np.mean(labels == 1))
        return 2 * positive / (1 + positive), "label 1 for every example"
    return None


def best_constant_answer(golds: Sequence[Sequence[str]], version: str = "v1") -> dict[str, tuple[str, float]]:
    """``{"exact_match": (answer, mean), "f1": (answer, mean)}``: the constant answer that scores best on each, and
    its mean score in [0, 1] over the questions (``headlab.tasks.metrics.squad_scores`` of it, the max over each
    question's gold answers). Candidates: the empty answer, each gold answer and each word of one."""
    from headlab.tasks.metrics import normalize_answer

    questions = []  # per question: its gold answers as token lists
    for answers in golds:
        tokens = [normalize_answer(answer).split() for answer in answers]
        if version == "v2":
            tokens = [t for t in tokens if t]  # none left: unanswerable, the single gold answer ""
        questions.append(tokens or [[]])
    holding = defaultdict(set)  # word -> the questions with a gold answer holding it
    for number, answers in enumerate(questions):
        for tokens in answers:
            for token in tokens:
                holding[token].add(number)
    candidates = {" ".join(tokens) for answers in questions for tokens in answers} | set(holding) | {""}
    best = {"exact_match": ("", -1.0), "f1": ("", -1.0)}
    for candidate in sorted(candidates):
        tokens = candidate.split()
        scored = set().union(*(holding[t] for t in tokens)) if tokens else range(len(questions))
        exact = f1 = 0.0  # a question sharing no word with the candidate scores 0 (but "" on "")
        for number in scored:
            exact += max(float(tokens == gold) for gold in questions[number])
            f1 += max(_f1(tokens, gold, version) for gold in questions[number])
        for metric, total in (("exact_match", exact), ("f1", f1)):
            if total / len(questions) > best[metric][1]:
                best[metric] = (candidate, total / len(questions))
    return best


def _f1(prediction: list[str], gold: list[str], version: str) -> float:
    """The official script's token F1 of normalised token lists."""
    if not prediction or not gold:
        return float(prediction == gold) if version == "v2" else 0.0
    same = sum((Counter(prediction) & Counter(gold)).values())
    return 0.0 if same == 0 else 2 * same / (len(prediction) + len(gold))
