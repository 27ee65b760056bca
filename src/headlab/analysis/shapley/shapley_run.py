"""``ablate.py mode=shapley``: how much of the score each group of heads accounts for (docs/shapley.md).

The players are ``shapley.over``: head types (the labels of ``mask.clusters``), layers or single heads; a group
outside a coalition loses its heads under ``shapley.policy``. Up to 12 groups, every coalition is evaluated and the
values are exact (``values.exact_values``); past that, removal chains in antithetic pairs are evaluated until every
value's standard error is at most ``shapley.target_se`` (or ``shapley.max_permutations``), each chain truncated
once its score reaches ``shapley.floor``. Coalitions run as per-row plans (``coalitions.CoalitionEvaluator``); a
coalition met again (the full model, every head removed) is not evaluated again. Per eval split:

====================  ============================================================================================
``shapley.csv`` / md  per group: its value, the bootstrap confidence interval over examples, the sampling standard
                      error (sampled values), its share of full minus empty
``shapley_<split>``   the waterfall figure: from every group removed to the full model
``results.json``      values, intervals, full and empty scores, the efficiency check (the values' sum against full
                      minus empty), coalitions evaluated, permutations; a complete one makes a rerun skip the job
``coalitions.csv``    per split and coalition evaluated: the groups it removes, its score (``coalitions.parquet``: the
                      per-example scores, for paired comparisons such as Guan et al.'s Table 2, one type removed)
``progress.npz``      sampling: the chains evaluated so far (a killed job resumes there)
====================  ============================================================================================
"""

from __future__ import annotations

import io
import math
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats
from rich.console import Console

from headlab.analysis.jobs.eval_job import EvalJob
from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.jobs.plan_evaluator import Variant
from headlab.analysis.shapley.coalitions import CoalitionEvaluator, coalition_plan
from headlab.analysis.shapley.players import player_groups
from headlab.analysis.shapley.schema import EXACT_LIMIT
from headlab.analysis.shapley.scores import WHOLE_SCORES, example_scores, shapley_score
from headlab.analysis.shapley.values import PermutationEstimate, antithetic_orders, exact_values
from headlab.core.model_files import model_shape
from headlab.files import atomic_file, write_frame_atomic, write_json_atomic, write_text_atomic
from headlab.reporting import plots
from headlab.reporting.layouts import to_markdown
from headlab.tasks.batches import column_values
from headlab.training.tracking import log_artifacts


class CoalitionScores:
    """Per-example scores of coalitions (``kept`` bits), evaluated in passes and remembered."""

    def __init__(self, job: EvalJob, groups: list[list], policy: str, score: str, per_forward: int):
        self.job, self.groups, self.policy, self.score, self.per_forward = job, groups, policy, score, per_forward
        self.shape = (job.model.config.num_hidden_layers, job.model.config.num_attention_heads)
        self.full = (1 << len(groups)) - 1
        self.known: dict[int, dict[str, np.ndarray]] = {}  # kept bits -> {split: [examples]}

    @property
    def evaluated(self) -> int:
        """The coalitions scored besides the full model, those an earlier run of this job left in ``progress.npz``
        included: a resumed job reports what the uninterrupted one does."""
        return len(self.known) - (self.full in self.known)

    def __call__(self, coalitions: list[int]) -> dict[int, dict[str, np.ndarray]]:
        """The scores of ``coalitions``; those not known yet are evaluated in one pass."""
        missing = sorted({c for c in coalitions if c not in self.known and c != self.full})
        if missing or self.full not in self.known:
            variants = [Variant(f"S{c:x}", coalition_plan(self.groups, c, self.policy, self.shape)) for c in missing]
            make = lambda chosen, extra: CoalitionEvaluator(  # noqa: E731
                self.job.model, self.job.cfg.task, [*chosen, *extra], self.job.data.eval_examples, self.per_forward,
                self.job.substitutes, self.job.constants)
            records, baseline = self.job.evaluate(variants or [Variant("full", coalition_plan(
                self.groups, self.full, self.policy, self.shape))], make)
            splits = self.job.data.eval_splits
            self.known[self.full] = {s: example_scores(baseline[s], self.score) for s in splits}
            for c, variant in zip(missing, variants):
                self.known[c] = {s: example_scores(records[(variant.name, s)], self.score) for s in splits}
        return {c: self.known[c] for c in coalitions}


