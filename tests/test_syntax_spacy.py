"""``syntax.parser=spacy``: plain text parsed by a spaCy pipeline (trained here on the demo treebank for a few
seconds: no pipeline is downloaded) gives the same trees, and so the same scores, as the CoNLL-U of that parse."""

from __future__ import annotations

import json
import random
import sys

import pandas as pd
import pytest
from conftest import COMMON, ROOT, assert_one_error_line, run
from forked import HANG_GUARD, run_script

from headlab.analysis.syntax.parsed_text import span_sentence
from headlab.analysis.syntax.treebank import Sentence, read_conllu

spacy = pytest.importorskip("spacy")
DEMO = ROOT / "src/headlab/tasks/data/demo_syntax"


def train_parser(folder):
    """A spaCy pipeline with a dependency parser trained on 300 demo_syntax training trees, saved to ``folder``."""
    from spacy.tokens import Doc
    from spacy.training import Example

    nlp = spacy.blank("en")
    nlp.add_pipe("parser")
    examples = []
    for sentence in read_conllu(DEMO / "train.conllu")[:300]:
        heads = [word if head == 0 else head - 1 for word, head in enumerate(sentence.heads)]  # spaCy: 0-based, root
        deps = ["ROOT" if relation == "root" else relation for relation in sentence.relations]  # heads itself
        examples.append(Example.from_dict(Doc(nlp.vocab, words=list(sentence.words)), {"heads": heads, "deps": deps}))
    optimizer = nlp.initialize(lambda: examples)
    random.Random(0).shuffle(examples)
    for _ in range(3):
        for start in range(0, len(examples), 16):
            nlp.update(examples[start:start + 16], sgd=optimizer)
    nlp.to_disk(folder)
    return folder


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    return train_parser(tmp_path_factory.mktemp("spacy") / "parser")


def test_a_spacy_sentence_becomes_a_tree_with_one_based_heads_and_root_zero():
    from spacy.tokens import Doc

    words = ["Mira", "'s", "dog", "barked", ".", "It", "slept", "."]
    heads = [2, 0, 3, 3, 3, 6, 6, 6]  # spaCy: the index in the doc of each token's head; a root heads itself
    deps = ["poss", "case", "nsubj", "ROOT", "punct", "nsubj", "ROOT", "punct"]
    doc = Doc(spacy.blank("en").vocab, words=words, heads=heads, deps=deps)
    sentences = [span_sentence(span, str(i)) for i, span in enumerate(doc.sents)]
    assert sentences == [Sentence("0", ("Mira", "'s", "dog", "barked", "."), (3, 1, 4, 0, 4),
                                  ("poss", "case", "nsubj", "root", "punct")),
                         Sentence("1", ("It", "slept", "."), (2, 0, 2), ("nsubj", "root", "punct"))]


def conllu_of(sentences) -> str:
    """CoNLL-U written here from each sentence's 0-based spaCy heads."""
    blocks = []
    for number, span in enumerate(sentences):
        lines = [f"# sent_id = s{number}"]
        for token in span:
            head = 0 if token.head.i == token.i else token.head.i - span.start + 1
            relation = "root" if token.dep_ == "ROOT" else token.dep_
            lines.append(f"{token.i - span.start + 1}\t{token.text}\t_\t_\t_\t_\t{head}\t{relation}\t_\t_")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def test_mode_syntax_on_parsed_text_equals_mode_syntax_on_the_conllu_of_that_parse(pipeline, tmp_path):
    lines = [" ".join(sentence.words) for sentence in read_conllu(DEMO / "dev.conllu")[:60]]
    text = tmp_path / "dev.txt"
    text.write_text("\n\n".join(lines) + "\n")  # blank lines between: skipped
    nlp = spacy.load(pipeline)
    (tmp_path / "dev.conllu").write_text(conllu_of([span for doc in nlp.pipe(lines) for span in doc.sents]))
    jobs = {"text": tmp_path / "from_text", "conllu": tmp_path / "from_conllu"}
    common = ["allow_random_head=true", "syntax.min_count=10", "syntax.resamples=100", "syntax.examples=0"]
    run("ablate.py", "mode=syntax", *common, "syntax.parser=spacy", f"syntax.text={text}",
        f"syntax.spacy_model={pipeline}", f"hydra.run.dir={jobs['text']}", cwd_tmp=tmp_path)
    run("ablate.py", "mode=syntax", *common, f"syntax.conllu={tmp_path / 'dev.conllu'}",
        f"hydra.run.dir={jobs['conllu']}", cwd_tmp=tmp_path)
    parsed, written = (json.loads((job / "syntax.json").read_text()) for job in jobs.values())
    assert parsed["heads"] == written["heads"] and parsed["counts"] == written["counts"]
    pd.testing.assert_frame_equal(*(pd.read_csv(job / "syntax.csv") for job in jobs.values()))
    pd.testing.assert_frame_equal(*(pd.read_csv(job / "sieve_roles.csv") for job in jobs.values()))
    summary = json.loads((jobs["text"] / "results.json").read_text())
    assert summary["num_sentences"] == len(read_conllu(tmp_path / "dev.conllu")) and summary["treebank"] == str(text)


