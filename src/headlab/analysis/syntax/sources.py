"""Where ``mode=syntax`` reads its sentences: a CoNLL-U treebank (``syntax.conllu=FILE``, else the bundled
``syntax.treebank``: ``ud_ewt``, a slice of UD English EWT, by default; ``demo_syntax``) or plain text parsed by
spaCy (``syntax.parser=spacy syntax.text=FILE``); and the attention probe's training split (``syntax.train_conllu``
/ ``syntax.train_text``, else the bundled treebank's ``train.conllu``), kept apart from the first."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rich.console import Console

from headlab.analysis.syntax.parsed_text import read_text
from headlab.analysis.syntax.treebank import Sentence, read_conllu
from headlab.errors import UserError
from headlab.tasks.demo_tasks import DATA_DIR

BUNDLED = DATA_DIR  # <treebank>/dev.conllu (scored), train.conllu


@dataclass(frozen=True)
class Source:
    """A file of sentences and the setting that names it (for errors: ``syntax.conllu='...'``)."""

    key: str
    path: Path
    spacy_model: str | None  # None: CoNLL-U; else the spaCy pipeline that parses the plain text

    def __str__(self) -> str:
        return f"{self.key}={str(self.path)!r}"

    def read(self, limit: int | None = None) -> list[Sentence]:
        return list(_read(self, limit))


@lru_cache(maxsize=4)
def _read(source: Source, limit: int | None) -> tuple[Sentence, ...]:
    """A source's sentences, read (parsed) once per process: the mode's check and its run both ask."""
    if source.spacy_model is not None:
        return tuple(read_text(source.path, source.spacy_model, source.key, limit))
    return tuple(read_conllu(source.path, source.key)[:limit])


def evaluation_source(options: Any) -> Source:
    """The sentences scored: ``syntax.text`` parsed by spaCy, ``syntax.conllu``, or the bundled treebank's dev
    split."""
    if options.parser == "spacy":
        return Source("syntax.text", Path(options.text), options.spacy_model)
    if options.conllu is None:
        return Source(f"syntax.treebank={options.treebank}: syntax.conllu", BUNDLED / options.treebank / "dev.conllu",
                      None)
    return Source("syntax.conllu", Path(options.conllu), None)


def training_source(options: Any) -> Source:
    """The probe's training sentences: ``syntax.train_text`` / ``syntax.train_conllu``, or the bundled treebank's
    train split when the evaluation sentences are its dev split."""
    if options.parser == "spacy":
        if options.train_text is None:
            raise UserError(f"syntax.probe={options.probe} needs training sentences: syntax.text={options.text!r} is "
                            "given without syntax.train_text=FILE (other text, parsed the same way)")
        return Source("syntax.train_text", Path(options.train_text), options.spacy_model)
    if options.train_conllu is not None:
        return Source("syntax.train_conllu", Path(options.train_conllu), None)
    if options.conllu is not None:
        raise UserError(f"syntax.probe={options.probe} needs a training treebank: syntax.conllu={options.conllu!r} is "
                        "given without syntax.train_conllu=FILE (its train split)")
    return Source(f"syntax.treebank={options.treebank}: syntax.train_conllu",
                  BUNDLED / options.treebank / "train.conllu", None)


def read_evaluation(options: Any) -> list[Sentence]:
    """The (first ``max_sentences``) sentences scored; the relations asked for must occur in them."""
    sentences = evaluation_source(options).read(options.max_sentences)
    if options.relations is not None:
        found = sorted({relation for sentence in sentences for relation in sentence.relations})
        unknown = [r for r in options.relations if r not in found and r != "all"]
        if unknown:
            raise UserError(f"syntax.relations: {', '.join(map(repr, unknown))} not in the treebank; its relations: "
                            f"{', '.join(found)}")
    return sentences


def read_training(options: Any, evaluation: list[Sentence], quiet: bool = False) -> list[Sentence]:
    """The probe's training sentences; a ``UserError`` when they hold every evaluation sentence (the same file or a
    copy: the probe would be scored on what it learnt), a note when they hold some (unless ``quiet``)."""
    source = training_source(options)
    if source.path.resolve() == evaluation_source(options).path.resolve():
        raise UserError(f"{source} is the evaluation file too: the probe would be scored on the sentences it was "
                        "trained on; give its train split")
    sentences = source.read()
    seen = {sentence.words for sentence in sentences}
    shared = sum(sentence.words in seen for sentence in evaluation)
    if shared == len(evaluation):
        raise UserError(f"{source} holds every evaluation sentence of {evaluation_source(options)}: the probe would "
                        "be scored on the sentences it was trained on; give a train split apart from them")
    if shared and not quiet:
        Console().print(f"note: {shared} of the {len(evaluation)} evaluation sentences are also in {source} (the "
                        "probe's UAS counts them)", markup=False, soft_wrap=True)
    return sentences
