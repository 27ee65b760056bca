"""Syntax heads (Clark et al. 2019, section 4) against references written here, one word pair at a time, in float64:
CoNLL-U reading, word-level attention, every head's per-word outcome in both directions, the offset baselines."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ROOT, assert_one_error_line, run

from headlab.analysis.syntax.data import encode_treebank
from headlab.analysis.syntax.heads import OFFSETS, head_accuracies, syntax_scores
from headlab.analysis.syntax.treebank import read_conllu
from headlab.analysis.syntax.word_attention import slot_matrix, word_level
from headlab.core.plans import HeadPlan
from headlab.core.tiny_tokenizers import tiny_tokenizer
from headlab.errors import UserError
from headlab.reporting.head_table import head_table
from tests.reference import bert_forward, params_of

COLUMNS = "{id}\t{form}\t_\t_\t_\t_\t{head}\t{rel}\t_\t_"
# A multiword token (didn't = did + n't), punctuation, a possessive with its own 's, a word of several pieces,
# an empty node (3.1) and a non-projective arc (the relative clause of "man" across the root "arrived").
TREEBANK = """# sent_id = first
1\tMira\t_\t_\t_\t_\t3\tnmod:poss\t_\t_
2\t's\t_\t_\t_\t_\t1\tcase\t_\t_
3\tdog\t_\t_\t_\t_\t6\tnsubj\t_\t_
4-5\tdidn't\t_\t_\t_\t_\t_\t_\t_\t_
4\tdid\t_\t_\t_\t_\t6\taux\t_\t_
5\tn't\t_\t_\t_\t_\t6\tadvmod\t_\t_
6\tfind\t_\t_\t_\t_\t0\troot\t_\t_
7\tthe\t_\t_\t_\t_\t9\tdet\t_\t_
8\tVartorholm\t_\t_\t_\t_\t9\tcompound\t_\t_
9\tkey\t_\t_\t_\t_\t6\tobj\t_\t_
10\t.\t_\t_\t_\t_\t6\tpunct\t_\t_

# sent_id = second
1\tA\t_\t_\t_\t_\t2\tdet\t_\t_
2\tman\t_\t_\t_\t_\t3\tnsubj\t_\t_
3\tarrived\t_\t_\t_\t_\t0\troot\t_\t_
3.1\tgone\t_\t_\t_\t_\t_\t_\t3:conj\t_
4\twho\t_\t_\t_\t_\t6\tnsubj\t_\t_
5\twas\t_\t_\t_\t_\t6\tcop\t_\t_
6\ttired\t_\t_\t_\t_\t2\tacl:relcl\t_\t_
7\t.\t_\t_\t_\t_\t3\tpunct\t_\t_

"""


@pytest.fixture
def treebank(tmp_path):
    path = tmp_path / "hand.conllu"
    path.write_text(TREEBANK)
    return read_conllu(path)


def test_conllu_keeps_syntactic_words_only(treebank):
    first, second = treebank
    assert first.words == ("Mira", "'s", "dog", "did", "n't", "find", "the", "Vartorholm", "key", ".")
    assert first.heads == (3, 1, 6, 6, 6, 0, 9, 9, 6, 6) and first.relations[0] == "nmod:poss"
    assert second.words == ("A", "man", "arrived", "who", "was", "tired", ".") and second.heads[5] == 2


# ----------------------------------------------------------------------------- references, one word at a time


def reference_word_attention(maps, slots):
    """``maps`` [L, H, T, T] float64, ``slots`` per token -> [L, H, S, S]: to a word = sum over its pieces' columns,
    from a word = mean over its pieces' rows (loops over slots and tokens)."""
    count = max(slots) + 1
    layers, heads = maps.shape[:2]
    out = np.zeros((layers, heads, count, count))
    for a in range(count):
        rows = [t for t, s in enumerate(slots) if s == a]
        for b in range(count):
            cols = [t for t, s in enumerate(slots) if s == b]
            for t in rows:
                for u in cols:
                    out[:, :, a, b] += maps[:, :, t, u] / len(rows)
    return out


def clark_predictions(word_maps):
    """Clark et al.'s attn_head_predictor: zero the diagonal, crop [CLS] / [SEP], argmax + 1 (ROOT is 0)."""
    predictions = {}
    for direction, transpose in (("dep->head", False), ("head->dep", True)):
        attention = word_maps.T.copy() if transpose else word_maps.copy()
        attention[range(len(attention)), range(len(attention))] = 0
        predictions[direction] = np.argmax(attention[1:-1, 1:-1], axis=-1) + 1
    return predictions


