"""The seeds' table layouts from the tidy table (``load_sweep``), as DataFrames, markdown and LaTeX.

- ``plan_grid``: Guan et al. 2020 Tables 2 and 3: one row per plan; one column per head selector the
  plans use (``cluster:diagonal`` -> ``diagonal``) with what the plan does to those heads (``✓`` keep,
  ``✗`` prune, ``1/L`` uniform, ``-intra`` / ``-inter``); then each metric as
  ``value (delta [CI low, CI high])`` with ``*`` (adjusted p < 0.05) or ``**`` (< 0.01).
- ``head_grid``: a head sweep as layers x heads of the delta, significance marked the same way.
- ``seeds_grid``: the same configuration over several fine-tuning seeds, each metric as
  ``mean (delta mean [t-CI low, high])``.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

SYMBOLS = {"keep": "✓", "prune": "✗", "uniform": "1/L", "drop_intra": "-intra", "drop_inter": "-inter", "mean": "μ",
           "resample": "↻", "optimal": "c*"}


def significance(p_adjusted: float) -> str:
    if not np.isfinite(p_adjusted):
        return ""
    return "**" if p_adjusted < 0.01 else "*" if p_adjusted < 0.05 else ""


def in_percent(frame: pd.DataFrame, metric: str) -> bool:
    """Whether ``metric`` is a SQuAD score, which is in percent: ``exact_match`` / ``f1`` (and their
    ``has_ans_`` / ``no_ans_`` parts) of a frame whose task reports ``exact_match``; GLUE's f1 is in [0, 1]."""
    squad = frame["metric"].str.endswith("exact_match").any()
    return bool(squad) and metric.endswith(("exact_match", "f1"))


def decimals_for(values: pd.Series, percent: bool) -> int:
    """2 decimals for scores in percent (SQuAD's), 4 for scores in [0, 1] and losses; more (up to 6) when the
    smallest non-zero value would show fewer than 2 significant digits (a converged baseline's loss of 0.005)."""
    magnitudes = values.abs()
    digits = 2 if percent else 4
    smallest = magnitudes[magnitudes > 0].min()
    if np.isfinite(smallest):
        digits = max(digits, min(6, 1 - int(np.floor(np.log10(smallest)))))
    return digits


def describe_cell(row: pd.Series, digits: int) -> str:
    """``value (delta [low, high])*``; the baseline plan shows its value only."""
    if not np.isfinite(row["value"]):
        return "n/a"
    if row["heads"] == 0:
        return f"{row['value']:.{digits}f}"
    if not np.isfinite(row["delta"]):
        return f"{row['value']:.{digits}f} (n/a)"
    ci = f" [{row['ci_low']:+.{digits}f}, {row['ci_high']:+.{digits}f}]" if np.isfinite(row["ci_low"]) else ""
    return f"{row['value']:.{digits}f} ({row['delta']:+.{digits}f}{ci}){significance(row['p_adjusted'])}"


def plan_legend(confidence: float, correction: str, intervals: str = "per_comparison") -> str:
    """How ``describe_cell``'s cells read, for a table's caption: what the CIs and the stars each control."""
    adjusted = {"holm": "Holm-adjusted ", "bh": "Benjamini-Hochberg-adjusted "}.get(correction, "")
    if intervals == "simultaneous":
        kind = f"{confidence * 100:g}% simultaneous CI, Bonferroni over the table's plans"
        note = ""
    else:
        kind = f"{confidence * 100:g}% CI"
        note = (f"; each CI is per comparison while the p-values are {adjusted.strip() or 'unadjusted'}: a CI that "
                "excludes 0 need not come with a star (report.ci=simultaneous adjusts the intervals too)"
                if adjusted else "")
    return f"value (delta [{kind}]); * / ** {adjusted}p < 0.05 / 0.01{note}"


def _rules(readable: str) -> list[tuple[str, list[str]]]:
    """``[(policy, [selector tokens])]`` of ``readable_rules`` text."""
    if readable == "keep":
        return []
    out = []
    for part in readable.split("; "):
        policy, _, heads = part.partition(" ")
        out.append((policy, heads.split(",")))
    return out


_BLOCK = re.compile(r"^(?:L(\d+)(?:-(\d+))?)?(?:H(\d+)(?:-(\d+))?)?$")  # L3, L2-5, L3H7, L2-5H0-3, H1, H0-3


