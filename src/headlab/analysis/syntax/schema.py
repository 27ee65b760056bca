"""The ``syntax`` section of ``conf/ablate.yaml`` (``mode=syntax``): which treebank, which relations, how many."""

from __future__ import annotations

from dataclasses import dataclass

from headlab.analysis.syntax.treebank import LEFT_OUT_RELATIONS
from headlab.errors import UserError, one_of, within
from headlab.reporting.settings import MAX_RESAMPLES, RESAMPLES_WHY

PROBES = ("attn", "attn_emb")  # headlab.analysis.syntax.probe.KINDS (no torch import here)
PARSERS = ("conllu", "spacy")
TREEBANKS = ("ud_ewt", "demo_syntax")  # bundled: src/headlab/tasks/data/<name>/{dev,train}.conllu
SIEVES = ("pande", "relatives")  # headlab.analysis.syntax.sieves.SIEVES
SIEVE_DIRECTIONS = ("l2r", "r2l", "bi")


@dataclass
class SyntaxConfig:
    """Dependency relations per head from a treebank (Clark et al. 2019, section 4)."""

    treebank: str = "ud_ewt"  # the bundled treebank scored when conllu is null: ud_ewt (UD English EWT) | demo_syntax
    conllu: str | None = None  # a CoNLL-U treebank (the evaluation split); null: the bundled treebank's dev split
    parser: str = "conllu"  # conllu: trees from syntax.conllu | spacy: plain text (syntax.text) parsed by spaCy
    text: str | None = None  # parser=spacy: a plain-text file, one or more sentences a line
    spacy_model: str = "en_core_web_sm"  # parser=spacy: the pipeline (an installed package's name or a folder)
    relations: list[str] | None = None  # the table's relations (null: every one with min_count words; root, punct out)
    min_count: int = 20  # without relations: a relation needs this many words in the treebank to get a row
    max_sentences: int | None = None  # the treebank's first N sentences (null: all)
    max_length: int | None = None  # word pieces per sentence with [CLS] and [SEP] (null: the model's maximum)
    batch_size: int = 32
    resamples: int = 10_000  # paired bootstrap of the best head against the best offset baseline
    unit: str = "sentence"  # what that bootstrap and its sign flips resample: sentence (as sampled) | word
    confidence: float = 0.95
    examples: int = 2  # sentences drawn with the best heads' attention in syntax_examples.png
    sieve: str = "pande"  # the syntactic sieve score: pande (their code's, over dependency pairs) | relatives
    sieve_direction: str = "l2r"  # pande: l2r (dependent to head) | r2l (head to dependent) | bi (their mean)
    sieve_tau: float = 3.0  # Pande et al.'s syntactic roles: mean sieve score above tau ...
    sieve_alpha: float = 0.05  # ... by a one-sided t-test over sentences at this level ...
    sieve_correction: str = "holm"  # ... corrected across heads and roles: holm | bh | none
    probe: str | None = None  # Clark et al.'s attention probe: attn | attn_emb (with the words' embeddings) | null
    train_conllu: str | None = None  # the probe's training treebank (null: the bundled treebank's train split)
    train_text: str | None = None  # parser=spacy: the probe's training text
    probe_epochs: int = 1  # passes over the training treebank (Clark et al.: 1)
    probe_lr: float = 0.002  # Adam, one sentence a step (Clark et al.)

    def __post_init__(self) -> None:
        for key in ("min_count", "batch_size"):
            if getattr(self, key) < 1:
                raise UserError(f"syntax.{key}={getattr(self, key)} must be at least 1")
        within("syntax.resamples", self.resamples, 1, MAX_RESAMPLES, RESAMPLES_WHY)
        if self.max_sentences is not None and self.max_sentences < 1:
            raise UserError(f"syntax.max_sentences={self.max_sentences} must be at least 1 (or null: all)")
        if self.max_length is not None and self.max_length < 3:
            raise UserError(f"syntax.max_length={self.max_length} must be at least 3 ([CLS] word [SEP])")
        if not 0 < self.confidence < 1:
            raise UserError(f"syntax.confidence={self.confidence} must be in (0, 1)")
        if self.examples < 0:
            raise UserError(f"syntax.examples={self.examples} must be at least 0")
        one_of("syntax.unit", self.unit, ("sentence", "word"))
        one_of("syntax.sieve", self.sieve, SIEVES)
        one_of("syntax.sieve_direction", self.sieve_direction, SIEVE_DIRECTIONS)
        if self.sieve == "relatives" and self.sieve_direction != "l2r":
            raise UserError(f"syntax.sieve_direction={self.sieve_direction} is a setting of syntax.sieve=pande; the "
                            "relatives sieve takes a word's head and dependents together (leave the direction out)")
        one_of("syntax.sieve_correction", self.sieve_correction, ("holm", "bh", "none"))
        if self.sieve_tau <= 0:
            raise UserError(f"syntax.sieve_tau={self.sieve_tau} must be above 0 (uniform attention scores 1)")
        if not 0 < self.sieve_alpha < 1:
            raise UserError(f"syntax.sieve_alpha={self.sieve_alpha} must be in (0, 1)")
        if self.probe is not None:
            one_of("syntax.probe", self.probe, PROBES)
        if self.probe_epochs < 1:
            raise UserError(f"syntax.probe_epochs={self.probe_epochs} must be at least 1")
        if not self.probe_lr > 0:
            raise UserError(f"syntax.probe_lr={self.probe_lr} must be above 0")
        one_of("syntax.parser", self.parser, PARSERS)
        one_of("syntax.treebank", self.treebank, TREEBANKS)
        if self.parser == "spacy" and (self.text is None or self.conllu is not None or self.train_conllu is not None):
            raise UserError("syntax.parser=spacy parses plain text: give syntax.text=FILE (and syntax.train_text=FILE "
                            "for the probe), not syntax.conllu / syntax.train_conllu")
        if self.parser == "conllu" and (self.text is not None or self.train_text is not None):
            raise UserError("syntax.text / syntax.train_text are plain text, parsed with syntax.parser=spacy; add it "
                            "(or give a CoNLL-U treebank as syntax.conllu)")
        if self.relations is not None and not self.relations:
            raise UserError("syntax.relations is empty; give relation names (e.g. [nsubj, obj]) or null: all")
        for relation in self.relations or ():
            if str(relation).strip().lower() in LEFT_OUT_RELATIONS:
                raise UserError(f"syntax.relations: {relation!r} is left out of the table (as by Clark et al.): a "
                                "head never attends to ROOT, so a root row is 0 by construction, and punct attaches "
                                "by convention; name other relations (e.g. [nsubj, obj])")