def clark_outcomes(predictions, sentence):
    """Clark et al.'s evaluate_predictor per word, with the possessive case (the 's token's prediction counts)."""
    out = []
    for i, (head, relation) in enumerate(zip(sentence.heads, sentence.relations)):
        judged = predictions[i]
        if relation == "nmod:poss" and i + 1 < len(sentence) and sentence.words[i + 1] in ("'s", "'", "s'"):
            judged = predictions[i + 1]
        out.append(judged == head)
    return out


def reference_sieve_scores(word_maps, sentence):
    """Pande et al.'s syntactic sieve bias scores of one head on one sentence, word by word: per role the mean, over
    words with a non-empty sieve, of attention to the sieve / (|sieve| / slots); NaN when no word has one."""
    roles = {"syntactic": None, "nsubj": {"nsubj"}, "obj": {"obj", "dobj"}, "amod": {"amod"}, "advmod": {"advmod"}}
    n = len(sentence)
    out = {}
    for role, names in roles.items():
        values = []
        for i in range(1, n + 1):
            sieve = set()
            head, relation = sentence.heads[i - 1], sentence.relations[i - 1]
            if head != 0 and (names is None or relation in names):
                sieve.add(head)
            for k in range(1, n + 1):
                if sentence.heads[k - 1] == i and (names is None or sentence.relations[k - 1] in names):
                    sieve.add(k)
            if sieve:
                values.append(sum(word_maps[i, k] for k in sieve) * (n + 2) / len(sieve))
        out[role] = float(np.mean(values)) if values else float("nan")
    return out


def reference_pande_scores(token_maps, slots, sentence, direction):
    """Pande et al.'s syntactic_score loop (their notebook's ``Heads1.get_score``) for one head on one sentence:
    ``token_maps`` its token attention ``[T, T]``, ``slots`` each token's slot (0 [CLS], word k at k, n + 1 [SEP]).
    Per role the mean over the sentence's (dependent w1, head w2) pairs; NaN when it has none."""
    roles = {"syntactic": None, "nsubj": {"nsubj"}, "obj": {"obj", "dobj"}, "amod": {"amod"}, "advmod": {"advmod"}}
    sent_len = len(slots)
    out = {}
    for role, names in roles.items():
        pair_scores = []
        for dependent in range(1, len(sentence) + 1):
            head, relation = sentence.heads[dependent - 1], sentence.relations[dependent - 1]
            if head == 0 or (names is not None and relation not in names):
                continue
            w1_idx = [t for t, slot in enumerate(slots) if slot == dependent]
            w2_idx = [t for t, slot in enumerate(slots) if slot == head]
            attention = {}
            for source, target in ((w1_idx, w2_idx), (w2_idx, w1_idx)):
                token_score = total = 0.0
                for id1 in source:
                    total += float(np.sum(token_maps[id1, :]))
                    token_score += sum(float(token_maps[id1, id2]) for id2 in target) / len(target)
                attention[tuple(source)] = (token_score / len(source)) / (total / len(source) / sent_len)
            l2r, r2l = attention[tuple(w1_idx)], attention[tuple(w2_idx)]
            pair_scores.append({"l2r": l2r, "r2l": r2l, "bi": (l2r + r2l) / 2}[direction])
        out[role] = float(np.mean(pair_scores)) if pair_scores else float("nan")
    return out


def test_word_attention_sums_pieces_into_columns_and_averages_rows():
    generator = torch.Generator().manual_seed(0)
    weights = torch.rand(2, 3, 7, 7, generator=generator, dtype=torch.float64).softmax(-1)  # [batch, heads, T, T]
    slots = [[0, 1, 1, 1, 2, 3, 4], [0, 1, 2, 2, 3, -1, -1]]  # a word of 3 pieces; the second row padded
    weights[1, :, :, 5:] = 0  # no attention to padding, as the model's
    weights[1] /= weights[1].sum(-1, keepdim=True)
    words = word_level(weights.float(), slot_matrix(torch.tensor(slots), 5))
    for row, token_slots in enumerate(slots):
        real = [s for s in token_slots if s >= 0]
        expected = reference_word_attention(weights[row:row + 1, :, :len(real), :len(real)].numpy(), real)[0]
        size = max(real) + 1
        np.testing.assert_allclose(words[row, :, :size, :size].numpy(), expected, atol=1e-6)
        np.testing.assert_allclose(words[row, :, :size, :size].sum(-1).numpy(), 1.0, atol=1e-6)


