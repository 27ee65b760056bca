"""The ``features`` section of ``conf/ablate.yaml`` (``mode=features``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from headlab.errors import UserError, one_of

FEATURE_FAMILIES = ("distance", "clark", "sieve", "js")  # types.features.FAMILIES (no torch here)
CORRECTIONS = ("holm", "bh", "none")


@dataclass
class FeaturesConfig:
    """Attention features of every head over a task split or a text file (DESIGN.md section 5)."""

    text_file: str | None = None  # one sequence per line, or tab-separated pairs; null: the task's split
    split: str = "validation"  # the task split (train, or one of task.eval_splits) when text_file is null
    max_sequences: int | None = 1000  # a seeded random sample of the split's examples / the file's lines (null: all)
    families: list[str] = field(default_factory=lambda: list(FEATURE_FAMILIES))
    js_max_sequences: int | None = None  # JS over the first N sequences only (it costs (L H)^2 n^2 per sequence)
    batch_size: int = 16
    max_length: int | None = None  # text_file: tokens per sequence (null: the model's maximum); longer: truncated
    sieve_tau: float = 3.0  # a head has a sieve role when its mean score is above tau (Pande et al. 2021: 3)
    sieve_alpha: float = 0.05  # one-sided one-sample t-test over sequences, at this level
    sieve_correction: str = "holm"  # holm | bh | none, across every head and role

    def __post_init__(self) -> None:
        if not self.families:
            raise UserError(f"features.families is empty; choose from {', '.join(FEATURE_FAMILIES)}")
        for family in self.families:
            one_of("features.families entry", family, FEATURE_FAMILIES)
        one_of("features.sieve_correction", self.sieve_correction, CORRECTIONS)
        for key in ("max_sequences", "js_max_sequences"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise UserError(f"features.{key}={value} must be at least 1 (or null: all)")
        if self.batch_size < 1:
            raise UserError(f"features.batch_size={self.batch_size} must be at least 1")
        if self.max_length is not None and self.max_length < 3:
            raise UserError(f"features.max_length={self.max_length} must be at least 3 ([CLS] x [SEP])")
        if self.sieve_tau <= 0:  # scores are ratios to uniform attention (>= 0): a role needs a positive bar
            raise UserError(f"features.sieve_tau={self.sieve_tau} must be above 0 (uniform attention scores 1; "
                            "Pande et al.: 3)")
        if not 0 < self.sieve_alpha < 1:
            raise UserError(f"features.sieve_alpha={self.sieve_alpha} must be in (0, 1)")


MAX_BOOTSTRAP_FITS = 100  # each fit's type plans are evaluated again by the study: more is hours, not precision


@dataclass
class ClusterConfig:
    """Head types by clustering distance features (Guan et al. 2020)."""

    features: str | None = None  # a mode=features job directory (or its features.npz)
    k: int = 4  # clusters; 4 are named dense / diagonal / dense_vertical / vertical when the profiles match
    method: str = "kmeans"  # kmeans | gmm (Gaussian mixture)
    names: list[str] | None = None  # name the clusters by hand (k names, in the order cluster0..k-1)
    stability_fits: int = 10  # Guan et al. Table 1: fits on random halves
    stability_split: str = "sequences"  # halves of the sequences (features recomputed) | of the heads
    stability_repeats: int = 0  # the whole procedure again with other seeds: the spread of its stability
    bootstrap_fits: int = 0  # fits on bootstrap resamples of the sequences: their labels in refits.json
    perplexity: float = 30.0  # t-SNE (capped below the number of heads)
    min_stability: float | None = 0.9  # a note when the stability is lower (Guan et al. Table 1: 94-96%)

    def __post_init__(self) -> None:
        one_of("cluster.method", self.method, ("kmeans", "gmm"))
        one_of("cluster.stability_split", self.stability_split, ("sequences", "heads"))
        if self.k < 2:
            raise UserError(f"cluster.k={self.k} must be at least 2")
        if self.stability_fits < 2:
            raise UserError(f"cluster.stability_fits={self.stability_fits} must be at least 2")
        if self.stability_repeats < 0:
            raise UserError(f"cluster.stability_repeats={self.stability_repeats} must be 0 (none) or more")
        if not 0 <= self.bootstrap_fits <= MAX_BOOTSTRAP_FITS:
            raise UserError(f"cluster.bootstrap_fits={self.bootstrap_fits} must be in 0..{MAX_BOOTSTRAP_FITS} (0: "
                            "none; the study reruns its type plans under each fit)")
        if not self.perplexity > 0:
            raise UserError(f"cluster.perplexity={self.perplexity} must be > 0")
        if self.min_stability is not None and not 0 <= self.min_stability <= 1:
            raise UserError(f"cluster.min_stability={self.min_stability} must be in [0, 1] (or null: no note)")


@dataclass
class CompareConfig:
    """Head types of two or more models side by side (Guan et al. 2020, Fig. 4 and Table 1)."""

    runs: list[str] = field(default_factory=list)  # mode=cluster job directories (or their clusters.json)
    names: list[str] | None = None  # a label per run (null: model and checkpoint, and what else differs)
    syntax: list[str] | None = None  # a mode=syntax job per run, in the runs' order: their syntactic roles too
