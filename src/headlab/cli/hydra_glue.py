"""Hydra glue: the resolvers the configs use, the running job's directory, the sweep's name, the report at a
multirun's end."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from headlab.files import cut_at_comma, package_dir, plain_name, plain_text, short_name


def register_resolvers() -> None:
    """``${pkg_dir:NAME}``: folder of an installed package (the embedded MiniLM lives in one).
    ``${job_dir:OVERRIDES}``: a job's directory name from its overrides, ``defaults`` when there are none.
    ``${scored:MODE,TASK,MODEL,CKPT_PATH,TEXT_FILE}``: what a job scores, as directories (``TASK/MODEL/CKPT_TAG``,
    ``text_file`` for the task of features of a text file), or ``from_jobs`` for the modes that read other jobs'
    files instead of running a model.
    ``${ablate_dir:MODE,TASK,MODEL,CKPT_PATH,TEXT_FILE,STUDY_CHECKPOINT,SWEEP_DIR,OVERRIDES}``: an ``ablate.py``
    job's folder.
    ``${config_groups:[UNUSED,...]}``: the config groups ``--help`` lists.
    """
    OmegaConf.register_new_resolver("pkg_dir", package_dir, replace=True)
    OmegaConf.register_new_resolver("job_dir", job_dir_name, replace=True)
    OmegaConf.register_new_resolver("scored", scored_dirs, replace=True)
    OmegaConf.register_new_resolver("ablate_dir", ablate_run_dir, replace=True)
    OmegaConf.register_new_resolver("config_groups", config_groups, replace=True)


INTERNAL_GROUPS = ("hydra", "schema")  # Hydra's own groups; the schemas the configs extend (cli/schema.py)


def config_groups(*unused: str) -> str:
    """``group: option, option`` per line, for ``--help``: Hydra's ``$APP_CONFIG_GROUPS`` without the schemas
    (``schema/task``: what a task config extends, not a choice) and the groups the script does not read
    (``unused``: ``train.py`` takes no study or ablation preset)."""
    from hydra.core.global_hydra import GlobalHydra

    loader = GlobalHydra.instance().config_loader()
    lines = []

    def walk(parent: str) -> None:
        for name in sorted(loader.list_groups(parent)):
            group = f"{parent}/{name}" if parent else name
            if group.split("/")[0] in (*INTERNAL_GROUPS, *unused):
                continue
            options = sorted(loader.get_group_options(group))
            if options:
                lines.append(f"{group}: {', '.join(options)}")
            walk(group)

    walk("")
    return "\n".join(lines)


def job_dir_name(overrides: str) -> str:
    """The overrides as one directory name that pastes back into an override as printed (``plain_name``:
    ``mask.heads=L0,mask=prune`` -> ``mask.heads-L0+mask-prune``, paths' ``/`` -> ``_``); a long list is cut to its
    first overrides and a hash of all (``short_name``): no name past the filesystem's 255 bytes, whatever the command
    line (the full config is in the job's ``.hydra/``). Overrides whose values are paths come last, so a cut keeps
    what a sweep varies (``plan=prune_dense`` of a sweep given ``mask.clusters=/a/long/path``)."""
    parts = re.split(r",(?=[+~]?[\w.@-]+=)", overrides) if overrides else []  # commas inside [..] or {..} stay
    ordered = sorted(parts, key=lambda part: "/" in part.partition("=")[2])
    return plain_name(",".join(ordered) or "defaults")


def checkpoint_tag(ckpt_path: str | None) -> str:
    """``pretrained`` for the model's own weights, else the checkpoint's (or any folder's) name and a hash of its
    absolute path."""
    if ckpt_path is None:
        return "pretrained"
    path = Path(ckpt_path).expanduser().absolute()
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"{short_name(plain_text(path.name.removesuffix('.ckpt')) or 'root', 60)}-{digest}"


FROM_JOBS = ("cluster", "compare", "report")  # modes that read other jobs' files: no model, task or checkpoint


def scored_dirs(mode: str, task: str, model: str, ckpt_path: str | None, text_file: str | None = None) -> str:
    """``TASK/MODEL/CKPT_TAG`` of a job that runs a model, ``from_jobs`` for one that reads other jobs' files (the
    task and model defaults would name a cluster job of BERT-base's SST-2 features ``demo_qa/minilm``)."""
    if mode in FROM_JOBS:
        return "from_jobs"
    data = "text_file" if mode == "features" and text_file else task
    return f"{data}/{model}/{checkpoint_tag(ckpt_path)}"


def ablate_run_dir(mode: str, task: str, model: str, ckpt_path: str | None, text_file: str | None,
                   study_checkpoint: str | None, sweep_dir: str | None, overrides: str) -> str:
    """``outputs/study/TASK/MODEL/<study_folder_name>`` for the study, else
    ``outputs/ablate/MODE/<scored_dirs>/<job_dir_name>``; a report's folder is named by its sweep folder too (the
    reports of two sweeps do not share one folder)."""
    if mode == "study":
        return f"{STUDIES}/{task}/{model}/{study_folder_name(study_checkpoint, overrides)}"
    job = job_dir_name(overrides)
    if mode == "report" and sweep_dir is not None:
        job = f"{checkpoint_tag(sweep_dir)}/{job}"
    return f"outputs/ablate/{mode}/{scored_dirs(mode, task, model, ckpt_path, text_file)}/{job}"


STUDIES = "outputs/study"
LATEST = "latest"  # outputs/study/TASK/MODEL/latest: a link to the study started last


def study_folder_name(study_checkpoint: str | None, overrides: str) -> str:
    """``finetuned`` (or the tag of ``study.checkpoint``), followed, when settings are overridden, by a readable
    start of them (``plain_text``: it pastes back into an override) and a hash of all:
    ``finetuned-finetune.trainer.max_epochs-1-3a9f01bc``. A study with other settings keeps out of the folder of the
    earlier one; the seeds and stages to run (``study.seeds``, ``study.stages``) are not settings of the study
    (``exclude_keys`` in ``conf/ablate.yaml``): more seeds or another stage join the same folder."""
    base = "finetuned" if study_checkpoint is None else checkpoint_tag(study_checkpoint)
    if not overrides:
        return base
    digest = hashlib.sha256(overrides.encode()).hexdigest()[:8]
    readable = plain_text(cut_at_comma(re.sub(r"(^|,)[+~]*(study\.)?", r"\1", overrides), 80))  # ++study.x
    return f"{base}-{readable}-{digest}"


def point_latest(folder: Path) -> None:
    """``latest`` beside a study folder made by its default name points at it (a relative link, replaced
    atomically); a folder given by ``hydra.run.dir`` or a ``latest`` that is not a link is left alone."""
    if any(override.startswith("hydra.run.dir=") for override in HydraConfig.get().overrides.hydra):
        return
    link, temporary = folder.parent / LATEST, folder.parent / f".{LATEST}.{os.getpid()}"
    if link.exists() and not link.is_symlink():
        return
    try:
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(folder.name, target_is_directory=True)
        os.replace(temporary, link)
    except OSError:  # a filesystem without links: the folder names say which study is which
        temporary.unlink(missing_ok=True)


def model_and_task_overrides() -> list[str]:
    """The running job's model and task as overrides another script takes: the groups chosen (``model=minilm``,
    ``task=sst2``), then every ``model.*`` and ``task.*`` override of the command line as typed (own data files, a
    task's own name)."""
    hydra = HydraConfig.get()
    chosen = [f"{group}={hydra.runtime.choices[group]}" for group in ("model", "task")]
    typed = [o for o in hydra.overrides.task if o.lstrip("+~").startswith(("model.", "task."))]
    return chosen + typed


def typed_overrides(prefix: str) -> dict[str, str]:
    """``{key: value}`` of the command line's overrides whose dotted key starts with ``prefix`` (``+`` / ``~`` off)."""
    found = {}
    for override in HydraConfig.get().overrides.task:
        key, _, value = override.lstrip("+~").partition("=")
        if key == prefix.rstrip(".") or key.startswith(prefix):
            found[key] = value
    return found


def job_dir() -> Path:
    """The running Hydra job's output directory (``hydra.run.dir``, or the sweep's subdir)."""
    return Path(HydraConfig.get().runtime.output_dir)


def log_lightning_once() -> None:
    """Once a stage has loaded Lightning: its messages go out once, through Hydra's handlers (the console and the
    job's log file). The ``lightning`` package gives its logger a console handler of its own at import, while
    ``lightning.pytorch`` sends its messages on to the root logger when that has handlers (Hydra's), so every
    line came twice. Its advertisements ("Tip: try installing litlogger") are left out, and so is the deprecation
    warning its own code triggers in torch (``isinstance(treespec, LeafSpec)``, Lightning 2.6 on torch 2.13): a
    line in every job that no headlab user can act on."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    if "lightning" in sys.modules and logging.getLogger().hasHandlers():
        logging.getLogger("lightning").handlers.clear()
        logging.getLogger("lightning.pytorch.utilities.rank_zero").filters = [_no_tips]


def progress_bars_follow(trainer_cfg: Any) -> None:
    """``trainer.enable_progress_bar=false`` also turns off the bars of Hugging Face's weight loading and data sets
    (one per job of a sweep otherwise, in logs that want none)."""
    if trainer_cfg.get("enable_progress_bar") is False:
        import datasets
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        datasets.disable_progress_bars()


def _no_tips(record: logging.LogRecord) -> bool:
    return "Tip: " not in record.getMessage()


class SweepNamedByChoice(Callback):
    """Hydra callback (both entry configs): ``hydra.sweep.dir`` may name the sweep after a config group's choice
    (``${hydra:runtime.choices.experiment}``, through ``experiment`` or ``group``). Hydra's sweeper makes that
    directory before it sets ``HydraConfig`` for the jobs, so the multirun's own config is set here first."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        HydraConfig.instance().set_config(config)


class ReportOnMultirunEnd(Callback):
    """Hydra callback (``conf/ablate.yaml``): when a multirun of ``mode=eval`` or ``mode=sweep_heads`` ends and
    ``report.auto`` is true, ``mode=report`` runs on the sweep directory; after one of ``mode=cluster``, a table of
    its jobs' stability and silhouette (``cluster_selection.csv``)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.report.auto:
            return
        if config.get("mode") == "cluster":
            from headlab.analysis.types.cluster_run import summarize_sweep

            summarize_sweep(config.hydra.sweep.dir)
            return
        if config.get("mode") not in ("eval", "sweep_heads"):
            return
        from headlab.analysis.evaluation.report_run import (
            run as run_report,  # pandas, scipy and matplotlib load only here
        )

        cfg = OmegaConf.masked_copy(config, ["report", "logger"])
        OmegaConf.set_struct(cfg, False)
        cfg.sweep_dir = config.hydra.sweep.dir
        cfg.latest_multirun = True  # this multirun's jobs, not those of earlier sweeps into the same folder
        run_report(cfg)
