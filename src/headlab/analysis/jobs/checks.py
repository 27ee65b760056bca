"""The checks that several ``ablate.py`` modes share, none of which reads weights: a preset's plan laid over the
mask, the plan against the model's shape, the checkpoint, the estimation data, the files a mode reads. Each mode's
``check(cfg)`` (in its own module) calls the ones it needs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict
from rich.console import Console

from headlab.core.masks import check_mask, plan_from_mask
from headlab.core.plans import REFERENCED
from headlab.errors import UserError, one_of
from headlab.files import check_writable, read_json
from headlab.tasks.hub_data import cached_rows
from headlab.tasks.local_files import check_text_file, count_questions, count_rows

log = logging.getLogger(__name__)
REFERENCE_SPLITS = ("train", "validation")  # mask.reference values that name a split of the task


def job_mask(cfg: Any) -> Any:
    """``mask`` with the fields of the named ``plan`` (a preset's plan) laid over it."""
    if cfg.plan is None:
        return cfg.mask
    if not cfg.plans:
        raise UserError(f"plan={cfg.plan!r}, but no plans are defined: plan= names one of the plans a preset defines, "
                        "e.g. experiment=guan2020_table2 plan=prune_dense (docs/plans.md)")
    one_of("plan", cfg.plan, list(cfg.plans))
    fields = OmegaConf.to_container(cfg.plans[cfg.plan], resolve=True)
    if "rules" in fields:  # a plan gives rules, or one policy on heads: the other form is cleared
        fields |= {"policy": None, "heads": None}
    elif "policy" in fields:
        fields |= {"rules": None}
    return OmegaConf.merge(cfg.mask, fields)


def check_evaluation(cfg: Any, per_head: bool = False) -> Any:
    """The checks of a mode that scores a checkpoint on a task (eval, sweep_heads, importance, prune_curve): the
    baseline folder is writable, the preset's clusters exist, the plan (``per_head``: the sweep's policy) fits the
    model's shape, the checkpoint is of this model and task. Returns the plan (None for a sweep)."""
    check_writable(cfg.baseline_dir, "baseline_dir")  # written after the baseline's evaluation: checked before it
    check_preset_clusters(cfg)
    with open_dict(cfg):
        cfg.mask = job_mask(cfg)
    if per_head:
        from headlab.analysis.evaluation.sweep_plans import check_sweep_mask

        check_sweep_mask(cfg.mask)
    else:
        check_mask(cfg.mask)
    from headlab.core.model_files import check_fits_positions, model_shape
    from headlab.training.checkpoints import locate_checkpoint

    plan = None if per_head else plan_from_mask(cfg.mask, *model_shape(cfg.model), cfg.model)
    check_fits_positions(cfg.model, cfg.task.max_length)
    checkpoint = locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)
    note_other_weights(cfg.mask, checkpoint)
    if checkpoint.kind == "model" and cfg.model.get("random_init") and not cfg.allow_random_head:
        raise UserError(f"model {cfg.model.name} has random weights (random_init=true) and ckpt_path=null: no trained "
                        f"head for task {cfg.task.name}; fine-tune first (train.py) and pass ckpt_path, or set "
                        "allow_random_head=true")
    check_reference_size(cfg, substitutes_used(cfg, plan))
    check_constants(cfg, plan)
    return plan


def check_constants(cfg: Any, plan: Any) -> None:
    """``optimal`` heads (the plan's, the sweep's or the Shapley removal's) need ``mask.constants``: a constants file
    of this model's shape (``plan_from_mask`` refused another model's already)."""
    from headlab.core.model_files import head_width, model_shape
    from headlab.core.substitutes.constants import check_constants_file

    used = (plan is not None and plan.counts()["optimal"]) or \
        {"sweep_heads": cfg.mask.policy, "shapley": cfg.shapley.policy}.get(cfg.mode) == "optimal"
    if used and cfg.mask.constants is None:
        raise UserError("optimal heads take the constants a mode=gates gates.method=optimal job learned: give "
                        "mask.constants=JOB/constants.json")
    if cfg.mask.constants is not None:
        from headlab.core.masks import check_same_model

        if not used:
            raise UserError(f"mask.constants={cfg.mask.constants!r} is read by optimal heads only, and this job has "
                            "none: give mask=optimal (or mask.policy=optimal, shapley.policy=optimal), or leave "
                            "mask.constants out")
        data = check_constants_file(cfg.mask.constants, (*model_shape(cfg.model), head_width(cfg.model)))
        check_same_model(data, cfg.model, f"mask.constants={cfg.mask.constants!r}")


