"""Clark et al.'s attention probe: its scores against a loop over (dependent, candidate) pairs written here, the ROOT
merge of [CLS] and [SEP], a planted head recovered, and the right-branching baseline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headlab.analysis.syntax.probe import (
    DISTANCE_CLIP,
    AttentionProbe,
    ProbeSentence,
    attachment,
    root_merged,
    train_probe,
)

HEADS, PLANTED = 6, 4


def random_sentence(generator: torch.Generator, planted: bool = True, dim: int = 0) -> ProbeSentence:
    """A sentence of 4-10 words with random gold heads (ROOT or another word) and random attention rows; head
    PLANTED's dependent -> head attention puts all its weight on the gold head."""
    n = int(torch.randint(4, 11, (1,), generator=generator))
    heads = torch.stack([torch.randint(0, n, (1,), generator=generator)[0] for _ in range(n)])
    heads = torch.where(heads >= torch.arange(1, n + 1), heads + 1, heads)  # never the word itself
    attention = torch.rand(HEADS, n + 1, n + 1, generator=generator)
    attention = attention / attention.sum(-1, keepdim=True)
    if planted:
        attention[PLANTED, 1:] = 0
        attention[PLANTED, torch.arange(1, n + 1), heads] = 1.0  # a(j -> head of j)
    embeddings = torch.randn(n + 1, dim, generator=generator) if dim else None
    return ProbeSentence(attention, heads, torch.zeros(n, dtype=torch.bool), embeddings)


def test_scores_equal_the_definition_pair_by_pair():
    generator = torch.Generator().manual_seed(0)
    sentence = random_sentence(generator, dim=3)
    for kind in ("attn", "attn_emb"):
        probe = AttentionProbe(kind, HEADS, 3)
        with torch.no_grad():
            for parameter in probe.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
            scores = probe(sentence).double()
        a, e, n = sentence.attention.double(), sentence.embeddings.double(), len(sentence.heads)
        for j in range(1, n + 1):
            for i in range(n + 1):
                if i == j:
                    assert scores[j - 1, i] == float("-inf")
                    continue
                if kind == "attn":
                    w, u = probe.w.double(), probe.u.double()
                else:
                    pair = torch.cat([e[i], e[j]])
                    w = probe.w.weight.double() @ pair + probe.w.bias.double()
                    u = probe.u.weight.double() @ pair + probe.u.bias.double()
                clipped = min(max(i - j, -DISTANCE_CLIP), DISTANCE_CLIP)
                bucket = 2 * DISTANCE_CLIP + 1 if i == 0 else clipped + DISTANCE_CLIP
                expected = (w * a[:, i, j]).sum() + (u * a[:, j, i]).sum() + probe.distance.double()[bucket]
                assert float(scores[j - 1, i]) == pytest.approx(expected.item(), rel=1e-5, abs=1e-5)


def test_root_is_cls_and_sep_together():
    words = torch.rand(2, 5, 5)  # [K, slots]: [CLS], 3 words, [SEP]
    merged = root_merged(words, 3)
    np.testing.assert_allclose(merged[:, 0, 1:], words[:, 0, 1:4] + words[:, 4, 1:4])
    np.testing.assert_allclose(merged[:, 1:, 0], words[:, 1:4, 0] + words[:, 1:4, 4])
    np.testing.assert_allclose(merged[:, 1:, 1:], words[:, 1:4, 1:4])
    assert (merged[:, 0, 0] == 0).all()


@pytest.mark.parametrize("kind", ["attn", "attn_emb"])
def test_the_probe_finds_the_planted_head(kind):
    dim = 4 if kind == "attn_emb" else 0
    generator = torch.Generator().manual_seed(1)
    train = [random_sentence(generator, dim=dim) for _ in range(300)]
    test = [random_sentence(generator, dim=dim) for _ in range(100)]
    probe = train_probe(kind, lambda: train, HEADS, dim, epochs=2, lr=0.05, seed=0)
    assert attachment(probe, test)["uas"] > 0.95
    unplanted = [random_sentence(generator, planted=False, dim=dim) for _ in range(100)]
    assert attachment(probe, unplanted)["uas"] < 0.5  # it reads the planted head, not the data's shape
    if kind == "attn":
        assert int(torch.argmax(probe.u)) == PLANTED


def test_right_branching_baseline_counts_without_punctuation():
    # "A b c ." with heads: A->b, b->c, c->ROOT, .->c ; right-branching: A->b, b->c, c->., .->ROOT
    punct = torch.tensor([False, False, False, True])
    sentence = ProbeSentence(torch.zeros(1, 5, 5), torch.tensor([2, 3, 0, 3]), punct)
    result = attachment(None, [sentence])
    assert result["uas"] == pytest.approx(2 / 3) and result["uas_with_punct"] == pytest.approx(2 / 4)
    assert (result["words"], result["words_with_punct"]) == (3, 4)
