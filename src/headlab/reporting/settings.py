"""The choices of a report's settings (a light module: the config checks import it before anything heavy)."""

CI_METHODS = ("bca", "percentile", "basic")  # as scipy.stats.bootstrap's ``method``
CI_KINDS = ("per_comparison", "simultaneous")  # each CI at its level, or Bonferroni-adjusted over a family
CORRECTIONS = {"holm": "holm", "bh": "fdr_bh", "none": None}  # name -> statsmodels multipletests method
FIGURE_FORMATS = ("png", "pdf", "svg")
# Bootstrap resamples and permutations a config may ask for (report.*, syntax.resamples, shapley.resamples)
MAX_RESAMPLES = 100_000
RESAMPLES_WHY = (f"at {MAX_RESAMPLES} the resampling's own Monte Carlo error in a p-value or a CI's tail probability "
                 f"is at most 0.5/sqrt({MAX_RESAMPLES}) = 0.0016; more resamples only cost time and memory")
# The resamples and permutations below a study's verdicts (its tables, sweep and syntax stages): at 2000 the Monte Carlo
# error of a 95% CI's end (its 2.5% tail) and of a p-value near 0.05 stays well below the interval's width and alpha
MIN_RESAMPLES = 2000
MIN_RESAMPLES_WHY = ("a verdict reads the CI's ends and the p-value, and their own Monte Carlo error must stay well "
                     "below the interval's width: a 95% CI's end is the 2.5% quantile of the resamples, whose tail "
                     "has standard error sqrt(0.025*0.975/B), 0.0035 at 2000 (a seventh of the tail) and 0.011 at 200 "
                     "(almost half); a p-value near 0.05 has sqrt(0.05*0.95/B), 0.005 at 2000")
