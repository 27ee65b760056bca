"""A treebank tokenised for the syntax heads: one sentence per sequence, each token's word slot, each word's gold.

Sequences are ``[CLS] words [SEP]``: the words joined by spaces (as Clark et al. do), tokenised with character
offsets, each piece given to the word whose characters it covers. This serves WordPiece and byte-level BPE alike
(RoBERTa's tokenizer refuses pre-split words unless made with ``add_prefix_space``). Slots
(``word_attention``): 0 ``[CLS]`` (the first special token), 1..n the words, n + 1 ``[SEP]`` (any later
special token).
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

from headlab.analysis.syntax.treebank import Sentence
from headlab.core.units import content_span
from headlab.errors import UserError

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


def encode_treebank(sentences: Sequence[Sentence], tokenizer, max_length: int,
                    what: str = "the treebank") -> EncodedTreebank:
    """Tokenise every sentence (module docstring); a ``UserError`` naming ``what`` when none fits ``max_length``."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"the syntax heads need a fast tokenizer (word_ids); {type(tokenizer).__name__} is not one")
    encoded = EncodedTreebank([], [], [])
    for sentence in sentences:
        ids, slots = _tokens(tokenizer, sentence.words)
        if len(ids) > max_length:
            encoded.too_long += 1
            continue
        if len(set(slots) - {0, len(sentence) + 1}) != len(sentence):
            encoded.no_pieces += 1
            continue
        encoded.sentences.append(sentence)
        encoded.input_ids.append(ids)
        encoded.token_slots.append(slots)
    if not encoded.sentences:
        raise UserError(f"no sentence of {what} fits max_length={max_length} word pieces "
                        f"({encoded.too_long} longer, {encoded.no_pieces} with a word of no piece)")
    _flatten(encoded)
    return encoded


def _tokens(tokenizer, words: Sequence[str]) -> tuple[list[int], list[int]]:
    """The token ids of the words joined by spaces, and each token's slot: the word of its characters, the spaces its
    offsets may include left out (``content_span``); a bare word boundary (byte-level BPE's "Ġ" of no width,
    DeBERTa's lone "▁" over the space: a boundary not merged with its word) the word that starts after it."""
    starts = np.cumsum([0] + [len(word) + 1 for word in words[:-1]])  # each word's first character
    starts_set = set(starts.tolist())
    text = " ".join(words)
    encoding = tokenizer(text, truncation=False, return_offsets_mapping=True, return_special_tokens_mask=True)
    slots, seen_word = [], False
    for offsets, special in zip(encoding["offset_mapping"], encoding["special_tokens_mask"]):
        start, end = content_span(text, *offsets)
        if special or (start == end and start not in starts_set):
            slots.append(len(words) + 1 if seen_word else 0)
        elif start == end:
            slots.append(int(np.searchsorted(starts, start, side="right")))  # the word starting there, 1-based
            seen_word = True
        else:
            slots.append(int(np.searchsorted(starts, end - 1, side="right")))  # 1-based
            seen_word = True
    return list(encoding["input_ids"]), slots


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
