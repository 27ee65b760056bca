"""The bundled demo tasks and treebank: reproducible from the generator, well-formed, and not solvable by position."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import ROOT

from headlab.analysis.syntax.demo_treebank import write_demo_treebank
from headlab.analysis.syntax.treebank import read_conllu
from headlab.core.units import split_sentences
from headlab.tasks.demo_tasks import DATA_DIR, write_demo_tasks


def test_committed_files_equal_a_fresh_generation(tmp_path):
    generators = {write_demo_tasks: "headlab.tasks.demo_tasks",
                  write_demo_treebank: "headlab.analysis.syntax.demo_treebank"}
    for write, module in generators.items():
        for path in write(tmp_path):
            committed = DATA_DIR / path.relative_to(tmp_path)
            assert committed.read_bytes() == path.read_bytes(), f"{committed} is stale: run python -m {module}"
    demo = [p for folder in ("demo_qa", "demo_pairs") for p in (DATA_DIR / folder).glob("*.json*")]
    assert sum(p.stat().st_size for p in demo) < 2 * 1024 * 1024  # the generated demos stay small (real text aside)


def test_demo_qa_answers_are_spans_in_one_of_several_sentences():
    for split in ("train", "validation"):
        data = json.loads((DATA_DIR / "demo_qa" / f"{split}.json").read_text())
        assert data["version"] == "1.1"
        answer_sentence = Counter()
        for article in data["data"]:
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                sentences = split_sentences(context)
                assert len(sentences) >= 4
                for qa in paragraph["qas"]:
                    (answer,) = qa["answers"]
                    start = answer["answer_start"]
                    assert context[start : start + len(answer["text"])] == answer["text"]
                    answer_sentence[next(i for i, (a, b) in enumerate(sentences) if a <= start < b)] += 1
        assert len(answer_sentence) >= 4  # answers sit in every position, not always the first sentence


def test_demo_pairs_are_balanced_and_labelled_by_the_facts():
    rows = [json.loads(line) for line in (DATA_DIR / "demo_pairs" / "validation.jsonl").read_text().splitlines()]
    assert Counter(r["label"] for r in rows) == {0: 250, 1: 250}
    for row in rows:
        facts = {sentence.strip() for sentence in row["sentence1"].split(".") if sentence.strip()}
        assert (row["sentence2"].rstrip(".") in facts) == bool(row["label"])


def test_a_second_generation_leaves_unchanged_files_untouched(tmp_path):
    """Jobs count their data files' modification times: regenerating the same data must not make them rerun."""
    def written():
        return {path: path.stat().st_mtime_ns for path in write_demo_tasks(tmp_path) + write_demo_treebank(tmp_path)}

    first = written()
    assert written() == first


def test_demo_treebank_has_every_relation_of_the_tables_and_a_non_projective_arc():
    sentences = read_conllu(DATA_DIR / "demo_syntax" / "dev.conllu")
    relations = Counter(r for s in sentences for r in s.relations)
    wanted = ("nsubj obj iobj amod advmod det case nmod obl nmod:poss aux aux:pass cop mark cc conj punct root").split()
    assert all(relations[r] >= 20 for r in wanted), relations

    def dominates(heads, top, word):
        while word != 0:
            if word == top:
                return True
            word = heads[word - 1]
        return False

    crossing = longest = 0
    for s in sentences:
        for dependent, head in enumerate(s.heads, start=1):
            if head:
                longest = max(longest, abs(head - dependent))
                between = range(min(head, dependent) + 1, max(head, dependent))
                crossing += any(not dominates(s.heads, head, w) for w in between)
    assert crossing > 0 and longest >= 7


def test_the_bundled_ud_ewt_slice_is_the_test_splits_every_fourth_sentence_with_its_licence(tmp_path):
    """dev.conllu: sentences 1, 5, 9, ... of UD English EWT's test split; train.conllu: 3, 7, 11, ...; disjoint, copied
    unchanged, the licence (CC BY-SA 4.0) and the attribution beside them."""
    from headlab.analysis.syntax.ud_ewt_slice import FOLDER, sentence_blocks, write_slices

    dev, train = (read_conllu(FOLDER / f"{name}.conllu") for name in ("dev", "train"))
    assert (len(dev), len(train)) == (520, 519)
    assert not {s.sent_id for s in dev} & {s.sent_id for s in train}
    assert "Attribution-ShareAlike 4.0" in (FOLDER / "LICENSE.txt").read_text()
    assert "Silveira" in (FOLDER / "README.md").read_text()
    source = ROOT.parent / "shared/data/ud_english_ewt/en_ewt-ud-test.conllu"
    if not source.is_file():
        pytest.skip("the UD English EWT test split is not beside the repository")
    blocks = sentence_blocks(source.read_text())
    assert len(blocks) == 2077
    written = {path.name: path.read_text() for path in write_slices(source, tmp_path)}
    assert written["dev.conllu"] == (FOLDER / "dev.conllu").read_text()  # regenerated = committed
    assert written["train.conllu"] == (FOLDER / "train.conllu").read_text()
    assert written["dev.conllu"].split("\n\n")[1] == blocks[4]
