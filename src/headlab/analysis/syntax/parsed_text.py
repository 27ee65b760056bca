"""Plain text parsed into dependency trees by a spaCy pipeline (``syntax.parser=spacy``).

Each non-blank line of the file is parsed (runs of spaces and tabs read as one space); each sentence spaCy finds in
it is a tree of its tokens: the root's head is 0 and its relation ``root`` (spaCy's ``ROOT``), every other relation
is the pipeline's label as it is (``nsubj``, ``dobj``, ``poss``, ``punct``... for spaCy's English pipelines, which
use ClearNLP labels rather than UD's; Pande et al.'s ``obj`` role and Clark et al.'s possessive case read both).
spaCy and a pipeline are optional (``pip install 'headlab[syntax]'`` and ``python -m spacy download
en_core_web_sm``); without them a ``UserError`` says what to install.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from headlab.analysis.syntax.treebank import Sentence, check_tree
from headlab.errors import UserError

INSTALL = "pip install 'headlab[syntax]' && python -m spacy download en_core_web_sm"


def load_parser(name: str) -> Any:
    """The spaCy pipeline ``name`` (an installed package or a folder), checked to have a dependency parser."""
    try:
        import spacy
    except ImportError:
        raise UserError(f"syntax.parser=spacy needs spaCy and an English pipeline, which are not installed: "
                        f"{INSTALL}") from None
    try:
        nlp = spacy.load(name)
    except OSError:
        if Path(name).exists() or "/" in name or name.startswith("."):  # a folder: nothing to download
            raise UserError(f"syntax.spacy_model={name!r} is not a spaCy pipeline folder (one written by "
                            "nlp.to_disk, with config.cfg and meta.json); give such a folder, or the name of an "
                            "installed pipeline (e.g. en_core_web_sm)") from None
        raise UserError(f"syntax.spacy_model={name!r} is not an installed spaCy pipeline: python -m spacy download "
                        f"{name} (or give the package name or folder of one with a parser)") from None
    if "parser" not in nlp.pipe_names:
        raise UserError(f"syntax.spacy_model={name!r} has no dependency parser (its components: "
                        f"{', '.join(nlp.pipe_names) or 'none'}); give a pipeline with one, e.g. en_core_web_sm")
    return nlp


def read_text(path: str | Path, model: str, what: str = "syntax.text",
              limit: int | None = None) -> list[Sentence]:
    """The (first ``limit``) sentences of a plain-text file as parsed by the spaCy pipeline ``model``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what}={str(path)!r}: no such file; give a plain-text file (one or more sentences a line)")
    try:
        raw = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as error:
        raise UserError(f"{what}={str(path)!r} is not UTF-8 text: {error}") from None
    if any(len(line.split("\t")) == 10 for line in raw):  # parsed as text, its columns would make nonsense trees
        raise UserError(f"{what}={str(path)!r} looks like CoNLL-U (10 tab-separated columns): give it as "
                        "syntax.conllu, without syntax.parser=spacy")
    lines = [" ".join(line.split()) for line in raw]
    if not lines:
        raise UserError(f"{what}={str(path)!r} has no text; give one or more sentences a line")
    sentences = []
    for sentence in _parsed(load_parser(model), lines, f"{what}={str(path)!r}"):
        sentences.append(sentence)
        if limit is not None and len(sentences) == limit:
            break
    return sentences


def _parsed(nlp: Any, lines: list[str], where: str) -> Iterator[Sentence]:
    for number, doc in enumerate(nlp.pipe(lines), start=1):
        for index, span in enumerate(doc.sents, start=1):
            yield span_sentence(span, f"line {number}.{index}", where)


def span_sentence(span: Any, sent_id: str, where: str = "spaCy") -> Sentence:
    """A spaCy sentence (a ``Span`` whose tokens' heads lie inside it) as a tree: 1-based heads, 0 the root."""
    heads = tuple(0 if token.head.i == token.i else token.head.i - span.start + 1 for token in span)
    check_tree(heads, f"{where}, sentence {sent_id} as parsed")
    relations = tuple("root" if token.dep_ == "ROOT" else token.dep_ for token in span)
    return Sentence(sent_id, tuple(token.text for token in span), heads, relations)
