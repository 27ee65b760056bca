"""What the findings read: the files of the study's last run of each stage, and the settings that score them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headlab.files import read_json
from headlab.reporting.report import report_folder
from headlab.reporting.statistics import Resampling

MARKER = "stage.json"


@dataclass
class StudyFiles:
    """A study folder read as its stages' markers say: a job counts only when its stage's last run listed it."""

    folder: Path
    models: list[str]  # the fine-tuned models: seed0, seed1, ... (or checkpoint)
    metric: str  # the task's main metric
    split: str  # the first evaluation split
    scale: float  # the metric's maximum: 100 for SQuAD's percent scores, 1 for GLUE's
    resampling: Resampling  # the tables' report settings: CIs of the findings use the same
    reports: dict[str, tuple[Resampling, str]] = field(default_factory=dict)  # stage -> its reports' settings
    alpha: float = 0.05
    margin: float = 1.0  # points of a 0-100 score: a "no loss" claim's equivalence margin (study.findings.margin)
    smoke: bool = False  # a smoke run (study=quick): no claim gets a verdict
    version: str = "v1"  # SQuAD's (v2: unanswerable questions)
    answers: Callable[[], Mapping[str, Sequence[str]]] | None = None  # SQuAD: question id -> its gold answers
    stale: frozenset[str] = frozenset()  # stages whose files are of other settings: no job of theirs counts
    _jobs: dict[str, set[str]] = field(default_factory=dict)
    _answers: Mapping[str, Sequence[str]] | None = None

    def gold_answers(self, ids: list[str]) -> list[Sequence[str]] | None:
        """The gold answers of the questions ``ids`` (``answers``, read once); None when they cannot be read."""
        if self._answers is None and self.answers is not None:
            self._answers = self.answers()
        if self._answers is None or any(i not in self._answers for i in ids):
            return None
        return [self._answers[i] for i in ids]

    def absent(self, stage: str) -> str:
        """Why ``stage``'s files are not read: it did not run, or they are of other settings (stale)."""
        if stage in self.stale:
            return f"the {stage} stage's files are of other settings or inputs (left out; run it again)"
        return f"the {stage} stage did not run"

    def jobs(self, stage: str) -> set[str]:
        """The job folders (relative to the study) of ``stage``'s last finished run."""
        if stage not in self._jobs:
            path = self.folder / stage / MARKER
            marker = read_json(path, "stage marker") if path.is_file() and stage not in self.stale else {}
            self._jobs[stage] = set(marker.get("key", {}).get("jobs", {}))
        return self._jobs[stage]

    def job(self, *parts: str) -> Path | None:
        """The folder ``stage/.../job`` when it is a finished job of its stage's last run, else None."""
        name = "/".join(parts)
        path = self.folder / name
        return path if name in self.jobs(parts[0]) and (path / "results.json").is_file() else None

    def model_jobs(self, stage: str, models: list[str]) -> Iterator[tuple[str, Path]]:
        """``(model, folder)`` of each of ``models`` whose job of ``stage`` finished (``job``), in order."""
        for model in models:
            job = self.job(stage, model)
            if job is not None:
                yield model, job

    def report(self, *parts: str) -> Path | None:
        """The report folder (of the study's report settings) of a job's folder or of a table's model folder."""
        name = "/".join(parts)
        if not any(job == name or job.startswith(name + "/") for job in self.jobs(parts[0])):
            return None
        folder = report_folder(self.folder / name, *self.reports.get(parts[0], (self.resampling, "holm")))
        return folder if (folder / "table.csv").is_file() else None

    def records(self, job: Path) -> pd.DataFrame:
        """A ``mode=eval`` job's per-example records of the split the findings score."""
        frame = pd.read_parquet(job / "records.parquet")
        return frame[frame["split"] == self.split].reset_index(drop=True)

    def link(self, path: Path) -> str:
        return str(path.relative_to(self.folder))

    def points(self, value: float) -> float:
        """``value`` points of a 0-100 score on the metric's scale (1.5 points: 1.5 or 0.015)."""
        return value * self.scale / 100
