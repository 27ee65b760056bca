"""Each head type's removal beside random head sets of its size (the controls stage).

A type's removal costs more the more heads it has (Guan et al.'s dense type has three times the vertical one's), so
"removing this type costs more than that one" does not say the type matters. The control: ``sweep.draws`` random
sets of as many heads as the type, under the same policy, on the same examples. The type's **percentile** is the
share of the random sets it costs more than (ties count half); its **rank p-value** of costing more than heads taken
at random is ``(1 + #{random set costs at least as much}) / (R + 1)``, an exact test given the examples (so fewer than
19 sets cannot decide at 0.05). Whether it carries over to other examples is the paired bootstrap CI (by the
task's clusters of examples) of its **excess**, ``(metric(type removed) - mean over the sets of metric(set
removed)) / metric(baseline)``, which must lie below 0 too. A Table 2 ordering says the type it removes matters: it
holds only when that type also costs more than the random sets (each test at alpha: all must hold, so none is
adjusted for the others; the few distinct controls of a table are not adjusted across each other either).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from headlab.files import read_json
from headlab.reporting.value_intervals import area_difference_interval, metric_value
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import HOLDS, INCONCLUSIVE, interval

TYPE_POLICIES = ("prune", "uniform")  # Table 2's plans: {policy}_{type}


@dataclass(frozen=True)
class TypeControl:
    """What removing one type cost beside random sets of its size, on the random sets' examples."""

    model: str
    policy: str
    type: str
    size: int  # the type's heads
    value: float  # the main metric with the type removed, on the controls' examples
    random: tuple[float, ...]  # the main metric with each random set removed
    examples: int
    file: str  # the controls job, relative to the study
    excess: tuple[float, float, float] | None = None  # (value, low, high): (type - random mean) / baseline, its CI

    @property
    def percentile(self) -> float:
        """The share (in %) of the random sets the type costs more than, ties counting half."""
        random = np.asarray(self.random)
        return 100.0 * (np.sum(random > self.value) + 0.5 * np.sum(random == self.value)) / len(random)

    @property
    def p_value(self) -> float:
        """Rank p-value of "the type costs more than random sets of its size"."""
        return (1 + int(np.sum(np.asarray(self.random) <= self.value))) / (len(self.random) + 1)

    def describe(self, digits: int) -> str:
        low, high = min(self.random), max(self.random)
        heads = f"{self.size} head{'s' if self.size != 1 else ''}"
        return (f"{self.policy} of the {heads} of type {self.type}: {self.value:.{digits}f} on the controls' "
                f"{self.examples} examples, at the {ordinal(self.percentile)} percentile of the costs of "
                f"{len(self.random)} random sets of {heads} ({low:.{digits}f} to {high:.{digits}f}, ties counting "
                f"half; rank p {self.p_value:.3g}){self.excess_text()}")

    def excess_text(self) -> str:
        if self.excess is None:
            return ""
        value, low, high = self.excess
        return (f"; (type - the sets' mean) / baseline {value:+.4f} [{low:+.4f}, {high:+.4f}] (paired bootstrap "
                "CI)")


def type_control(files: StudyFiles, model: str, plan: str) -> TypeControl | str:
    """The control of Table 2's ``plan`` (``prune_diagonal``) on ``model``, or why there is none."""
    policy, _, type_name = plan.partition("_")
    if policy not in TYPE_POLICIES:
        return f"{plan} is no type's removal under {' or '.join(TYPE_POLICIES)}"
    job, tables = files.job("controls", policy, model), files.job("tables", "table2", model, plan)
    clusters = files.job("cluster", model)
    if job is None or tables is None or clusters is None:
        return f"no random-set control of {plan} (the controls stage did not run on {model})"
    size = int((read_json(clusters / "clusters.json", "clusters").get("counts") or {}).get(type_name, 0))
    sets = read_json(job / "results.json", "random head sets").get("sets", {}).get(str(size))
    if not size or not sets:
        return f"no random-set control of {plan}: the controls have no sets of {size} heads"
    frames = [files.records(job / s["plan"]) for s in sets]
    ids = list(frames[0]["id"])
    removed = files.records(tables).set_index("id")
    missing = [i for i in ids if i not in removed.index]
    if missing:
        return (f"no random-set control of {plan}: the controls' example {missing[0]!r} is not among the tables' "
                "(give the controls stage the tables' examples or fewer)")
    own = removed.loc[ids].reset_index()
    base = files.job("tables", "table2", model, "baseline")
    excess = None
    if base is not None:
        baseline = files.records(base).set_index("id")
        if all(i in baseline.index for i in ids):
            excess = area_difference_interval(files.metric, baseline.loc[ids].reset_index(), [own],
                                              [[frame] for frame in frames], files.resampling)
    return TypeControl(model, policy, type_name, size, metric_value(files.metric, own),
                       tuple(metric_value(files.metric, frame) for frame in frames), len(ids),
                       files.link(job), excess)


