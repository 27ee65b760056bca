"""Attention features (DESIGN.md section 5) against references written here from the definitions, in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headlab.analysis.types.features import (
    CLARK,
    DISTANCE_BINS,
    SIEVES,
    FeatureAccumulator,
    TokenKinds,
    attention_features,
)
from headlab.core.tiny_tokenizers import tiny_tokenizer
from headlab.errors import UserError
from tests.reference import bert_forward, params_of

KINDS = TokenKinds.of(tiny_tokenizer())  # the tiny vocabulary's [CLS], [SEP], ",", "." and specials
C, S, (COMMA,), (PERIOD,), PAD = KINDS.cls, KINDS.sep, KINDS.comma, KINDS.period, 0


# ----------------------------------------------------------------------------- references, one sequence at a time


def ref_distance(ids, attention):
    """[21]: per query, the attention mass of each key's bin; mean over queries."""
    n = len(ids)
    special = {KINDS.cls: 17, KINDS.sep: 18, **dict.fromkeys(KINDS.comma, 19), **dict.fromkeys(KINDS.period, 20)}
    out = np.zeros(21)
    for i in range(n):
        for j in range(n):
            if ids[j] in special:
                b = special[ids[j]]
            elif i == j:
                b = 0
            else:
                b = 1 + math.ceil(16 * abs(i - j) / n) - 1
            out[b] += attention[i, j]
    return out / n


def entropy(row):
    return -sum(p * math.log(p) for p in row if p > 0)


def ref_clark(ids, attention):
    n = len(ids)
    rows = range(n)
    mean = lambda f: sum(f(i) for i in rows) / n  # noqa: E731
    keys = lambda i, tokens: sum(attention[i, j] for j in range(n) if ids[j] in tokens)  # noqa: E731
    return {"cls": mean(lambda i: keys(i, {KINDS.cls})), "sep": mean(lambda i: keys(i, {KINDS.sep})),
            "punct": mean(lambda i: keys(i, {*KINDS.comma, *KINDS.period})),
            "next": mean(lambda i: attention[i, i + 1] if i + 1 < n else 0.0),
            "prev": mean(lambda i: attention[i, i - 1] if i > 0 else 0.0),
            "entropy": mean(lambda i: entropy(attention[i])),
            "cls_entropy": entropy(attention[ids.index(KINDS.cls)])}


def ref_sieve(ids, attention):
    """Per sieve: mean over queries with a non-empty sieve of (mean attention over the sieve) / (1 / n)."""
    n = len(ids)

    def segment(i):  # [CLS] with the first segment, [SEP]s (one, or RoBERTa's two) with the segment they close
        return sum(1 for p in range(1, i + 1) if ids[p] != KINDS.sep and ids[p - 1] == KINDS.sep)

    members = {
        "local": lambda i: [j for j in range(n) if abs(i - j) <= 2],
        "delimiter": lambda i: [j for j in range(n) if ids[j] in (KINDS.cls, KINDS.sep)],
        "delimiter_cls": lambda i: [j for j in range(n) if ids[j] == KINDS.cls],
        "delimiter_sep": lambda i: [j for j in range(n) if ids[j] == KINDS.sep],
        "block": lambda i: [j for j in range(n) if ids[j] not in KINDS.special and segment(j) == segment(i)],
    }
    out = {}
    for name, sieve in members.items():
        scores = [np.mean([attention[i, j] for j in sieve(i)]) * n for i in range(n) if sieve(i)]
        out[name] = np.mean(scores) if scores else np.nan
    return out


def js_divergence(p, q):
    total = 0.0
    for a, b in zip(p, q):
        m = (a + b) / 2
        total += 0.5 * (a * math.log(a / m) if a > 0 else 0.0) + 0.5 * (b * math.log(b / m) if b > 0 else 0.0)
    return total


def ref_js(maps):
    """[N, N]: mean over queries of JS between the heads' rows; ``maps`` [heads N, n, n]."""
    count, n = maps.shape[0], maps.shape[1]
    out = np.zeros((count, count))
    for a in range(count):
        for b in range(count):
            out[a, b] = np.mean([js_divergence(maps[a, i], maps[b, i]) for i in range(n)])
    return out


