"""Sentence splitting and the unit ids that drop_intra / drop_inter use."""

from __future__ import annotations

import pytest
import torch

from headlab.core.units import split_sentences, unit_ids


def sentences(text):
    return [text[a:b] for a, b in split_sentences(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("He left. She stayed.", ["He left.", "She stayed."]),
        ("Dr. Smith paid $3.5 million. He left!", ["Dr. Smith paid $3.5 million.", "He left!"]),
        ("Mr. and Mrs. Jones met Prof. Lee in Jan. 1931 at St. Paul. Bye.",
         ["Mr. and Mrs. Jones met Prof. Lee in Jan. 1931 at St. Paul.", "Bye."]),
        ("Fruit, e.g. apples, is good. It helps.", ["Fruit, e.g. apples, is good.", "It helps."]),
        ("J. R. Smith wrote it. Then he left.", ["J. R. Smith wrote it.", "Then he left."]),
        ("It grew by 3.5 percent in 2019. Version 2.0.1 followed.",
         ["It grew by 3.5 percent in 2019.", "Version 2.0.1 followed."]),
        ('She said "Stop." Then she left.', ['She said "Stop."', "Then she left."]),
        ('"Really?" she asked. "Yes!" he said.', ['"Really?" she asked.', '"Yes!" he said.']),
        ("Is it? Yes! It is.", ["Is it?", "Yes!", "It is."]),
        ("Wait... What happened?!", ["Wait...", "What happened?!"]),
        ("It ended (finally.) Good.", ["It ended (finally.)", "Good."]),
        ("The year was 1931. 42 people came.", ["The year was 1931.", "42 people came."]),
        ("no terminator here", ["no terminator here"]),
        ("  padded.  Spaces.  ", ["padded.", "Spaces."]),
        ("", [""]),
    ],
)
def test_split_sentences(text, expected):
    assert sentences(text) == expected


def test_unit_ids_sentence_and_segment(tokenizer):
    texts = ["He left. She stayed.", "Who?"]
    pairs = ["Dr. Smith paid. It was 3.5 million!", "No."]
    enc = tokenizer(texts, pairs, padding=True, return_offsets_mapping=True, return_tensors="pt")
    ids = unit_ids(enc, texts, pairs, unit="sentence")
    seg = unit_ids(enc, texts, pairs, unit="segment")
    for row in range(2):
        tokens = enc.tokens(row)
        # Expected from the definition, token by token.
        expected_sentence, expected_segment = [], []
        units_in_first = len(split_sentences(texts[row]))
        for position in range(len(tokens)):
            if not enc["attention_mask"][row, position]:
                expected_sentence.append(-1)
                expected_segment.append(-1)
                continue
            seq = enc.sequence_ids(row)[position]
            if seq is None:  # a special token: in every unit
                expected_sentence.append(-2)
                expected_segment.append(-2)
                continue
            text = (texts if seq == 0 else pairs)[row]
            start = enc["offset_mapping"][row, position, 0].item()
            sentence_in_segment = sum(a <= start for a, _ in split_sentences(text)) - 1
            first_unit = 0 if seq == 0 else units_in_first
            expected_sentence.append(first_unit + sentence_in_segment)
            expected_segment.append(seq)
        assert ids[row].tolist() == expected_sentence, tokens
        assert seg[row].tolist() == expected_segment
    # Hand-checked row 0: "he left ." = unit 0, "she stayed ." = unit 1; [CLS] and [SEP] in every unit (-2).
    row0 = dict(zip(enc.tokens(0), ids[0].tolist()))
    assert row0["[CLS]"] == -2 and row0["he"] == 0 and row0["she"] == 1
    assert ids[0].tolist()[enc.tokens(0).index("[SEP]")] == -2
    assert ids[0].tolist()[-1] == -2 and 3 in ids[0].tolist()  # "it was 3.5 million!" is unit 3
    assert ids[1].tolist()[-1] == -1  # padding
    # Segments equal BERT's token_type_ids on the text's tokens.
    text = enc["attention_mask"].bool() & (seg != -2)
    assert torch.equal(seg[text], enc["token_type_ids"][text])


def test_single_text_and_single_sentence_segment(tokenizer):
    texts = ["One sentence only", "Two here. Yes."]
    enc = tokenizer(texts, padding=True, return_offsets_mapping=True)
    ids = unit_ids(enc, texts)
    real = sum(enc["attention_mask"][0])
    assert ids[0].tolist()[:real] == [-2] + [0] * (real - 2) + [-2]  # [CLS] and [SEP] in every unit
    tokens, real = enc.tokens(1), sum(enc["attention_mask"][1])
    first_dot = tokens.index(".")  # [CLS] t ##w ##o here . | yes . [SEP] [PAD]...
    assert ids[1].tolist() == [-2] + [0] * first_dot + [1] * (real - first_dot - 2) + [-2] + [-1] * (
        len(tokens) - real)


def test_overflowing_features_use_their_sample(tokenizer):
    """SQuAD-style doc stride: each feature's units come from its own example's texts."""
    questions = ["who?", "where did he go?"]
    contexts = ["He left. She stayed. It was old. The end.", "To the river. Then home."]
    enc = tokenizer(questions, contexts, truncation="only_second", max_length=24, stride=4,
                    return_overflowing_tokens=True, return_offsets_mapping=True, padding=True)
    ids = unit_ids(enc, questions, contexts)
    samples = enc["overflow_to_sample_mapping"]
    assert len(samples) > 2
    for row, sample in enumerate(samples):
        single = tokenizer([questions[sample]], [contexts[sample]], return_offsets_mapping=True)
        full_ids = unit_ids(single, [questions[sample]], [contexts[sample]])[0].tolist()
        # Every context token of the feature has the unit it has in the untruncated encoding.
        full_starts = {(s, o[0]): u for s, o, u in zip(single.sequence_ids(0), single["offset_mapping"][0], full_ids)
                       if s == 1}
        for seq, offset, unit in zip(enc.sequence_ids(row), enc["offset_mapping"][row], ids[row].tolist()):
            if seq == 1:
                assert unit == full_starts[(1, offset[0])]