def controls_of(files: StudyFiles, types: list[str]) -> list[TypeControl]:
    """Every control the study ran: per model, policy and type (of Guan et al.'s types, those Table 2's orderings say
    matter: another type of the same size has sets of its size too, but no claim reads it)."""
    from headlab.study.stages import CONTROLLED, GUAN_TYPES

    found = []
    for model in files.models:
        for policy in TYPE_POLICIES:
            for name in CONTROLLED[policy] if sorted(types) == sorted(GUAN_TYPES) else types:
                control = type_control(files, model, f"{policy}_{name}")
                if isinstance(control, TypeControl):
                    found.append(control)
    return found


def controlled(files: StudyFiles, model: str, removed: str, outcome: str, notes: list[str], values: dict) -> str:
    """A Table 2 ordering's verdict once ``removed``'s type is set beside random sets of its size (``controls``):
    "holds" needs the type to cost more than them too. The control's numbers go into ``notes`` and ``values``."""
    control = type_control(files, model, removed)
    alpha = 1 - files.resampling.confidence
    if isinstance(control, TypeControl):
        digits = 2 if files.scale == 100 else 4
        notes.append("control: " + control.describe(digits))
        values["control"] = {"percentile": control.percentile, "p_value": control.p_value,
                             "draws": len(control.random), "size": control.size, "examples": control.examples,
                             "value": control.value, "excess": None if control.excess is None
                             else dict(zip(("value", "low", "high"), control.excess))}
        why = control_shortfalls(control, alpha) if outcome == HOLDS else []
        if why:
            notes.append(f"the ordering holds, but {removed} is not shown to cost more than as many heads taken at "
                         f"random ({'; '.join(why)}): the type is not shown to matter")
            return INCONCLUSIVE
        return outcome
    if outcome == HOLDS:
        notes.append(f"the ordering holds, but {control}: the type is not shown to matter more than as many random "
                     "heads")
        return INCONCLUSIVE
    return outcome


def control_shortfalls(control: TypeControl, alpha: float) -> list[str]:
    """Why ``control`` does not show its type costing more than random sets of its size at ``alpha``, if it does not:
    its rank p above alpha (and whether so few sets could reach it), its excess's CI reaching 0 or missing."""
    why = []
    if control.p_value > alpha:
        draws, needed = len(control.random), math.ceil(1 / alpha) - 1
        why.append(f"rank p {control.p_value:.3g} > {alpha:.3g}" + (
            f"; {draws} sets cannot reach it, study.controls.sweep.draws={needed} or more can"
            if 1 / (draws + 1) > alpha * (1 + 1e-9) else ""))
    if control.excess is None:
        why.append("its excess over the sets has no interval: the tables' baseline lacks the controls' examples")
    elif not control.excess[2] < 0:
        why.append(f"its excess over the sets' mean, {interval(*control.excess, 4)} of the baseline, reaches 0: it "
                   "may not carry over to other examples")
    return why


def ordinal(value: float) -> str:
    """``92`` -> ``92nd``, ``11`` -> ``11th``, ``1`` -> ``1st`` (a percentile, rounded to a whole number)."""
    number = round(value)
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"
