"""Typed results records (``results.json``), written atomically so a killed job never leaves half a file."""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from rich.console import Console

from headlab.errors import UserError
from headlab.files import write_json_atomic


def library_versions() -> dict[str, str]:
    """Versions of Python and the libraries a result depends on."""
    versions = {"python": platform.python_version()}
    for package in ("headlab", "torch", "transformers", "lightning", "datasets", "torchmetrics", "hydra-core"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def read_complete(path: str | Path, job_hash: str) -> dict[str, Any] | None:
    """The results file at ``path`` if it is complete and belongs to the config hashed ``job_hash``, else None."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return data if data.get("complete") and data.get("config_hash") == job_hash else None


def note_why_again(results_path: Path, computed: dict[str, Any], inputs: dict[str, Any],
                   computed_of: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Say why a job runs again where complete results of an earlier run lie: the settings that changed
    (``trainer.max_epochs 3 -> 1``; ``computed_of`` takes the earlier resolved config to its hashed part), else the
    input files written again since (a checkpoint fine-tuned again at the same path)."""
    try:
        previous = json.loads(Path(results_path).read_text())
    except (OSError, ValueError):  # missing, partial or corrupt: the job simply runs
        return
    if not isinstance(previous, dict) or not previous.get("complete"):
        return
    try:
        settings = changed_settings(computed_of(previous["config"]), computed)
    except (KeyError, TypeError, AttributeError):  # results of an older headlab: no config to compare
        settings = []
    before = previous.get("inputs") if isinstance(previous.get("inputs"), dict) else {}
    files = sorted(key for key in set(before) | set(inputs) if before.get(key) != inputs.get(key))
    if settings:
        more = f" and {len(settings) - MAX_SHOWN} more" if len(settings) > MAX_SHOWN else ""
        reason = f"settings changed since {results_path} was written ({'; '.join(settings[:MAX_SHOWN])}{more})"
    elif files:
        named = [key if key in before and key in inputs else
                 f"{key} ({'not given now' if key in before else 'given now'})" for key in files]
        reason = f"the files of {', '.join(named)} changed since {results_path} was written"
    else:
        return
    Console().print(f"note: {reason}: running the job again", markup=False, soft_wrap=True)


def retire_results(results_path: Path) -> None:
    """Remove the ``results.json`` of an earlier run before a job that is not it writes anything in its folder:
    killed part-way, the folder would read as that run, done, beside a mix of both runs' files."""
    Path(results_path).unlink(missing_ok=True)


MAX_SHOWN = 4  # changed settings named in a note


def changed_settings(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``key old -> new`` for each dotted key whose value differs between two plain configs (``(none)``: absent)."""
    old, new = _flat(before), _flat(after)
    return [f"{key} {_shown(old.get(key, _ABSENT))} -> {_shown(new.get(key, _ABSENT))}"
            for key in sorted(set(old) | set(new)) if old.get(key, _ABSENT) != new.get(key, _ABSENT)]


_ABSENT = object()


def _flat(config: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(config, dict) and config:
        return {key: value for name, item in config.items() for key, value in _flat(item, f"{prefix}{name}.").items()}
    return {prefix.removesuffix("."): config}


def _shown(value: Any, limit: int = 40) -> str:
    text = "(none)" if value is _ABSENT else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refuse_another_job(results_path: Path, kind: str, script: str) -> None:
    """A ``UserError`` where ``results_path`` holds the results of another kind of job (a ``train.py`` job's, another
    mode's): running there would write over them (a fine-tuned model's folder made unusable as a checkpoint)."""
    try:
        previous = json.loads(Path(results_path).read_text())
    except (OSError, ValueError):  # missing, partial or corrupt: nothing to lose
        return
    other = previous.get("kind") if isinstance(previous, dict) else None
    if isinstance(other, str) and other != kind:
        job = "a train.py job" if other == "train" else f"a mode={other} job"
        raise UserError(f"{Path(results_path).parent} holds the results of {job}; this {script} job ({kind}) would "
                        "write over them: give it a folder of its own (hydra.run.dir=...)")


def already_done(results_path: Path, job_hash: str) -> dict[str, Any] | None:
    """The complete results of this very config, announced, or None (missing, partial, corrupt or another config)."""
    done = read_complete(results_path, job_hash)
    if done is not None:
        Console().print(f"[green]already done[/green]: {results_path} (delete it to run this job again)",
                        soft_wrap=True)
    return done


@dataclass
class TrainResult:
    """``results.json`` of a fine-tuning run (``train.py``)."""

    task: str
    model: str
    seed: int
    plan: dict[str, Any]  # HeadPlan.to_dict() of the mask trained under
    metrics: dict[str, dict[str, float]]  # eval split -> metric -> value, of the final weights (final_weights)
    main_metric: str  # "{split}/{metric}" that picks the best checkpoint
    num_examples: dict[str, int]  # split -> examples in the data
    num_evaluated: dict[str, int]  # eval split -> examples scored (all processes; equals num_examples)
    final_weights: str  # model/: the final weights and tokenizer (save_pretrained)
    best_checkpoint: str | None  # the best main metric among the validations (final_weights when those are it)
    best_score: float | None
    resumed_from: str | None
    global_step: int
    last_checkpoint: str | None  # checkpoints/last.ckpt with the training state (keep_training_state=true), or None
    config_hash: str
    config: dict[str, Any]  # the resolved config
    inputs: dict[str, Any]  # size and content digest of the local data files (task.data_files)
    versions: dict[str, str] = field(default_factory=library_versions)
    kind: str = "train"
    complete: bool = True

    def write(self, path: str | Path) -> Path:
        return write_json_atomic(path, asdict(self))


@dataclass
class EvalResult:
    """``results.json`` of an evaluation under a plan (``ablate.py mode=eval``, one per plan of ``sweep_heads``).

    Metrics per eval split include ``loss`` (the mean per-example loss); ``delta`` = metrics - baseline.
    ``records``: this job's per-example records (parquet, beside the file); ``baseline_records``: the baseline's.
    """

    mode: str
    group: str
    task: str
    model: str
    checkpoint: dict[str, Any]  # kind, path, weights_hash
    seed: int
    plan_name: str
    plan: dict[str, Any]  # HeadPlan.to_dict(): rules and the policy of every changed head
    policy: str  # the policies the plan uses, "+"-joined ("keep" for none)
    unit: str
    renormalize: bool
    metrics: dict[str, dict[str, float]]  # split -> metric -> value
    baseline: dict[str, dict[str, float]]
    delta: dict[str, dict[str, float]]
    num_examples: dict[str, int]
    records: str
    baseline_records: dict[str, str]  # split -> parquet file of the baseline's records
    config_hash: str
    config: dict[str, Any]
    inputs: dict[str, Any]  # size and content digest of the files the config names (the checkpoint ...)
    versions: dict[str, str] = field(default_factory=library_versions)
    kind: str = "eval"
    complete: bool = True

    def write(self, path: str | Path) -> Path:
        return write_json_atomic(path, asdict(self))
