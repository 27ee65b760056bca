"""ablate.py mode=importance end to end on a tiny_random checkpoint: the importance file and its estimators,
per-example rows, key types, heatmaps, agreement with a measured head sweep, and a selector that reads it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import scipy.stats
from conftest import run, wandb_log

from headlab.core.importance import normalize_importance


def test_importance_files_agree_with_their_rows_and_feed_selectors(trained, tmp_path):
    root, _ = trained
    sweep = tmp_path / "sweep"
    run("ablate.py", "mode=sweep_heads", "mask.policy=uniform", f"ckpt_path={root / 'train'}",
        f"hydra.run.dir={sweep}", cwd_tmp=root)
    out = tmp_path / "importance"
    args = ("mode=importance", f"ckpt_path={root / 'train'}", "importance.max_examples=50", "data.eval_batch_size=16",
            f"importance.sweep={sweep}", "importance.top_k=3", f"hydra.run.dir={out}", "logger=wandb")
    printed = run("ablate.py", *args, cwd_tmp=root).stdout
    assert b"key_types.table.json" in wandb_log(out) and b"agreement.table.json" in wandb_log(out)
    assert "Agreement with measured single-head ablations" in printed
    data = json.loads((out / "importance.json").read_text())
    assert data["settings"]["split"] == "train" and data["settings"]["num_examples"] == 50
    assert set(data["estimators"]) == {"example", "token", "batch", "fisher", "estimate_prune", "estimate_uniform",
                                       "estimate_drop_intra", "estimate_drop_inter"}

    rows = pd.read_parquet(out / "per_example.parquet")
    assert len(rows) == 50 * (2 + 4 + 4) and list(rows["example"].iloc[:50]) == list(range(50))
    heads = [c for c in rows.columns if c.startswith("L")]
    gate = rows[rows["quantity"] == "gate"][heads].to_numpy().reshape(50, 3, 4)
    np.testing.assert_allclose(data["raw"]["example"], np.abs(gate).mean(0), rtol=1e-12)
    np.testing.assert_allclose(data["importance"], normalize_importance(np.abs(gate).mean(0)), rtol=1e-12)
    np.testing.assert_allclose(data["estimators"]["fisher"], normalize_importance((gate ** 2).mean(0)), rtol=1e-12)
    np.testing.assert_allclose(data["estimators"]["estimate_prune"], -gate.mean(0), rtol=1e-9, atol=1e-15)
    keys = pd.read_csv(out / "key_types.csv")
    assert list(keys.columns) == ["head", "cls", "sep", "punct", "other"] and len(keys) == 12
    for name in ("importance_example.png", "importance_estimate_uniform.png", "key_sep.png", "agreement_uniform.png"):
        assert (out / name).stat().st_size > 5000

    measured = json.loads((sweep / "results.json").read_text())["tables"]["validation"]["loss"]["delta"]
    agreement = pd.read_csv(out / "agreement.csv")
    row = agreement[(agreement["estimator"] == "estimate_uniform") & (agreement["target"] == "loss increase")].iloc[0]
    x, y = np.ravel(data["raw"]["estimate_uniform"]), np.ravel(measured)
    assert abs(row["spearman"] - scipy.stats.spearmanr(x, y).statistic) < 1e-12
    assert abs(row["kendall"] - scipy.stats.kendalltau(x, y).statistic) < 1e-12
    top = lambda v: set(np.argsort(-v, kind="stable")[:3])  # noqa: E731  ties: the earlier head (equal deltas happen)
    assert row["top3_overlap"] == len(top(x) & top(y)) / 3
    assert "estimate_prune" not in set(agreement["estimator"])  # estimates meet the sweep of their own policy
    normalised = agreement[(agreement["scores"] != "raw") & (agreement["estimator"] == "fisher")
                           & (agreement["target"] == "loss increase")]
    assert list(normalised["scores"]) == ["normalised: layer L2, then global min-max"]
    x = np.ravel(data["estimators"]["fisher"])
    assert abs(normalised["spearman"].iloc[0] - scipy.stats.spearmanr(x, y).statistic) < 1e-12
    assert set(agreement[agreement["scores"] != "raw"]["estimator"]) == {"example", "token", "batch", "fisher"}

    assert "already done" in run("ablate.py", *args, cwd_tmp=root).stdout
    evaluated = tmp_path / "bottom"
    run("ablate.py", "mode=eval", "mask=prune", "mask.heads=bottom:2", f"mask.importance={out / 'importance.json'}",
        "mask.importance_estimator=fisher", f"ckpt_path={root / 'train'}", f"hydra.run.dir={evaluated}", cwd_tmp=root)
    plan = json.loads((evaluated / "results.json").read_text())["plan"]
    fisher = np.ravel(data["estimators"]["fisher"])
    expected = {f"L{i // 4}H{i % 4}" for i in np.argsort(fisher, kind="stable")[:2]}
    assert set(plan["policies"]) == expected and set(plan["policies"].values()) == {"prune"}


def test_a_mask_that_prunes_heads_scores_them_zero(trained, tmp_path):
    root, _ = trained
    out = tmp_path / "importance"
    printed = run("ablate.py", "mode=importance", "mask=prune", "mask.heads=L1H2", f"ckpt_path={root / 'train'}",
                  "importance.max_examples=20", "importance.key_types=false", "importance.policies=[prune]",
                  f"hydra.run.dir={out}", cwd_tmp=root).stdout
    assert "note: the mask prunes L1H2: their importance is 0" in printed
    data = json.loads((out / "importance.json").read_text())
    assert data["raw"]["example"][1][2] == 0 and data["settings"]["pruned_by_mask"] == ["L1H2"]
    assert set(data["estimators"]) == {"example", "token", "batch", "fisher", "estimate_prune"}


def test_an_undefined_correlation_reads_n_a_and_says_why():
    """A measured change the same for every head (no single head moves the f1 of a few examples) has no order."""
    from headlab.analysis.importance.agreement import UNDEFINED, agreement_markdown, agreement_table

    scores = np.arange(12.0).reshape(3, 4)
    sweep = {"policy": "prune", "tables": {"validation": {"loss": {"delta": (-scores * 0.1).tolist()},
                                                          "f1": {"delta": np.zeros((3, 4)).tolist()}}}}
    table = agreement_table({"example": scores}, sweep, "f1", k=5)
    text = agreement_markdown(table, 4)
    rows = [line for line in text.splitlines() if line.startswith("| prune")]
    loss, f1 = rows
    assert "| -1.0 " in loss and "n/a" not in loss  # the reversed order: -1
    assert f1.count("| n/a ") == 2 and text.rstrip().endswith(UNDEFINED)
    assert np.isclose(table["spearman"][0], scipy.stats.spearmanr(scores.ravel(), -scores.ravel()).statistic)
    defined = agreement_markdown(table.iloc[:1], 4)
    assert UNDEFINED not in defined and "n/a" not in defined
