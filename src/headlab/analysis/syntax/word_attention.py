"""Word-level attention (Clark et al. 2019, section 4): token maps merged into word maps, one matrix product.

A sequence is ``[CLS] w1 ... wn [SEP]``; its *slots* are 0 for ``[CLS]``, 1..n for the words and n + 1 for
``[SEP]``, and each token belongs to one slot (``token_slots``; -1 for padding). The attention *to* a word is the sum
over its pieces (the columns of its tokens added), the attention *from* a word the mean over its pieces (the rows of
its tokens averaged), so every word's row still sums to 1. ``to = weights @ onehot`` and
``from = onehot^T @ to / pieces``: two batched products, no loop over tokens.

``most_attended`` is Clark et al.'s per-head parser: each word's predicted head is the other word it attends to most
(``dependent -> head``), or the word that attends to it most (``head -> dependent``); ``[CLS]``, ``[SEP]`` and the
word itself are never predicted. Ties go to the leftmost word (``argmax``'s first maximum, as numpy's).
"""

from __future__ import annotations

import torch

DIRECTIONS = ("dep->head", "head->dep")


def slot_matrix(token_slots: torch.Tensor, slots: int) -> torch.Tensor:
    """``[batch, tokens, slots]`` one-hot float32 of each token's slot (padding: a zero row)."""
    onehot = torch.nn.functional.one_hot(token_slots.clamp(min=0), slots).float()
    return onehot * (token_slots >= 0).unsqueeze(-1)


def word_level(weights: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
    """``[batch, heads, slots, slots]`` word attention from token attention ``weights`` ``[batch, heads, T, T]`` and
    ``onehot`` ``[batch, T, slots]`` (``slot_matrix``); a slot without tokens (padding) gets a zero row."""
    to_words = weights.float() @ onehot.unsqueeze(1)  # [batch, heads, T, slots]
    pieces = onehot.sum(1).clamp(min=1)  # [batch, slots]
    from_words = onehot.transpose(1, 2) / pieces.unsqueeze(-1)  # [batch, slots, T]
    return from_words.unsqueeze(1) @ to_words  # [batch, heads, slots, slots]


def most_attended(words: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per direction, ``[batch, heads, slots]`` the predicted head slot (1..n) of every slot's word, from word
    attention ``words`` ``[batch, heads, slots, slots]``; ``lengths`` ``[batch]`` the words per sequence. Slots that
    are not words (``[CLS]``, ``[SEP]``, padding) get predictions too; callers read only the words'."""
    slots = words.shape[-1]
    index = torch.arange(slots, device=words.device)
    candidate = (index >= 1) & (index <= lengths.unsqueeze(-1))  # [batch, slots]: the words
    allowed = candidate.unsqueeze(1) & (index.unsqueeze(0) != index.unsqueeze(1)).unsqueeze(0)  # [batch, from, to]
    blocked = ~allowed.unsqueeze(1)  # [batch, 1, slots, slots]
    dependent_to_head = words.masked_fill(blocked, float("-inf")).argmax(-1)
    head_to_dependent = words.transpose(-1, -2).masked_fill(blocked, float("-inf")).argmax(-1)
    return {"dep->head": dependent_to_head, "head->dep": head_to_dependent}
