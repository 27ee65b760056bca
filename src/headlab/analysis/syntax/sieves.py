"""Pande et al.'s (2021) syntactic sieves: how much more than uniform a head attends along dependency arcs.

Two definitions, ``syntax.sieve``:

- ``pande`` (default), as their ``syntactic_score`` notebook computes it. A role's pairs are the (dependent ``d``,
  head ``h``) arcs of the gold tree (root's left out; ``syntactic``: every arc, a fine role ``r``: the arcs whose
  dependent has relation ``r``; ``obj`` also takes ``dobj``). A pair's ``l2r`` score is the attention from ``d`` to
  ``h`` averaged over ``d``'s pieces and ``h``'s pieces, over ``d``'s uniform share: its pieces' mean row sum over
  the sequence length in pieces (``[CLS]`` and ``[SEP]`` included). ``r2l`` is the same from ``h`` to ``d``; ``bi``
  their mean (``syntax.sieve_direction``). A sentence's score is the mean over its pairs of the role.
- ``relatives`` (headlab's earlier one): the sieve of a word ``i`` is its gold head (unless ROOT) and its dependents
  (a fine role: those linked to ``i`` by it); the score is, over the words with a sieve, the mean of (attention
  from ``i`` to its sieve) / (|sieve| / slots) on word-level attention, ``slots`` being the words with ``[CLS]`` and
  ``[SEP]``: the token-level local / block / delimiter sieves' definition (``analysis/types/features.py``).

**The fixed-offset control** (``pande``): a head that attends by position alone (the next word, say) scores high on
every role whose arcs are often that far apart. Per sentence, a pair's score minus the mean score of the sentence's
other word pairs at the same offset (``offset_means``, the role's own arcs left out, so that they do not raise their
own baseline), averaged over the role's pairs (``beyond_offset``), is what the head gives the arcs beyond its offset
pattern: 0 for a purely positional head. The roles' offset test asks that excess to clear the role's own bar,
``tau - 1`` above uniform attention's 0 (``analysis/types/sieve_roles.py``).

Uniform attention scores exactly 1 under both. A sentence without a pair (a member) of a role gets no score (NaN);
the roles then follow from the one-sided t-test across sentences and correction (``analysis/types/sieve_roles.py``).
"""

from __future__ import annotations

import torch

SYNTACTIC_SIEVES = {"syntactic": None, "nsubj": ("nsubj",), "obj": ("obj", "dobj"), "amod": ("amod",),
                    "advmod": ("advmod",)}  # role -> relations (None: every relation)
SIEVES = ("pande", "relatives")
SIEVE_DIRECTIONS = ("l2r", "r2l", "bi")


def _arcs(heads: torch.Tensor, relations: list[list[str]], words: torch.Tensor):
    """``[batch, i, k]``: whether word slot k is the gold head of word slot i; per role ``[batch, slots]``: whether a
    word's own relation is the role's."""
    index = torch.arange(heads.shape[1], device=heads.device)
    head_of = (heads.unsqueeze(-1) == index) & words.unsqueeze(-1) & words.unsqueeze(1)  # [b, i, k]: k heads i
    related = {}
    for role, names in SYNTACTIC_SIEVES.items():
        if names is None:
            related[role] = torch.ones_like(words)
            continue
        related[role] = torch.zeros_like(words)
        for row, sentence in enumerate(relations):
            related[role][row, 1:len(sentence) + 1] = torch.tensor([r in names for r in sentence], device=heads.device)
    return head_of, related


