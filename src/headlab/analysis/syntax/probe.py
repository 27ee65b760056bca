"""Clark et al.'s attention probe (2019, section 6): a dependency parser from every head's attention at once.

For a dependent word ``j`` and a candidate head ``i`` (a word, or ROOT), the score is a weighted sum of every head's
attention in both directions, plus a learned bias for their distance (clipped to +-``DISTANCE_CLIP``; ROOT its own):

    attn:      s(i, j) = sum_k  w_k a^k(i -> j) + u_k a^k(j -> i)                     + d(i - j)
    attn_emb:  s(i, j) = sum_k  W_k (e_i + e_j) a^k(i -> j) + U_k (e_i + e_j) a^k(j -> i) + d(i - j)

``a^k`` is head ``k``'s word-level attention (``word_attention``) with ROOT standing for ``[CLS]`` and ``[SEP]``
together (their rows and columns added), ``e`` the model's own input embeddings of the words (the mean of their
pieces'; ROOT: ``[CLS]``'s), concatenated (``+`` above), in place of Clark et al.'s GloVe vectors. A softmax over
the candidates (ROOT and every other word) gives p(head of j = i); cross-entropy against the gold head, Adam, one
sentence a step, as Clark et al. (lr 0.002, one epoch by default). Accuracy is UAS on the evaluation treebank,
punctuation left out as Clark et al. do, against the right-branching baseline (each word's head is the next word,
the last word's is ROOT). The attention is computed as it is consumed, a batch of sentences at a time, each epoch:
memory does not grow with the treebank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from headlab.analysis.syntax.data import EncodedTreebank
from headlab.analysis.syntax.word_attention import slot_matrix, word_level
from headlab.core.observe import observe_attention

KINDS = ("attn", "attn_emb")
DISTANCE_CLIP = 5
PUNCT = "punct"


@dataclass
class ProbeSentence:
    """One sentence's probe inputs: ``attention`` ``[K, n + 1, n + 1]`` (slot 0 ROOT, 1..n the words; from, to),
    ``heads`` ``[n]`` gold heads (0 ROOT), ``punct`` ``[n]`` which words are punctuation, ``embeddings``
    ``[n + 1, d]`` (attn_emb) or None."""

    attention: torch.Tensor
    heads: torch.Tensor
    punct: torch.Tensor
    embeddings: torch.Tensor | None = None


def root_merged(words: torch.Tensor, n: int) -> torch.Tensor:
    """``[K, n + 1, n + 1]`` from word attention ``[K, slots, slots]`` (0 [CLS], 1..n words, n + 1 [SEP]): ROOT's
    row and column are [CLS]'s and [SEP]'s added; ROOT to itself 0."""
    special = torch.tensor([0, n + 1], device=words.device)
    merged = words.new_zeros(words.shape[0], n + 1, n + 1)
    merged[:, 1:, 1:] = words[:, 1:n + 1, 1:n + 1]
    merged[:, 0, 1:] = words[:, special, 1:n + 1].sum(1)
    merged[:, 1:, 0] = words[:, 1:n + 1, special].sum(2)
    return merged


def distance_buckets(n: int) -> torch.Tensor:
    """``[n + 1, n + 1]`` bucket of each (candidate i, dependent j): i - j clipped to +-DISTANCE_CLIP, shifted to
    0..2 * DISTANCE_CLIP; ROOT (i = 0) the last bucket."""
    index = torch.arange(n + 1)
    buckets = (index.unsqueeze(1) - index.unsqueeze(0)).clamp(-DISTANCE_CLIP, DISTANCE_CLIP) + DISTANCE_CLIP
    buckets[0] = 2 * DISTANCE_CLIP + 1
    return buckets


class AttentionProbe(torch.nn.Module):
    """The probe's weights: per head (``attn``), or per head as a linear function of both words' embeddings
    (``attn_emb``), for each direction; and the distance biases."""

    def __init__(self, kind: str, heads: int, embedding_dim: int = 0):
        super().__init__()
        self.kind = kind
        if kind == "attn":
            self.w, self.u = (torch.nn.Parameter(torch.zeros(heads)) for _ in range(2))
        else:
            self.w, self.u = (torch.nn.Linear(2 * embedding_dim, heads) for _ in range(2))
            for parameter in (*self.w.parameters(), *self.u.parameters()):
                torch.nn.init.zeros_(parameter)
        self.distance = torch.nn.Parameter(torch.zeros(2 * DISTANCE_CLIP + 2))

    def forward(self, sentence: ProbeSentence) -> torch.Tensor:
        """``[n, n + 1]`` scores: row j - 1 the dependent word j, column i the candidate (0 ROOT); -inf at i = j."""
        attention = sentence.attention  # [K, n + 1, n + 1]
        n = attention.shape[-1] - 1
        head_to_dependent = attention.permute(1, 2, 0)  # [i, j, K]: a^k(i -> j)
        dependent_to_head = attention.permute(2, 1, 0)  # [i, j, K]: a^k(j -> i)
        if self.kind == "attn":
            scores = head_to_dependent @ self.w + dependent_to_head @ self.u  # [i, j]
        else:
            e = sentence.embeddings  # [n + 1, d]
            pairs = torch.cat([e.unsqueeze(1).expand(-1, n + 1, -1), e.unsqueeze(0).expand(n + 1, -1, -1)], -1)
            scores = (self.w(pairs) * head_to_dependent).sum(-1) + (self.u(pairs) * dependent_to_head).sum(-1)
        scores = scores + self.distance[distance_buckets(n).to(scores.device)]
        scores = scores.T[1:]  # [j = 1..n, i = 0..n]
        itself = torch.arange(n + 1, device=scores.device) == torch.arange(1, n + 1, device=scores.device).unsqueeze(1)
        return scores.masked_fill(itself, float("-inf"))


def train_probe(kind: str, sentences: Callable[[], Iterable[ProbeSentence]], heads: int, embedding_dim: int,
                epochs: int = 1, lr: float = 0.002, seed: int = 0) -> AttentionProbe:
    """The probe trained on ``sentences()`` (called once per epoch: a fresh pass), one sentence a step."""
    torch.manual_seed(seed)
    probe = AttentionProbe(kind, heads, embedding_dim)
    optimizer = torch.optim.Adam(probe.parameters(), lr=lr)
    for _ in range(epochs):
        for sentence in sentences():
            loss = torch.nn.functional.cross_entropy(probe(sentence), sentence.heads)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return probe.eval()


def attachment(probe: AttentionProbe | None, sentences: Iterable[ProbeSentence]) -> dict[str, float]:
    """UAS of the probe (None: the right-branching baseline): with and without punctuation, and the word counts."""
    right = total = right_all = total_all = 0
    with torch.no_grad():
        for sentence in sentences:
            n = len(sentence.heads)
            if probe is None:
                predicted = torch.cat([torch.arange(2, n + 1), torch.zeros(1, dtype=torch.long)])
            else:
                predicted = probe(sentence).argmax(-1)
            hit = predicted == sentence.heads
            right, total = right + int(hit[~sentence.punct].sum()), total + int((~sentence.punct).sum())
            right_all, total_all = right_all + int(hit.sum()), total_all + n
    return {"uas": right / max(total, 1), "uas_with_punct": right_all / max(total_all, 1), "words": total,
            "words_with_punct": total_all}


def gold_trees(encoded: EncodedTreebank) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per sentence of ``encoded``, in order: its gold heads ``[n]`` and which of its words are punctuation."""
    start = 0
    for sentence in encoded.sentences:
        words = slice(start, start + len(sentence))
        yield torch.as_tensor(encoded.gold[words]), torch.as_tensor(np.asarray(encoded.relations[words]) == PUNCT)
        start += len(sentence)


