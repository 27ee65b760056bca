"""SQuAD features and post-processing, checked against brute-force references written here."""

from __future__ import annotations

import random

import pytest
import torch
from test_tasks import task_cfg

from headlab.tasks.encoding import Collator, tokenize_split
from headlab.tasks.loading import load_task_data
from headlab.tasks.squad import AnswerCollector, best_spans


@pytest.fixture(scope="module")
def windowed_task():
    """demo_qa with windows short enough that every context is split into several features."""
    task = task_cfg("demo_qa")
    task.max_length, task.doc_stride = 64, 16
    return task


@pytest.fixture(scope="module")
def raw(windowed_task):
    return load_task_data(windowed_task)["validation"].select(range(40))


def test_training_features_point_at_the_answer_or_at_cls(tokenizer, windowed_task, raw, tmp_path):
    features = tokenize_split(raw, windowed_task, tokenizer, "sentence", tmp_path, "train", training=True)
    direct = tokenizer([q.lstrip() for q in raw["question"]], list(raw["context"]), truncation="only_second",
                       max_length=64, stride=16, return_overflowing_tokens=True, return_offsets_mapping=True)
    assert len(features) == len(direct["input_ids"]) > 2 * len(raw)  # long contexts: several windows each
    answered = set()
    for row, feature in enumerate(features):
        example = raw[direct["overflow_to_sample_mapping"][row]]
        text, start_char = example["answers"]["text"][0], example["answers"]["answer_start"][0]
        offsets, segments = direct["offset_mapping"][row], direct.sequence_ids(row)
        context = [i for i, s in enumerate(segments) if s == 1]
        inside = offsets[context[0]][0] <= start_char and offsets[context[-1]][1] >= start_char + len(text)
        start, end = feature["start_positions"], feature["end_positions"]
        if inside:
            assert example["context"][offsets[start][0] : offsets[end][1]] == text
            answered.add(example["id"])
        else:
            assert (start, end) == (0, 0)
        assert feature["input_ids"] == direct["input_ids"][row]
    assert answered == set(raw["id"])  # every answer lies whole in some window


def test_evaluation_features_keep_question_and_context_offsets(tokenizer, windowed_task, raw, tmp_path):
    features = tokenize_split(raw, windowed_task, tokenizer, "sentence", tmp_path, "validation", training=False)
    direct = tokenizer([q.lstrip() for q in raw["question"]], list(raw["context"]), truncation="only_second",
                       max_length=64, stride=16, return_overflowing_tokens=True, return_offsets_mapping=True)
    assert list(features["example_index"]) == list(direct["overflow_to_sample_mapping"])
    for row, feature in enumerate(features):
        segments, offsets = direct.sequence_ids(row), direct["offset_mapping"][row]
        expected = [list(o) if s == 1 else [-1, -1] for s, o in zip(segments, offsets)]
        assert feature["context_offsets"] == expected
    batch = Collator(tokenizer.pad_token_id)([features[i] for i in range(5)])
    assert batch["context_offsets"].shape == (*batch["input_ids"].shape, 2)
    assert (batch["context_offsets"][batch["attention_mask"] == 0] == -1).all()


def reference_best_span(start, end, offsets, n_best, max_len):
    """One feature, float64, by enumeration: HF's rule restricted to context tokens."""
    context = [i for i in range(len(start)) if offsets[i][0] >= 0]
    top_starts = sorted(context, key=lambda i: -start[i])[:n_best]
    top_ends = sorted(context, key=lambda i: -end[i])[:n_best]
    best = (-float("inf"), -1, -1)
    for s in top_starts:
        for e in top_ends:
            if s <= e < s + max_len and start[s] + end[e] > best[0]:
                best = (start[s] + end[e], offsets[s][0], offsets[e][1])
    return best


def random_features(generator, count, seq):
    start = torch.randn(count, seq, generator=generator, dtype=torch.float64)
    end = torch.randn(count, seq, generator=generator, dtype=torch.float64)
    offsets = torch.full((count, seq, 2), -1)
    for row in range(count):
        first = int(torch.randint(1, 6, (1,), generator=generator))
        last = int(torch.randint(first, seq, (1,), generator=generator))  # context tokens [first, last)
        offsets[row, first:last, 0] = torch.arange(last - first) * 4
        offsets[row, first:last, 1] = torch.arange(last - first) * 4 + 3
    return start, end, offsets


