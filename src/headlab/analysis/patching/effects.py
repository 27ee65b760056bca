"""The numbers of a ``mode=patch`` job from its per-example scores (``PatchEvaluator.scores``): each patch's effect,
its interval and p-value, its first-order estimate, and how well the estimates rank the exact effects."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import scipy.stats

from headlab.analysis.importance.agreement import top_k_overlap
from headlab.analysis.patching.patch_evaluator import PatchSpec
from headlab.reporting.statistics import Resampling, paired_tests

TOP_K = 10  # the agreement of estimates and exact effects: overlap of the patches each ranks highest by |change|


def effects(scores: dict, specs: list[PatchSpec], options: Any, seed: int, task_type: str
            ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per patch its effect (``exact``: from the patched runs; ``estimate``: from the first-order estimates, per
    ``options.method``), and the clean and corrupted runs' means with the normaliser (docs/patching.md)."""
    clean, corrupted = scores["clean"], scores["corrupted"]
    base = clean if options.direction == "noising" else corrupted
    labels = scores["labels"]["label"] if task_type != "regression" else None  # accuracy of classifications
    summary = {run: {"logit_diff": float(s["logit_diff"].mean()), "loss": float(s["loss"].mean()),
                     **({} if labels is None else {"accuracy": float(np.mean(s["prediction"] == labels))})}
               for run, s in (("clean", clean), ("corrupted", corrupted))}
    normaliser = summary["clean"]["logit_diff"] - summary["corrupted"]["logit_diff"]
    summary |= {"normaliser": normaliser, "examples": len(clean["logit_diff"])}
    exact, estimated = options.method in ("exact", "both"), options.method in ("attribution", "both")
    intervals = _intervals(scores, specs, base, options, seed) if exact else {}
    rows = []
    for index, spec in enumerate(specs):
        reached = ~np.isnan(scores[index if exact else ("estimate", index)]["logit_diff"])  # examples it reaches
        means = {run: _mean(s["logit_diff"], reached) for run, s in (("clean", clean), ("corrupted", corrupted),
                                                                      ("base", base))}
        scale, floor = means["clean"] - means["corrupted"], means["corrupted"]
        normalise = lambda v, scale=scale, floor=floor: (v - floor) / scale if scale else np.nan  # noqa: E731
        row = {"site": spec.name, "kind": spec.site.kind, "layer": spec.site.layer, "head": spec.site.head,
               "position": spec.position, "unit": spec.unit, "examples": int(reached.sum())}
        if exact:
            patched, test = scores[index], intervals.get(index)
            value = _mean(patched["logit_diff"], reached)
            bounds = sorted(normalise(means["base"] + bound) for bound in (test.ci_low, test.ci_high)) if test else \
                [np.nan, np.nan]  # a negative normaliser reverses them
            row |= {"logit_diff": value, "effect": normalise(value), "effect_low": bounds[0],
                    "effect_high": bounds[1], "delta": value - means["base"],
                    "p_value": test.p_value if test else np.nan, "loss": _mean(patched["loss"], reached)}
            if labels is not None:
                row["accuracy"] = _mean((patched["prediction"] == labels).astype(float), reached)
        if estimated:
            value = _mean(scores[("estimate", index)]["logit_diff"], reached)
            row |= {"estimate": normalise(value), "estimate_delta": value - means["base"]}
        rows.append(row)
    table = pd.DataFrame(rows).astype({"head": "Int64", "position": "Int64", "unit": "Int64"})
    if exact and estimated:
        summary["attribution"] = agreement(table)
    difference = clean["logit_diff"] - corrupted["logit_diff"]  # per example: how far apart the two runs are
    spread = difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else np.nan
    if len(difference) < 2:
        summary["warning"] = (f"one pair: the clean and corrupted runs' logit differences are {normaliser:+.4g} apart, "
                              "with no standard error to tell that from noise; the normalised effects rest on one "
                              "example")
    elif not abs(normaliser) > 2 * spread:
        summary["warning"] = (f"the clean and corrupted runs' mean logit differences are {normaliser:+.4g} apart, "
                              f"within 2 standard errors ({spread:.3g}): the normalised effects divide by noise")
    return table, summary


def agreement(table: pd.DataFrame) -> dict[str, Any]:
    """How well the estimated changes rank the exact ones: Spearman's rho of the signed changes, and the overlap of
    the ``TOP_K`` patches each ranks highest by the size of the change."""
    both = table.dropna(subset=["delta", "estimate_delta"])
    exact, estimate = both["delta"].to_numpy(float), both["estimate_delta"].to_numpy(float)
    rho = float(scipy.stats.spearmanr(exact, estimate).statistic) if len(both) > 1 and np.ptp(exact) and \
        np.ptp(estimate) else np.nan
    k = min(TOP_K, len(both))
    overlap = top_k_overlap(np.abs(estimate), np.abs(exact), k) if k else np.nan
    return {"patches": len(both), "spearman": rho, "top_k": k, "top_k_overlap": overlap}


def per_example(scores: dict, specs: list[PatchSpec]) -> pd.DataFrame:
    """``patches.parquet``: every run's scores per example (an estimate's run: ``estimate:<site>``)."""
    frames = []
    runs = ["clean", "corrupted", *(run for run in scores if run not in ("clean", "corrupted", "labels"))]
    for run in runs:
        frame = pd.DataFrame(dict(scores[run]))
        name = run if isinstance(run, str) else f"estimate:{specs[run[1]].name}" if isinstance(run, tuple) else \
            specs[run].name
        frame.insert(0, "run", name)
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    out["example"] = out["example"].astype(int)
    return out


def _mean(values: np.ndarray, reached: np.ndarray) -> float:
    return float(values[reached].mean()) if reached.any() else np.nan


def _intervals(scores: dict, specs: list[PatchSpec], base: dict, options: Any, seed: int) -> dict[int, Any]:
    """The paired bootstrap interval and permutation p-value of each patch that reaches every example."""
    whole = [i for i, spec in enumerate(specs) if spec.position is None and spec.unit is None]
    if not whole or len(base["logit_diff"]) < 2:
        return {}
    config = Resampling(options.resamples, options.resamples, options.confidence, "bca", seed)
    tests = paired_tests("logit_diff", [{"logit_diff": scores[i]["logit_diff"]} for i in whole],
                         {"logit_diff": base["logit_diff"]}, config, [specs[i].name for i in whole])
    return dict(zip(whole, tests))
