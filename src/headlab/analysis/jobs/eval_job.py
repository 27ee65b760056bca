"""What every job on a checkpoint shares (``mode=eval``, ``sweep_heads``, ``importance``, ``prune_curve``): the
checkpoint's model on the task's eval splits and a Lightning Trainer, or on an estimation split and a Trainer
for gradient scoring, or both; the cached unablated baseline, results files and the one-line summary.

The baseline of a checkpoint + task + split + data settings is computed once and cached under
``baseline_dir/<key>/`` (``baseline.json`` + ``records.parquet``), the key a hash of exactly those,
the weights' hash included. A file lock makes parallel jobs of a sweep compute it once: the first
job that misses it evaluates the baseline together with its own plans (one pass over the data) while
holding the lock; the others wait, then read it. Under DDP the processes Lightning starts inherit the
first process's decision (an environment variable), so all of them run the same plans.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from filelock import FileLock
from omegaconf import OmegaConf
from rich.console import Console

from headlab.analysis.jobs.identity import JobIdentity
from headlab.analysis.jobs.plan_evaluator import RECORDS_VERSION, PlanEvaluator, Variant
from headlab.analysis.jobs.substitutes import JobSubstitutes, uses_substitutes
from headlab.core.models import apply_runtime_options, model_hash, weights_hash
from headlab.core.plans import HeadPlan
from headlab.core.substitutes.constants import load_constants
from headlab.errors import UserError
from headlab.files import config_hash, read_json, write_json_atomic
from headlab.reporting.records import read_records, write_records
from headlab.reporting.results import EvalResult
from headlab.tasks.record_metrics import metrics_from_records
from headlab.training.checkpoint_loading import load_checkpoint
from headlab.training.checkpoints import locate_checkpoint, tokenizer_config
from headlab.training.datamodule import TaskDataModule
from headlab.training.finetune import make_trainer

BASELINE = "baseline"  # the name of the unablated variant


def estimation_task(task: Any, split: str) -> Any:
    """The task with ``split`` as its only evaluation split (``train``: the task's training split)."""
    split = task.train_split if split == "train" else split
    estimation = OmegaConf.create(OmegaConf.to_container(task, resolve=True))
    estimation.eval_splits = [split]
    return estimation


def policy_label(plan: HeadPlan) -> str:
    """The policies a plan uses, ``+``-joined (``keep`` when it changes no head)."""
    used = [policy for policy, count in plan.counts().items() if count and policy != "keep"]
    return "+".join(used) or "keep"


class EvalJob:
    """One evaluating job: loads the data, then the checkpoint's weights, the trainer and the logger."""

    def __init__(self, cfg: Any, identity: JobIdentity, *, estimation: Any = None, evaluation: bool = True,
                 plans: list[HeadPlan] = (), estimates: tuple[str, ...] = (), prepare: Any = None):
        """``evaluation``: the task's eval splits (``data``) and a Trainer for them (``trainer``); ``estimation``
        (the ``importance`` config section): its estimation split (``estimation_data``, ``estimation_task``) and a
        Trainer without inference mode for gradient scoring (``scoring_trainer``). Either or both. ``plans``: the
        job's plans and ``estimates`` its first-order estimates: with ``mean`` or ``resample`` among them, the
        reference set is loaded too (``substitutes``). ``prepare(job)``: what else the job makes of its data and
        checkpoint before the weights load (so that bad data fails first), kept as ``prepared``."""
        self.cfg, self.identity = cfg, identity
        self.output_dir, self.job_hash, self.resolved = identity.output_dir, identity.hash, identity.resolved
        self.checkpoint = locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)
        # load, check and tokenise the data before the weights
        self.data = self._data_module(cfg.task) if evaluation else None
        self.estimation_data = None if estimation is None else self._data_module(
            estimation_task(cfg.task, estimation.split), max_eval_examples=estimation.max_examples,
            by_length=False)  # in file order, as HF's run_bertology: the batch granularity depends on the batches
        self.prepared = None if prepare is None else prepare(self)
        used = uses_substitutes(list(plans), estimates)
        self.substitutes = None if not used else JobSubstitutes(
            cfg, tokenizer_config(self.checkpoint, cfg.model), self.data or self.estimation_data, "resample" in used)
        self.constants = load_constants(cfg.mask.constants) if cfg.mask.get("constants") else None  # optimal heads'
        self.model = load_checkpoint(self.checkpoint, cfg.model, cfg.task, cfg.allow_random_head, cfg.seed)
        apply_runtime_options(self.model, cfg)
        self.weights = weights_hash(self.model)
        self.model_key = model_hash(self.model)  # weights and config: the caches of what the model computes
        if self.substitutes is not None:
            self.substitutes.model_key = self.model_key
        self.logger = identity.logger(cfg.logger, f"{cfg.mode}-{cfg.task.name}-{cfg.model.name}")
        self.trainer = make_trainer(cfg.trainer, [], None, self.output_dir, fitting=False) if evaluation else None
        self.scoring_trainer = None if estimation is None else make_trainer(cfg.trainer, [], None, self.output_dir,
                                                                            inference_mode=False, fitting=False)

    def _data_module(self, task: Any, **overrides: Any) -> TaskDataModule:
        """``task``'s eval splits under the ``data`` settings (``overrides`` win), loaded and tokenised."""
        data_cfg = {k: v for k, v in OmegaConf.to_container(self.cfg.data, resolve=True).items()
                    if k not in ("batch_size", "max_train_examples")}
        data = TaskDataModule(task, tokenizer_config(self.checkpoint, self.cfg.model), unit=self.cfg.mask.unit,
                              seed=self.cfg.seed, train=False, **data_cfg | overrides)
        data.setup()
        return data

    @property
    def is_global_zero(self) -> bool:
        return (self.trainer or self.scoring_trainer).is_global_zero

    # ------------------------------------------------------------------ baseline

    def baseline_key(self, split: str) -> str:
        """The model (weights and config: ``model_hash``), the tokenizer (by content), the task (and its local files'
        stamps: data written again at the same path is other data), the split, the data settings, the precision and
        how records are computed."""
        data = {k: v for k, v in self.resolved["data"].items() if k not in ("num_workers", "cache_dir")}
        return config_hash({"model": self.model_key, "task": self.resolved["task"], "split": split, "data": data,
                            "precision": self.resolved["trainer"]["precision"],
                            "data_files": self.identity.inputs.get("task.data_files"),
                            "tokenizer": self.data.tokenizer_digest, "records": RECORDS_VERSION})

    def _baseline_paths(self, split: str) -> tuple[Path, Path]:
        folder = Path(self.cfg.baseline_dir) / self.baseline_key(split)
        return folder / "baseline.json", folder / "records.parquet"

    def _cached_baselines(self) -> dict[str, Any] | None:
        """``{split: records}`` of the cached baseline, or None when a split is missing (read once per job)."""
        if getattr(self, "_baseline", None) is not None:
            return self._baseline
        cached = {}
        for split in self.data.eval_splits:
            summary, records = self._baseline_paths(split)
            if not (summary.is_file() and records.is_file()):
                return None
            try:  # a cache damaged outside the job (a full disk, a hand edit) is computed again, not a traceback
                if not read_json(summary, "baseline").get("complete"):
                    return None
                cached[split] = read_records(records)
            except (UserError, OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
                if not getattr(self, "_damage_said", False):
                    self._damage_said = True
                    Console().print(f"note: the cached baseline in {summary.parent} cannot be read ("
                                    f"{type(error).__name__}: {str(error).splitlines()[0][:200]}): computing it "
                                    "again", markup=False, soft_wrap=True)
                return None
        self._baseline = cached
        return cached

    def baseline_records(self, split: str) -> Any:
        """The cached baseline's records of ``split`` (a DataFrame), None before it is computed."""
        return (self._cached_baselines() or {}).get(split)

    def chance(self, split: str) -> float | None:
        """What a model that learned nothing scores in the main metric on the cached baseline's ``split``
        (``headlab.tasks.chance``; SQuAD's from the split's gold answers); None where it is unknown."""
        from headlab.tasks.chance import chance_level

        records = self.baseline_records(split)
        if records is None:
            return None
        golds = None
        if "exact_match" in records:
            examples = self.data.eval_examples[split]
            answers = dict(zip(map(str, examples["id"]), (a["text"] for a in examples["answers"])))
            golds = [answers.get(str(i), []) for i in records["id"]]
        found = chance_level(self.cfg.task.main_metric, records, golds, self.cfg.task.get("version", "v1"))
        return None if found is None else found[0]

    def _write_baseline(self, split: str, records: list[dict[str, Any]]) -> None:
        summary, path = self._baseline_paths(split)
        write_records(path, records)
        write_json_atomic(summary, {
            "task": self.cfg.task.name, "model": self.cfg.model.name, "split": split,
            "checkpoint": self.checkpoint_record(), "metrics": metrics_from_records(_frame(records), self.cfg.task),
            "num_examples": len(records), "key": self.baseline_key(split), "complete": True})

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, variants: list[Variant], make_evaluator=None) -> tuple[dict[tuple[str, str], Any], dict]:
        """Records of every variant and split, and the baseline's per split (``pandas.DataFrame`` each).

        ``make_evaluator(variants, extra)`` builds the LightningModule (default ``PlanEvaluator``); ``extra``
        holds the baseline variant when the baseline must be computed in this pass.
        """
        self._calls = getattr(self, "_calls", 0) + 1
        decision = f"HEADLAB_BASELINE_CACHED_{self.job_hash}_{self._calls}"  # read by DDP children started later
        if decision in os.environ:
            return self._run(variants, self._cached_baselines() if os.environ[decision] == "1" else None,
                             make_evaluator)
        started = processes_started()  # by an earlier fit (mode=gates): rank 0 decides, the others hear it
        if started and not self.is_global_zero:
            return self._run(variants, self._cached_baselines() if _from_rank_zero(None) else None, make_evaluator)
        cached = self._cached_baselines()
        if cached is None:
            lock_path = Path(self.cfg.baseline_dir) / f"{self.weights}.lock"
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with FileLock(lock_path):  # held while this job computes the baseline; others wait, then read it
                    cached = self._cached_baselines()
                    if cached is None:
                        os.environ[decision] = "0"
                        if started:
                            _from_rank_zero(False)
                        return self._run(variants, None, make_evaluator)
            finally:  # no empty lock file stays; a job that waited on it reads the cache once it holds it
                lock_path.unlink(missing_ok=True)
        os.environ[decision] = "1"
        if started:
            _from_rank_zero(True)
        return self._run(variants, cached, make_evaluator)

    def _run(self, variants: list[Variant], cached: dict[str, Any] | None, make_evaluator) -> tuple[dict, dict]:
        identity = next((v for v in variants if v.plan.is_identity), None)
        shape = variants[0].plan.num_layers, variants[0].plan.num_heads
        extra = [] if cached is not None or identity else [Variant(BASELINE, HeadPlan.keep_all(*shape))]
        if make_evaluator is None:
            evaluator = PlanEvaluator(self.model, self.cfg.task, [*variants, *extra], self.data.eval_examples,
                                      self.substitutes, self.constants)
        else:
            evaluator = make_evaluator(variants, extra)
        self.trainer.validate(evaluator, datamodule=self.data, verbose=False)
        if cached is None:
            source = (identity or extra[0]).name
            cached = {split: _frame(evaluator.records[(source, split)]) for split in self.data.eval_splits}
            if self.is_global_zero:
                for split in self.data.eval_splits:
                    self._write_baseline(split, evaluator.records[(source, split)])
        return {key: _frame(rows) for key, rows in evaluator.records.items()}, cached

    def checkpoint_record(self) -> dict[str, Any]:
        return self.checkpoint.record(self.cfg.ckpt_path) | {"weights_hash": self.weights,
                                                             "model_hash": self.model_key}

    def result(self, variant: Variant, records: dict[str, Any], baseline: dict[str, Any], folder: Path,
               job_hash: str | None = None) -> EvalResult:
        """Write ``variant``'s per-example records and ``results.json`` into ``folder`` (rank 0 only)."""
        metrics = {split: metrics_from_records(records[split], self.cfg.task) for split in self.data.eval_splits}
        base = {split: metrics_from_records(baseline[split], self.cfg.task) for split in self.data.eval_splits}
        rows = [{"split": split, **row} for split in self.data.eval_splits
                for row in records[split].to_dict("records")]
        result = EvalResult(
            mode=self.cfg.mode, group=self.cfg.group, task=self.cfg.task.name, model=self.cfg.model.name,
            checkpoint=self.checkpoint_record(), seed=self.cfg.seed, plan_name=variant.name,
            plan=variant.plan.to_dict(), policy=policy_label(variant.plan), unit=self.cfg.mask.unit,
            renormalize=variant.renormalize, metrics=metrics, baseline=base,
            delta={s: {m: metrics[s][m] - base[s][m] for m in metrics[s]} for s in metrics},
            num_examples={split: len(records[split]) for split in self.data.eval_splits},
            records="records.parquet",
            baseline_records={split: str(self._baseline_paths(split)[1].absolute()) for split in base},
            config_hash=job_hash or self.job_hash, config=self.resolved, inputs=self.identity.inputs,
        )
        if self.is_global_zero:
            write_records(folder / "records.parquet", rows)
            result.write(folder / "results.json")
        return result

    def log_metrics(self, result: EvalResult, prefix: str = "") -> None:
        """The metrics, the baseline's and the deltas to the configured logger (W&B, CSV)."""
        if not self.logger:
            return
        values = {}
        for split, metrics in result.metrics.items():
            for name, value in metrics.items():
                values |= {f"{prefix}{split}/{name}": value, f"{prefix}{split}/{name}_baseline":
                           result.baseline[split][name], f"{prefix}{split}/{name}_delta": result.delta[split][name]}
        self.logger.log_metrics(values, step=0)

    def finish(self) -> None:
        if self.logger:
            self.logger.finalize("success")


def summary_line(result: EvalResult, main_metric: str, where: Path) -> str:
    """``plan: split metric value (baseline b, delta d) -> results path``, one line per job."""
    parts = [f"{split} {main_metric} {m[main_metric]:.4f} (baseline {result.baseline[split][main_metric]:.4f}, "
             f"delta {result.delta[split][main_metric]:+.4f})" for split, m in result.metrics.items()]
    return f"{result.plan_name} [{result.policy}]: " + "; ".join(parts) + f" -> {where}"


def _frame(rows: list[dict[str, Any]]):
    import pandas as pd

    return pd.DataFrame(rows)


def processes_started() -> bool:
    """Whether this job's DDP processes run already (a fit started them): a decision is then broadcast, not
    inherited through the environment by the processes the first Trainer starts."""
    import torch.distributed

    return torch.distributed.is_available() and torch.distributed.is_initialized() and \
        torch.distributed.get_world_size() > 1


def _from_rank_zero(value: Any) -> Any:
    """``value`` of rank 0, on every rank (a collective: every rank calls it)."""
    import torch.distributed

    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]
