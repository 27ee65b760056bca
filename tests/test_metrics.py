"""Task metrics against scikit-learn / scipy and hand-computed SQuAD values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from headlab.tasks.metrics import SquadMetric, glue_metrics, normalize_answer, squad_scores


@pytest.mark.parametrize("num_labels", [2, 3])
def test_classification_metrics_equal_sklearn(num_labels):
    rng = np.random.default_rng(num_labels)
    target = rng.integers(0, num_labels, 500)
    preds = np.where(rng.random(500) < 0.6, target, rng.integers(0, num_labels, 500))
    names = ["accuracy", "matthews"] + (["f1"] if num_labels == 2 else [])
    metrics = glue_metrics(names, num_labels)
    for chunk in np.array_split(np.arange(500), 7):  # several batches, like an epoch
        metrics.update(torch.tensor(preds[chunk]), torch.tensor(target[chunk]))
    scores = {k: v.item() for k, v in metrics.compute().items()}
    assert scores["accuracy"] == pytest.approx(accuracy_score(target, preds), rel=1e-12)
    assert scores["matthews"] == pytest.approx(matthews_corrcoef(target, preds), rel=1e-12)
    if num_labels == 2:
        assert scores["f1"] == pytest.approx(f1_score(target, preds), rel=1e-12)


def test_regression_metrics_equal_scipy():
    rng = np.random.default_rng(0)
    target = rng.uniform(0, 5, 300)
    preds = target + rng.normal(0, 1.5, 300)
    target[:40] = np.round(target[:40])  # ties in the gold scores, as in STS-B
    metrics = glue_metrics(["pearson", "spearman"], 1)
    for chunk in np.array_split(np.arange(300), 4):
        metrics.update(torch.tensor(preds[chunk]), torch.tensor(target[chunk]))
    scores = {k: v.item() for k, v in metrics.compute().items()}
    assert scores["pearson"] == pytest.approx(pearsonr(preds, target)[0], rel=1e-12)
    # Brute force: Pearson of the average ranks (ties share the mean of their positions).
    ranks = [np.array([np.mean(np.flatnonzero(np.sort(v) == x)) for x in v]) for v in (preds, target)]
    assert scores["spearman"] == pytest.approx(np.corrcoef(*ranks)[0, 1], rel=1e-12)
    assert scores["spearman"] == pytest.approx(spearmanr(preds, target)[0], rel=1e-12)


def test_matthews_of_a_constant_prediction_is_zero():
    metrics = glue_metrics(["matthews"], 3)
    metrics.update(torch.zeros(10, dtype=torch.long), torch.arange(10) % 3)
    assert metrics.compute()["matthews"].item() == 0.0 == matthews_corrcoef(np.arange(10) % 3, np.zeros(10))


def test_bad_metric_names():
    with pytest.raises(ValueError, match=r"unknown metric\(s\) \['bleu'\]"):
        glue_metrics(["bleu"], 2)
    with pytest.raises(ValueError, match="binary F1"):
        glue_metrics(["f1"], 3)


def test_normalize_answer():
    assert normalize_answer("  The Eiffel-Tower, in PARIS! ") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


V1_CASES = [  # prediction, golds, exact, f1 (by hand)
    ("the Eiffel Tower!", ["Eiffel Tower"], 1, 1.0),
    ("in Paris, France", ["Paris", "Paris, France"], 0, 0.8),  # vs "paris france": p=2/3, r=1
    ("1931", ["in 1931", "1931."], 1, 1.0),
    ("an apple a day", ["apple day"], 1, 1.0),
    ("blue", ["red"], 0, 0.0),
]


def test_squad_v1_hand_computed():
    for prediction, golds, exact, f1 in V1_CASES:
        assert squad_scores(prediction, golds) == pytest.approx((exact, f1))
    metric = SquadMetric("v1")
    metric.update([c[0] for c in V1_CASES[:2]], [c[1] for c in V1_CASES[:2]])
    metric.update([c[0] for c in V1_CASES[2:]], [c[1] for c in V1_CASES[2:]])
    scores = metric.compute()
    assert scores["exact_match"].item() == pytest.approx(60.0)
    assert scores["f1"].item() == pytest.approx(76.0)


def test_squad_v2_null_answers_hand_computed():
    cases = [
        ("the Eiffel Tower!", ["Eiffel Tower"], 1, 1.0),
        ("in Paris, France", ["Paris", "Paris, France"], 0, 0.8),
        ("", [], 1, 1.0),  # unanswerable, predicted no answer
        ("Oslo", [], 0, 0.0),  # unanswerable, answered anyway
        ("", ["Oslo"], 0, 0.0),  # answerable, no answer given
    ]
    for prediction, golds, exact, f1 in cases:
        assert squad_scores(prediction, golds, "v2") == pytest.approx((exact, f1))
    assert squad_scores("the", ["the", "a"], "v2") == (1.0, 1.0)  # golds normalising to "" mean no answer
    metric = SquadMetric("v2")
    metric.update([c[0] for c in cases], [c[1] for c in cases])
    scores = {k: v.item() for k, v in metric.compute().items()}
    assert scores == pytest.approx({"exact_match": 40.0, "f1": 56.0, "has_ans_exact_match": 100 / 3,
                                    "has_ans_f1": 60.0, "no_ans_exact_match": 50.0, "no_ans_f1": 50.0})


def official_v2_scores(predictions: dict, dataset: list) -> dict:
    """The official SQuAD v2.0 evaluation script's exact/F1/HasAns/NoAns, transcribed (evaluate-v2.0.py)."""
    import collections
    import re
    import string

    def normalize(s):
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s, flags=re.UNICODE).split())

    def f1(gold, pred):
        gold_toks, pred_toks = normalize(gold).split(), normalize(pred).split()
        common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
        num_same = sum(common.values())
        if len(gold_toks) == 0 or len(pred_toks) == 0:
            return int(gold_toks == pred_toks)
        if num_same == 0:
            return 0
        precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
        return 2 * precision * recall / (precision + recall)

    exact, f1s, has_ans = {}, {}, {}
    for qa in dataset:
        has_ans[qa["id"]] = bool(qa["answers"])  # make_qid_to_has_ans
        gold = [a["text"] for a in qa["answers"] if normalize(a["text"])] or [""]
        exact[qa["id"]] = max(int(normalize(a) == normalize(predictions[qa["id"]])) for a in gold)
        f1s[qa["id"]] = max(f1(a, predictions[qa["id"]]) for a in gold)

    def mean(scores, ids):
        return 100.0 * sum(scores[i] for i in ids) / len(ids)

    has, no = [i for i, v in has_ans.items() if v], [i for i, v in has_ans.items() if not v]
    out = {"exact_match": mean(exact, exact), "f1": mean(f1s, f1s)}
    if has:  # the script reports a group only when it has questions
        out |= {"has_ans_exact_match": mean(exact, has), "has_ans_f1": mean(f1s, has)}
    if no:
        out |= {"no_ans_exact_match": mean(exact, no), "no_ans_f1": mean(f1s, no)}
    return out


