"""``mode=patch`` on extractive QA: the span-score logit difference, loss and prediction by definition; every patch of
a tiny QA model against a forward whose activation is replaced by definition, in float64; the job end to end on the
bundled paired questions; bad paired SQuAD files refused in one line before the model loads."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ROOT, assert_one_error_line, run
from families import tiny_model
from test_activation_sites import HEAD_DIM, by_definition
from test_patching import paired_batch, patched_by_definition
from transformers import AutoModelForQuestionAnswering

from headlab.analysis.patching.patch_evaluator import PatchEvaluator, _span_scores, patch_specs

PAIRS = ROOT / "src/headlab/tasks/data/demo_qa/patch.json"
SPANS = {"start_positions": [3, 2, 1], "end_positions": [4, 2, 3],  # the clean answers' tokens per row
         "corrupt_start_positions": [6, 5, 2], "corrupt_end_positions": [7, 6, 2]}  # the corrupted answers'


def qa_batch() -> dict[str, torch.Tensor]:
    rows = {k: v for k, v in paired_batch().items() if k not in ("labels", "corrupt_labels")}
    return rows | {name: torch.tensor(values) for name, values in SPANS.items()}


def span_scores_by_definition(start, end, rows: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, in float64 loops: score(clean span) - score(corrupted span) (a span's score: start logit of its first
    token + end logit of its last), the mean of the start and end cross-entropies over the row's tokens, and whether
    the highest start and end logits are the clean answer's."""
    diffs, losses, hits = [], [], []
    for b in range(start.shape[0]):
        tokens = int(rows["attention_mask"][b].sum())  # padded on the right
        s, e = start[b, :tokens].double(), end[b, :tokens].double()
        cs, ce = int(rows["start_positions"][b]), int(rows["end_positions"][b])
        xs, xe = int(rows["corrupt_start_positions"][b]), int(rows["corrupt_end_positions"][b])
        diffs.append(float(s[cs] + e[ce] - s[xs] - e[xe]))
        losses.append(float((torch.logsumexp(s, 0) - s[cs] + torch.logsumexp(e, 0) - e[ce]) / 2))
        hits.append(float(int(s.argmax()) == cs and int(e.argmax()) == ce))
    return np.array(diffs), np.array(losses), np.array(hits)