@pytest.mark.parametrize(("n_best", "max_len"), [(3, 2), (5, 4), (20, 30)])
def test_best_spans_equal_enumeration(n_best, max_len):
    generator = torch.Generator().manual_seed(n_best)
    start, end, offsets = random_features(generator, 50, 24)
    spans = best_spans(start, end, offsets, n_best, max_len)
    for row in range(50):
        score, first, last = reference_best_span(start[row].tolist(), end[row].tolist(), offsets[row].tolist(),
                                                 n_best, max_len)
        assert (int(spans.start[row]), int(spans.end[row])) == (first, last)
        assert float(spans.score[row]) == pytest.approx(score, rel=1e-12)
    assert torch.equal(spans.null_score, start[:, 0] + end[:, 0])


def test_a_feature_without_valid_span_has_none():
    start = torch.tensor([[0.0, 5.0, 1.0]])
    end = torch.tensor([[0.0, 1.0, 5.0]])
    offsets = torch.tensor([[[-1, -1], [0, 2], [3, 5]]])
    spans = best_spans(start, end, offsets, n_best=1, max_answer_length=30)  # best start 1 > best end... no: 1 <= 2
    assert (int(spans.start[0]), int(spans.end[0])) == (0, 5)
    spans = best_spans(end, start, offsets, n_best=1, max_answer_length=30)  # best start 2, best end 1: invalid
    assert int(spans.start[0]) == -1 and spans.score[0] == -torch.inf
    assert AnswerCollector().answers(["abcdef"]) == {}


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_answers_merge_features_of_a_question_in_any_order(version):
    generator = torch.Generator().manual_seed(7)
    start, end, offsets = random_features(generator, 60, 20)
    start[::3, 0] += 2.5  # strong [CLS] on some features, so v2 predicts no answer for some questions
    end[::3, 0] += 2.5
    example_index = torch.tensor(sorted(random.Random(0).choices(range(25), k=60)))
    contexts = ["".join(chr(97 + (i * 7 + j) % 26) for j in range(100)) for i in range(25)]
    expected = {}  # brute force over all features of each question
    for example in example_index.unique().tolist():
        rows = (example_index == example).nonzero()[:, 0].tolist()
        best = max((reference_best_span(start[r].tolist(), end[r].tolist(), offsets[r].tolist(), 20, 30)
                    for r in rows), key=lambda b: b[0])
        null = min(float(start[r, 0] + end[r, 0]) for r in rows)
        no_answer = best[1] < 0 or (version == "v2" and null > best[0])
        expected[example] = "" if no_answer else contexts[example][best[1] : best[2]]
    collector = AnswerCollector()
    order = torch.randperm(60, generator=generator)
    for chunk in order.split(7):  # features arrive shuffled, in batches
        collector.add(example_index[chunk], best_spans(start[chunk], end[chunk], offsets[chunk]))
    assert collector.answers(contexts, version) == expected
    if version == "v2":
        assert "" in expected.values() and any(expected.values())


def test_oracle_logits_recover_every_gold_answer(tokenizer, windowed_task, raw, tmp_path):
    """Logits peaked on the gold span (found here from the offsets) must give back the gold text."""
    features = tokenize_split(raw, windowed_task, tokenizer, "sentence", tmp_path, "validation", training=False)
    batch = Collator(tokenizer.pad_token_id)([features[i] for i in range(len(features))])
    start = torch.zeros(batch["input_ids"].shape)
    end = torch.zeros(batch["input_ids"].shape)
    for row, example in enumerate(batch["example_index"].tolist()):
        answer = raw[example]["answers"]
        first, last = answer["answer_start"][0], answer["answer_start"][0] + len(answer["text"][0])
        spans = batch["context_offsets"][row].tolist()
        tokens = [i for i, (a, b) in enumerate(spans) if a >= 0 and a < last and b > first]
        if tokens and spans[tokens[0]][0] <= first and spans[tokens[-1]][1] >= last:
            start[row, tokens[0]], end[row, tokens[-1]] = 10.0, 10.0
    collector = AnswerCollector()
    collector.add(batch["example_index"], best_spans(start, end, batch["context_offsets"]))
    answers = collector.answers(list(raw["context"]))
    assert [answers[i] for i in range(len(raw))] == [a["text"][0] for a in raw["answers"]]
