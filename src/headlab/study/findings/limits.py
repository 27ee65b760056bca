"""A model at its floor or ceiling: no ablation can show what its heads do, so no ablation claim gets a verdict.

The baseline is each fine-tuned model unablated on the tables' examples (``tables/table2/<model>/baseline``): its
main metric with a bootstrap CI over those examples (the tables' report settings: the same resamples, seed and
method as the tables' deltas). The model is **at its floor** when that CI reaches chance (``low <= chance``,
``headlab.study.findings.chance``: what a model that learned nothing scores) and **at its ceiling** when it
reaches the metric's maximum (``high >= maximum``: 100 for SQuAD's scores, 1 for GLUE's). A loss has neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headlab.reporting.statistics import value_interval
from headlab.study.findings.chance import chance_level
from headlab.study.findings.inputs import StudyFiles
from headlab.study.findings.verdicts import interval

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

    def reason(self) -> str:
        """Why the ablation claims of this model are not tested ("" when they are)."""
        if self.kind == "floor":
            return (f"{self.model}'s baseline is at its floor: {self.numbers()} reaches chance "
                    f"{self.chance:.{self.digits}f} ({self.chance_is}), so its heads have nothing to lose")
        if self.kind == "ceiling":
            return (f"{self.model}'s baseline is at its ceiling: {self.numbers()} reaches the maximum "
                    f"{self.maximum:g}, so its drops are compressed and gains cannot show")
        return ""


def baseline_limits(files: StudyFiles) -> dict[str, Limit]:
    """Each fine-tuned model's ``Limit``, of those whose tables' baseline records are there."""
    limits = {}
    for model in files.models:
        job = files.job("tables", "table2", model, "baseline")
        if job is None or not (job / "records.parquet").is_file():
            continue
        records = files.records(job)
        if len(records) < 2:
            continue
        value, low, high = value_interval(files.metric, records, files.resampling)
        golds = files.gold_answers(list(records["id"])) if "exact_match" in records else None
        found = chance_level(files.metric, records, golds, files.version)
        chance, chance_is = found if found else (None, "")
        maximum = files.scale if files.metric.endswith(BOUNDED) else None
        limits[model] = Limit(model, files.metric, value, low, high, len(records),
                              files.link(job / "records.parquet"), chance, chance_is, maximum)
    return limits


def limit_reasons(files: StudyFiles) -> dict[str, str]:
    """``model -> why its ablation claims are not tested``, of the models at their floor or ceiling."""
    return {model: limit.reason() for model, limit in baseline_limits(files).items() if limit.kind}