PLANS = {"none": None, "mixed": [{"heads": "L0H0", "policy": "prune"}, {"heads": "L0H1", "policy": "uniform"},
                                   {"heads": "L1H2-3", "policy": "drop_intra"}]}


@pytest.mark.parametrize("plan_name", list(PLANS))
def test_every_head_and_offset_equals_clark_on_a_model(treebank, tiny_model, tokenizer, plan_name):
    """Per word, head and direction, as Clark et al.'s predictor on the float64 reference's attention; under a
    plan, the kept heads see what the plan's earlier layers passed on, and the changed heads get no accuracy."""
    plan = None if PLANS[plan_name] is None else HeadPlan.from_rules(PLANS[plan_name], num_layers=3, num_heads=4)
    encoded = encode_treebank(treebank, tokenizer, max_length=512)
    assert [len(t) for t in encoded.token_slots] == [len(ids) for ids in encoded.input_ids]
    scores = syntax_scores(tiny_model, encoded, encoded.batches(2, tokenizer.pad_token_id), plan, sieve="relatives")
    pande = {direction: syntax_scores(tiny_model, encoded, encoded.batches(2, tokenizer.pad_token_id), plan,
                                      direction=direction).sieve for direction in ("l2r", "r2l", "bi")}
    layers, heads = tiny_model.config.num_hidden_layers, tiny_model.config.num_attention_heads
    policy_of = plan.policy_of if plan is not None else lambda layer, head: "keep"
    expected = np.zeros((encoded.num_words, layers, heads, 2), dtype=bool)
    start = 0
    for index, (sentence, ids, slots) in enumerate(zip(encoded.sentences, encoded.input_ids, encoded.token_slots)):
        record = {"weights": []}
        ids = torch.tensor([ids])
        bert_forward(params_of(tiny_model), tiny_model.config, ids, torch.ones_like(ids), torch.zeros_like(ids),
                     policy_of, sentence_ids=torch.zeros_like(ids), record=record)
        maps = np.zeros((layers, heads, len(slots), len(slots)))
        for layer, _, head, weights in record["weights"]:
            maps[layer, head] = weights.numpy()
        words = reference_word_attention(maps, slots)
        for layer in range(layers):
            for head in range(heads):
                if policy_of(layer, head) == "keep":
                    expected_scores = {"relatives": reference_sieve_scores(words[layer, head], sentence)} | {
                        direction: reference_pande_scores(maps[layer, head], slots, sentence, direction)
                        for direction in pande}
                    for kind, expected_of in expected_scores.items():
                        for role, expected_score in expected_of.items():
                            got = (scores.sieve if kind == "relatives" else pande[kind])[role][index, layer, head]
                            assert (np.isnan(got) and np.isnan(expected_score)) or got == pytest.approx(
                                expected_score, rel=1e-5), (kind, role)
                else:
                    for sieves in (scores.sieve, *pande.values()):
                        assert all(np.isnan(sieves[role][index, layer, head]) for role in sieves)
                predictions = clark_predictions(words[layer, head])
                for number, direction in enumerate(("dep->head", "head->dep")):
                    outcome = clark_outcomes(predictions[direction], sentence)
                    expected[start:start + len(sentence), layer, head, number] = outcome
        for offset in OFFSETS:  # Clark et al.'s offset_predictor: max(0, min(i + offset + 1, n)), 0-based i
            predictions = [max(0, min(i + offset + 1, len(sentence))) for i in range(len(sentence))]
            np.testing.assert_array_equal(scores.offsets[offset][start:start + len(sentence)],
                                          clark_outcomes(predictions, sentence))
        start += len(sentence)
    kept = np.array([[policy_of(layer, head) == "keep" for head in range(heads)] for layer in range(layers)])
    np.testing.assert_array_equal(scores.correct[:, kept], expected[:, kept])
    assert expected.any() and not expected.all()  # the check can fail both ways
    table = head_accuracies(scores, ["all", "nsubj"])
    assert table.set_index(["layer", "head"])["accuracy"].isna().groupby(level=[0, 1]).all().to_numpy().tolist() == (
        ~kept).ravel().tolist()
    nsubj = np.array([r == "nsubj" for s in encoded.sentences for r in s.relations])
    row = table[(table.relation == "nsubj") & (table.name == "L2H1") & (table.direction == "head->dep")]
    assert row["accuracy"].item() == pytest.approx(expected[nsubj, 2, 1, 1].mean())
    assert row["count"].item() == 3  # dog, man, who


