"""The configs of a study's jobs: ``train.py``'s for a fine-tuning seed, ``ablate.py``'s for an analysis mode.

Each is the study's own config (model, task, trainer, data, logger, seed) with the stage's settings of ``study``
(``conf/study/``) laid over it: ``study.finetune`` over ``conf/train.yaml``, ``study.features`` over the
``ablate.py`` config of ``mode=features``, and so on. The W&B group is the study's, the job type the stage's.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, ValidationError

from headlab.errors import UserError

SHARED_GROUPS = ("model", "task", "trainer", "data", "logger")  # what every job takes from the study's config
CLEAR_MASK = {"rules": [], "policy": None, "heads": None, "renormalize": False, "unit": "sentence", "clusters": None,
              "importance": None, "importance_estimator": None, "constants": None}


def lay_over(cfg: Any, settings: Any, where: str) -> Any:
    """``settings`` (a dict of config fields, or a list of them laid in turn) merged into a copy of ``cfg``; a key
    ``cfg`` lacks is a ``UserError``."""
    try:
        return OmegaConf.merge(cfg, *(settings if isinstance(settings, list) else [settings or {}]))
    except (ConfigKeyError, ValidationError) as error:
        key = getattr(error, "full_key", None)  # the field inside the stage's config: cluster.k
        what = (getattr(error, "msg", None) or str(error)).splitlines()[0]
        raise UserError(f"{where}.{key}: {what}" if key else f"{where}: {what} (its keys are those of the stage's "
                        "config)") from None


def stage_logger(cfg: Any, group: str, stage: str) -> None:
    """The job's W&B run joins the study's group, typed by its stage (``cfg`` is open)."""
    cfg.group = group
    if cfg.logger is not None and "job_type" in cfg.logger:
        cfg.logger.job_type = stage


def analysis_config(study_cfg: Any, stage: str, mode: str, ckpt_path: str | Path | None, group: str,
                    **fields: Any) -> Any:
    """An ``ablate.py`` config of ``mode`` on ``ckpt_path``: the study's, with no plan, ``study.<stage>`` laid over
    it, then ``fields`` (dotted keys: ``{"cluster.features": DIR}``). One merge makes the copy (a study builds about
    60 of these: a deep copy and then a merge, which copies again, took 18 ms each)."""
    settings = study_cfg.study.get(stage) or {}
    base = {"mode": mode, "ckpt_path": None if ckpt_path is None else str(ckpt_path), "plan": None,
            "mask": CLEAR_MASK, "group": group}
    cfg = lay_over(study_cfg, [base, settings], f"study.{stage}")
    with open_dict(cfg):
        cfg.plans = settings.get("plans") or {}  # the study's own plans are no stage's (a stage may give its own)
        if cfg.logger is not None and "job_type" in cfg.logger:
            cfg.logger.job_type = stage
    for key, value in fields.items():
        OmegaConf.update(cfg, key, value, merge=False, force_add=False)
    return cfg


def train_config(study_cfg: Any, seed: int, group: str) -> Any:
    """``train.py``'s config for fine-tuning seed ``seed``: ``conf/train.yaml`` (composed by Hydra, so the optimiser's
    defaults are the script's), the study's model, task, trainer, data and logger, then ``study.finetune``."""
    from hydra import compose

    cfg = compose(config_name="train")
    with open_dict(cfg):
        for group_name in SHARED_GROUPS:
            cfg[group_name] = copy.deepcopy(study_cfg[group_name])
        cfg.mask = OmegaConf.merge(cfg.mask, CLEAR_MASK)
        cfg.seed = seed
        cfg.compile = study_cfg.compile
        cfg.ckpt_path = None
        cfg.experiment = group
        stage_logger(cfg, group, "finetune")
    return lay_over(cfg, study_cfg.study.get("finetune"), "study.finetune")