def right_branching(encoded: EncodedTreebank) -> dict[str, float]:
    """``attachment`` of the right-branching baseline on ``encoded`` (it needs no attention)."""
    return attachment(None, [ProbeSentence(torch.empty(0), heads, punct) for heads, punct in gold_trees(encoded)])


class AllHeads:
    """Observer: every layer's word-level attention of a batch, ``[batch, layers * heads, slots, slots]``."""

    def __init__(self):
        self.layers: list[torch.Tensor] = []

    def begin(self, onehot: torch.Tensor) -> None:
        self.onehot, self.layers = onehot, []

    def layer(self, layer: int, weights: torch.Tensor) -> None:
        self.layers.append(word_level(weights, self.onehot))

    def stacked(self) -> torch.Tensor:
        return torch.cat(self.layers, dim=1)


def probe_sentences(model, encoded: EncodedTreebank, batch_size: int, pad_id: int,
                    embeddings: bool = False) -> Iterator[ProbeSentence]:
    """The probe's inputs of every sentence of ``encoded``, in order, computed a batch at a time (no gradient; the
    consumer runs with gradients: nothing is yielded inside the no-grad block)."""
    device = next(model.parameters()).device
    table = model.get_input_embeddings().weight.detach() if embeddings else None
    observer, trees = AllHeads(), gold_trees(encoded)
    for batch in encoded.batches(batch_size, pad_id):
        lengths = batch["lengths"].tolist()
        with torch.no_grad(), observe_attention(model, observer.layer):
            observer.begin(slot_matrix(batch["token_slots"].to(device), max(lengths) + 2))
            model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
        attention = observer.stacked().float().cpu()
        for row, (n, (heads, punct)) in enumerate(zip(lengths, trees)):
            vectors = None
            if table is not None:
                vectors = _word_embeddings(table, batch["input_ids"][row], batch["token_slots"][row], n)
            yield ProbeSentence(root_merged(attention[row], n), heads, punct, vectors)


def _word_embeddings(table: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor, n: int) -> torch.Tensor:
    """``[n + 1, d]``: ROOT the first token's ([CLS]) input embedding, each word the mean of its pieces'."""
    vectors = table[ids.to(table.device)].float().cpu()  # [T, d]
    onehot = slot_matrix(slots.unsqueeze(0), n + 2)[0]  # [T, slots]
    words = (onehot.T @ vectors) / onehot.sum(0).clamp(min=1).unsqueeze(-1)
    return torch.cat([vectors[:1], words[1:n + 1]])