def note_other_weights(mask: Any, checkpoint: Any) -> None:
    """A ``note:`` line when ``mask.clusters`` or ``mask.importance`` was computed on other weights of this model
    than the job's (the pre-trained model's types on a fine-tuned checkpoint, say): allowed, but their heads' roles
    may have changed. Files that record no checkpoint (written by hand) are taken as they are."""
    for key in ("clusters", "importance", "constants"):
        source = mask.get(key)
        if not isinstance(source, str) or not Path(source).is_file():
            continue
        data = read_json(source, key)  # a bare mapping or list (written by hand) records no checkpoint
        recorded = data.get("checkpoint") if isinstance(data, dict) else None
        if not isinstance(recorded, dict) or "path" not in recorded:
            continue
        theirs = recorded["path"]
        if not checkpoint.same_weights(recorded):
            described = "the model's own weights" if theirs is None else f"{recorded.get('kind')} {theirs}"
            Console(stderr=True).print(f"note: mask.{key}={source!r} was computed on {described}; this job evaluates "
                                       f"{checkpoint.describe()}", markup=False, soft_wrap=True)


def substitutes_used(cfg: Any, plan: Any) -> set[str]:
    """Which of ``mean`` and ``resample`` the job of ``cfg.mode`` takes from a reference set: its plan's heads, the
    sweep's policy, the Shapley removal, the estimates, the prune curve's policy and estimator."""
    policies = set() if plan is None else {policy for policy, count in plan.counts().items() if count}
    policies |= {"sweep_heads": {cfg.mask.policy}, "shapley": {cfg.shapley.policy},
                 "importance": set(cfg.importance.policies),
                 "prune_curve": {cfg.prune_curve.policy, cfg.prune_curve.estimator.removeprefix("estimate_")},
                 }.get(cfg.mode, set())
    return policies & set(REFERENCED)


def check_reference_size(cfg: Any, used: set[str]) -> None:
    """For a job with ``used`` (``mean`` / ``resample``) heads, before anything loads: a reference file exists (with
    the task's columns), and the reference set has ``mask.reference_examples`` examples, counted in its data file
    or the cached hub split (``JobSubstitutes`` counts again once it is loaded: a QA training split may drop some)."""
    if not used:
        return
    mask, task = cfg.mask, cfg.task
    if "resample" in used and mask.reference_examples < 2:
        raise UserError(f"mask.reference_examples={mask.reference_examples}: resample needs at least 2 reference "
                        "examples (each example takes another's heads)")
    if mask.reference in REFERENCE_SPLITS:
        split = task.train_split if mask.reference == "train" else task.eval_splits[0]
        where, files = f"{mask.reference} (split {split})", task.get("data_files")
        path = Path(files[split]) if files and split in files else None
    else:
        where, path = mask.reference, Path(mask.reference)
        if not path.is_file():
            raise UserError(f"mask.reference={mask.reference!r} is neither train, validation nor an existing data "
                            f"file (in the format of task {task.name}'s files)")
        if not path.read_bytes().strip():
            raise UserError(f"mask.reference={mask.reference!r} is an empty file; give a data file with rows in the "
                            f"format of task {task.name}'s files")
        if task.type != "extractive_qa":
            check_text_file(path, task.name, list(task.text_fields), task.label_field)
    if path is None:
        found = cached_rows(task.dataset, task.get("subset"), split) if task.get("dataset") else None
    else:
        found = count_questions(path) if task.type == "extractive_qa" else count_rows(path)
    if found is not None and found < mask.reference_examples:
        raise UserError(f"mask.reference={where} has {found} examples; mask.reference_examples="
                        f"{mask.reference_examples} needs that many (lower it, or use a larger reference set)")