@pytest.mark.parametrize(("text", "said"), [
    ("1\tA\t_\t_\t_\t_\t2\tdet\t_\t_\n2\tman\t_\t_\t_\t_\t1\tnsubj\t_\t_\n\n", "0 roots"),
    ("1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tman\t_\t_\t_\t_\t0\troot\t_\t_\n\n", "2 roots"),
    ("1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tb\t_\t_\t_\t_\t3\tdep\t_\t_\n3\tc\t_\t_\t_\t_\t2\tdep\t_\t_\n\n",
     "form a cycle"),
    ("1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tman\t_\t_\t_\t_\t7\tnsubj\t_\t_\n\n", "word 2 has head 7, outside 0..2"),
    ("hello world\n", "is not CoNLL-U"),
    ("1\tword\n\n", "is not a CoNLL-U word line"),
    ("", "holds no sentence"),
    ("1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tman\t_\t_\t_\t_\t1\t_\t_\t_\n\n",
     "sentence bad-one: word 2 \\('man'\\) has the relation '_'"),
    ("1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tman\t_\t_\t_\t_\t1\tnsubj pass\t_\t_\n\n",
     "word 2 \\('man'\\) has the relation 'nsubj pass'"),
    ("1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tman\t_\t_\t_\t_\t1\tnsubj\t_\t_\n\n# sent_id = two\n"
     "1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tman\t_\t_\t_\t_\t1\tNsubj\t_\t_\n\n",
     "sentence two, word 2 \\('man'\\) has the relation 'Nsubj', which differs only in case from 'nsubj' "
     "\\(sentence bad-one, word 2\\)"),
    ("1\tA\t_\t_\t_\t_\t0\tdep\t_\t_\n2\tman\t_\t_\t_\t_\t1\tnsubj\t_\t_\n\n",
     "word 1 \\('A'\\) is the root \\(head 0\\) but has the relation 'dep'"),
    ("1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n2\tman\t_\t_\t_\t_\t1\troot\t_\t_\n\n",
     "word 2 \\('man'\\) has the relation 'root' but head 1"),
])
def test_a_broken_treebank_is_named_with_its_sentence(tmp_path, text, said):
    path = tmp_path / "bad.conllu"
    path.write_text("# sent_id = bad-one\n" + text if text else text)
    with pytest.raises(UserError, match=said) as error:
        read_conllu(path)
    if "sentence" not in said and text.startswith("1"):
        assert "sentence bad-one" in str(error.value)
    assert str(path) in str(error.value)


def test_relations_are_stripped_and_a_byte_order_mark_is_skipped(tmp_path):
    """``nsubj `` (a trailing space) was a relation of its own, printed as nsubj: two rows, half the words each."""
    path = tmp_path / "spaced.conllu"
    word = "{}\t{}\t_\t_\t_\t_\t{}\t{}\t_\t_\n"
    first = word.format(1, "Dogs", 2, "nsubj ") + word.format(2, "run", 0, "root")
    second = word.format(1, "Cats", 2, " nsubj") + word.format(2, "sleep", 0, "root")
    path.write_text(f"\ufeff# sent_id = a\n{first}\n# sent_id = b\n{second}\n", encoding="utf-8")
    first, second = read_conllu(path)
    assert first.sent_id == "a" and first.relations == second.relations == ("nsubj", "root")


def test_a_root_labelled_as_other_tools_do_is_the_root(tmp_path):
    """Read as a word of a relation ``ROOT``, the root counted in ``all`` (27 words where 23 count) and got a row of
    its own, 0 by construction."""
    path = tmp_path / "upper.conllu"
    word = "{}\t{}\t_\t_\t_\t_\t{}\t{}\t_\t_\n"
    path.write_text(word.format(1, "Dogs", 2, "nsubj") + word.format(2, "run", 0, "ROOT") + "\n"
                    + word.format(1, "Cats", 2, "nsubj") + word.format(2, "sleep", 0, "Root") + "\n")
    assert [s.relations for s in read_conllu(path)] == [("nsubj", "root")] * 2


