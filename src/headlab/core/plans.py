"""Head plans: which policy each attention head gets (DESIGN.md section 2).

A plan is built from an ordered list of rules ``{heads: SELECTOR, policy: POLICY}``;
a later rule overrides an earlier one for the heads it selects, unselected heads
are ``keep``. Heads are named ``L{layer}H{head}``, both 0-based.

Selector grammar (comma-separated union, whitespace ignored)::

    all                      every head
    L3   L2-5                every head of layer 3 / of layers 2..5
    H4   H0-5                head 4 / heads 0..5 of every layer
    L3H7 L2-5H0-3            one head / a block of heads
    cluster:NAME             heads labelled NAME in a clusters mapping
    top:K  bottom:K          the K most / least important heads
    top:P% bottom:P%         the same for round(P% of all heads), ties by head order
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headlab.core.head_files import load_clusters, load_importance
from headlab.core.head_names import head_index, head_name
from headlab.errors import UserError

POLICIES = ("keep", "prune", "uniform", "drop_intra", "drop_inter", "mean", "resample", "optimal")
SUBSTITUTED = ("mean", "resample", "optimal")  # policies whose context vector comes from elsewhere (core/substitutes)
REFERENCED = ("mean", "resample")  # substituted from a reference set (optimal: from a constants file)
MEAN_OVER = ("tokens", "positions")  # what a mean head's mean is over (headlab.head_means)
UNITS = ("sentence", "segment")
ESTIMABLE = ("prune", "uniform", "drop_intra", "drop_inter", "mean", "resample")  # with a first-order estimate
ESTIMATED = ESTIMABLE[:4]  # what mode=importance estimates unless importance.policies says (no reference set needed)
GRANULARITIES = ("example", "token", "batch", "fisher")  # gradient importance estimators (section 4)

_RANGE_TOKEN = re.compile(r"^(?:L(\d+)(?:-(\d+))?)?(?:H(\d+)(?:-(\d+))?)?$")
_RANK_TOKEN = re.compile(r"^(top|bottom):(\d+(?:\.\d+)?)(%?)$")


def check_policy(policy: Any) -> str:
    if policy not in POLICIES:
        raise UserError(f"unknown policy {policy!r}; valid policies: {', '.join(POLICIES)}")
    return policy


def check_unit(unit: Any) -> str:
    if unit not in UNITS:
        raise UserError(f"unknown unit {unit!r}; valid units: {', '.join(UNITS)}")
    return unit


# --------------------------------------------------------------------------- selectors


def _tokens(selector: str | Sequence[str]) -> list[str]:
    """Split a selector (a string, or a list of strings as Hydra gives ``[a,b]``) into tokens."""
    if selector is None or isinstance(selector, (bool, int, float)):  # Hydra reads mask.heads=5 as a number
        raise UserError(f"head selector {selector!r} is not a string: name heads as L<layer>H<head> (e.g. H5 for "
                        "head 5 of every layer, L0H5, L0-2); valid tokens: all, L3, L2-5, H4, L3H7, cluster:NAME, "
                        "top:K")
    parts = [selector] if isinstance(selector, str) else list(selector)
    tokens: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise UserError(f"selector part {part!r} is not a string")
        tokens += [re.sub(r"\s+", "", t) for t in part.split(",")]
    tokens = [t for t in tokens if t]
    if not tokens:
        raise UserError(f"empty head selector {selector!r}; e.g. 'all', 'L3', 'L0H1,L2', 'cluster:dense'")
    return tokens


def check_selector_syntax(selector: str | Sequence[str]) -> None:
    """Validate a selector's grammar without knowing the model's size (cheap, before loading)."""
    for token in _tokens(selector):
        if token == "all" or (token.startswith("cluster:") and len(token) > len("cluster:")):
            continue
        if _RANK_TOKEN.match(token):
            continue
        match = _RANGE_TOKEN.match(token)
        if token and match and any(match.groups()):
            padded = [number for number in match.groups() if number and len(number) > 1 and number.startswith("0")]
            if padded:  # one head, one spelling: L2H03 would name a plan and a job of its own
                plain = re.sub(r"(?<=[LH-])0+(?=\d)", "", token)
                raise UserError(f"selector token {token!r} in {selector!r}: write numbers without leading zeros "
                                f"({plain})")
            continue
        raise UserError(
            f"unknown selector token {token!r} in {selector!r}; valid tokens: all, L3, L2-5, H4, L3H7, "
            "cluster:NAME, top:K, bottom:K, top:P%, bottom:P%"
        )


def _span(lo: str | None, hi: str | None, size: int, what: str, token: str) -> range:
    """The index range a token names for one axis (all of it when unnamed), range-checked."""
    if lo is None:
        return range(size)
    first, last = int(lo), int(lo if hi is None else hi)
    for value in (first, last):
        if not 0 <= value < size:
            raise UserError(
                f"{what} {value} in selector token {token!r} is out of range; "
                f"valid {what}s are 0..{size - 1}"
            )
    if last < first:
        raise UserError(f"empty {what} range {first}-{last} in selector token {token!r}")
    return range(first, last + 1)


def _rank_count(amount: str, percent: str, total: int, token: str) -> int:
    value = float(amount)
    if percent:
        if not 0 <= value <= 100:
            raise UserError(f"percentage {amount}% in {token!r} must be between 0 and 100")
        return math.floor(value * total / 100 + 0.5)
    if value != int(value) or not 0 <= value <= total:
        raise UserError(f"head count {amount} in {token!r} must be a whole number in 0..{total}")
    return int(value)


def select_heads(
    selector: str | Sequence[str],
    num_layers: int,
    num_heads: int,
    clusters: Mapping[str, str] | None = None,
    importance: np.ndarray | None = None,
) -> np.ndarray:
    """Boolean ``[num_layers, num_heads]`` mask of the heads a selector names."""
    check_selector_syntax(selector)
    chosen = np.zeros((num_layers, num_heads), dtype=bool)
    for token in _tokens(selector):
        if token == "all":
            chosen[:] = True
        elif token.startswith("cluster:"):
            chosen |= _cluster_heads(token, clusters, num_layers, num_heads)
        elif match := _RANK_TOKEN.match(token):
            chosen |= _ranked_heads(token, match, importance, num_layers, num_heads)
        else:
            l_lo, l_hi, h_lo, h_hi = _RANGE_TOKEN.match(token).groups()
            layers = _span(l_lo, l_hi, num_layers, "layer", token)
            heads = _span(h_lo, h_hi, num_heads, "head", token)
            chosen[np.ix_(list(layers), list(heads))] = True
    return chosen


def _cluster_heads(token, clusters, num_layers, num_heads) -> np.ndarray:
    name = token[len("cluster:") :]
    if clusters is None:
        raise UserError(
            f"selector {token!r} needs a clusters file (mask.clusters=PATH, or clusters= in Python); none was given"
        )
    labels = sorted(set(clusters.values()))
    if name not in labels:
        raise UserError(f"cluster {name!r} is not in the clusters file; its clusters are: {', '.join(labels)}")
    chosen = np.zeros((num_layers, num_heads), dtype=bool)
    for head, label in clusters.items():
        if label == name:
            chosen[head_index(head, num_layers, num_heads)] = True
    return chosen


def _ranked_heads(token, match, importance, num_layers, num_heads) -> np.ndarray:
    if importance is None:
        raise UserError(
            f"selector {token!r} needs an importance file (mask.importance=PATH, or importance= in Python); "
            "none was given"
        )
    total = num_layers * num_heads
    count = _rank_count(match.group(2), match.group(3), total, token)
    scores = importance.reshape(-1)
    # Stable sort: ties go to the earlier head (layer-major order) for both top and bottom.
    order = np.argsort(-scores if match.group(1) == "top" else scores, kind="stable")
    chosen = np.zeros(total, dtype=bool)
    chosen[order[:count]] = True
    return chosen.reshape(num_layers, num_heads)


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Rule:
    """One plan rule: give ``policy`` to the heads ``heads`` selects."""

    heads: str | tuple[str, ...]
    policy: str

    @classmethod
    def parse(cls, rule: Any) -> Rule:
        if isinstance(rule, Rule):
            return rule
        if not isinstance(rule, Mapping) or set(rule) != {"heads", "policy"}:
            found = sorted(rule) if isinstance(rule, Mapping) else type(rule).__name__
            raise UserError(
                f"rule {rule!r} must have exactly the keys heads and policy (it has {found}), "
                f"e.g. {{heads: L0H1, policy: prune}}; policies: {', '.join(POLICIES)}"
            )
        heads = rule["heads"]
        if heads is not None and not isinstance(heads, (str, bool, int, float)):  # a list of selectors
            heads = tuple(heads)
        check_selector_syntax(heads)
        return cls(heads=heads, policy=check_policy(rule["policy"]))

    def to_dict(self) -> dict[str, Any]:
        return {"heads": self.heads if isinstance(self.heads, str) else list(self.heads), "policy": self.policy}


def check_rules(rules: Iterable[Any]) -> tuple[Rule, ...]:
    """Validate rules' grammar and policies without the model (used before anything loads)."""
    if isinstance(rules, (str, Mapping)):
        raise UserError(f"rules must be a list of {{heads, policy}} mappings, got {rules!r}")
    return tuple(Rule.parse(rule) for rule in rules)


