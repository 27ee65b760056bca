"""Whether a relation's best head beats its best offset baseline, allowing for the choice of the head.

The best of a model's heads x 2 directions is picked on the same words it is then compared on, so its lead over the
baseline is the largest of up to hundreds of noisy leads: a paired test of that one head, as if it had been named
beforehand, finds "significant" heads on trees no head can know (random gold heads: 2 of 3 such treebanks at
p < 0.05). Both numbers below hold for every candidate head at once (single-step max-T, Westfall & Young 1993), so
for the chosen one too. Per word and candidate ``k``: ``d_k = head k right - baseline right`` (-1, 0 or 1).

* **p-value**, one-sided (the head is better): ``t_k = sum(d_k) / sqrt(sum(d_k^2))``; each word's sign flipped at
  random, the same flip for every head (their dependence kept), ``resamples`` times;
  ``p = (1 + #{max_k t*_k >= t_chosen}) / (resamples + 1)``.
* **interval**: the words resampled with replacement ``resamples`` times; ``q`` is the ``confidence`` quantile of
  ``max_k |mean*_k - mean_k| / se_k``; the interval is the chosen head's difference +- ``q se``. None (NaN) when every
  word's difference is the same: there is nothing to resample, and a zero-width interval would read as certainty.
  The interval is cut to [-1, 1], where a difference of two accuracies lies.

The baseline's offset is the best of five on the same words and is held fixed; that only makes the test stricter.
"""

from __future__ import annotations

import numpy as np
import torch

CHUNK = 256  # resamples per matrix product ([CHUNK, words] @ [words, heads])


def best_head_test(candidates: np.ndarray, chosen: int, baseline: np.ndarray, resamples: int, confidence: float,
                   seed: int) -> dict[str, float]:
    """``candidates`` bool ``[words, heads]`` (every scored head and direction), ``chosen`` its column of the best
    head, ``baseline`` bool ``[words]``: the chosen head's difference in accuracy, its interval and p-value."""
    differences = candidates.astype(np.float64) - baseline.astype(np.float64)[:, None]  # [words, heads]
    difference = float(differences[:, chosen].mean())
    if len(baseline) < 2:  # one word: no interval, no test
        return {"difference": difference, "ci_low": np.nan, "ci_high": np.nan, "p_value": np.nan}
    generator = torch.Generator().manual_seed(seed)
    p_value = _max_t_p_value(differences, chosen, resamples, generator)
    low, high = _simultaneous_interval(differences, chosen, resamples, confidence, generator)
    return {"difference": difference, "ci_low": low, "ci_high": high, "p_value": p_value}


def _max_t_p_value(differences: np.ndarray, chosen: int, resamples: int, generator: torch.Generator) -> float:
    squares = (differences ** 2).sum(0)  # [heads]: unchanged by sign flips
    varied = squares > 0  # a head equal to the baseline on every word has t = 0 under every flip
    if not varied[chosen]:
        return 1.0
    observed = differences[:, chosen].sum() / np.sqrt(squares[chosen])
    moving = torch.from_numpy(differences[:, varied].astype(np.float32))  # -1 / 0 / 1: sums exact in float32
    scale = torch.from_numpy(np.sqrt(squares[varied]))
    exceed = 0
    for size in _chunks(resamples):
        signs = torch.randint(0, 2, (size, len(differences)), generator=generator).float().mul_(2).sub_(1)
        flipped = (signs @ moving).double() / scale  # [size, varied heads]
        exceed += int((flipped.max(1).values >= observed - 1e-9).sum())
    return (1 + exceed) / (resamples + 1)


def _simultaneous_interval(differences: np.ndarray, chosen: int, resamples: int, confidence: float,
                           generator: torch.Generator) -> tuple[float, float]:
    words = len(differences)
    means, spread = differences.mean(0), differences.std(0, ddof=1) / np.sqrt(words)  # [heads]
    varied = spread > 0  # a head whose difference is the same on every word: every resample gives its mean
    if not varied[chosen]:
        return np.nan, np.nan
    moving = torch.from_numpy(differences[:, varied].astype(np.float32))  # counts x -1/0/1: sums exact in float32
    centre, scale = torch.from_numpy(means[varied]), torch.from_numpy(spread[varied])
    largest = []
    for size in _chunks(resamples):
        picks = torch.randint(0, words, (size, words), generator=generator)
        counts = torch.zeros(size, words).scatter_add_(1, picks, torch.ones(size, words))  # [size, words]
        resampled = (counts @ moving).double() / words  # [size, varied heads]
        largest.append(((resampled - centre).abs() / scale).max(1).values)
    q = float(torch.quantile(torch.cat(largest), confidence))
    low, high = means[chosen] - q * spread[chosen], means[chosen] + q * spread[chosen]
    return float(max(low, -1.0)), float(min(high, 1.0))  # a difference of two accuracies lies in [-1, 1]


def _chunks(total: int) -> list[int]:
    return [min(CHUNK, total - start) for start in range(0, total, CHUNK)]
