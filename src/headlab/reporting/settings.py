"""The choices of a report's settings (a light module: the config checks import it before anything heavy)."""

CI_METHODS = ("bca", "percentile", "basic")  # as scipy.stats.bootstrap's ``method``
CI_KINDS = ("per_comparison", "simultaneous")  # each CI at its level, or Bonferroni-adjusted over a family
CORRECTIONS = {"holm": "holm", "bh": "fdr_bh", "none": None}  # name -> statsmodels multipletests method
FIGURE_FORMATS = ("png", "pdf", "svg")