def _block(token: str) -> tuple[set[int] | None, set[int] | None] | None:
    """``(layers, heads)`` of a layer / head selector token, None standing for every layer or head (``all``: both;
    ``H1``: head 1 of every layer); None for other tokens (``cluster:dense``, ``top:5``), which match only
    themselves."""
    if token == "all":
        return None, None
    match = _BLOCK.match(token)
    if match is None or not token:
        return None
    first, last, head, head_last = match.groups()
    layers = None if first is None else set(range(int(first), int(last or first) + 1))
    return layers, None if head is None else set(range(int(head), int(head_last or head) + 1))


def _overlap(column: str, token: str) -> str | None:
    """How a rule's ``token`` covers a grid ``column``'s heads: ``"all"``, ``"part"`` or None."""
    if column == token:
        return "all"
    mine, theirs = _block(column), _block(token)
    if mine is None or theirs is None:
        return None
    meet = [a is None or b is None or bool(a & b) for a, b in zip(mine, theirs)]
    if not all(meet):
        return None
    inside = [b is None or (a is not None and a <= b) for a, b in zip(mine, theirs)]
    return "all" if all(inside) else "part"


def _column_cell(column: str, rules: list[tuple[str, list[str]]]) -> str:
    """What a plan does to a column's heads: the symbol of the rule that covers them all (the last such, as later
    rules win), or ``✗ (part)`` when a rule reaches only some of them (``prune L0`` under column ``L0H0`` is ``✗``,
    ``prune L0H0`` under ``L0`` is ``✗ (part)``); ``✓`` when none does."""
    cell = SYMBOLS["keep"]
    for policy, tokens in rules:
        cover = {_overlap(column, token) for token in tokens}
        symbol = SYMBOLS.get(policy, policy)
        if "all" in cover:
            cell = symbol
        elif "part" in cover:
            cell = f"{symbol} (part)"
    return cell


def _column_order(token: str) -> tuple:
    """Selector columns: named ones (``cluster:``) first, as they come, then ``all``; layer and head blocks by layer
    (every layer first), then head."""
    block = _block(token)
    if block is None:
        return (0, 0, 0)
    layers, heads = block
    return (1, -1 if layers is None else min(layers), -1 if heads is None else min(heads))


def plan_grid(frame: pd.DataFrame, split: str, metrics: list[str]) -> pd.DataFrame:
    """One row per plan of ``frame`` (one checkpoint's evaluation jobs, in the frame's order) on ``split``."""
    rows = frame[(frame["split"] == split) & frame["family"].isin(["", "random"])]  # plans by name, not by head
    plans = list(dict.fromkeys(rows["plan"]))
    tokens = list(dict.fromkeys(t for r in dict.fromkeys(rows["rules"]) for _, ts in _rules(r) for t in ts))
    tokens = sorted(tokens, key=_column_order)  # stable: named selectors keep their order
    table = []
    for number, plan in enumerate(plans, start=1):
        mine = rows[rows["plan"] == plan]
        first = mine.iloc[0]
        line = {"id": number, "plan": plan}
        rules = _rules(first["rules"])
        line |= {t.removeprefix("cluster:"): _column_cell(t, rules) for t in tokens}
        for metric in metrics:
            cells = mine[mine["metric"] == metric]
            if len(cells):
                values = rows.loc[rows["metric"] == metric, "value"]
                line[metric] = describe_cell(cells.iloc[0], decimals_for(values, in_percent(rows, metric)))
        table.append(line)
    return pd.DataFrame(table)


