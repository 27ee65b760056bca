"""Sieve roles of heads (Pande et al. 2021): a head has a role when its mean sieve score is above ``tau``.

Per head and sieve: a one-sided one-sample t-test over sequences (H0: mean score <= tau), scipy's
``ttest_1samp`` with the sample standard deviation (the peer code uses the population one, ddof=0), then
one correction across every head and role (Holm, Benjamini-Hochberg, or none as in the paper;
``reporting.statistics.adjust_p_values``: statsmodels' ``multipletests`` without its ``gc.collect()``). Sequences
without a score for a sieve (empty sieve) are left out of its test.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd
from scipy import stats

from headlab.core.head_names import head_name
from headlab.reporting.statistics import adjust_p_values


def sieve_roles(sieve: Mapping[str, np.ndarray], tau: float = 3.0, alpha: float = 0.05,
                correction: str = "holm") -> pd.DataFrame:
    """One row per (head, sieve): layer, head, name, sieve, sequences, mean, t, p, p_adjusted, role.

    ``sieve``: name -> per-sequence scores ``[sequences, layers, heads]`` (NaN: no score).
    """
    rows = []
    for name, scores in sieve.items():
        _, layers, heads = scores.shape
        with warnings.catch_warnings():  # constant scores (no spread) give NaN: never a role
            warnings.simplefilter("ignore", RuntimeWarning)
            test = stats.ttest_1samp(scores, tau, axis=0, alternative="greater", nan_policy="omit")
        counts = np.isfinite(scores).sum(0)
        means = np.where(counts > 0, np.nansum(scores, 0) / np.maximum(counts, 1), np.nan)
        for layer in range(layers):
            for head in range(heads):
                rows.append({"layer": layer, "head": head, "name": head_name(layer, head), "sieve": name,
                             "sequences": int(counts[layer, head]), "mean": float(means[layer, head]),
                             "t": float(np.asarray(test.statistic)[layer, head]),
                             "p": float(np.asarray(test.pvalue)[layer, head])})
    table = pd.DataFrame(rows)
    table["p_adjusted"] = _adjusted(table["p"].to_numpy(), correction)
    table["role"] = table["p_adjusted"] < alpha  # NaN (fewer than two scores, or no spread) is never a role
    table.attrs |= {"tau": tau, "alpha": alpha, "correction": correction}
    return table


def with_offset_control(roles: pd.DataFrame, beyond: Mapping[str, np.ndarray], tau: float = 3.0,
                        alpha: float = 0.05, correction: str = "holm") -> pd.DataFrame:
    """``roles`` (``sieve_roles``) with each (head, sieve)'s fixed-offset control: ``beyond_offset_mean`` (the mean
    over sequences of its score less what its offset pattern gives the other pairs at the same offsets),
    ``p_offset`` (one-sided t-test that it is above ``tau - 1``: the role's own bar above uniform attention, whose
    excess is 0), ``p_offset_adjusted`` (corrected across every head and sieve, as the roles are) and
    ``beyond_offset`` (below ``alpha``): a role held by position alone, or barely beyond it, has no such excess."""
    rows = []
    for name, scores in beyond.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            test = stats.ttest_1samp(scores, tau - 1, axis=0, alternative="greater", nan_policy="omit")
        counts = np.isfinite(scores).sum(0)
        means = np.where(counts > 0, np.nansum(scores, 0) / np.maximum(counts, 1), np.nan)
        _, layers, heads = scores.shape
        rows += [{"layer": layer, "head": head, "sieve": name, "beyond_offset_mean": float(means[layer, head]),
                  "p_offset": float(np.asarray(test.pvalue)[layer, head])}
                 for layer in range(layers) for head in range(heads)]
    control = pd.DataFrame(rows)
    control["p_offset_adjusted"] = _adjusted(control["p_offset"].to_numpy(), correction)
    control["beyond_offset"] = control["p_offset_adjusted"] < alpha
    merged = roles.merge(control, on=["layer", "head", "sieve"], how="left")
    merged.attrs = roles.attrs
    return merged


def _adjusted(p: np.ndarray, correction: str) -> np.ndarray:
    """``p`` corrected across all finite entries (NaN stays NaN)."""
    return adjust_p_values(np.where(np.isfinite(p), p, np.nan), correction)


def role_matrix(roles: pd.DataFrame) -> pd.DataFrame:
    """Per head, one boolean column per sieve (the multi-label table): ``layer, head, name, <sieve>...``."""
    wide = roles.pivot_table(index=["layer", "head", "name"], columns="sieve", values="role", aggfunc="first",
                             sort=False)
    return wide.reset_index().rename_axis(columns=None).astype({s: bool for s in roles["sieve"].unique()})
