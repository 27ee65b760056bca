"""Hydra glue: the resolvers the configs use and the running job's directory."""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from headlab.files import package_dir


def register_resolvers() -> None:
    """``${pkg_dir:NAME}``: folder of an installed package (the embedded MiniLM lives in one).
    ``${job_dir:OVERRIDES}``: a job's directory name from its overrides, ``defaults`` when there are none.
    """
    OmegaConf.register_new_resolver("pkg_dir", package_dir, replace=True)
    OmegaConf.register_new_resolver("job_dir", lambda overrides: overrides or "defaults", replace=True)


def job_dir() -> Path:
    """The running Hydra job's output directory (``hydra.run.dir``, or the sweep's subdir)."""
    return Path(HydraConfig.get().runtime.output_dir)