def dependency_pairs(heads: torch.Tensor, relations: list[list[str]], words: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per role ``[batch, slots, slots]``: whether (d, h) is a pair of the role (``pande``). ``heads`` ``[batch,
    slots]`` holds each word slot's gold head slot (0: ROOT, never a pair), ``relations`` each sentence's relations
    per word, ``words`` ``[batch, slots]`` which slots are words."""
    head_of, related = _arcs(heads, relations, words)
    return {role: head_of & related[role].unsqueeze(-1) for role in SYNTACTIC_SIEVES}


def sieve_members(heads: torch.Tensor, relations: list[list[str]], words: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per role ``[batch, slots, slots]``: whether slot k is in the ``relatives`` sieve of slot i (arguments as
    ``dependency_pairs``)."""
    head_of, related = _arcs(heads, relations, words)
    # i's head when i's relation is r; i's dependents k whose relation is r
    return {role: (head_of & related[role].unsqueeze(-1)) | (head_of.transpose(1, 2) & related[role].unsqueeze(1))
            for role in SYNTACTIC_SIEVES}


def sieve_scores(words_attention: torch.Tensor, members: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``relatives``: ``[batch, heads]`` sieve bias scores from word attention ``[batch, heads, slots, slots]`` and one
    role's ``members`` ``[batch, slots, slots]``; NaN for a sentence where no word has a sieve."""
    size = members.sum(-1)  # [batch, slots]
    has = size > 0
    count = has.sum(-1)  # [batch]
    weight = (lengths + 2).unsqueeze(-1) / size.clamp(min=1) / count.clamp(min=1).unsqueeze(-1)  # [batch, slots]
    table = members * weight.unsqueeze(-1)  # [batch, i, k]
    scores = torch.einsum("bhik,bik->bh", words_attention.float(), table.float())
    return scores.masked_fill((count == 0).unsqueeze(-1), float("nan"))


def pande_pair_scores(words_attention: torch.Tensor, pieces: torch.Tensor, tokens: torch.Tensor,
                      direction: str) -> torch.Tensor:
    """``pande``: ``[batch, heads, d, h]`` the score of every word pair as a (dependent d, head h) pair, from word
    attention ``[batch, heads, slots, slots]`` (rows: the mean of a word's pieces' rows; columns: the sum of its
    pieces' columns), ``pieces`` ``[batch, slots]`` per slot and ``tokens`` ``[batch]`` per sequence. Computed once
    per layer; ``mean_over_pairs`` then averages it over each role's pairs."""
    words = words_attention.float()
    share = words.sum(-1) / tokens.view(-1, 1, 1)  # [batch, heads, slots]: a word's mean row sum / sequence length
    per_piece = pieces.clamp(min=1).float()

    def along() -> torch.Tensor:  # d to h, over d's share
        return words / per_piece[:, None, None, :] / share.unsqueeze(-1)

    def against() -> torch.Tensor:  # h to d, over h's share
        return words.transpose(-1, -2) / per_piece[:, None, :, None] / share.unsqueeze(-2)

    if direction == "l2r":
        return along()
    return against() if direction == "r2l" else (along() + against()) / 2


def mean_over_pairs(pair_scores: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """``[batch, heads]``: the mean of ``pair_scores`` ``[batch, heads, d, h]`` over one role's ``pairs``
    ``[batch, d, h]``; NaN for a sentence without a pair."""
    count = pairs.sum((-1, -2))  # [batch]
    total = torch.where(pairs.unsqueeze(1), pair_scores, 0.0).sum((-1, -2))  # [batch, heads]
    return (total / count.clamp(min=1).unsqueeze(-1)).masked_fill((count == 0).unsqueeze(-1), float("nan"))


def offset_means(pair_scores: torch.Tensor, words: torch.Tensor, exclude: torch.Tensor | None = None) -> torch.Tensor:
    """``[batch, heads, d, h]``: the mean of ``pair_scores`` ``[batch, heads, d, h]`` over the sentence's word pairs
    (``words`` ``[batch, slots]``, d != h) at the pair's own offset ``h - d``, leaving out the pairs ``exclude``
    ``[batch, d, h]`` (a role's own arcs): what a head's offset pattern alone gives that pair; NaN where no pair at
    that offset is left."""
    batch, heads, slots, _ = pair_scores.shape
    index = torch.arange(slots, device=pair_scores.device)
    offset = (index[None, :] - index[:, None] + slots - 1).flatten()  # [d * h] in 0 .. 2 slots - 2
    valid = words[:, :, None] & words[:, None, :] & (index[:, None] != index[None, :])  # [batch, d, h]
    if exclude is not None:
        valid = valid & ~exclude
    valid = valid.flatten(1)  # [batch, d * h]
    values = torch.where(valid[:, None], pair_scores.flatten(2), 0.0)  # [batch, heads, d * h]
    sums = values.new_zeros(batch, heads, 2 * slots - 1).scatter_add_(-1, offset.expand(batch, heads, -1), values)
    counts = values.new_zeros(batch, 1, 2 * slots - 1).scatter_add_(-1, offset.expand(batch, 1, -1),
                                                                    valid[:, None].to(values.dtype))
    means = (sums / counts.clamp(min=1)).masked_fill(counts == 0, float("nan"))  # [batch, heads, offsets]
    return means.gather(-1, offset.expand(batch, heads, -1)).view(batch, heads, slots, slots)


def beyond_offset(pair_scores: torch.Tensor, words: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """``[batch, heads]``: the mean over one role's ``pairs`` ``[batch, d, h]`` of each pair's score less the mean
    score of the sentence's other pairs at its offset (``offset_means`` without the role's arcs); a pair whose offset
    has no other pair is left out, a sentence with none left is NaN."""
    beyond = pair_scores - offset_means(pair_scores, words, pairs)  # [batch, heads, d, h]
    usable = pairs & torch.isfinite(beyond[:, 0])  # the same pairs for every head
    return mean_over_pairs(beyond.nan_to_num(0.0), usable)