def reference(sequences):
    """Every family over ``sequences`` [(ids, maps [L, H, n, n])], averaged over sequences."""
    layers, heads = sequences[0][1].shape[:2]
    per = lambda f: np.mean([[[f(ids, m[l, h]) for h in range(heads)] for l in range(layers)]  # noqa: E731
                              for ids, m in sequences], axis=0)
    distance = per(ref_distance)
    clark = {name: per(lambda ids, a, name=name: ref_clark(ids, a)[name]) for name in CLARK}
    sieve = {name: np.array([[[ref_sieve(ids, m[l, h])[name] for h in range(heads)] for l in range(layers)]
                             for ids, m in sequences]) for name in SIEVES}
    js = np.mean([ref_js(m.reshape(layers * heads, *m.shape[2:])) for _, m in sequences], axis=0)
    return distance, clark, sieve, js


def assert_matches(features, expected, atol=1e-6):
    distance, clark, sieve, js = expected
    np.testing.assert_allclose(features.distance, distance, atol=atol, rtol=0)
    for name in CLARK:
        np.testing.assert_allclose(features.clark[name], clark[name], atol=atol * 10, rtol=0, err_msg=name)
    for name in SIEVES:
        np.testing.assert_allclose(features.sieve[name], sieve[name], atol=atol * 10, rtol=0, err_msg=name)
    np.testing.assert_allclose(features.js, js, atol=atol * 10, rtol=0)


# ----------------------------------------------------------------------------- hand-made maps


def padded(sequences, left=False):
    """(input_ids, attention_mask, weights [batch, L, H, seq, seq]) with right (or left) padding."""
    seq = max(len(ids) for ids, _ in sequences)
    layers, heads = sequences[0][1].shape[:2]
    ids = torch.full((len(sequences), seq), PAD)
    mask = torch.zeros(len(sequences), seq, dtype=torch.long)
    weights = torch.zeros(len(sequences), layers, heads, seq, seq)
    for b, (tokens, maps) in enumerate(sequences):
        n = len(tokens)
        at = slice(seq - n, seq) if left else slice(0, n)
        ids[b, at], mask[b, at] = torch.tensor(tokens), 1
        weights[b, :, :, at, at] = torch.tensor(maps, dtype=torch.float32)
        padding = [i for i in range(seq) if not at.start <= i < at.stop]
        weights[b, :, :, padding, at] = 1.0 / n  # padding queries: some distribution over the valid keys
    return ids, mask, weights


def accumulate(sequences, batch_sizes, families=("distance", "clark", "sieve", "js"), left=False):
    layers, heads = sequences[0][1].shape[:2]
    acc = FeatureAccumulator(layers, heads, families, KINDS, torch.device("cpu"))
    start = 0
    for size in batch_sizes:
        ids, mask, weights = padded(sequences[start:start + size], left)
        acc.begin(ids, mask)
        for layer in range(layers):
            acc.layer(layer, weights[:, layer])
        acc.end()
        start += size
    return acc.result()


def hand_made(rng, layers=2, heads=3):
    """Sequences with [CLS], [SEP]s, commas, periods and words; rows drawn from a Dirichlet (some sharp)."""
    token_lists = [
        [C, 70, COMMA, 80, 90, PERIOD, S, 100, 110, S],
        [C, 70, 80, S],
        [C, 90, PERIOD, 100, COMMA, 70, 80, 110, 120, PERIOD, S, 130, S],
        [C, S, S],  # empty segments: no block sieve anywhere
        [C, 70, COMMA, 80, S, S, 90, 100, PERIOD, S],  # a RoBERTa pair: <s> A </s></s> B </s>
    ]
    sequences = []
    for tokens in token_lists:
        n = len(tokens)
        maps = rng.dirichlet(np.full(n, 0.3), size=(layers, heads, n))
        maps[0, 0] = np.eye(n)  # a one-hot head: 0 ln 0 terms
        sequences.append((tokens, maps.astype(np.float32).astype(np.float64) / maps.astype(np.float32).sum(-1,
                                                                                                    keepdims=True)))
    return sequences


