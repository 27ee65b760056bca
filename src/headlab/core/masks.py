"""The ``mask`` config group as a HeadPlan: ``rules``, or one ``policy`` on ``heads``, plus unit and renormalize."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from headlab.core.model_files import architecture
from headlab.core.plans import SUBSTITUTED, HeadPlan, check_policy, check_rules, check_unit
from headlab.errors import UserError
from headlab.files import read_json


def mask_rules(mask: Any) -> list[dict[str, Any]]:
    """The rules a ``mask`` config describes: its ``rules`` list, or one ``{heads, policy}`` rule."""
    rules, policy, heads = mask.get("rules"), mask.get("policy"), mask.get("heads")
    if rules and policy is not None:
        raise UserError("a mask config gives either mask.rules or mask.policy + mask.heads, not both")
    if policy is None:
        if heads is not None:
            raise UserError(f"mask.heads={_plain(heads)!r} needs a policy: mask=prune|uniform|drop_intra|drop_inter "
                            "(or mask.policy=POLICY)")
        return _plain(rules) if rules is not None else []
    if heads is None:
        raise UserError(f"mask.policy={policy} needs mask.heads=SELECTOR, e.g. mask.heads=L0H1 or all")
    return [{"heads": _plain(heads), "policy": check_policy(policy)}]


def _plain(value: Any) -> Any:
    """OmegaConf containers as plain lists / dicts (selectors may be Hydra lists)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def check_mask(mask: Any) -> None:
    """Validate a ``mask`` config without the model: grammar, policies, unit, renormalize."""
    check_rules(mask_rules(mask))
    check_unit(mask.unit)
    if not isinstance(mask.renormalize, bool):
        raise UserError(f"mask.renormalize must be true or false, got {mask.renormalize!r}")


def plan_from_mask(mask: Any, num_layers: int, num_heads: int, model: Any = None) -> HeadPlan:
    """The mask's plan for a model of this shape; given ``model`` (the job's model config), a clusters, importance or
    constants file that names another model or architecture (as headlab's jobs write them) is a ``UserError``: heads
    of a model of the same shape (BERT-base and RoBERTa-base: 12 x 12) are other heads."""
    if model is not None:
        for key in ("clusters", "importance", "constants"):
            source = mask.get(key)
            data = read_json(source, key) if isinstance(source, str) else None
            if isinstance(data, dict):
                check_same_model(data, model, f"mask.{key}={source!r}")
    return HeadPlan.from_rules(
        mask_rules(mask), num_layers, num_heads, clusters=mask.get("clusters"), importance=mask.get("importance"),
        estimator=mask.get("importance_estimator"),
    )


def check_same_model(data: dict[str, Any], model: Any, what: str) -> None:
    """A ``UserError`` naming ``what`` when a job's file ``data`` records another ``model`` name or ``architecture``
    (``model_files.architecture``) than the model config ``model``; a file without them is not checked."""
    written_for, built = data.get("model"), data.get("architecture")
    if written_for is not None and written_for != model.name:
        raise UserError(f"{what} was computed on model {written_for}; this job's model is {model.name}")
    ours = None if built is None else architecture(model)
    if built is not None and built != ours:
        raise UserError(f"{what} was computed on a model of another architecture ({built}); this job's model "
                        f"{model.name} is {ours} ({model.get('name_or_path') or 'random'}): its heads are other heads")


def refuse_substituted(plan: HeadPlan, where: str) -> None:
    """A ``UserError`` when ``plan`` has ``mean`` or ``resample`` heads, which ``where`` does not take (their values
    come from a reference set that only ``ablate.py``'s evaluating modes load)."""
    used = [policy for policy in SUBSTITUTED if plan.counts()[policy]]
    if used:
        raise UserError(f"{where} takes no {' or '.join(used)} heads (the plan has {plan.describe()}); they are "
                        "evaluation ablations: use them with ablate.py mode=eval or sweep_heads")
