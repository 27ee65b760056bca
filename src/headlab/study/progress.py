"""How much of a study is left: each stage's work, counted in example passes, times the seconds a pass took in the
stages this run has finished.

A pass is one example through the model, forward, in an evaluation batch (rows of similar lengths). The weights of
the other kinds of work were measured on the MiniLM study of ``qnli_articles`` (BENCHMARKS.md, the study's stage
times): a training example costs about 5.5 passes (forward, backward, optimiser step, in a shuffled batch padded to
its longest row); the single-head sweep about 0.6 a plan and example (it shares each batch between plans); a
clustering job and a syntax sentence (short) about 500 and 1. The estimate is an "about": the prune curve
stops when the metric falls, and the rate of the stages done carries over to the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headlab.files import read_json

TRAIN_PASSES = 5.5  # a training example: forward, backward, step
SWEEP_PASSES = 0.6  # a head's plan on an example in the single-head sweep
CLUSTER_PASSES = 500.0  # a clustering job (k-means of 50 starts: fits, stability's 21 runs, bootstrap fits, plots)
JS_PASSES = 4.0  # a sequence's Jensen-Shannon divergences between every pair of heads
SYNTAX_SENTENCES = 500  # a treebank read whole (syntax.max_sentences=null): about the bundled UD EWT slice
PRUNE_STEPS_RUN = 0.6  # the share of the prune curve's possible steps it runs before the metric falls below
REFIT_DISTINCT = 0.45  # the share of the bootstrap fits' type plans with a head set of their own (MiniLM: 18 of 40)


@dataclass(frozen=True)
class Sizes:
    """The task's examples (train and first eval split, from the fine-tuning's ``results.json``) and the model's
    heads."""

    train: int
    eval: int
    layers: int
    heads: int

    @classmethod
    def read(cls, results: Path, eval_split: str, shape: tuple[int, int]) -> Sizes | None:
        """From a ``train.py`` job's ``results.json`` (None when it is not there or lacks the counts)."""
        if not results.is_file():
            return None
        counts = read_json(results, "fine-tuning results").get("num_examples") or {}
        if "train" not in counts or eval_split not in counts:
            return None
        return cls(int(counts["train"]), int(counts[eval_split]), *shape)


def _at_most(count: int, limit: Any) -> int:
    return count if limit is None else min(count, int(limit))


