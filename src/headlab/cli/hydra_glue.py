"""Hydra glue: the resolvers the configs use and the running job's directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from headlab.files import package_dir


def register_resolvers() -> None:
    """``${pkg_dir:NAME}``: folder of an installed package (the embedded MiniLM lives in one).
    ``${job_dir:OVERRIDES}``: a job's directory name from its overrides, ``defaults`` when there are none.
    ``${ckpt_tag:CKPT_PATH}``: a directory name for a checkpoint.
    """
    OmegaConf.register_new_resolver("pkg_dir", package_dir, replace=True)
    OmegaConf.register_new_resolver("job_dir", job_dir_name, replace=True)
    OmegaConf.register_new_resolver("ckpt_tag", checkpoint_tag, replace=True)


def job_dir_name(overrides: str) -> str:
    """The overrides as one directory name (paths in values keep their slashes out: ``/`` -> ``~``)."""
    return overrides.replace("/", "~") or "defaults"


def checkpoint_tag(ckpt_path: str | None) -> str:
    """``pretrained`` for the model's own weights, else the checkpoint's name and a hash of its absolute path."""
    if ckpt_path is None:
        return "pretrained"
    path = Path(ckpt_path).expanduser().absolute()
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"{path.name.removesuffix('.ckpt') or 'root'}-{digest}"


def job_dir() -> Path:
    """The running Hydra job's output directory (``hydra.run.dir``, or the sweep's subdir)."""
    return Path(HydraConfig.get().runtime.output_dir)
