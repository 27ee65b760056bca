"""Task metrics as torchmetrics objects, so they are exact across processes (sums, not means of means).

GLUE metrics are torchmetrics' own. SQuAD exact match and F1 are written here because they must
equal the official evaluation scripts (v1.1 and v2.0) to the letter, answer normalisation and the
max over gold answers included, and torchmetrics' ``SQuAD`` scores v1.1 only (no null answers).
"""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from collections.abc import Sequence

import scipy.stats
import torch
import torchmetrics.regression
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import BinaryF1Score, MulticlassAccuracy, MulticlassMatthewsCorrCoef
from torchmetrics.regression import PearsonCorrCoef
from torchmetrics.utilities import dim_zero_cat

from headlab.errors import UserError


class MatthewsCorrCoef(MulticlassMatthewsCorrCoef):
    """torchmetrics' confusion-matrix states, the coefficient computed in float64.

    Multiclass R_K (Gorodkin 2004), as scikit-learn: 0 when a marginal is constant.
    """

    def compute(self) -> torch.Tensor:
        confmat = self.confmat.double()  # [true class, predicted class]
        total, correct = confmat.sum(), confmat.trace()
        true_counts, pred_counts = confmat.sum(1), confmat.sum(0)
        covariance = correct * total - (true_counts * pred_counts).sum()
        scale = (total**2 - (pred_counts**2).sum()) * (total**2 - (true_counts**2).sum())
        return covariance / scale.sqrt() if scale > 0 else torch.zeros((), dtype=torch.float64)


class SpearmanCorrCoef(torchmetrics.regression.SpearmanCorrCoef):
    """torchmetrics' gathered predictions and targets, the coefficient computed in float64 by scipy."""

    def __init__(self, **kwargs):
        with warnings.catch_warnings():  # "will save all targets and predictions": needed for ranks, and small
            warnings.simplefilter("ignore", UserWarning)
            super().__init__(**kwargs)

    def compute(self) -> torch.Tensor:
        preds = dim_zero_cat(self.preds).double().cpu().numpy()
        target = dim_zero_cat(self.target).double().cpu().numpy()
        return torch.tensor(scipy.stats.spearmanr(preds, target).statistic, dtype=torch.float64)


def glue_metrics(names: Sequence[str], num_labels: int) -> MetricCollection:
    """A collection of the named GLUE metrics, computed in float64.

    ``update(preds, target)`` takes class ids, or scores (float64 for full precision).
    """
    factories = {
        "accuracy": lambda: MulticlassAccuracy(num_classes=num_labels, average="micro"),
        "f1": lambda: BinaryF1Score(),  # F1 of the positive class (1), as GLUE reports it for MRPC / QQP
        "matthews": lambda: MatthewsCorrCoef(num_classes=num_labels),
        "pearson": lambda: PearsonCorrCoef(),
        "spearman": lambda: SpearmanCorrCoef(),
    }
    unknown = [name for name in names if name not in factories]
    if unknown:
        raise UserError(f"unknown metric(s) {unknown}; valid metrics: {', '.join(factories)}")
    if "f1" in names and num_labels != 2:
        raise UserError(f"metric f1 is the binary F1 of class 1; the task has {num_labels} labels")
    return MetricCollection({name: factories[name]() for name in names}).set_dtype(torch.float64)


# --------------------------------------------------------------------------- SQuAD (official scripts)


_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)  # built once: runs for every question scored


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, the articles a/an/the and extra whitespace (official scripts)."""
    text = text.lower().translate(_DROP_PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text, flags=re.UNICODE)
    return " ".join(text.split())


def _f1(prediction: str, gold: str, version: str) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version == "v2" and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _check_version(version: str) -> None:
    if version not in ("v1", "v2"):
        raise UserError(f"unknown SQuAD version {version!r}; valid: v1, v2")


def squad_scores(prediction: str, golds: Sequence[str], version: str = "v1") -> tuple[float, float]:
    """(exact match, F1) of one prediction, each in [0, 1], max over the gold answers.

    ``version="v2"``: golds that normalise to nothing are dropped and an unanswerable question
    (no golds left) has the single gold answer ``""``, as in the official v2.0 script.
    """
    _check_version(version)
    if version == "v2":
        golds = [g for g in golds if normalize_answer(g)] or [""]
    elif not golds:
        raise ValueError("a SQuAD v1.1 question needs at least one gold answer")
    exact = max(float(normalize_answer(prediction) == normalize_answer(g)) for g in golds)
    return exact, max(_f1(prediction, g, version) for g in golds)


class SquadMetric(Metric):
    """Exact match and F1 in percent, summed over questions and synced across processes.

    ``update(predictions, gold_answers)``: predicted texts and, per question, its gold texts.
    For v2 it also reports both scores over answerable (``has_ans_*``) and unanswerable
    (``no_ans_*``) questions.
    """

    full_state_update = False

    def __init__(self, version: str = "v1", **kwargs):
        super().__init__(**kwargs)
        _check_version(version)
        self.version = version
        for name in ("exact", "f1", "count", "has_exact", "has_f1", "has_count"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, predictions: Sequence[str], gold_answers: Sequence[Sequence[str]]) -> None:
        if len(predictions) != len(gold_answers):
            raise ValueError(f"{len(predictions)} predictions for {len(gold_answers)} questions")
        for prediction, golds in zip(predictions, gold_answers):
            exact, f1 = squad_scores(prediction, golds, self.version)
            self.exact += exact
            self.f1 += f1
            self.count += 1
            if len(golds) > 0:  # official v2.0 script: answerable iff the gold list is non-empty
                self.has_exact += exact
                self.has_f1 += f1
                self.has_count += 1

    def compute(self) -> dict[str, torch.Tensor]:
        """Scores in percent; v2's HasAns / NoAns score NaN over a group without a question (undefined: the official
        script leaves them out)."""
        percent = lambda total, count: torch.where(count > 0, 100.0 * total / count.clamp(min=1),  # noqa: E731
                                                   torch.nan)
        scores = {"exact_match": percent(self.exact, self.count), "f1": percent(self.f1, self.count)}
        if self.version == "v2":
            no_count = self.count - self.has_count
            scores |= {
                "has_ans_exact_match": percent(self.has_exact, self.has_count),
                "has_ans_f1": percent(self.has_f1, self.has_count),
                "no_ans_exact_match": percent(self.exact - self.has_exact, no_count),
                "no_ans_f1": percent(self.f1 - self.has_f1, no_count),
            }
        return scores