class HeadPlan:
    """An immutable map from every head ``(layer, head)`` to one policy."""

    def __init__(self, policies: np.ndarray, rules: Sequence[Rule] = ()):
        policies = np.asarray(policies, dtype=object)
        if policies.ndim != 2:
            raise ValueError(f"a plan needs a [layers, heads] table of policies, got shape {policies.shape}")
        for policy in policies.flat:
            check_policy(policy)
        self._policies = policies.copy()
        self._policies.setflags(write=False)
        self._hash = hash(tuple(self._policies.flat))  # plans key caches: hash once
        self._counts = {policy: int((self._policies == policy).sum()) for policy in POLICIES}  # read per forward
        self.rules = tuple(rules)

    @classmethod
    def from_rules(
        cls,
        rules: Iterable[Any],
        num_layers: int,
        num_heads: int,
        clusters: str | Path | Mapping[str, Any] | None = None,
        importance: str | Path | Mapping[str, Any] | Sequence | None = None,
        estimator: str | None = None,
    ) -> HeadPlan:
        """Apply ``rules`` in order to an all-``keep`` plan (later rules win).

        ``estimator``: which of the importance file's ``estimators`` ``top:``/``bottom:`` use (None: ``importance``).
        """
        for name, size in (("num_layers", num_layers), ("num_heads", num_heads)):
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise UserError(f"{name} must be a positive whole number, got {size!r}")
        rules = check_rules(rules)
        labels = None if clusters is None else load_clusters(clusters, num_layers, num_heads)
        scores = None if importance is None else load_importance(importance, num_layers, num_heads, estimator)
        policies = np.full((num_layers, num_heads), "keep", dtype=object)
        for rule in rules:
            policies[select_heads(rule.heads, num_layers, num_heads, labels, scores)] = rule.policy
        return cls(policies, rules)

    @classmethod
    def keep_all(cls, num_layers: int, num_heads: int) -> HeadPlan:
        return cls(np.full((num_layers, num_heads), "keep", dtype=object))

    @property
    def num_layers(self) -> int:
        return self._policies.shape[0]

    @property
    def num_heads(self) -> int:
        return self._policies.shape[1]

    @property
    def is_identity(self) -> bool:
        """True when every head is ``keep``."""
        return bool((self._policies == "keep").all())

    def policy_of(self, layer: int, head: int) -> str:
        return self._policies[layer, head]

    def heads_with(self, policy: str) -> list[tuple[int, int]]:
        """Heads ``(layer, head)`` that get ``policy``, in layer-major order."""
        check_policy(policy)
        return [tuple(int(i) for i in index) for index in np.argwhere(self._policies == policy)]

    def layer_groups(self, layer: int) -> dict[str, list[int]]:
        """``policy -> heads`` of one layer, for the policies that occur in it."""
        groups: dict[str, list[int]] = {}
        for head, policy in enumerate(self._policies[layer]):
            groups.setdefault(policy, []).append(head)
        return groups

    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def describe(self) -> str:
        """One line: how many heads get each policy that is used."""
        used = [f"{policy}={count}" for policy, count in self.counts().items() if count and policy != "keep"]
        return ", ".join(used) if used else "all heads keep"

    def to_dict(self) -> dict[str, Any]:
        """The record every output carries: the rules and the resulting head -> policy map."""
        return {
            "rules": [rule.to_dict() for rule in self.rules],
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "policies": {
                head_name(layer, head): self._policies[layer, head]
                for layer in range(self.num_layers)
                for head in range(self.num_heads)
                if self._policies[layer, head] != "keep"
            },
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeadPlan) and np.array_equal(self._policies, other._policies)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"HeadPlan({self.num_layers}x{self.num_heads}: {self.describe()})"
