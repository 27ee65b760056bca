"""Unit ids for ``drop_intra`` / ``drop_inter`` (DESIGN.md section 2).

``unit_ids`` maps a fast-tokenizer encoding and the original texts to ``sentence_ids``
(``LongTensor [batch, seq]``): tokens of one unit share an id, padding is -1, special tokens ``SHARED``.

* ``unit="segment"``: one unit per segment (question vs context, sentence1 vs sentence2).
* ``unit="sentence"``: the sentences of each segment, found by ``split_sentences`` on the
  original text and mapped to tokens through the tokenizer's character offsets.
* Special tokens ([CLS], [SEP], <s>, </s>) get the id ``SHARED`` (-2): they belong to every unit, so
  ``drop_intra`` and ``drop_inter`` keep every attention to or from them. Guan et al.'s intra / inter distinction is
  about the text's sentences; many heads park their attention on [CLS] or [SEP], and with [CLS] in the first unit
  ``drop_inter`` cut the second sentence's attention to it, so a head that only attends to [CLS] read as carrying
  information across sentences.

The sentence rule (dependency-free, deterministic): a sentence ends after a run of
``.``, ``?`` or ``!`` (plus any closing quotes or brackets) that is followed by whitespace
and then an upper-case letter, a digit, or an opening quote or bracket, or by the end of
the text. A single ``.`` does not end a sentence after a known abbreviation (``Dr.``,
``e.g.``, ``U.S.``, month names, ...) or a one-letter initial (``J. Smith``). Numbers such
as ``3.5`` never split (no whitespace after the dot); ``"Really?" she asked.`` stays one
sentence because the next word is lower case.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence

import torch

from headlab.core.plans import check_unit
from headlab.errors import UserError

SHARED = -2  # the unit id of special tokens: in every unit (padding is -1, in none)
UNITS_VERSION = 2  # in the cached features' and the jobs' keys: raised when the unit ids change (2: SHARED)

ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e cf al inc ltd co corp no nos fig figs vol
    approx dept est gen gov sen rep rev capt col lt sgt jan feb mar apr jun jul aug sep sept oct nov dec
    u.s u.k u.n a.m p.m ph.d""".split()
)
_BOUNDARY = re.compile(r"[.?!]+[\"'\u201d\u2019)\]]*(?=\s+[A-Z0-9\"'\u201c\u2018(\[]|\s*$)")
_LAST_WORD = re.compile(r"(\S+)$")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the sentences of ``text`` (see the module rule)."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        if match.group().rstrip("\"'\u201d\u2019)]") == "." and _is_abbreviation(text[start : match.start()]):
            continue
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(text)))
    spans = [_strip(text, a, b) for a, b in spans]
    return [span for span in spans if span[0] < span[1]] or [(0, len(text))]


def _is_abbreviation(before_dot: str) -> bool:
    word = _LAST_WORD.search(before_dot)
    if not word:
        return False
    word = word.group(1).lstrip("\"'(\u201c\u2018[").lower()
    return word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def content_span(text: str, start: int, end: int) -> tuple[int, int]:
    """A token's character span without the whitespace its offsets may include: DeBERTa's ``▁word`` starts at the
    space before the word, and its lone ``▁`` (a word boundary it did not merge with the word) is that space alone,
    which becomes ``(end, end)``: no characters, at the start of the word after it."""
    start, stripped = _strip(text, start, end)
    return (end, end) if start == stripped else (start, stripped)


def unit_ids(
    encoding,
    texts: Sequence[str],
    text_pairs: Sequence[str] | None = None,
    unit: str = "sentence",
    splitter: Callable[[str], list[tuple[int, int]]] = split_sentences,
) -> torch.Tensor:
    """``sentence_ids`` ``[batch, seq]`` for an encoding of ``texts`` (and ``text_pairs``).

    Unpadded (ragged) encodings are allowed: positions past a row's end are -1.

    ``encoding`` is what a fast tokenizer returned for ``tokenizer(texts, text_pairs, ...,
    return_offsets_mapping=True)``; with overflowing features (SQuAD's doc stride) its
    ``overflow_to_sample_mapping`` picks each row's texts.
    """
    check_unit(unit)
    if "offset_mapping" not in encoding:
        raise ValueError("unit_ids needs the encoding's character offsets: tokenize with return_offsets_mapping=True")
    if not hasattr(encoding, "sequence_ids") or encoding.encodings is None:
        raise UserError("the tokenizer gives no sequence ids (a Python tokenizer, not one of the tokenizers library): "
                        "headlab reads each token's sentence and segment from them; save the model with a "
                        "tokenizer.json (a fast tokenizer) and use that")
    offsets = encoding["offset_mapping"]
    rows = len(offsets)
    samples = encoding.get("overflow_to_sample_mapping", list(range(rows)))
    mask = encoding.get("attention_mask")
    ids = torch.full((rows, max(len(o) for o in offsets)), -1, dtype=torch.long)  # ragged rows: -1 after the end
    sentence_cache: dict[tuple[int, int], list[int]] = {}
    for row in range(rows):
        sample = int(samples[row])
        segments = [texts[sample]] + ([] if text_pairs is None else [text_pairs[sample]])
        for segment in range(len(segments)):
            if (sample, segment) not in sentence_cache:
                sentence_cache[(sample, segment)] = [a for a, _ in splitter(segments[segment])]
        sequence_ids = encoding.sequence_ids(row)
        spans = [tuple(map(int, o)) if s is None else content_span(segments[s], *map(int, o))
                 for s, o in zip(sequence_ids, offsets[row])]  # lists or tensors
        ids[row, : len(offsets[row])] = _row_ids(
            sequence_ids, spans, None if mask is None else mask[row],
            [sentence_cache[(sample, s)] for s in range(len(segments))], unit,
        )
    return ids


def _row_ids(sequence_ids, offsets, mask, sentence_starts, unit) -> torch.Tensor:
    """Unit ids of one row. ``sentence_starts[s]``: start offsets of segment s's sentences."""
    # Units are numbered across segments; every segment has at least one unit.
    first_unit = [0]
    for starts in sentence_starts[:-1]:
        first_unit.append(first_unit[-1] + (max(len(starts), 1) if unit == "sentence" else 1))
    ids = []
    for position, (segment, (start, _)) in enumerate(zip(sequence_ids, offsets)):
        if mask is not None and not mask[position]:
            ids.append(-1)
            continue
        if segment is None:  # a special token: in every unit
            ids.append(SHARED)
            continue
        local = 0
        if unit == "sentence" and sentence_starts[segment]:
            local = max(bisect.bisect_right(sentence_starts[segment], start) - 1, 0)
        ids.append(first_unit[segment] + local)
    return torch.tensor(ids, dtype=torch.long)
