"""Glue between Hydra configs and the package: resolvers and the ``mask`` group."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from headlab.models import package_dir
from headlab.plans import HeadPlan, check_policy, check_rules, check_unit


def register_resolvers() -> None:
    """``${pkg_dir:NAME}``: folder of an installed package (the embedded MiniLM lives in one).
    ``${job_dir:OVERRIDES}``: a job's directory name from its overrides, ``defaults`` when there are none.
    """
    OmegaConf.register_new_resolver("pkg_dir", package_dir, replace=True)
    OmegaConf.register_new_resolver("job_dir", lambda overrides: overrides or "defaults", replace=True)


def mask_rules(mask: Any) -> list[dict[str, Any]]:
    """The rules a ``mask`` config describes: its ``rules`` list, or one ``{heads, policy}`` rule."""
    rules = mask.get("rules")
    if rules is not None and mask.get("policy") is not None:
        raise ValueError("a mask config gives either 'rules' or 'policy' + 'heads', not both")
    if rules is None:
        rules = [{"heads": mask.heads, "policy": check_policy(mask.policy)}]
    return [{"heads": _plain(rule["heads"]), "policy": rule["policy"]} for rule in _plain(rules)]


def _plain(value: Any) -> Any:
    """OmegaConf containers as plain lists / dicts (selectors may be Hydra lists)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def check_mask(mask: Any) -> None:
    """Validate a ``mask`` config without the model: grammar, policies, unit, renormalize."""
    check_rules(mask_rules(mask))
    check_unit(mask.unit)
    if not isinstance(mask.renormalize, bool):
        raise ValueError(f"mask.renormalize must be true or false, got {mask.renormalize!r}")


def plan_from_mask(mask: Any, num_layers: int, num_heads: int) -> HeadPlan:
    return HeadPlan.from_rules(
        mask_rules(mask), num_layers, num_heads, clusters=mask.get("clusters"), importance=mask.get("importance")
    )