def stage_work(stage: str, cfg: Any, sizes: Sizes, models: int, plans: int = 0, types: int = 4,
               fits: int = 0, learned: bool = False) -> float:
    """Passes of ``stage`` with its config ``cfg`` (``study.<stage>`` laid over; ``train.py``'s for the fine-tuning)
    for ``models`` fine-tuned models; ``plans``: the tables' plans per model; ``types``: the clusters' k; ``fits``:
    their bootstrap fits; ``learned``: the gates stage runs (robustness adds optimal ablation)."""
    n_eval = _at_most(sizes.eval, cfg.data.get("max_eval_examples"))
    if stage == "finetune":
        n_train = _at_most(sizes.train, cfg.data.get("max_train_examples"))
        steps, batch = cfg.trainer.get("max_steps", -1), cfg.data.batch_size
        epochs = cfg.trainer.max_epochs if cfg.trainer.max_epochs is not None else 1000  # Lightning's default
        trained = steps * batch if steps and steps > 0 else max(epochs, 1) * n_train
        validations = math.ceil(trained / max(n_train, 1))  # one at each epoch's end
        return models * (TRAIN_PASSES * trained + validations * n_eval)
    if stage == "features":
        options = cfg.features
        sequences = _at_most(sizes.eval, options.max_sequences)
        return (models + 1) * (sequences + JS_PASSES * _at_most(sequences, options.js_max_sequences))
    if stage == "cluster":
        return (models + 1) * CLUSTER_PASSES
    if stage == "syntax":
        return (models + 1) * (cfg.syntax.max_sentences or SYNTAX_SENTENCES)
    if stage == "tables":
        return models * plans * n_eval
    if stage == "controls":  # random sets of the sizes of three types (Table 2's: diagonal twice, dense_vertical)
        return models * 3 * cfg.sweep.draws * n_eval
    if stage == "refits":  # Table 2's 8 type plans per bootstrap fit, fits that agree sharing jobs, and a baseline
        return models * (1 + REFIT_DISTINCT * 8 * fits) * n_eval
    if stage == "sweep":
        return models * SWEEP_PASSES * sizes.layers * sizes.heads * n_eval
    if stage == "robustness":  # sweeps and Shapley under prune, mean, resample (each draw: sources + ablated), optimal
        coalitions = 2 ** types - 1  # every coalition of the head types but the full model
        methods = 2 + 2 * cfg.mask.resamples + learned
        return models * n_eval * methods * (SWEEP_PASSES * sizes.layers * sizes.heads + coalitions)
    if stage == "gates":  # a job per method: L0's fits, CHG's three stages per fit, the constants and two sweeps
        from omegaconf import OmegaConf

        from headlab.analysis.gates.schema import METHOD_DEFAULTS

        options, batch, heads = cfg.gates, cfg.data.batch_size, sizes.layers * sizes.heads
        steps = {m: options.max_steps or METHOD_DEFAULTS[m]["max_steps"] for m in METHOD_DEFAULTS}
        l0 = len(OmegaConf.to_container(options.lambdas)) * (TRAIN_PASSES * steps["l0"] * batch + n_eval)
        chg = options.chg_fits * 3 * TRAIN_PASSES * steps["chg"] * batch + 4 * n_eval
        optimal = TRAIN_PASSES * steps["optimal"] * batch + 2 * SWEEP_PASSES * heads * n_eval
        return models * (l0 + chg + optimal + _at_most(sizes.train, options.max_examples))
    if stage == "importance":
        return models * TRAIN_PASSES * _at_most(sizes.train, cfg.importance.max_examples)
    if stage == "prune_curve":
        options = cfg.prune_curve
        from headlab.analysis.importance.prune_curve import most_steps

        steps = PRUNE_STEPS_RUN * most_steps(sizes.layers, sizes.heads, options.step, options.min_heads_per_layer)
        scoring = TRAIN_PASSES * _at_most(sizes.train, cfg.importance.max_examples) if options.recompute else 0.0
        return models * steps * ((1 + len(options.random_seeds)) * n_eval + scoring)
    return 0.0  # compare, report: reading files


def seconds_left(ran: list[tuple[float, float]], remaining: float) -> float | None:
    """Seconds the ``remaining`` passes take at the rate of the stages that ran (``(passes, seconds)`` each); None
    before a stage with work has run, or when none is left."""
    passes, seconds = sum(p for p, _ in ran), sum(s for _, s in ran)
    return remaining * seconds / passes if passes > 0 and remaining > 0 else None


def about(seconds: float) -> str:
    """``about 12 minutes left`` (``less than a minute left``)."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "less than a minute left"
    return f"about {minutes} minute{'s' * (minutes != 1)} left"


def study_work(study: Any) -> Callable[[str], float] | None:
    """``stage -> passes`` of ``study`` (a ``headlab.study.stages.Study``), once the first fine-tuned model's
    ``results.json`` gives the task's sizes (None before)."""
    from headlab.core.model_files import model_shape
    from headlab.study.configs import analysis_config, train_config
    from headlab.study.stages import GUAN_TYPES, STAGE_MODES, TABLES, table_plans

    cfg = study.cfg
    sizes = Sizes.read(Path(study.models[0][1]) / "results.json", cfg.task.eval_splits[0], model_shape(cfg.model))
    if sizes is None:
        return None
    configs = {"finetune": train_config(cfg, cfg.study.seeds[0], study.group)}
    configs |= {stage: analysis_config(cfg, stage, mode, None, study.group) for stage, mode in STAGE_MODES.items()}
    plans = sum(len(table_plans(table, list(GUAN_TYPES))) for table in TABLES)
    types, fits = configs["cluster"].cluster.k, configs["cluster"].cluster.bootstrap_fits
    learned = "gates" in cfg.study.stages
    work = {stage: stage_work(stage, config, sizes, len(study.models), plans, types, fits, learned)
            for stage, config in configs.items()}
    return lambda stage: work.get(stage, 0.0)
