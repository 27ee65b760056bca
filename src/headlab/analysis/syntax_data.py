"""A treebank tokenised for the syntax heads: one sentence per sequence, each token's word slot, each word's gold.

Sequences are ``[CLS] words [SEP]`` (``is_split_into_words``: each treebank word is tokenised alone, so word pieces
never cross words). Slots (``headlab.core.word_attention``): 0 ``[CLS]``, 1..n the words, n + 1 ``[SEP]``.
Sentences longer than ``max_length`` word pieces are skipped and counted, as are sentences with a word that the
tokenizer turns into no piece at all (a control character): its attention would be undefined.

Clark et al.'s possessive case: a possessor followed by a separate ``'s`` (or ``'`` / ``s'``) token is judged by
the prediction of that token, which the model's attention treats as the possessor (``judged``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from headlab.errors import UserError
from headlab.tasks.treebank import Sentence

POSSESSIVE_RELATIONS = ("nmod:poss", "poss")
POSSESSIVE_MARKERS = ("'s", "'", "s'")


@dataclass
class EncodedTreebank:
    """The sentences that fit, tokenised, and per word (in sentence order) its gold and where it is judged."""

    sentences: list[Sentence]
    input_ids: list[list[int]]
    token_slots: list[list[int]]  # per token its slot (0 [CLS], 1..n words, n+1 [SEP])
    too_long: int = 0  # sentences skipped: more than max_length pieces
    no_pieces: int = 0  # sentences skipped: a word without a piece
    relations: list[str] = field(default_factory=list)  # per word, flat
    gold: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per word: head (0 root, else 1-based)
    position: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per word: 1-based index
    judged: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per word: the slot whose prediction
    length: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # counts; its sentence's words
    sentence: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per word: sentence number

    @property
    def num_words(self) -> int:
        return len(self.gold)

    def batches(self, batch_size: int, pad_id: int) -> Iterator[dict[str, torch.Tensor]]:
        """Padded batches in order: ``input_ids``, ``attention_mask``, ``token_slots`` (-1 on padding),
        ``lengths`` (words per sentence)."""
        for start in range(0, len(self.input_ids), batch_size):
            ids, slots = self.input_ids[start:start + batch_size], self.token_slots[start:start + batch_size]
            width = max(map(len, ids))
            yield {"input_ids": torch.tensor([row + [pad_id] * (width - len(row)) for row in ids]),
                   "attention_mask": torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids]),
                   "token_slots": torch.tensor([row + [-1] * (width - len(row)) for row in slots]),
                   "lengths": torch.tensor([len(s) for s in self.sentences[start:start + batch_size]])}


def encode_treebank(sentences: Sequence[Sentence], tokenizer, max_length: int) -> EncodedTreebank:
    """Tokenise every sentence (module docstring); a ``UserError`` when none fits ``max_length``."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"the syntax heads need a fast tokenizer (word_ids); {type(tokenizer).__name__} is not one")
    encoded = EncodedTreebank([], [], [])
    for sentence in sentences:
        encoding = tokenizer(list(sentence.words), is_split_into_words=True, truncation=False)
        word_ids = encoding.word_ids()
        if len(word_ids) > max_length:
            encoded.too_long += 1
            continue
        if len({w for w in word_ids if w is not None}) != len(sentence):
            encoded.no_pieces += 1
            continue
        encoded.sentences.append(sentence)
        encoded.input_ids.append(list(encoding["input_ids"]))
        encoded.token_slots.append(_slots(word_ids, len(sentence)))
    if not encoded.sentences:
        raise UserError(f"no sentence of the treebank fits max_length={max_length} word pieces "
                        f"({encoded.too_long} longer, {encoded.no_pieces} with a word of no piece)")
    _flatten(encoded)
    return encoded


def _slots(word_ids: list[int | None], words: int) -> list[int]:
    """Per token its slot: a special token before the first word is [CLS] (0), any other is [SEP] (n + 1)."""
    first = next(i for i, w in enumerate(word_ids) if w is not None)
    return [w + 1 if w is not None else 0 if i < first else words + 1 for i, w in enumerate(word_ids)]


def _flatten(encoded: EncodedTreebank) -> None:
    gold, position, judged, length, sentence_of = [], [], [], [], []
    for number, sentence in enumerate(encoded.sentences):
        n = len(sentence)
        for index in range(n):
            slot = index + 1
            possessor = (sentence.relations[index] in POSSESSIVE_RELATIONS and index + 1 < n
                         and sentence.words[index + 1] in POSSESSIVE_MARKERS)
            judged.append(slot + 1 if possessor else slot)
        gold += sentence.heads
        position += range(1, n + 1)
        length += [n] * n
        sentence_of += [number] * n
        encoded.relations += sentence.relations
    encoded.gold, encoded.position, encoded.judged, encoded.length, encoded.sentence = (
        np.asarray(v, dtype=np.int64) for v in (gold, position, judged, length, sentence_of))
