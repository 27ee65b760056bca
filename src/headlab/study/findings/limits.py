"""A model at its floor or ceiling: no ablation can show what its heads do, so no ablation claim gets a verdict.

The baseline is each fine-tuned model unablated on the tables' examples (``tables/table2/<model>/baseline``), or,
in a study that ran no tables, on the single-head sweep's (``sweep``, then ``robustness``: the baseline records its
jobs name), else on the gates stage's (the baseline rows of an L0, CHG or optimal job's records): its main metric
with a bootstrap CI over those examples (the tables' report settings: the same resamples, seed and method as the
tables' deltas). The model is **at its floor** when that CI reaches chance
(``low <= chance``, ``headlab.tasks.chance``: what a model that learned nothing scores) and **at its
ceiling** when it reaches the metric's maximum (``high >= maximum``: 100 for SQuAD's scores, 1 for GLUE's). A loss
has neither. A model with none of these baselines gets no ablation verdict either: nothing says it learned its task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from headlab.files import read_json
from headlab.reporting.value_intervals import value_interval
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import interval
from headlab.tasks.chance import chance_level

BOUNDED = ("accuracy", "f1", "exact_match", "matthews", "pearson", "spearman")  # metrics whose maximum is the scale


@dataclass(frozen=True)
class Limit:
    """One model's baseline against chance and the maximum."""

    model: str
    metric: str
    value: float
    low: float
    high: float
    examples: int
    file: str  # the baseline's records, relative to the study
    chance: float | None  # None: the metric has no chance level (a loss) or its inputs are missing
    chance_is: str  # "the majority class (1) for every example"
    maximum: float | None

    @property
    def kind(self) -> str:
        """``floor``, ``ceiling`` or ``""`` (neither); an undefined CI is read as its point, an undefined value (r of
        constant predictions) as the floor."""
        if math.isnan(self.value) and self.chance is not None:
            return "floor"
        low = self.value if math.isnan(self.low) else self.low
        high = self.value if math.isnan(self.high) else self.high
        if self.chance is not None and low <= self.chance:
            return "floor"
        if self.maximum is not None and high >= self.maximum:
            return "ceiling"
        return ""

    @property
    def digits(self) -> int:
        return 2 if self.maximum == 100 else 4

    def numbers(self) -> str:
        return (f"{self.metric} {interval(self.value, self.low, self.high, self.digits, sign=False)} (bootstrap CI "
                f"over {self.examples} examples, `{self.file}`)")

    def reason(self, ablation: bool = True) -> str:
        """Why the ablation claims (``ablation``) or the fine-tuning claims of this model are not tested ("" when
        they are: a model at its ceiling learned its task)."""
        if self.kind == "floor":
            why = "its heads have nothing to lose" if ablation else "it learned nothing its heads' changes could show"
            return (f"{self.model}'s baseline is at its floor: {self.numbers()} reaches chance "
                    f"{self.chance:.{self.digits}f} ({self.chance_is}), so {why}")
        if not ablation:
            return ""
        if self.kind == "ceiling":
            return (f"{self.model}'s baseline is at its ceiling: {self.numbers()} reaches the maximum "
                    f"{self.maximum:g}, so its drops are compressed and gains cannot show")
        return ""


def baseline_limits(files: StudyFiles) -> dict[str, Limit]:
    """Each fine-tuned model's ``Limit``, of those whose baseline records are there (``baseline_records``)."""
    limits = {}
    for model in files.models:
        found = baseline_records(files, model)
        if found is None:
            continue
        path, plans = found
        records = pd.read_parquet(path)
        if plans is not None:  # a gates job's records: the baseline's rows have no plan
            records = records[records[plans].isna()].reset_index(drop=True)
        if "split" in records:  # an eval job's records (a baseline cache's hold one split)
            records = records[records["split"] == files.split].reset_index(drop=True)
        if len(records) < 2:
            continue
        value, low, high = value_interval(files.metric, records, files.resampling)
        golds = files.gold_answers(list(records["id"])) if "exact_match" in records else None
        found = chance_level(files.metric, records, golds, files.version)
        chance, chance_is = found if found else (None, "")
        maximum = files.scale if files.metric.endswith(BOUNDED) else None
        shown = files.link(path) if path.is_relative_to(files.folder) else str(path)
        limits[model] = Limit(model, files.metric, value, low, high, len(records), shown, chance, chance_is, maximum)
    return limits


GATES_BASELINES = (("l0", "penalty"), ("chg", "plan"), ("optimal", "policy"))  # a gates job, its records' plan column


def baseline_records(files: StudyFiles, model: str) -> tuple[Path, str | None] | None:
    """The records of ``model`` unablated, and the column whose empty rows are the baseline's (None: every row): the
    tables' baseline job's, else those a single-head sweep job of the study names (``baseline_records`` of its
    split: the sweep stage's, then the robustness stage's prune sweep), else a gates job's (its first eval split)."""
    job = files.job("tables", "table2", model, "baseline")
    if job is not None and (job / "records.parquet").is_file():
        return job / "records.parquet", None
    for parts in (("sweep", model), ("robustness", "sweep_prune", model)):
        job = files.job(*parts)
        for result in [] if job is None else sorted(job.glob("*/results.json")):
            path = (read_json(result, "results").get("baseline_records") or {}).get(files.split)
            if path and Path(path).is_file():
                return Path(path), None
    for method, plans in GATES_BASELINES:
        job = files.job("gates", method, model)
        if job is not None and (job / "records.parquet").is_file():
            return job / "records.parquet", plans
    return None


def limit_reasons(files: StudyFiles, limits: dict[str, Limit] | None = None) -> dict[str, str]:
    """``model -> why its ablation claims are not tested``: the models at their floor or ceiling, and those without
    a baseline to tell (``limits``: ``baseline_limits``, when already found)."""
    limits = baseline_limits(files) if limits is None else limits
    reasons = {model: limit.reason() for model, limit in limits.items() if limit.kind}
    for model in files.models:
        if model not in limits:
            reasons[model] = (f"no baseline of {model} in this run's stages (the tables', the single-head sweep's or "
                              "the gates jobs' records) says whether it learned its task, so no ablation of it can be "
                              "read")
    return reasons


def floor_reasons(limits: dict[str, Limit]) -> dict[str, str]:
    """``model -> why its fine-tuning claims are not tested``: the models at their floor."""
    return {model: limit.reason(ablation=False) for model, limit in limits.items() if limit.kind == "floor"}