def test_every_family_equals_the_definitions_on_hand_made_maps():
    sequences = hand_made(np.random.default_rng(0))
    features = accumulate(sequences, [5])
    expected = reference(sequences)
    assert_matches(features, expected)
    assert np.isnan(features.sieve["block"][3]).all(), "a sequence whose sieve is empty for every query has no score"
    layers, heads = 2, 3
    each = np.array([[[ref_distance(ids, m[l, h]) for h in range(heads)] for l in range(layers)]
                     for ids, m in sequences])
    np.testing.assert_allclose(features.distance_sequences, each, atol=1e-6)  # [sequences, L, H, 21]
    np.testing.assert_allclose(features.distance.sum(-1), 1.0, atol=1e-6)  # each query's 21 values sum to 1


def test_streaming_over_batches_equals_one_batch():
    sequences = hand_made(np.random.default_rng(1))
    one, streamed = accumulate(sequences, [5]), accumulate(sequences, [1, 2, 2])
    arrays, streamed_arrays = one.to_arrays(), streamed.to_arrays()
    assert arrays.keys() == streamed_arrays.keys()
    for name in arrays.keys() - {"families"}:  # float32 sums per batch: equal to rounding
        np.testing.assert_allclose(streamed_arrays[name], arrays[name], atol=1e-6, rtol=0, err_msg=name)


def test_left_padding_gives_the_same_features():
    """Right padding takes each sequence's JS block by slicing, any other mask by gathering: both as defined."""
    sequences = hand_made(np.random.default_rng(5))
    expected = reference(sequences)
    for left in (False, True):
        assert_matches(accumulate(sequences, [3, 2], left=left), expected)


def test_uniform_attention_gives_the_analytic_values():
    n = 16
    tokens = [100 + i for i in range(n)]  # no special token, no punctuation
    sequences = [(tokens, np.full((1, 1, n, n), 1.0 / n))]
    features = accumulate(sequences, [1])
    expected = np.zeros(21)
    expected[0] = 1 / n
    for w in range(16):  # window w holds distance d = w + 1 (n = 16): 2 (n - d) (query, key) pairs
        expected[1 + w] = 2 * (n - (w + 1)) / n / n
    np.testing.assert_allclose(features.distance[0, 0], expected, atol=1e-7)
    assert features.clark["entropy"][0, 0] == pytest.approx(math.log(n), abs=1e-6)
    assert features.clark["next"][0, 0] == pytest.approx((n - 1) / n**2, abs=1e-7)
    assert features.sieve["local"][0, 0, 0] == pytest.approx(1.0, abs=1e-6)
    assert features.js[0, 0] == 0.0


def test_uniform_attention_scores_exactly_one_in_every_sieve():
    tokens = [C, 70, COMMA, 80, S, 90, PERIOD, S]
    n = len(tokens)
    features = accumulate([(tokens, np.full((1, 2, n, n), 1.0 / n))], [1], families=("sieve",))
    for name in SIEVES:
        np.testing.assert_allclose(features.sieve[name], 1.0, atol=1e-6, err_msg=name)


def test_js_is_symmetric_with_a_zero_diagonal_and_equals_the_direct_computation():
    sequences = hand_made(np.random.default_rng(2), layers=2, heads=2)
    js = accumulate(sequences, [2, 3], families=("js",)).js
    np.testing.assert_array_equal(js, js.T)
    np.testing.assert_array_equal(np.diag(js), 0.0)
    np.testing.assert_allclose(js, reference(sequences)[3], atol=1e-6)
    assert (js[~np.eye(4, dtype=bool)] > 0).all()


# ----------------------------------------------------------------------------- a real model


def model_maps(model, inputs):
    """Per sequence: (ids, maps [L, H, n, n]) from the independent float64 forward of tests/reference.py."""
    record = {"weights": []}
    bert_forward(params_of(model), model.config, inputs["input_ids"], inputs["attention_mask"],
                 inputs["token_type_ids"], lambda layer, head: "keep", record=record)
    lengths = inputs["attention_mask"].sum(1).tolist()
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    out = []
    for b, n in enumerate(lengths):
        maps = np.zeros((layers, heads, n, n))
        for layer, example, head, weights in record["weights"]:
            if example == b:
                maps[layer, head] = weights[:n, :n].numpy()
        out.append((inputs["input_ids"][b, :n].tolist(), maps))
    return out


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_features_of_a_model_equal_the_definitions_on_its_float64_attention(tiny_model, tokenizer, inputs,
                                                                            implementation):
    tiny_model.config._attn_implementation_internal = implementation
    sequences = model_maps(tiny_model, inputs)
    one_by_one = [{k: v[b:b + 1, :len(sequences[b][0])] for k, v in inputs.items()} for b in range(3)]
    for batches in ([inputs], one_by_one):
        features = attention_features(tiny_model, tokenizer, batches)
        assert features.num_sequences == 3
        assert_matches(features, reference(sequences), atol=2e-6)
    assert tiny_model.config._attn_implementation == implementation  # restored