# ----------------------------------------------------------------------------- ablate.py mode=syntax


def clark_offset_accuracy(sentences, relation, offset):
    """Clark et al.'s offset_predictor and evaluate_predictor over the sentences, for one relation."""
    right = total = 0
    for sentence in sentences:
        predictions = [max(0, min(i + offset + 1, len(sentence))) for i in range(len(sentence))]
        for outcome, rel in zip(clark_outcomes(predictions, sentence), sentence.relations):
            if rel == relation:
                right, total = right + outcome, total + 1
    return right / total


def test_mode_syntax_writes_clark_table_from_its_per_head_accuracies(tmp_path):
    out = run("ablate.py", "mode=syntax", "allow_random_head=true", "syntax.min_count=40", "syntax.resamples=200",
              f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path)
    job = tmp_path / "job"
    record = json.loads((job / "syntax.json").read_text())
    summary = json.loads((job / "results.json").read_text())
    assert summary["complete"] and summary["num_sentences"] == 520 and summary["too_long"] == 0  # the default: UD EWT
    for name in summary["files"]:
        assert (job / name).is_file(), name
    sentences = read_conllu(ROOT / "src/headlab/tasks/data/ud_ewt/dev.conllu")
    heads = pd.DataFrame(record["heads"])
    table = pd.read_csv(job / "syntax.csv")
    counts = Counter(r for s in sentences for r in s.relations if r not in ("root", "punct"))
    assert table["relation"][0] == "all" and set(table["relation"][1:]) == {r for r, c in counts.items() if c >= 40}
    assert list(table["count"][1:]) == sorted(table["count"][1:], reverse=True) and len(table) > 10
    for row in table.itertuples():
        rows = heads[heads["relation"] == row.relation]
        assert row.accuracy == pytest.approx(rows["accuracy"].max())  # the best head, either direction
        best = rows.loc[rows["accuracy"].idxmax()]
        assert (best["name"], best["direction"]) == (row.head, row.direction)
        if row.relation != "all":
            words = sum(r == row.relation for s in sentences for r in s.relations)
            assert row.count == words
            expected = max(clark_offset_accuracy(sentences, row.relation, o) for o in OFFSETS)
            assert row.baseline_accuracy == pytest.approx(expected)
            assert row.baseline_accuracy == pytest.approx(
                clark_offset_accuracy(sentences, row.relation, row.baseline_offset))
        assert row.difference == pytest.approx(row.accuracy - row.baseline_accuracy)
        assert row.ci_low <= row.difference <= row.ci_high or (np.isnan(row.ci_low) and row.tied >= 1)
    markdown = (job / "syntax.md").read_text()
    roles = pd.read_csv(job / "sieve_roles.csv")
    assert set(roles["sieve"]) == {"syntactic", "nsubj", "obj", "amod", "advmod"} and len(roles) == 5 * 12
    counts = ", ".join(f"{sieve} {int(flags.sum())}" for sieve, flags in roles.groupby("sieve", sort=False)["role"])
    assert f"): {counts} of 12 heads." in markdown and summary["roles"] == json.loads(
        json.dumps({s: int(f.sum()) for s, f in roles.groupby("sieve", sort=False)["role"]}))
    joined = head_table(syntax=job, label="tiny").set_index("name")  # the per-head table of mode=report
    for row in heads.itertuples():
        other = heads[(heads["name"] == row.name) & (heads["relation"] == row.relation)]["accuracy"].max()
        assert joined.loc[row.name, f"syntax_{row.relation}"] == pytest.approx(other)
    for row in roles.itertuples():
        assert joined.loc[row.name, f"sieve_{row.sieve}"] == pytest.approx(row.mean, nan_ok=True)
        assert joined.loc[row.name, f"role_{row.sieve}"] == row.role
    planned = tmp_path / "planned"  # the same job as a syntax job under a plan records itself
    shutil.copytree(job, planned)
    record = json.loads((planned / "results.json").read_text())
    (planned / "results.json").write_text(json.dumps(record | {"plan": {"rules": [{"heads": "L0H0", "policy": "prune"}],
                                                                        "policies": {"L0H0": "prune"}}}))
    with pytest.raises(UserError, match="ran under a plan"):
        head_table(syntax=planned)
    first = table.iloc[1]
    assert f"| {first.relation} " in markdown and f"{100 * first.accuracy:.1f}" in markdown
    assert f"{first['head']} ({first.direction})" in out.stdout
    again = run("ablate.py", "mode=syntax", "allow_random_head=true", "syntax.min_count=40", "syntax.resamples=200",
                f"hydra.run.dir={job}", cwd_tmp=tmp_path)
    assert "already done" in again.stdout


