"""A report draws the metric against the number of heads only for plans that add heads to each other."""

import pandas as pd

from headlab.reporting.report import is_dose_series


def plans(*changed: str) -> pd.DataFrame:
    return pd.DataFrame({"changed": list(changed)})


def test_nested_plans_are_a_series():
    assert is_dose_series(plans("L0H1", "L0H1,L2H3", "L0H1,L1H0,L2H3"))
    assert is_dose_series(plans("L0H1,L2H3", "L0H1", "L0H1,L1H0,L2H3", "L0H1"))  # any order, rows repeated by metric


def test_plans_of_unrelated_head_types_are_not():
    assert not is_dose_series(plans("L0H0", "L1H0,L1H1", "L2H0,L2H1,L2H2"))  # Table 2: one type each
    assert not is_dose_series(plans("L0H1", "L0H1,L2H3"))  # two sizes make no curve
    assert not is_dose_series(plans("L0H1", "L0H2", "L0H1,L0H2,L0H3"))  # two plans of one size
