"""Glue between Hydra configs and the package: resolvers and the ``mask`` group."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from headlab.models import package_dir
from headlab.plans import HeadPlan, check_policy, check_rules, check_unit


def register_resolvers() -> None:
    """``${pkg_dir:NAME}``: folder of an installed package (the embedded MiniLM lives in one)."""
    OmegaConf.register_new_resolver("pkg_dir", package_dir, replace=True)


def mask_rules(mask: Any) -> list[dict[str, Any]]:
    """The rules a ``mask`` config describes: its ``rules`` list, or one ``{heads, policy}`` rule."""
    rules = mask.get("rules")
    if rules is not None and mask.get("policy") is not None:
        raise ValueError("a mask config gives either 'rules' or 'policy' + 'heads', not both")
    if rules is None:
        return [{"heads": mask.heads, "policy": check_policy(mask.policy)}]
    container = OmegaConf.to_container(rules, resolve=True) if OmegaConf.is_config(rules) else rules
    return list(container)


def check_mask(mask: Any) -> None:
    """Validate a ``mask`` config without the model: grammar, policies, unit, renormalize."""
    check_rules(mask_rules(mask))
    check_unit(mask.unit)
    if not isinstance(mask.renormalize, bool):
        raise ValueError(f"mask.renormalize must be true or false, got {mask.renormalize!r}")


def plan_from_mask(mask: Any, num_layers: int, num_heads: int) -> HeadPlan:
    heads = lambda v: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v  # noqa: E731
    rules = [{"heads": heads(rule["heads"]), "policy": rule["policy"]} for rule in mask_rules(mask)]
    return HeadPlan.from_rules(
        rules, num_layers, num_heads, clusters=mask.get("clusters"), importance=mask.get("importance")
    )