def exact(scores: CoalitionScores, splits: list[str]) -> dict[str, dict[str, Any]]:
    """Per split: ``values`` ``[groups, examples]`` from all 2^k coalitions."""
    table = scores(list(range(scores.full + 1)))
    return {split: {"values": exact_values(np.stack([table[c][split] for c in range(scores.full + 1)]))}
            for split in splits}


def sampled(scores: CoalitionScores, splits: list[str], options: Any, seed: int, progress: Path) -> dict:
    """Per split: ``values`` and ``se`` from removal chains in antithetic pairs (module docstring). The first split
    governs the stop (``target_se``) and the chains' floor."""
    k, first = len(scores.groups), splits[0]
    sizes = {split: len(scores([scores.full])[scores.full][split]) for split in splits}
    floor = options.floor
    if floor is not None and (why := unreachable_floor(scores, floor, first)):
        Console().print(f"warning: {why}", markup=False, soft_wrap=True)
        floor = None
    estimates = {split: PermutationEstimate(k, sizes[split]) for split in splits}
    generator, done = np.random.default_rng(seed), _load_progress(progress, scores, options.job)
    if done:
        Console().print(f"note: resuming from {progress} ({len(done)} antithetic pairs of orders done)", markup=False,
                        soft_wrap=True)
    while estimates[first].permutations < options.max_permutations:
        orders = antithetic_orders(k, generator)
        key = tuple(orders[0])
        chains = done.get(key) or [_chain(scores, order, floor, first) for order in orders]
        for order, chain in zip(orders, chains):
            for split in splits:
                estimates[split].add_chain(order, np.stack([scores.known[c][split] for c in chain]))
        if key not in done:
            done[key] = chains
            _save_progress(progress, scores, done, options.job)
        if options.target_se is not None and estimates[first].standard_errors().max() <= options.target_se:
            break
    largest = float(estimates[first].standard_errors().max())
    if options.target_se is not None and largest > options.target_se:
        Console().print(f"note: shapley.target_se={options.target_se:g} not reached on {first}: the largest standard "
                        f"error is {largest:.4g} after shapley.max_permutations={options.max_permutations} orders",
                        markup=False, soft_wrap=True)
    return {split: {"values": e.values(), "se": e.standard_errors(), "permutations": e.permutations,
                    "floor": floor} for split, e in estimates.items()}


def unreachable_floor(scores: CoalitionScores, floor: float, split: str) -> str | None:
    """Why ``floor`` is not applied, when the full model is already no better than it on ``split``: every chain would
    stop before its first removal (the first group removed took the whole marginal, the others read 0 with no
    spread); else None."""
    full = float(scores.known[scores.full][split].mean())
    if not _worse(scores.score)(full, floor):
        return None
    return (f"shapley.floor={floor:g} is not applied: the full model's {scores.score} on {split} ({full:.4f}) is no "
            "better than it, so every removal chain would stop at once; the values are untruncated")


def _worse(score: str):
    """``worse(a, b)``: score ``a`` is no better than ``b`` (at or below it; for ``loss``, at or above it)."""
    return np.greater_equal if score == "loss" else np.less_equal


def _chain(scores: CoalitionScores, order: list[int], floor: float | None, split: str, stage: int = 8) -> list[int]:
    """The coalitions of one removal chain, from the full model, ``stage`` removals per pass, stopped once the mean
    score on ``split`` is no better than ``floor`` (at or below it; for ``loss``, at or above it)."""
    worse = _worse(scores.score)
    chain = [scores.full]
    while len(chain) <= len(order):
        step = len(chain) - 1
        upcoming, kept = [], chain[-1]
        for player in order[step : step + stage]:
            kept &= ~(1 << player)
            upcoming.append(kept)
        known = scores(upcoming)
        for coalition in upcoming:
            chain.append(coalition)
            if floor is not None and worse(known[coalition][split].mean(), floor):
                return chain
    return chain


