"""What the study's report is made of: ``StudyReport`` collects the markdown, the terminal's lines, the numbers for
``study.json`` and the figures and tables for W&B, section by section (``report_types``, ``report_heads``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from headlab.files import read_json
from headlab.study.stages import MARKER, Study


@dataclass
class StudyReport:
    """What the report says: markdown lines, the terminal's summary lines, and the numbers for ``study.json``."""

    study: Study
    markdown: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    images: dict[str, Path] = field(default_factory=dict)  # W&B key -> figure
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # W&B key -> table
    closing: list[str] = field(default_factory=list)  # the terminal's last lines: findings and caveats
    stale: frozenset[str] = frozenset()  # stages whose files are of other settings: read as not run
    stale_reads: dict[str, str] = field(default_factory=dict)  # stale stage -> the stale stage whose files it read

    def path(self, *parts: str) -> Path:
        return self.study.folder.joinpath(*parts)

    def link(self, path: Path) -> str:
        return str(path.relative_to(self.study.folder))

    def section(self, title: str) -> None:
        self.markdown += ["", f"## {title}", ""]

    def missing(self, stage: str) -> None:
        if stage in self.stale_reads:
            read = self.stale_reads[stage]
            self.markdown.append(f"_Left out: the {stage} stage read the {read} stage's files, which are of other "
                                 f"settings or inputs now; run {read} and {stage} again._")
        elif stage in self.stale:
            self.markdown.append(f"_Left out: the {stage} stage's files were computed with other settings or inputs; "
                                 "run that stage again._")
        else:
            self.markdown.append(f"_Not run: the {stage} stage has no results in this study's folder._")

    def left_out(self, stage: str) -> bool:
        """Whether ``stage``'s files are of other settings (said in the report where the section would be)."""
        if stage in self.stale:
            self.missing(stage)
        return stage in self.stale

    def sources(self, stage: str, file: str, names: list[str] | None = None) -> list[tuple[str, Path]]:
        """``(name, path)`` of each model's ``<stage>/<name>/<file>`` that exists and is a job of the stage's last
        run (its ``stage.json``: a job of another configuration in the folder, seed1 of an earlier two-seed run, is
        not this study's); none: the stage is said missing."""
        names = [name for name, _ in self.study.models] if names is None else names
        jobs = self.stage_jobs(stage)
        found = [(name, self.path(stage, name, file)) for name in names
                 if f"{stage}/{name}" in jobs and self.path(stage, name, file).is_file()]
        if not found:
            self.missing(stage)
        return found

    def stage_jobs(self, stage: str) -> set[str]:
        """The job folders (relative to the study) of ``stage``'s last finished run, from its marker."""
        path = self.path(stage, MARKER)
        if stage in self.stale or not path.is_file():
            return set()
        return set(read_json(path, "stage marker").get("key", {}).get("jobs", {}))

    def figure(self, path: Path, alt: str) -> None:
        if path.is_file():
            self.markdown += ["", f"![{alt}]({self.link(path)})"]
            self.images[self.link(path).removesuffix(".png").replace("/", "_")] = path


def number(value: float) -> str:
    return f"{value:.4f}" if np.isfinite(value) else "n/a"


def main_metric(study: Study) -> str:
    return str(study.cfg.task.main_metric)
