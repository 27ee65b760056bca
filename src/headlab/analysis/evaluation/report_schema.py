"""The ``report`` section of ``conf/ablate.yaml`` (``mode=report`` and the report at a multirun's end), typed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headlab.errors import UserError, check_seed, one_of, within
from headlab.reporting.settings import CI_KINDS, CI_METHODS, CORRECTIONS, FIGURE_FORMATS, MAX_RESAMPLES, RESAMPLES_WHY

HEAD_SOURCES = ("features", "clusters", "importance", "sweeps", "syntax", "label")


@dataclass
class ReportConfig:
    """``mode=report`` (and the report at the end of a multirun): statistics, correction, figure formats."""

    auto: bool = True  # report the sweep directory when a multirun of mode=eval / sweep_heads ends
    resamples: int = 10_000  # paired bootstrap resamples per delta
    permutations: int = 10_000  # paired permutation test swaps (exact when 2^examples is at most this)
    confidence: float = 0.95
    ci_method: str = "bca"  # bca | percentile | basic (as scipy.stats.bootstrap)
    correction: str = "holm"  # holm | bh (Benjamini-Hochberg) | none, across the plans of a sweep
    ci: str = "per_comparison"  # per_comparison | simultaneous (Bonferroni-adjusted over the plans of a sweep)
    seed: int = 0
    formats: list[str] = field(default_factory=lambda: ["png"])  # png, pdf, svg
    heads: list[Any] = field(default_factory=list)  # per-head tables: [{features, clusters, importance, sweeps,
    #                                                  syntax, label}]

    def __post_init__(self) -> None:
        for key in ("resamples", "permutations"):
            within(f"report.{key}", getattr(self, key), 1, MAX_RESAMPLES, RESAMPLES_WHY)
        if not 0 < self.confidence < 1:
            raise UserError(f"report.confidence={self.confidence} must be between 0 and 1 (e.g. 0.95)")
        one_of("report.ci_method", self.ci_method, CI_METHODS)
        one_of("report.correction", self.correction, CORRECTIONS)
        one_of("report.ci", self.ci, CI_KINDS)
        check_seed("report.seed", self.seed)
        for extension in self.formats:
            one_of("report.formats", extension, FIGURE_FORMATS)
        for entry in self.heads:
            if not isinstance(entry, dict) or not entry:
                raise UserError(f"report.heads entry {entry!r} must be a mapping of sources, e.g. "
                                "{features: DIR, clusters: DIR, importance: DIR, sweeps: [DIR], label: NAME}")
            for key in entry:
                one_of("report.heads key", key, HEAD_SOURCES)