@pytest.mark.parametrize(("overrides", "said"), [
    (["syntax.conllu=/nonexistent/dev.conllu"], "syntax.conllu='/nonexistent/dev.conllu': no such file"),
    (["syntax.conllu=BAD"], "is not CoNLL-U"),
    (["syntax.conllu=CYCLE"], "sentence cyc-1: the heads of words [2, 3] form a cycle"),
    (["syntax.max_length=3", "syntax.treebank=demo_syntax"], "dev.conllu' fits max_length=3"),
    (["syntax.max_length=3"], "that fit max_length=3 have no word to score"),  # EWT's one-word sentences fit
    (["syntax.probe=attn", "syntax.conllu=SHORT", "syntax.train_conllu=CYCLE_FREE", "syntax.max_length=12"],
     "fine.conllu' fits max_length=12"),  # the probe's training treebank: too long for max_length
    (["syntax.relations=[nsubj,dobj]"], "syntax.relations: 'dobj' not in the treebank"),
    (["syntax.relations=[root]"], "syntax.relations: 'root' is left out of the table"),  # 0 by construction
    (["syntax.conllu=UNSCORABLE"], "unscorable.conllu' has no word to score: every word is a root or punct"),
    (["syntax.relations=[nsubj,punct]"], "syntax.relations: 'punct' is left out of the table"),
    (["mask=prune", "mask.heads=all"], "a plan that changes every head (prune=12): no head is left to score"),
    (["syntax.min_count=0"], "syntax.min_count=0 must be at least 1"),
    (["syntax.probe=mlp"], "syntax.probe"),
    (["syntax.probe=attn", "syntax.conllu=CYCLE_FREE"], "needs a training treebank"),
    (["syntax.probe=attn", "mask=prune", "mask.heads=L0"], "syntax.probe=attn reads every head"),
    (["syntax.probe=attn", "syntax.train_conllu=BAD"], "syntax.train_conllu="),
    (["syntax.probe=attn", "syntax.conllu=CYCLE_FREE", "syntax.train_conllu=CYCLE_FREE"],
     "is the evaluation file too"),
    (["syntax.probe=attn", "syntax.conllu=CYCLE_FREE", "syntax.train_conllu=COPY"],
     "holds every evaluation sentence"),  # a copy under another name
])
def test_mode_syntax_bad_input_is_one_line(tmp_path, overrides, said):
    (tmp_path / "bad.conllu").write_text('{"not": "conllu"}\n')
    (tmp_path / "cycle.conllu").write_text("# sent_id = cyc-1\n1\tA\t_\t_\t_\t_\t0\troot\t_\t_\n"
                                           "2\tb\t_\t_\t_\t_\t3\tdep\t_\t_\n3\tc\t_\t_\t_\t_\t2\tdep\t_\t_\n\n")
    (tmp_path / "fine.conllu").write_text(TREEBANK)
    (tmp_path / "copy.conllu").write_text(TREEBANK)
    (tmp_path / "short.conllu").write_text("1\tA\t_\t_\t_\t_\t2\tdet\t_\t_\n2\tb\t_\t_\t_\t_\t0\troot\t_\t_\n\n")
    (tmp_path / "unscorable.conllu").write_text(  # one-word sentences and punctuation: ended in All-NaN slice
        "1\tHi\t_\t_\t_\t_\t0\troot\t_\t_\n\n1\tYes\t_\t_\t_\t_\t0\troot\t_\t_\n2\t!\t_\t_\t_\t_\t1\tpunct\t_\t_\n\n")
    # CYCLE_FREE before CYCLE
    files = {"SHORT": "short", "BAD": "bad", "CYCLE_FREE": "fine", "CYCLE": "cycle", "COPY": "copy",
             "UNSCORABLE": "unscorable"}

    def filled(override: str) -> str:
        for placeholder, name in files.items():
            override = override.replace(placeholder, str(tmp_path / f"{name}.conllu"))
        return override
    overrides = [filled(o) for o in overrides]
    result = run("ablate.py", "mode=syntax", "allow_random_head=true", *overrides,
                 f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path, check=False)
    assert_one_error_line(result, said)
    assert not (tmp_path / "job").exists()