def seeds_grid(seeds: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The across-seeds table for reading: one row per configuration (``keys`` but ``metric``), each metric as
    ``mean (delta mean [t-CI low, high])`` over the seeds (the baseline: its mean only); key columns that are the
    same in every row are left out, ``plan`` always stays."""
    by = [k for k in keys if k != "metric"]
    table = []
    for key, group in seeds.groupby(by, sort=False):
        line = dict(zip(by, key)) | {"seeds": int(group["seeds"].max())}
        for row in group.itertuples():
            task = seeds[seeds["task"] == row.task]
            digits = decimals_for(task.loc[task["metric"] == row.metric, "value_mean"], in_percent(task, row.metric))
            if not np.isfinite(row.value_mean):  # undefined for some seed (its note says so)
                line[row.metric] = "n/a"
                continue
            cell = f"{row.value_mean:.{digits}f}"
            if row.rules != "keep":
                low, high = f"{row.delta_ci_low:+.{digits}f}", f"{row.delta_ci_high:+.{digits}f}"
                cell += f" ({row.delta_mean:+.{digits}f} [{low}, {high}])"
            line[row.metric] = cell
        table.append(line)
    table = pd.DataFrame(table)
    varying = [k for k in by if k == "plan" or table[k].nunique() > 1]
    return table[varying + [c for c in table.columns if c not in by]]


def head_grid(frame: pd.DataFrame, split: str, metric: str, column: str = "delta") -> pd.DataFrame:
    """Layers x heads (or x 1 for whole layers) of ``column`` with significance marks, as text cells."""
    rows = frame[(frame["split"] == split) & (frame["metric"] == metric) & (frame["family"] != "")]
    digits = decimals_for(rows["value"], in_percent(frame[frame["task"].isin(rows["task"])], metric))
    whole_layers = rows["head"].isna().all()
    layers = sorted(int(x) for x in rows["layer"].unique())
    heads = [0] if whole_layers else sorted(int(x) for x in rows["head"].unique())
    grid = pd.DataFrame("", index=[f"L{l}" for l in layers], columns=["layer"] if whole_layers else
                        [f"H{h}" for h in heads])
    for _, row in rows.iterrows():
        column_name = "layer" if whole_layers else f"H{int(row['head'])}"
        grid.loc[f"L{int(row['layer'])}", column_name] = f"{row[column]:+.{digits}f}{significance(row['p_adjusted'])}"
    return grid


def head_matrix(frame: pd.DataFrame, split: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(deltas, significant) ``[layers, heads or 1]`` of a head sweep, NaN / False where a plan is missing."""
    rows = frame[(frame["split"] == split) & (frame["metric"] == metric) & (frame["family"] != "")]
    whole_layers = rows["head"].isna().all()
    shape = (int(rows["layer"].max()) + 1, 1 if whole_layers else int(rows["head"].max()) + 1)
    delta, significant = np.full(shape, np.nan), np.zeros(shape, dtype=bool)
    for _, row in rows.iterrows():
        at = (int(row["layer"]), 0 if whole_layers else int(row["head"]))
        delta[at] = row["delta"]
        significant[at] = np.isfinite(row["p_adjusted"]) and row["p_adjusted"] < 0.05
    return delta, significant


def to_markdown(table: pd.DataFrame, index: bool = False) -> str:
    return table.to_markdown(index=index, disable_numparse=True) + "\n"  # cells are formatted text


def to_latex(table: pd.DataFrame, caption: str, index: bool = False) -> str:
    """A ``table`` environment (booktabs) with the text escaped for LaTeX."""
    text = table.to_latex(index=index, escape=True, caption=caption, position="t")
    return text.replace("✓", r"\checkmark{}").replace("✗", r"$\times$")


def clark_layout(table: pd.DataFrame) -> pd.DataFrame:
    """Clark et al.'s Table 1: relation, head (direction), accuracy, baseline (offset), with our CI and p-value; a
    head as right as others says how many (``L0H2 (head->dep), 1 of 26 tied``: it is named as the first of them)."""
    return pd.DataFrame({
        "relation": table["relation"], "words": table["count"],
        "head": [f"{head} ({direction})" + (f", 1 of {tied} tied" if tied > 1 else "")
                 for head, direction, tied in zip(table["head"], table["direction"], _tied(table))],
        "accuracy": (100 * table["accuracy"]).map("{:.1f}".format),
        "baseline": [f"{100 * a:.1f} ({o:+d})" for a, o in zip(table["baseline_accuracy"], table["baseline_offset"])],
        "difference [CI]": [f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" if np.isfinite(lo) else
                            f"{100 * d:+.1f} [n/a]"
                            for d, lo, hi in zip(table["difference"], table["ci_low"], table["ci_high"])],
        "p (Holm)": table["p_adjusted"].map(lambda p: "n/a" if np.isnan(p) else f"{p:.3g}")})


def _tied(table: pd.DataFrame) -> list[int]:
    """The heads as right as the one named, per row (1 for a table written before headlab counted them)."""
    return [int(n) for n in table["tied"]] if "tied" in table else [1] * len(table)