def test_span_scores_by_definition():
    torch.manual_seed(0)
    rows = qa_batch()
    logits = torch.randn(3, 11, 2, dtype=torch.float64)
    logits[0, 3, 0], logits[0, 4, 1] = 9.0, 9.0  # row 0 predicts its clean answer; the others need not
    logits[2, 8:] = 50.0  # padding of row 2 (5 tokens): out of the loss and the prediction
    spans = torch.stack([rows["start_positions"], rows["end_positions"]], 1)
    contrast = torch.stack([rows["corrupt_start_positions"], rows["corrupt_end_positions"]], 1)
    diff, loss, hit = _span_scores(logits, spans, contrast, rows["attention_mask"])
    expected = span_scores_by_definition(logits[..., 0], logits[..., 1], rows)
    for got, want in zip((diff, loss, hit), expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    assert hit[0] == 1.0


@pytest.mark.parametrize("name", ["bert", "roberta", "deberta-v2", "modernbert"])
@pytest.mark.parametrize("direction", ["noising", "denoising"])
def test_every_qa_patch_equals_a_forward_with_that_activation_replaced(name, direction):
    model = tiny_model(name, AutoModelForQuestionAnswering).double()
    rows = qa_batch()
    positions = 3 if direction == "denoising" else None
    specs = patch_specs(["head", "attention", "mlp", "residual"], 3, 4, positions)
    evaluator = PatchEvaluator(model, "extractive_qa", specs, direction, 5)
    evaluator.validation_step(rows, 0)
    evaluator.on_validation_epoch_end()
    for index, spec in enumerate(specs):
        patched = patched_by_definition(model, name, spec, rows, direction == "noising")[0]
        expected = span_scores_by_definition(patched.start_logits, patched.end_logits, rows)
        for score, want in zip(("logit_diff", "loss", "prediction"), expected):
            np.testing.assert_allclose(evaluator.scores[index][score], want, rtol=1e-9, atol=1e-12,
                                       err_msg=f"{spec.name} {score}")
    for run_name, inputs in (("clean", "input_ids"), ("corrupted", "corrupt_input_ids")):
        out = model(input_ids=rows[inputs], attention_mask=rows["attention_mask"])
        want = span_scores_by_definition(out.start_logits.detach(), out.end_logits.detach(), rows)[0]
        np.testing.assert_allclose(evaluator.scores[run_name]["logit_diff"], want, rtol=1e-9)
    moved = [np.abs(evaluator.scores[i]["logit_diff"] - evaluator.scores["clean" if direction == "noising" else
                                                                          "corrupted"]["logit_diff"]).max()
             for i in range(len(specs))]
    assert max(moved) > 1e-3, "the patches must move the scores, or the comparison proves nothing"
    assert evaluator.scores["labels"]["label"].tolist() == [1.0, 1.0, 1.0]


def test_qa_patch_job_end_to_end(tmp_path):
    """The bundled paired questions on a random tiny QA model: one window per question, the per-example scores, and
    the residual after the last layer patched everywhere giving the corrupted run (noising)."""
    args = ["mode=patch", "model=tiny_random", "task=demo_qa", "allow_random_head=true", f"patch.pairs={PAIRS}",
            "data.max_eval_examples=12", "patch.sites=[attention,residual]", "patch.resamples=100",
            f"hydra.run.dir={tmp_path / 'patch'}"]
    result = run("ablate.py", *args, cwd_tmp=tmp_path)
    folder = tmp_path / "patch"
    results = json.loads((folder / "results.json").read_text())
    per_example = pd.read_parquet(folder / "patches.parquet")
    assert results["complete"] and results["summary"]["examples"] == 12 and len(results["effects"]) == 3 * 2
    scores = {run_name: frame.sort_values("example") for run_name, frame in per_example.groupby("run")}
    assert sorted(scores["clean"]["example"]) == list(range(12))
    np.testing.assert_allclose(scores["L2.residual"]["logit_diff"], scores["corrupted"]["logit_diff"], rtol=1e-5,
                               atol=1e-6)
    assert set(scores["clean"]["prediction"]) <= {0.0, 1.0}
    assert "patch (noising, 6 patches, positions all, exact) on pairs" in result.stdout


def test_an_unanswerable_v2_question_is_left_out_with_a_note(tmp_path):
    """SQuAD v2: a question without answers (``is_impossible``) has no span to score; the file was refused whole.
    It is left out with a note, and the other questions' scores are those of the file without it."""
    squad = json.loads(PAIRS.read_text())
    squad["data"] = squad["data"][:1]
    paragraph = squad["data"][0]["paragraphs"][0]
    answered = tmp_path / "answered.json"
    answered.write_text(json.dumps(squad))
    paragraph["qas"].insert(1, paragraph["qas"][0] | {"id": "impossible", "answers": [], "is_impossible": True,
                                                     "corrupt_answers": []})
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(squad))
    scores = []
    for path in (answered, whole):
        result = run("ablate.py", "mode=patch", "model=tiny_random", "task=demo_qa", "task.version=v2",
                     "allow_random_head=true", f"patch.pairs={path}", "patch.sites=[residual]",
                     f"hydra.run.dir={tmp_path / path.stem}", cwd_tmp=tmp_path)
        scores.append(pd.read_parquet(tmp_path / path.stem / "patches.parquet"))
    questions = len(paragraph["qas"])
    assert (f"note: 1 of {questions} questions have no window holding both their answer and the corrupted one (or "
            "are unanswerable); left out") in result.stderr
    assert scores[0]["run"].tolist() == scores[1]["run"].tolist() and len(scores[0]) > 0
    np.testing.assert_allclose(scores[1]["logit_diff"], scores[0]["logit_diff"], rtol=1e-6, atol=1e-7)


def paired_squad(tmp_path, change: dict) -> str:
    """The bundled file's first paragraph with ``change`` applied to its first question (None removes a key)."""
    squad = json.loads(PAIRS.read_text())
    squad["data"] = squad["data"][:1]
    qa = squad["data"][0]["paragraphs"][0]["qas"][0]
    for key, value in change.items():
        qa.pop(key) if value is None else qa.__setitem__(key, value)
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(squad))
    return f"patch.pairs={path}"