def _load_progress(path: Path, scores: CoalitionScores, job: str) -> dict[tuple, list[list[int]]]:
    """Chains of an earlier run of this very job (its coalitions' scores back in ``scores``); none when the file is
    another job's or unreadable."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if str(data["job"]) != job:
                return {}
            chains = {tuple(data[f"order_{i}"].tolist()): [[int(c) for c in data[f"chain_{i}_{j}"]] for j in (0, 1)]
                      for i in range(int(data["pairs"]))}
            for name in data.files:
                if name.startswith("scores_"):
                    _, coalition, split = name.split("_", 2)
                    scores.known.setdefault(int(coalition, 16), {})[split] = data[name]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return {}
    return chains


def _save_progress(path: Path, scores: CoalitionScores, done: dict[tuple, list[list[int]]], job: str) -> None:
    arrays = {"pairs": np.array(len(done)), "job": np.array(job)}
    for i, (order, chains) in enumerate(done.items()):
        arrays[f"order_{i}"] = np.array(order)
        arrays |= {f"chain_{i}_{j}": np.array([str(c) for c in chain]) for j, chain in enumerate(chains)}
    for coalition, by_split in scores.known.items():
        arrays |= {f"scores_{coalition:x}_{split}": values for split, values in by_split.items()}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with atomic_file(path, "wb") as handle:
        handle.write(buffer.getvalue())


def intervals(per_example: np.ndarray, options: Any, seed: int, grid: int | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, low, high)``: each group's mean per-example value and its bootstrap (BCa) confidence interval,
    resampling the examples.

    ``grid``: the values' common denominator when the scores are whole numbers (``WHOLE_SCORES``: 0/1 accuracy,
    0/100 exact match): k! for exact values (the weights' denominator), the permutations for sampled ones. The
    values are then resampled as the whole numbers ``value * grid``: their means are exact, so BCa, which counts the
    resamples that tie with the observed mean, does not move with the last bits of a float sum (it moved intervals
    by up to a tenth of a point).
    """
    scaled, scale = per_example, 1.0
    if grid is not None:
        whole = np.rint(per_example * grid)
        if np.abs(whole - per_example * grid).max(initial=0.0) < 1e-3:  # (a float sum's error is far smaller)
            scaled, scale = whole, float(grid)
    values = scaled.mean(1) / scale
    low, high = values.copy(), values.copy()
    varied = scaled.std(1) > 0
    if varied.any() and scaled.shape[1] > 1:
        result = scipy.stats.bootstrap((scaled[varied],), np.mean, axis=-1, vectorized=True, method="BCa",
                                       n_resamples=options.resamples, confidence_level=options.confidence,
                                       random_state=np.random.default_rng(seed))
        low[varied], high[varied] = result.confidence_interval.low / scale, result.confidence_interval.high / scale
    return values, low, high


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Shapley values of ``cfg.shapley.over`` on ``cfg.task``'s eval splits; ``cfg`` passed ``check_mode``."""
    options, shape = cfg.shapley, model_shape(cfg.model)
    names, groups = player_groups(options.over, shape, cfg.mask.clusters)
    score = shapley_score(cfg.task, options.score)
    job = EvalJob(cfg, identity, plans=[coalition_plan(groups, 0, options.policy, shape)])
    scores = CoalitionScores(job, groups, options.policy, score, options.coalitions_per_batch)
    splits = job.data.eval_splits
    method = "exact" if len(groups) <= EXACT_LIMIT and options.target_se is None else "permutations"
    found = exact(scores, splits) if method == "exact" else sampled(
        scores, splits, SimpleNamespace(**options, job=identity.hash), cfg.seed, identity.output_dir / "progress.npz")
    empty = scores([0])[0]
    if method == "exact" and options.floor is not None:
        Console().print(f"note: shapley.floor={options.floor:g} is not used: it truncates sampled removal orders, and "
                        f"these {len(groups)} groups' values are exact (every coalition)", markup=False, soft_wrap=True)
    rows, summary = [], {}
    for split in splits:
        per_example = found[split]["values"]  # [groups, examples]
        grid = math.factorial(len(groups)) if method == "exact" else found[split]["permutations"]
        values, low, high = intervals(per_example, options, cfg.seed, grid if score in WHOLE_SCORES else None)
        full, none = float(scores.known[scores.full][split].mean()), float(empty[split].mean())
        se = found[split].get("se", np.zeros(len(names)))
        for i, name in enumerate(names):
            rows.append({"split": split, "group": name, "heads": len(groups[i]), "value": values[i],
                         "ci_low": low[i], "ci_high": high[i], "se": se[i],
                         "share": values[i] / (full - none) if full != none else np.nan})
        summary[split] = {"full": full, "empty": none, "sum": float(values.sum()),
                          "efficiency_gap": float(values.sum() - (full - none)),
                          "permutations": found[split].get("permutations"),
                          "floor_applied": found[split].get("floor")}  # (None: no truncation)
        warning = noise_warning(scores.known[scores.full][split], empty[split], score)
        if warning:
            summary[split]["warning"] = warning
    table = pd.DataFrame(rows)
    result = {"kind": "shapley", "group": cfg.group, "task": cfg.task.name, "model": cfg.model.name,
              "over": options.over, "policy": options.policy, "score": score, "method": method,
              "players": names, "checkpoint": job.checkpoint_record(), "splits": summary,
              "values": table.to_dict("records"), "coalitions_evaluated": scores.evaluated, "seed": cfg.seed,
              "config_hash": identity.hash, "config": identity.resolved, "inputs": identity.inputs, "complete": True}
    if job.is_global_zero:
        write_coalitions(scores, names, identity.output_dir)
        write_outputs(cfg, job, table, summary, score, identity.output_dir)
        write_json_atomic(identity.output_dir / "results.json", result)
        for split, numbers in summary.items():
            Console().print(f"shapley over {options.over} ({len(names)} groups, {options.policy}, {method}) on "
                            f"{split}: {score} {numbers['empty']:.4f} with every group removed, {numbers['full']:.4f} "
                            f"full; values sum to {numbers['sum']:+.4f} -> {identity.output_dir / 'shapley.csv'}",
                            markup=False, soft_wrap=True)
            if "warning" in numbers:
                Console().print(f"warning: {split}: {numbers['warning']}", markup=False, soft_wrap=True)
    job.finish()
    return result