def byte_level_bpe_tokenizer(texts, trim_offsets=True):
    """A RoBERTa-style tokenizer (byte-level BPE, <s> ... </s>) trained here on ``texts``; untrimmed, a token's
    offsets include the space before its word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import RobertaTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ids = {token: bpe.token_to_id(token) for token in ("<s>", "</s>")}
    bpe.post_processor = processors.RobertaProcessing(("</s>", ids["</s>"]), ("<s>", ids["<s>"]),
                                                      trim_offsets=trim_offsets)
    return RobertaTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                unk_token="<unk>", cls_token="<s>", sep_token="</s>", trim_offsets=trim_offsets)


@pytest.mark.parametrize("kind", ["wordpiece", "byte-level BPE", "byte-level BPE, untrimmed offsets", "roberta",
                                  "xlm-roberta", "albert", "deberta-v2"])
def test_each_word_gets_exactly_its_own_pieces(treebank, tokenizer, kind):
    """Trained on the treebank's words, and each family's tiny tokenizer (rarely whole words: RoBERTa's lone "Ġ"
    before a word, SentencePiece's lone "▁", whose offsets DeBERTa's tokenizer puts on the space before the word).
    By the pieces' text, and by their characters: each piece's non-space characters lie in its word, and a piece of
    spaces alone (or of none) ends where its word starts."""
    if kind.startswith("byte-level"):
        tokenizer = byte_level_bpe_tokenizer([" ".join(s.words) for s in treebank] * 3, "untrimmed" not in kind)
    elif kind != "wordpiece":
        tokenizer = tiny_tokenizer(kind)
    encoded = encode_treebank(treebank, tokenizer, max_length=512)
    for sentence, ids, slots in zip(encoded.sentences, encoded.input_ids, encoded.token_slots):
        pieces = tokenizer.convert_ids_to_tokens(ids)
        assert slots[0] == 0 and slots[-1] == len(sentence) + 1 and slots == sorted(slots)
        for number, word in enumerate(sentence.words, start=1):
            text = tokenizer.convert_tokens_to_string([p for p, s in zip(pieces, slots) if s == number])
            lower = kind in ("wordpiece", "albert")  # uncased
            assert text.strip().replace(" ", "") == word.lower() if lower else text.strip() == word, (kind, word)
        joined = " ".join(sentence.words)
        encoding = tokenizer(joined, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert encoding["input_ids"] == list(ids)
        word_starts = [sum(len(w) + 1 for w in sentence.words[:i]) for i in range(len(sentence.words))]
        for (start, end), special, slot in zip(encoding["offset_mapping"], encoding["special_tokens_mask"], slots):
            if special:
                continue
            first = word_starts[slot - 1]
            characters = [i for i in range(start, end) if not joined[i].isspace()]
            if characters:
                assert first <= min(characters) and max(characters) < first + len(sentence.words[slot - 1]), kind
            else:
                assert end == first, (kind, joined[start:end], slot)
    pieces_of_longest = max(slots.count(8) for slots in encoded.token_slots[:1])  # "Vartorholm" is slot 8
    assert pieces_of_longest >= (3 if kind in ("wordpiece", "roberta", "xlm-roberta", "albert") else 1)


def test_mode_syntax_trains_the_attention_probe_and_scores_the_baseline(tmp_path):
    (tmp_path / "hand.conllu").write_text(TREEBANK)
    demo = (ROOT / "src/headlab/tasks/data/demo_syntax/train.conllu").read_text().strip().split("\n\n")
    (tmp_path / "train.conllu").write_text("\n\n".join(demo[:30]) + "\n\n")  # trees apart from the evaluated ones
    hand, train = str(tmp_path / "hand.conllu"), str(tmp_path / "train.conllu")
    run("ablate.py", "mode=syntax", "allow_random_head=true", f"syntax.conllu={hand}", f"syntax.train_conllu={train}",
        "syntax.probe=attn", "syntax.probe_epochs=2", "syntax.min_count=1", "syntax.resamples=50",
        f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path)
    probe = json.loads((tmp_path / "job/probe.json").read_text())
    right = total = 0
    for sentence in read_conllu(tmp_path / "hand.conllu"):  # each word's head the next word, the last word's ROOT
        for index, (head, relation) in enumerate(zip(sentence.heads, sentence.relations), start=1):
            if relation != "punct":
                right, total = right + (head == (index + 1 if index < len(sentence) else 0)), total + 1
    assert probe["right_branching"]["uas"] == pytest.approx(right / total) and probe["probe"]["words"] == total
    assert 0 <= probe["probe"]["uas"] <= 1 and probe["train_sentences"] == 30 and probe["epochs"] == 2
    assert f"UAS {100 * probe['probe']['uas']:.1f}" in (tmp_path / "job/syntax.md").read_text()



def test_relations_named_get_a_row_whatever_their_count():
    """``syntax.relations`` is what the user asked for: a rare relation (or punct) is not dropped by min_count."""
    from headlab.analysis.syntax.heads import SyntaxScores, relation_counts, relations_below

    relations = np.array(["nsubj"] * 30 + ["iobj"] * 3 + ["punct"] * 5 + ["root"] * 2)
    scores = SyntaxScores(np.zeros((len(relations), 1, 1, 2), dtype=bool), {}, relations)
    assert relation_counts(scores, 20).to_dict() == {"all": 33, "nsubj": 30}
    assert relation_counts(scores, 20, ["iobj", "punct"]).to_dict() == {"all": 33, "punct": 5, "iobj": 3}
    assert relations_below(scores, 20).to_dict() == {"iobj": 3} and relations_below(scores, 20, ["iobj"]).empty


def test_a_treebank_without_a_frequent_relation_gets_the_all_row_only(tmp_path):
    """No relation reaches min_count: the table has its ``all`` row and no per-relation figure (it crashed)."""
    (tmp_path / "short.conllu").write_text("1\tA\t_\t_\t_\t_\t2\tdet\t_\t_\n2\tb\t_\t_\t_\t_\t0\troot\t_\t_\n\n"
                                           "1\tC\t_\t_\t_\t_\t2\tamod\t_\t_\n2\td\t_\t_\t_\t_\t0\troot\t_\t_\n\n")
    out = run("ablate.py", "mode=syntax", "allow_random_head=true", f"syntax.conllu={tmp_path / 'short.conllu'}",
              "syntax.resamples=20", f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path)
    table = pd.read_csv(tmp_path / "job/syntax.csv")
    assert list(table["relation"]) == ["all"] and table["count"].item() == 2
    left_out = "Left out, fewer than 20 words each (syntax.min_count): amod 1, det 1."
    assert left_out in (tmp_path / "job/syntax.md").read_text() and left_out in out.stdout
    assert json.loads((tmp_path / "job/results.json").read_text())["left_out"] == {
        "min_count": 20, "relations": {"amod": 1, "det": 1}}
    assert not list((tmp_path / "job").glob("syntax_heads_*.png"))


def test_resamples_too_few_for_any_row_to_pass_are_said():
    """600 resamples over 32 rows: the smallest p-value, 1/601, times 32 rows is 0.053: no relation can pass (the
    first version's two-sided floor at 1,000 resamples hid every relation, and nothing said so)."""
    from omegaconf import OmegaConf

    from headlab.analysis.syntax.syntax_run import resolution_warning, unscored_note

    table = pd.DataFrame({"p_value": [1 / 601] * 32 + [np.nan]})
    (line,) = resolution_warning(table, OmegaConf.create({"resamples": 600, "confidence": 0.95}))
    assert line.startswith("warning: with syntax.resamples=600, no row can reach p (Holm) < 0.05")
    assert line.endswith("use syntax.resamples=640 or more") and 32 / 641 < 0.05
    assert resolution_warning(table, OmegaConf.create({"resamples": 640, "confidence": 0.95})) == []
    assert unscored_note([], 5, 0) == []
    assert unscored_note(["compound"], 3, 1) == ["note: syntax.relations names compound, but none of the 3 sentences "
                                                 "scored has it (1 sentences skipped): no row"]
