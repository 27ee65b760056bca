"""Shapley values of groups of heads from the scores of coalitions (Shapley 1953; for heads, Held and Yang 2023).

The players are groups of heads (head types, layers, or single heads). A coalition ``S`` is the set of groups that
keep their heads; every other group's heads are removed under the removal policy. ``v(S)`` is the mean over
examples of a per-example score, so every value below is also a mean over examples of a per-example value (what
the bootstrap confidence intervals resample):

    phi_i = sum over S not holding i of |S|! (k - |S| - 1)! / k! * (v(S + i) - v(S))

* ``exact_values``: from all 2^k coalitions (bit ``i`` of a coalition's index: group ``i`` kept). The values sum to
  ``v(all) - v(none)`` (efficiency).
* ``PermutationEstimate``: from removal chains: a permutation removes the groups one by one from the full model;
  each group's marginal is the score before its removal minus the score after. Permutations come in antithetic pairs
  (a permutation and its reverse); a chain is truncated once its score reaches the floor (the groups left get 0).
  The estimate is the mean marginal; its standard error is over the pairs.
"""

from __future__ import annotations

import math

import numpy as np


def coalition_sizes(k: int) -> np.ndarray:
    """``[2^k]``: the number of groups each coalition keeps."""
    masks = np.arange(2 ** k)
    return np.array([bin(mask).count("1") for mask in masks]) if k else np.zeros(1, dtype=int)


def exact_values(scores: np.ndarray) -> np.ndarray:
    """``[k, examples]`` per-example Shapley values from ``scores`` ``[2^k, examples]`` (index = kept groups' bits)."""
    count = scores.shape[0]
    k = count.bit_length() - 1
    if count != 2 ** k:
        raise ValueError(f"exact Shapley values need the scores of all 2^k coalitions; got {count} rows")
    sizes = coalition_sizes(k)
    weights = np.array([math.factorial(s) * math.factorial(k - s - 1) / math.factorial(k) for s in range(k)])
    masks = np.arange(count)
    values = np.zeros((k, scores.shape[1]))
    for i in range(k):
        without = masks[(masks >> i) & 1 == 0]  # coalitions that do not hold group i
        values[i] = (weights[sizes[without], None] * (scores[without | (1 << i)] - scores[without])).sum(0)
    return values


class PermutationEstimate:
    """Monte Carlo Shapley values from removal chains in antithetic pairs (module docstring)."""

    def __init__(self, players: int, examples: int):
        self.players, self.examples = players, examples
        self.sums = np.zeros((players, examples))  # per-example marginals summed over permutations
        self.pair_values: list[np.ndarray] = []  # per pair: [players] mean marginal over its two permutations
        self.permutations = 0
        self._pending: np.ndarray | None = None  # the first permutation of the current pair's [players] marginals

    def add_chain(self, order: list[int], chain: np.ndarray) -> None:
        """One permutation's chain: ``order`` removes player ``order[j]`` at step j; ``chain`` ``[steps + 1,
        examples]`` holds the per-example scores before any removal and after each step taken (a truncated chain
        is shorter: the players it did not reach get 0)."""
        marginals = np.zeros((self.players, self.examples))
        for step in range(len(chain) - 1):
            marginals[order[step]] = chain[step] - chain[step + 1]
        self.sums += marginals
        self.permutations += 1
        means = marginals.mean(1)
        if self._pending is None:
            self._pending = means
        else:
            self.pair_values.append((self._pending + means) / 2)
            self._pending = None

    def values(self) -> np.ndarray:
        """``[players, examples]``: the per-example estimates (their mean over examples is the value)."""
        return self.sums / max(self.permutations, 1)

    def standard_errors(self) -> np.ndarray:
        """``[players]``: the Monte Carlo standard error of each value, over the antithetic pairs (inf below 2)."""
        if len(self.pair_values) < 2:
            return np.full(self.players, np.inf)
        pairs = np.stack(self.pair_values)
        return pairs.std(0, ddof=1) / np.sqrt(len(pairs))


def antithetic_orders(players: int, generator: np.random.Generator) -> tuple[list[int], list[int]]:
    """A uniformly drawn removal order and its reverse."""
    order = generator.permutation(players).tolist()
    return order, order[::-1]