BAD = [
    ({"corrupt_answers": None}, "question 1 (id 'validation-0-0') has no corrupt_answers"),
    ({"corrupt_answers": [{"text": "Melrenville", "answer_start": 5}]},
     "corrupt_answers 'Melrenville' is not at character 5 of the corrupted context"),
    ({"corrupt_question": None}, "question 1 (id 'validation-0-0') has no corrupted text"),
    ({"corrupt_question": "  "}, "question 1 (id 'validation-0-0') has no text in 'corrupt_question'"),
    ({"corrupt_question": "When was Oskar Quint born in the year?"},
     "split 'pairs' question 1: the clean and corrupted inputs tokenise to"),
    ({"corrupt_answers": [{"text": "1948", "answer_start": 78}]},
     "corrupt_answers is at the clean answer's characters 78..82; the logit difference compares two spans' scores"),
    ({"corrupt_question": "When was Oskar Quint born?"},
     "split 'pairs' question 1: the corrupted text tokenises as the clean text does (1 of 2 examples do)"),
    ({"corrupt_contxt": "Oskar Quint was born in 1952."},  # misspelt: the context would stay clean, without a word
     "question 1 (id 'validation-0-0') has ['corrupt_contxt'], which name no field of a paired SQuAD question"),
    ({"corrupt_question": "Where exactly was Oskar Quint born?", "max_length": 64},
     "split 'pairs' question 1: the clean and corrupted inputs make 4 and 5 windows"),
]


@pytest.mark.parametrize("change, expected", BAD, ids=[e[:28] for _, e in BAD])
def test_bad_paired_squad_files_are_one_line(tmp_path, change, expected):
    change = dict(change)
    windows = [f"task.max_length={change.pop('max_length')}", "task.doc_stride=16"] if "max_length" in change else []
    result = run("ablate.py", "mode=patch", "model=tiny_random", "task=demo_qa", "allow_random_head=true",
                 paired_squad(tmp_path, change), *windows, f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path,
                 check=False)
    assert_one_error_line(result, expected)


@pytest.mark.parametrize("overrides, expected", [
    (["patch.path.senders=L0H0"], "path patching scores classification and regression tasks; task demo_qa"),
    ([f"patch.pairs={ROOT / 'src/headlab/tasks/data/demo_pairs/patch.jsonl'}"], "whose paired file is SQuAD JSON"),
    (["patch.pairs=null"], "SQuAD JSON with corrupt_question / corrupt_context and corrupt_answers"),
], ids=["path", "jsonl", "unpaired"])
def test_bad_qa_patch_input_is_one_line(tmp_path, overrides, expected):
    result = run("ablate.py", "mode=patch", "model=tiny_random", "task=demo_qa", "allow_random_head=true",
                 f"patch.pairs={PAIRS}", *overrides, f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path,
                 check=False)
    assert_one_error_line(result, expected)


@pytest.mark.parametrize("name", ["bert", "deberta-v2"])
def test_qa_attribution_estimates_are_the_first_order_term_by_definition(name):
    """LD_base + sum over the patched positions and columns of (a_source - a_base) * dLD/da, the span-score logit
    difference written here (start logit of the span's first token + end logit of its last)."""
    model = tiny_model(name, AutoModelForQuestionAnswering).double()
    rows = qa_batch()
    specs = patch_specs(["head", "mlp", "residual"], 3, 4)
    evaluator = PatchEvaluator(model, "extractive_qa", specs, "noising", 4, exact=False, attribution=True)
    evaluator.validation_step(rows, 0)
    evaluator.on_validation_epoch_end()
    clean = {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"]}
    corrupted = clean | {"input_ids": rows["corrupt_input_ids"]}
    row = torch.arange(3)
    for index, spec in enumerate(specs):
        site, sources, seen = spec.site, [], []
        with torch.no_grad(), by_definition(model.base_model, name, site.kind, site.layer, sources.append):
            model(**corrupted)
        with by_definition(model.base_model, name, site.kind, site.layer, seen.append):
            out = model(**clean)
        start, end = out.start_logits, out.end_logits
        logit_diff = (start[row, rows["start_positions"]] + end[row, rows["end_positions"]]
                      - start[row, rows["corrupt_start_positions"]] - end[row, rows["corrupt_end_positions"]])
        gradient = torch.autograd.grad(logit_diff.sum(), seen[0])[0]
        cols = slice(site.head * HEAD_DIM, (site.head + 1) * HEAD_DIM) if site.kind == "head" else slice(None)
        terms = ((sources[0] - seen[0]) * gradient)[..., cols].sum(-1) * rows["attention_mask"]  # [batch, seq]
        expected = (logit_diff + terms.sum(-1)).detach().numpy()
        np.testing.assert_allclose(evaluator.scores[("estimate", index)]["logit_diff"], expected, rtol=1e-9,
                                   atol=1e-12, err_msg=spec.name)