def noise_warning(full: np.ndarray, empty: np.ndarray, score: str) -> str | None:
    """Why the shares (value / (full - empty)) mean nothing, when full and empty differ by less than 2 standard
    errors of their per-example differences (a model whose heads barely move its score), else None."""
    differences = full - empty  # [examples]
    if len(differences) < 2:
        return None
    spread = float(differences.std(ddof=1) / np.sqrt(len(differences)))
    if abs(float(differences.mean())) > 2 * spread:
        return None
    return (f"the full model's and the every-group-removed {score} are {float(differences.mean()):+.4g} apart, within "
            f"2 standard errors ({spread:.3g}): the shares divide by noise")


def write_coalitions(scores: CoalitionScores, names: list[str], folder: Path) -> None:
    """Every coalition evaluated: its removed groups and mean score per split, and the per-example scores (with each
    example's cluster, ``task.cluster_field``, where the task names one: what a bootstrap of them resamples)."""
    field = scores.job.cfg.task.get("cluster_field")
    clusters = {split: [str(v) for v in column_values(scores.job.data.eval_examples[split], field)]
                for split in scores.job.data.eval_splits} if field else {}
    rows, examples = [], []
    for coalition, by_split in sorted(scores.known.items(), key=lambda item: (-bin(item[0]).count("1"), -item[0])):
        removed = [name for i, name in enumerate(names) if not (coalition >> i) & 1]
        label = "none" if not removed else ",".join(removed)
        for split, values in by_split.items():
            rows.append({"split": split, "removed": label, "groups_removed": len(removed), "score": values.mean()})
            examples.append(pd.DataFrame({"split": split, "removed": label, "example": np.arange(len(values)),
                                          "score": values, **({"cluster": clusters[split]} if field else {})}))
    write_frame_atomic(pd.DataFrame(rows), folder / "coalitions.csv")
    write_frame_atomic(pd.concat(examples, ignore_index=True), folder / "coalitions.parquet")


def write_outputs(cfg: Any, job: EvalJob, table: pd.DataFrame, summary: dict, score: str, folder: Path) -> None:
    """The table, the waterfall figure per split, and the same to the logger."""
    formats = tuple(cfg.report.formats)
    write_frame_atomic(table, folder / "shapley.csv")
    write_text_atomic(folder / "shapley.md", to_markdown(table.round(6)))
    images = {}
    for split, numbers in summary.items():
        mine = table[table["split"] == split]
        paths = plots.shapley_waterfall(
            mine["group"].tolist(), mine["value"].to_numpy(), mine["ci_low"].to_numpy(), mine["ci_high"].to_numpy(),
            numbers["empty"], numbers["full"], score, f"{cfg.model.name} on {cfg.task.name} {split}: Shapley values "
            f"over {cfg.shapley.over} ({cfg.shapley.policy})", folder / f"shapley_{split}", formats)
        images[f"shapley_{split}"] = paths[0]
    if job.logger:
        job.logger.log_metrics({f"{row.split}/shapley/{row.group}": row.value for row in table.itertuples()}, step=0)
    log_artifacts(job.logger, {"shapley": table}, images)
