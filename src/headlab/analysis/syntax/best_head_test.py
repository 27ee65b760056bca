"""Whether a relation's best head beats its best offset baseline, allowing for the choice of the head.

The best of a model's heads x 2 directions is picked on the same words it is then compared on, so its lead over the
baseline is the largest of up to hundreds of noisy leads: a paired test of that one head, as if it had been named
beforehand, finds "significant" heads on trees no head can know (random gold heads: 2 of 3 such treebanks at
p < 0.05). Both numbers below hold for every candidate head at once (single-step max-T, Westfall & Young 1993), so
for the chosen one too. Per word and candidate ``k``: ``d_k = head k right - baseline right`` (-1, 0 or 1). The
words of one sentence were sampled together (a treebank samples sentences), so both numbers resample whole
sentences (``sentences``; ``syntax.unit=word``: each word alone, as if the words were drawn one by one), with
``D_uk`` the sum of ``d_k`` over the words of unit ``u``.

* **p-value**, one-sided (the head is better): ``t_k = sum_u D_uk / sqrt(sum_u D_uk^2)``; each unit's sign flipped
  at random, the same flip for every head (their dependence kept), ``resamples`` times;
  ``p = (1 + #{max_k t*_k >= t_chosen}) / (resamples + 1)``.
* **interval**: the units resampled with replacement ``resamples`` times; ``q`` is the ``confidence`` quantile of
  ``max_k |mean*_k - mean_k| / se_k`` (``se_k`` cluster-robust, the words' standard error for one-word units); the
  interval is the chosen head's difference +- ``q se``. None (NaN) when every word's difference is the same: there
  is nothing to resample, and a zero-width interval would read as certainty.
  The interval is cut to [-1, 1], where a difference of two accuracies lies.

The baseline's offset is the best of five on the same words and is held fixed; that only makes the test stricter.
"""

from __future__ import annotations

import numpy as np
import torch

CHUNK = 256  # resamples per matrix product ([CHUNK, units] @ [units, heads])


def best_head_test(candidates: np.ndarray, chosen: int, baseline: np.ndarray, resamples: int, confidence: float,
                   seed: int, sentences: np.ndarray | None = None) -> dict[str, float]:
    """``candidates`` bool ``[words, heads]`` (every scored head and direction), ``chosen`` its column of the best
    head, ``baseline`` bool ``[words]``: the chosen head's difference in accuracy, its interval and p-value.
    ``sentences``: each word's sentence, the unit that was sampled (its words flipped and resampled together); None:
    every word its own."""
    differences = candidates.astype(np.float64) - baseline.astype(np.float64)[:, None]  # [words, heads]
    difference = float(differences[:, chosen].mean())
    units, sizes = unit_sums(differences, sentences)  # [units, heads], [units]
    if len(units) < 2:  # one word or sentence: no interval, no test
        return {"difference": difference, "ci_low": np.nan, "ci_high": np.nan, "p_value": np.nan,
                "units": len(units)}
    generator = torch.Generator().manual_seed(seed)
    p_value = _max_t_p_value(units, chosen, resamples, generator)
    low, high = _simultaneous_interval(units, sizes, chosen, resamples, confidence, generator)
    return {"difference": difference, "ci_low": low, "ci_high": high, "p_value": p_value, "units": len(units)}


def unit_sums(differences: np.ndarray, sentences: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``([units, heads] sums of the words' differences per unit, [units] words per unit)``, units in order of
    first appearance; without ``sentences``, the words themselves."""
    if sentences is None:
        return differences, np.ones(len(differences))
    _, first, groups = np.unique(sentences, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first, kind="stable"), kind="stable")  # unit number by first appearance
    groups = order[groups]
    sums = np.zeros((int(groups.max()) + 1, differences.shape[1]))
    np.add.at(sums, groups, differences)
    return sums, np.bincount(groups).astype(np.float64)


def _max_t_p_value(units: np.ndarray, chosen: int, resamples: int, generator: torch.Generator) -> float:
    """Sign flips of whole units: ``t_k = sum_u D_uk / sqrt(sum_u D_uk^2)`` of the units' sums ``D``."""
    squares = (units ** 2).sum(0)  # [heads]: unchanged by sign flips
    varied = squares > 0  # a head equal to the baseline on every word has t = 0 under every flip
    if not varied[chosen]:
        return 1.0
    observed = units[:, chosen].sum() / np.sqrt(squares[chosen])
    moving = torch.from_numpy(units[:, varied].astype(np.float32))  # integer sums: exact in float32
    scale = torch.from_numpy(np.sqrt(squares[varied]))
    exceed = 0
    for size in _chunks(resamples):
        signs = torch.randint(0, 2, (size, len(units)), generator=generator).float().mul_(2).sub_(1)
        flipped = (signs @ moving).double() / scale  # [size, varied heads]
        exceed += int((flipped.max(1).values >= observed - 1e-9).sum())
    return (1 + exceed) / (resamples + 1)


def _simultaneous_interval(units: np.ndarray, sizes: np.ndarray, chosen: int, resamples: int, confidence: float,
                           generator: torch.Generator) -> tuple[float, float]:
    """Units resampled with replacement; each head's mean difference over the resampled words, studentised by its
    cluster-robust standard error ``sqrt(U / (U - 1) sum_u (D_u - n_u m)^2) / N`` (the words' own for units of one
    word)."""
    count, words = len(units), sizes.sum()
    means = units.sum(0) / words  # [heads]
    spread = np.sqrt(count / (count - 1) * ((units - sizes[:, None] * means) ** 2).sum(0)) / words
    varied = spread > 0  # a head whose difference is the same on every word: every resample gives its mean
    if not varied[chosen]:
        return np.nan, np.nan
    moving = torch.from_numpy(units[:, varied].astype(np.float32))  # counts x integer sums: exact in float32
    lengths = torch.from_numpy(sizes.astype(np.float32))
    centre, scale = torch.from_numpy(means[varied]), torch.from_numpy(spread[varied])
    largest = []
    for size in _chunks(resamples):
        picks = torch.randint(0, count, (size, count), generator=generator)
        drawn = torch.zeros(size, count).scatter_add_(1, picks, torch.ones(size, count))  # [size, units]
        resampled = (drawn @ moving).double() / (drawn @ lengths).double()[:, None]  # [size, varied heads]
        largest.append(((resampled - centre).abs() / scale).max(1).values)
    q = float(torch.quantile(torch.cat(largest), confidence))
    low, high = means[chosen] - q * spread[chosen], means[chosen] + q * spread[chosen]
    return float(max(low, -1.0)), float(min(high, 1.0))  # a difference of two accuracies lies in [-1, 1]


def _chunks(total: int) -> list[int]:
    return [min(CHUNK, total - start) for start in range(0, total, CHUNK)]
