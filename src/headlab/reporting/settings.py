"""The choices of a report's settings (a light module: the config checks import it before anything heavy)."""

CI_METHODS = ("bca", "percentile", "basic")  # as scipy.stats.bootstrap's ``method``
CI_KINDS = ("per_comparison", "simultaneous")  # each CI at its level, or Bonferroni-adjusted over a family
CORRECTIONS = {"holm": "holm", "bh": "fdr_bh", "none": None}  # name -> statsmodels multipletests method
FIGURE_FORMATS = ("png", "pdf", "svg")
# Bootstrap resamples and permutations a config may ask for (report.*, syntax.resamples, shapley.resamples)
MAX_RESAMPLES = 100_000
RESAMPLES_WHY = (f"at {MAX_RESAMPLES} the resampling's own Monte Carlo error in a p-value or a CI's tail probability "
                 f"is at most 0.5/sqrt({MAX_RESAMPLES}) = 0.0016; more resamples only cost time and memory")
