"""The choices of a report's settings (a light module: the config checks import it before anything heavy)."""

CI_METHODS = ("bca", "percentile", "basic")  # as scipy.stats.bootstrap's ``method``
CORRECTIONS = {"holm": "holm", "bh": "fdr_bh", "none": None}  # name -> statsmodels multipletests method
FIGURE_FORMATS = ("png", "pdf", "svg")