def test_the_probe_trains_on_parsed_text(pipeline, tmp_path):
    sentences = read_conllu(DEMO / "train.conllu")
    (tmp_path / "train.txt").write_text("\n".join(" ".join(s.words) for s in sentences[300:420]) + "\n")
    (tmp_path / "dev.txt").write_text("\n".join(" ".join(s.words) for s in sentences[420:460]) + "\n")
    job = tmp_path / "probe"
    run("ablate.py", "mode=syntax", "allow_random_head=true", "syntax.parser=spacy", f"syntax.spacy_model={pipeline}",
        f"syntax.text={tmp_path / 'dev.txt'}", f"syntax.train_text={tmp_path / 'train.txt'}", "syntax.probe=attn",
        "syntax.resamples=50", "syntax.examples=0", f"hydra.run.dir={job}", cwd_tmp=tmp_path)
    probe = json.loads((job / "probe.json").read_text())
    nlp = spacy.load(pipeline)
    parsed = {name: [span for doc in nlp.pipe((tmp_path / f"{name}.txt").read_text().splitlines())
                     for span in doc.sents] for name in ("train", "dev")}
    words = sum(token.dep_ != "punct" for span in parsed["dev"] for token in span)  # UAS leaves punctuation out
    assert probe["train_treebank"] == str(tmp_path / "train.txt") and probe["train_sentences"] == len(parsed["train"])
    assert probe["probe"]["words"] == probe["right_branching"]["words"] == words
    assert probe["probe"]["uas"] > probe["right_branching"]["uas"]  # the parse is learnt from the attention


def no_spacy(*overrides):
    """ablate.py in a Python where ``import spacy`` fails, as where it is not installed."""
    code = ("import runpy, sys; sys.modules['spacy'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    command = [sys.executable, "-c", code, str(ROOT / "ablate.py"), *COMMON, *overrides]
    return run_script(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)


@pytest.mark.parametrize(("overrides", "said"), [
    (["NO_SPACY", "syntax.parser=spacy", "syntax.text=TEXT"],
     "syntax.parser=spacy needs spaCy and an English pipeline, which are not installed: pip install"),
    (["syntax.parser=spacy", "syntax.text=TEXT"],
     "syntax.spacy_model='en_core_web_sm' is not an installed spaCy pipeline: python -m spacy download en_core_web_sm"),
    (["syntax.parser=spacy", "syntax.text=TEXT", "syntax.spacy_model=BLANK"], "has no dependency parser"),
    (["syntax.parser=spacy", "syntax.text=TEXT", "syntax.spacy_model=NOT_A_PIPELINE"],
     "is not a spaCy pipeline folder (one written by nlp.to_disk"),  # it advised: python -m spacy download /path
    (["syntax.parser=spacy"], "syntax.parser=spacy parses plain text: give syntax.text=FILE"),
    (["syntax.parser=spacy", "syntax.text=TEXT", "syntax.conllu=TEXT"], "not syntax.conllu"),
    (["syntax.text=TEXT"], "syntax.text / syntax.train_text are plain text, parsed with syntax.parser=spacy"),
    (["syntax.parser=spacy", "syntax.text=/nonexistent/dev.txt", "syntax.spacy_model=PARSER"],
     "syntax.text='/nonexistent/dev.txt': no such file"),
    (["syntax.parser=spacy", "syntax.text=EMPTY", "syntax.spacy_model=PARSER"], "has no text"),
    (["syntax.parser=spacy", "syntax.text=TREES", "syntax.spacy_model=PARSER"],
     "looks like CoNLL-U (10 tab-separated columns): give it as syntax.conllu"),
    (["syntax.parser=spacy", "syntax.text=TEXT", "syntax.spacy_model=PARSER", "syntax.probe=attn"],
     "is given without syntax.train_text=FILE"),
    (["syntax.parser=spacy", "syntax.text=TEXT", "syntax.spacy_model=PARSER", "syntax.probe=attn",
      "syntax.train_text=COPY"], "holds every evaluation sentence"),
])
def test_parsed_text_bad_input_is_one_line(pipeline, tmp_path, overrides, said):
    (tmp_path / "dev.txt").write_text("Mira 's dog found the key .\nA man arrived .\n")
    (tmp_path / "copy.txt").write_text("A man arrived .\nMira 's dog found the key .\n")
    (tmp_path / "empty.txt").write_text("\n  \n")
    spacy.blank("en").to_disk(tmp_path / "blank")
    files = {"TEXT": tmp_path / "dev.txt", "TREES": DEMO / "dev.conllu", "COPY": tmp_path / "copy.txt",
             "EMPTY": tmp_path / "empty.txt", "BLANK": tmp_path / "blank", "PARSER": pipeline,
             "NOT_A_PIPELINE": tmp_path}
    for placeholder, path in files.items():
        overrides = [o.replace(placeholder, str(path)) for o in overrides]
    job = [f"hydra.run.dir={tmp_path / 'job'}", "allow_random_head=true", f"data.cache_dir={tmp_path / 'cache'}"]
    if overrides[0] == "NO_SPACY":
        result = no_spacy("mode=syntax", *overrides[1:], *job)
    else:
        result = run("ablate.py", "mode=syntax", *overrides, *job, cwd_tmp=tmp_path, check=False)
    assert_one_error_line(result, said)
    assert not (tmp_path / "job").exists()