def test_bad_input(tokenizer):
    enc = tokenizer(["a b"], return_offsets_mapping=False)
    with pytest.raises(ValueError, match="return_offsets_mapping=True"):
        unit_ids(enc, ["a b"])
    enc = tokenizer(["a b"], return_offsets_mapping=True)
    with pytest.raises(ValueError, match="unknown unit 'word'; valid units: sentence, segment"):
        unit_ids(enc, ["a b"], unit="word")


def test_ragged_encoding_matches_padded(tokenizer):
    texts, pairs = ["He left. She stayed.", "Who?"], ["No.", "It was old. Yes."]
    padded = unit_ids(tokenizer(texts, pairs, padding=True, return_offsets_mapping=True), texts, pairs)
    ragged = unit_ids(tokenizer(texts, pairs, return_offsets_mapping=True), texts, pairs)
    assert torch.equal(padded, ragged)


def test_an_encoding_without_sequence_ids_is_one_clear_error():
    """A Python tokenizer's encoding has no ``sequence_ids``: the tokens' segments are unknown."""
    from transformers import BatchEncoding

    from headlab.errors import UserError

    encoding = BatchEncoding({"input_ids": [[2, 10, 3]], "offset_mapping": [[(0, 0), (0, 3), (0, 0)]]})
    with pytest.raises(UserError, match=r"the tokenizer gives no sequence ids \(a Python tokenizer"):
        unit_ids(encoding, ["The"])


@pytest.mark.parametrize("kind", ["bert", "roberta", "xlm-roberta", "albert", "deberta-v2", "modernbert"])
def test_each_token_gets_the_unit_of_its_characters(kind):
    """Each family's tokenizer: a token's unit is the sentence its non-space characters lie in (DeBERTa's offsets
    include the space before a word: its first token of a sentence starts in the sentence before); a token of spaces
    alone (DeBERTa's lone "▁") takes the sentence of the character after it; special tokens as documented."""
    from headlab.core.tiny_tokenizers import tiny_tokenizer

    tokenizer = tiny_tokenizer(kind)
    texts, pairs = ["It rained. Then it sat down.", "A cat. The dog ran."], ["The dog sat. A cat ran.", "It ran."]
    encoding = tokenizer(texts, pairs, return_offsets_mapping=True, padding=True)
    ids = unit_ids(encoding, texts, pairs)
    for row in range(2):
        segments = [texts[row], pairs[row]]
        first = [0, len(split_sentences(texts[row]))]  # units are numbered across the segments
        expected = []
        for segment, (start, end) in zip(encoding.sequence_ids(row), encoding["offset_mapping"][row]):
            if segment is None:
                expected.append(-2)  # a special token: in every unit
                continue
            text = segments[segment]
            characters = [i for i in range(start, end) if not text[i].isspace()] or [end]
            spans = split_sentences(text)
            found = {n for n, (a, b) in enumerate(spans) for i in characters if a <= i < b}
            assert len(found) == 1, (kind, text[start:end])
            expected.append(first[segment] + found.pop())
        mask = encoding["attention_mask"][row]
        assert ids[row].tolist() == [unit if m else -1 for unit, m in zip(expected, mask)], kind
    assert ids.max() == 3  # two sentences in each segment of the first row


@pytest.mark.parametrize("renormalize", [False, True])
def test_a_head_that_only_attends_to_cls_loses_nothing_under_drop_inter(tokenizer, renormalize):
    """Two sentences; a head whose every query attends to [CLS] alone. [CLS] is in every unit (-2), so drop_inter
    leaves that head's attention as it was (its inter-sentence cost is nothing: it cannot make a claim that its type
    carries information across sentences hold), while a head attending to the other sentence loses it. The keys
    headlab's masks drop (``dropped_keys``), applied here by the definition in float64 (the patch's SDPA path
    against a float64 reference: ``test_attention``)."""
    from headlab.core.patch.sdpa_masks import dropped_keys, unit_relation

    texts = ["He left. She stayed there."]
    enc = tokenizer(texts, return_offsets_mapping=True, return_tensors="pt")
    ids = unit_ids(enc, texts)  # [1, seq]
    seq = ids.shape[1]
    keep = ~dropped_keys("drop_inter", unit_relation(ids, torch.zeros(1, 1, seq, 4)))[0, 0]  # [seq, seq]
    assert keep[:, 0].all() and keep[:, -1].all() and keep[0].all()  # [CLS], [SEP]: every pair kept
    first, second = ids[0].tolist().index(0), ids[0].tolist().index(1)

    def patched(scores: torch.Tensor) -> torch.Tensor:
        if renormalize:
            return scores.masked_fill(~keep, float("-inf")).softmax(-1)
        return scores.softmax(-1) * keep

    on_cls = torch.full((seq, seq), -30.0, dtype=torch.float64)
    on_cls[:, 0] = 30.0  # every query's score: [CLS] alone
    assert torch.allclose(patched(on_cls), on_cls.softmax(-1), atol=1e-12)
    elsewhere = torch.full((seq, seq), -30.0, dtype=torch.float64)
    elsewhere[:, second] = 30.0  # every query attends to a token of the second sentence
    assert patched(elsewhere)[first, second] < 1e-12 < elsewhere.softmax(-1)[first, second]
