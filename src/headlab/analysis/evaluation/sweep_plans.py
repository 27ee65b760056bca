"""The plan families of ``mode=sweep_heads``: plans that each change the heads of one layer only.

=============  ==================================================================  ==========
family         plans (each under ``mask.policy``)                                  count
=============  ==================================================================  ==========
single_head    ``L{l}H{h}``: one head (Michel et al. 2019; Kovaleva et al. 2019)   L x H
all_but_one    ``L{l}H{h}``: every head of layer l except h (Michel et al. 2019)   L x H
layer          ``L{l}``: every head of layer l (Kovaleva et al. 2019)              L
=============  ==================================================================  ==========
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headlab.core.head_names import head_name
from headlab.core.plans import POLICIES, HeadPlan, Rule, check_unit
from headlab.errors import UserError

FAMILIES = ("single_head", "all_but_one", "layer")


def check_sweep_mask(mask: Any) -> None:
    """``mask.policy`` names the policy every plan applies; the mask gives no rules or heads of its own."""
    if mask.get("rules"):
        raise UserError("mode=sweep_heads takes mask.policy=POLICY (each plan applies it), not mask.rules")
    if mask.get("heads") is not None:
        raise UserError(f"mode=sweep_heads chooses the heads itself; drop mask.heads={mask.heads!r} "
                        "(sweep.family=single_head|all_but_one|layer says which plans)")
    policies = [p for p in POLICIES if p != "keep"]
    if mask.get("policy") not in policies:
        raise UserError(f"mode=sweep_heads needs mask.policy=POLICY; got {mask.get('policy')!r}, valid: "
                        f"{', '.join(policies)}")
    check_unit(mask.unit)


def family_plans(family: str, policy: str, num_layers: int, num_heads: int) -> list[tuple[str, int, HeadPlan]]:
    """``(name, layer, plan)`` of every plan of ``family``, layer by layer."""
    if family not in FAMILIES:
        raise UserError(f"unknown sweep.family {family!r}; valid: {', '.join(FAMILIES)}")
    plans = []
    for layer in range(num_layers):
        if family == "layer":
            chosen = [(f"L{layer}", list(range(num_heads)))]
        elif family == "single_head":
            chosen = [(head_name(layer, h), [h]) for h in range(num_heads)]
        else:
            chosen = [(head_name(layer, h), [o for o in range(num_heads) if o != h]) for h in range(num_heads)]
        for name, heads in chosen:
            policies = np.full((num_layers, num_heads), "keep", dtype=object)
            policies[layer, heads] = policy
            selector = ",".join(head_name(layer, h) for h in heads) if family == "all_but_one" else name
            plans.append((name, layer, HeadPlan(policies, [Rule(selector, policy)])))
    return plans