def check_preset_clusters(cfg: Any) -> None:
    """Every ``cluster:NAME`` the preset's plans use is a label of ``mask.clusters`` (all missing names at once)."""
    from headlab.core.head_files import load_clusters

    selectors = []
    for plan in cfg.plans.values():
        rules = plan.get("rules") or [{"heads": plan.get("heads")}]
        for rule in rules:
            heads = rule.get("heads")
            selectors += [heads] if isinstance(heads, str) else list(heads or [])
    needed = sorted({token.strip().removeprefix("cluster:") for selector in selectors
                     for token in str(selector).split(",") if token.strip().startswith("cluster:")})
    if not needed or cfg.mask.clusters is None:
        return
    labels = set(load_clusters(cfg.mask.clusters).values())
    if set(needed) - labels:
        raise UserError(f"the plans of {cfg.group} need clusters named {', '.join(needed)}; mask.clusters="
                        f"{cfg.mask.clusters!r} has {', '.join(sorted(labels))} (name them with mode=cluster "
                        "cluster.names=[...])")


def check_estimation(cfg: Any) -> None:
    """The estimation split exists; the evaluation split only when asked for (selection bias); sweeps exist."""
    split = cfg.importance.split
    one_of("importance.split", split, ["train", cfg.task.train_split, *cfg.task.eval_splits])
    if split in cfg.task.eval_splits and split != cfg.task.train_split:
        log.warning(f"importance.split={split}: heads are scored on the evaluation split, so evaluating a mask "
                    "chosen by this importance on it is biased (the default estimates on a training subset)")
    sweeps = cfg.importance.sweep
    for sweep in [] if sweeps is None else [sweeps] if isinstance(sweeps, str) else list(sweeps):
        if not Path(sweep).exists():
            raise UserError(f"importance.sweep={sweep!r}: no such mode=sweep_heads job directory")
    learned = listed(cfg.importance.learned)
    if learned and sweeps is None:
        raise UserError("importance.learned sets learned measures beside the estimators in the agreement with a "
                        "measured sweep: give importance.sweep=SWEEP_DIR too")
    twice = next((source for i, source in enumerate(learned) if source in learned[:i]), None)
    if twice is not None:
        raise UserError(f"importance.learned names {twice!r} twice; give each mode=gates job once")
    methods = {}
    for source in learned:
        method = check_learned_on_these_weights(source, cfg)
        if method in methods:  # their measures would share a name: one would replace the other
            raise UserError(f"importance.learned names two gates.method={method} jobs ({methods[method]!r} and "
                            f"{source!r}); give one job per method")
        methods[method] = source


def check_learned_on_these_weights(source: str, cfg: Any) -> str:
    """An ``importance.learned`` job is a finished ``mode=gates`` job of this model and, where both weights are a
    ``train.py`` job's, of the same job (its hash: wherever the folders lie); the weights' own hashes are compared
    again once they load. Returns the job's method."""
    from headlab.analysis.gates.scores import gates_job
    from headlab.training.checkpoints import locate_checkpoint

    record = gates_job(source)[1]
    if record.get("model") != cfg.model.name:
        raise UserError(f"importance.learned entry {source!r} is a job of model {record.get('model')}; this job's "
                        f"model is {cfg.model.name}")
    theirs = (record.get("checkpoint") or {}).get("trained_by")
    mine = locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task).trained_by()
    if theirs is not None and mine is not None and theirs != mine:
        raise UserError(f"importance.learned entry {source!r} learned on the weights of train.py job {theirs}; "
                        f"ckpt_path={cfg.ckpt_path} holds job {mine}'s: give a mode=gates job of this checkpoint")
    return str(record.get("method"))


def listed(value: Any) -> list[str]:
    """A setting that takes one path or a list of them, as a list."""
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def warn_about_plan(cfg: Any, plan: Any) -> None:
    """Plans that run but are probably not what was meant."""
    if plan is not None and plan.is_identity and any(rule.policy != "keep" for rule in plan.rules):
        log.warning("the mask selects no head (every head keeps its attention): this job equals the baseline")
    policies = [cfg.mask.policy] if plan is None else [p for p, n in plan.counts().items() if n]
    single_segment = cfg.task.type != "extractive_qa" and len(cfg.task.text_fields) == 1
    if cfg.mask.unit == "segment" and single_segment and any(str(p).startswith("drop_") for p in policies):
        log.warning(f"unit=segment on task {cfg.task.name}, which has one segment: every key is intra-segment, so "
                    "drop_intra equals prune and drop_inter changes nothing (use unit=sentence)")
