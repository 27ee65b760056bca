"""The plan families of ``mode=sweep_heads``: plans that each change the heads of one layer only, or random head sets.

=============  ==================================================================  ==========
family         plans (each under ``mask.policy``)                                  count
=============  ==================================================================  ==========
single_head    ``L{l}H{h}``: one head (Michel et al. 2019; Kovaleva et al. 2019)   L x H
all_but_one    ``L{l}H{h}``: every head of layer l except h (Michel et al. 2019)   L x H
layer          ``L{l}``: every head of layer l (Kovaleva et al. 2019)              L
random         ``{policy}_random{n}_{d}``: n heads drawn uniformly, without      sizes x draws
               replacement, from all L x H (the control of a type of n heads)
=============  ==================================================================  ==========

A plan's group is what one pass over the data runs together: its layer, or for ``random`` its size. Each size draws
from its own stream (``numpy.random.default_rng([seed, n])``): adding a size or more draws keeps the sets drawn
before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headlab.core.head_names import head_name
from headlab.core.plans import POLICIES, HeadPlan, Rule, check_unit
from headlab.errors import UserError

FAMILIES = ("single_head", "all_but_one", "layer", "random")


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


def family_plans(family: str, policy: str, num_layers: int, num_heads: int, sizes: tuple[int, ...] = (),
                 draws: int = 0, seed: int = 0) -> list[tuple[str, int, HeadPlan]]:
    """``(name, group, plan)`` of every plan of ``family``, group by group (a layer; for ``random`` a size)."""
    if family not in FAMILIES:
        raise UserError(f"unknown sweep.family {family!r}; valid: {', '.join(FAMILIES)}")
    if family == "random":
        return random_plans(policy, num_layers, num_heads, sizes, draws, seed)
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


def random_plans(policy: str, num_layers: int, num_heads: int, sizes: tuple[int, ...], draws: int,
                 seed: int) -> list[tuple[str, int, HeadPlan]]:
    """``({policy}_random{n}_{d}, n, plan)``: ``draws`` sets of ``n`` heads per size, each under ``policy`` (its name
    in the plan's, so that two policies' sets in one report are two plans)."""
    total = num_layers * num_heads
    too_big = [n for n in sizes if n > total]
    if too_big:
        raise UserError(f"sweep.sizes={list(sizes)}: {too_big[0]} heads is more than the model's {total} "
                        f"({num_layers} layers x {num_heads} heads)")
    plans = []
    for size in dict.fromkeys(sizes):
        generator = np.random.default_rng([seed, size])
        for draw in range(draws):
            chosen = sorted(generator.choice(total, size=size, replace=False).tolist())
            policies = np.full((num_layers, num_heads), "keep", dtype=object)
            for index in chosen:
                policies[index // num_heads, index % num_heads] = policy
            selector = ",".join(head_name(index // num_heads, index % num_heads) for index in chosen)
            plans.append((f"{policy}_random{size}_{draw:02d}", size, HeadPlan(policies, [Rule(selector, policy)])))
    return plans