def test_a_sequence_of_padding_only_is_an_error(tiny_model, tokenizer, inputs):
    inputs = dict(inputs, attention_mask=inputs["attention_mask"].clone())
    inputs["attention_mask"][1] = 0
    with pytest.raises(UserError, match="sequence 1 of batch 0 is all padding"):
        attention_features(tiny_model, tokenizer, [inputs])
    with pytest.raises(UserError, match="unknown attention feature families"):
        attention_features(tiny_model, tokenizer, [inputs], families=("distance", "syntax"))


def test_features_leave_the_model_as_it_was(tiny_model, tokenizer, inputs):
    before = tiny_model(**inputs).last_hidden_state
    attention_features(tiny_model, tokenizer, [inputs], families=("distance",))
    torch.testing.assert_close(tiny_model(**inputs).last_hidden_state, before, rtol=0, atol=0)
    assert DISTANCE_BINS[0] == "self" and len(DISTANCE_BINS) == 21


def test_js_over_the_first_sequences_only_when_limited():
    sequences = hand_made(np.random.default_rng(3), layers=1, heads=3)
    limited = accumulate(sequences, [1, 2, 1], families=("distance", "js"))
    layers, heads = 1, 3
    acc = FeatureAccumulator(layers, heads, ("distance", "js"), KINDS, torch.device("cpu"), js_max_sequences=2)
    for start, size in ((0, 1), (1, 2), (3, 1)):  # the limit falls inside the second batch
        ids, mask, weights = padded(sequences[start:start + size])
        acc.begin(ids, mask)
        acc.layer(0, weights[:, 0])
        acc.end()
    first_two = acc.result()
    assert (first_two.js_sequences, limited.js_sequences) == (2, 4)
    np.testing.assert_allclose(first_two.js, reference(sequences[:2])[3], atol=1e-6)
    np.testing.assert_array_equal(first_two.distance, limited.distance)  # the other families use every sequence


@pytest.mark.parametrize(("model_type", "boundary"), [("roberta", "\u0120"), ("xlm-roberta", "\u2581")])
def test_punctuation_after_a_space_counts_as_punctuation_in_every_vocabulary_kind(model_type, boundary):
    """Byte-level BPE writes the comma of "city , she" as its own token "Ġ,", SentencePiece may write "▁,": both are
    commas for the comma and period bins and Clark's punct (they read 0 on such text before)."""
    tokenizer = tiny_tokenizer(model_type)
    kinds = TokenKinds.of(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("the city , she went .")["input_ids"])
    for mark, ids in ((",", kinds.comma), (".", kinds.period)):
        spelled = {piece for piece in pieces if piece.lstrip(boundary) == mark}
        assert spelled and set(tokenizer.convert_tokens_to_ids(sorted(spelled))) <= set(ids), (pieces, ids)
        assert tokenizer.convert_tokens_to_ids(mark) in ids
    ids = tokenizer("the city , she went .", return_tensors="pt")["input_ids"]  # [1, seq]
    n = ids.shape[1]
    acc = FeatureAccumulator(1, 1, ("distance", "clark"), kinds, torch.device("cpu"))
    acc.begin(ids, torch.ones_like(ids))
    acc.layer(0, torch.full((1, 1, n, n), 1.0 / n))  # [batch, heads, seq, seq]: uniform
    acc.end()
    features = acc.result()
    commas, periods = (sum(piece.lstrip(boundary) == mark for piece in pieces) for mark in (",", "."))
    assert features.clark["punct"][0, 0] == pytest.approx((commas + periods) / n)
    assert features.distance[0, 0, DISTANCE_BINS.index("comma")] == pytest.approx(commas / n)