def test_squad_v2_has_ans_follows_the_official_script():
    """A gold list of only articles / punctuation is still an answerable question (official v2.0 rule)."""
    dataset = [
        {"id": "q1", "answers": [{"text": "the"}]},  # normalises to "": answerable all the same
        {"id": "q2", "answers": [{"text": "."}, {"text": "a"}]},
        {"id": "q3", "answers": []},  # unanswerable
        {"id": "q4", "answers": [{"text": "Oslo"}]},
        {"id": "q5", "answers": []},
    ]
    predictions = {"q1": "", "q2": "Oslo", "q3": "", "q4": "in Oslo", "q5": "Bergen"}
    expected = official_v2_scores(predictions, dataset)
    assert expected["has_ans_exact_match"] == pytest.approx(100 / 3)  # q1 counts as answerable and right
    metric = SquadMetric("v2")
    metric.update([predictions[qa["id"]] for qa in dataset], [[a["text"] for a in qa["answers"]] for qa in dataset])
    assert {k: v.item() for k, v in metric.compute().items()} == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("answerable", [True, False])
def test_squad_v2_a_group_without_questions_is_undefined(answerable):
    """The official script leaves out HasAns (NoAns) when no question has (lacks) an answer: NaN here, in the training
    metric, the records' metrics and the report's resampling form alike (it read 0.0, and the report +0.00)."""
    from headlab.reporting.metric_sums import metric_for
    from headlab.tasks.record_metrics import metrics_from_records

    dataset = [{"id": f"q{i}", "answers": [{"text": "Oslo"}] if answerable else []} for i in range(4)]
    predictions = {"q0": "Oslo", "q1": "", "q2": "in Oslo", "q3": "Bergen"}
    expected = official_v2_scores(predictions, dataset)
    missing = {f"{group}_{score}" for group in ("has_ans", "no_ans") for score in ("exact_match", "f1")} - set(expected)
    assert len(missing) == 2 and all(name.startswith("no_ans" if answerable else "has_ans") for name in missing)
    metric = SquadMetric("v2")
    golds = [[a["text"] for a in qa["answers"]] for qa in dataset]
    metric.update(list(predictions.values()), golds)
    records = {"exact_match": [], "f1": [], "has_answer": [], "loss": [0.0] * 4}
    for text, gold in zip(predictions.values(), golds):
        exact, f1 = squad_scores(text, gold, "v2")
        records["exact_match"].append(exact), records["f1"].append(f1), records["has_answer"].append(bool(gold))
    task = {"type": "extractive_qa", "metrics": ["exact_match", "f1"], "version": "v2"}
    computed = [{k: v.item() for k, v in metric.compute().items()},
                metrics_from_records(records, OmegaConf.create(task)),
                {name: metric_for(name, records).value(records) for name in (*expected, *missing)}]
    for scores in computed:
        assert {k: scores[k] for k in expected} == pytest.approx(expected, rel=1e-12)
        assert all(math.isnan(scores[k]) for k in missing)


def test_squad_bad_input():
    with pytest.raises(ValueError, match="unknown SQuAD version 'v3'"):
        SquadMetric("v3")
    with pytest.raises(ValueError, match="at least one gold answer"):
        squad_scores("x", [], "v1")
    with pytest.raises(ValueError, match="2 predictions for 1 questions"):
        SquadMetric().update(["a", "b"], [["a"]])
