"""Pande et al.'s (2021) syntactic sieve: how much more than uniform a head attends to a word's syntactic relatives.

The sieve of a word ``i`` is a set of other words: for the coarse ``syntactic`` role its gold head (unless ROOT) and
its dependents; for a fine role ``r`` (``nsubj``, ``obj`` (``dobj`` in older treebanks), ``amod``, ``advmod``) only
those linked to ``i`` by relation ``r``. The sieve bias score of a head on a sentence is, over the words whose sieve
is not empty, the mean of (attention from ``i`` to its sieve) / (|sieve| / slots): the share uniform attention would
give it, ``slots`` being the words with ``[CLS]`` and ``[SEP]`` (a word-level attention row covers them all). It
is the token-level local / block / delimiter sieves' definition (``analysis/features.py``) on word-level
attention; uniform attention scores exactly 1. A sentence where no word has a sieve gets no score (NaN); the roles
then follow from the same one-sided t-test across sentences and correction (``reporting/sieve_roles.py``).
"""

from __future__ import annotations

import torch

SYNTACTIC_SIEVES = {"syntactic": None, "nsubj": ("nsubj",), "obj": ("obj", "dobj"), "amod": ("amod",),
                    "advmod": ("advmod",)}  # role -> relations (None: every relation)


def sieve_members(heads: torch.Tensor, relations: list[list[str]], words: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per role ``[batch, slots, slots]``: whether slot k is in the sieve of slot i. ``heads`` ``[batch, slots]``
    holds each word slot's gold head slot (0: ROOT, i.e. [CLS], never a member), ``relations`` each sentence's
    relations per word, ``words`` ``[batch, slots]`` which slots are words."""
    index = torch.arange(heads.shape[1], device=heads.device)
    head_of = (heads.unsqueeze(-1) == index) & words.unsqueeze(-1) & words.unsqueeze(1)  # [b, i, k]: k heads i
    members = {}
    for role, names in SYNTACTIC_SIEVES.items():
        if names is None:
            related = torch.ones_like(words)
        else:
            related = torch.zeros_like(words)
            for row, sentence in enumerate(relations):
                related[row, 1:len(sentence) + 1] = torch.tensor([r in names for r in sentence], device=heads.device)
        # i's head when i's relation is r; i's dependents k whose relation is r
        members[role] = (head_of & related.unsqueeze(-1)) | (head_of.transpose(1, 2) & related.unsqueeze(1))
    return members


def sieve_scores(words_attention: torch.Tensor, members: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``[batch, heads]`` sieve bias scores from word attention ``[batch, heads, slots, slots]`` and one role's
    ``members`` ``[batch, slots, slots]``; NaN for a sentence where no word has a sieve."""
    size = members.sum(-1)  # [batch, slots]
    has = size > 0
    count = has.sum(-1)  # [batch]
    weight = (lengths + 2).unsqueeze(-1) / size.clamp(min=1) / count.clamp(min=1).unsqueeze(-1)  # [batch, slots]
    table = members * weight.unsqueeze(-1)  # [batch, i, k]
    scores = torch.einsum("bhik,bik->bh", words_attention.float(), table.float())
    return scores.masked_fill((count == 0).unsqueeze(-1), float("nan"))
