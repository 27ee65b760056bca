"""Selector grammar, rule ordering, clusters/importance selectors and every bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2Model

import headlab
from headlab.core.head_files import load_importance
from headlab.core.plans import HeadPlan, select_heads
from headlab.errors import UserError


def heads_of(selector, layers=4, heads=3, **kwargs):
    """Brute-force view of a selection: the set of (layer, head) pairs."""
    mask = select_heads(selector, layers, heads, **kwargs)
    return {(l, h) for l in range(layers) for h in range(heads) if mask[l, h]}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("all", {(l, h) for l in range(4) for h in range(3)}),
        ("L3", {(3, 0), (3, 1), (3, 2)}),
        ("L1-2", {(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)}),
        ("L3H2", {(3, 2)}),
        ("H1", {(0, 1), (1, 1), (2, 1), (3, 1)}),
        ("H0-1", {(l, h) for l in range(4) for h in (0, 1)}),
        ("L0-1H2", {(0, 2), (1, 2)}),
        (" L0H1 , L3H0 ", {(0, 1), (3, 0)}),
        ("L0H1,L0H1,L0", {(0, 0), (0, 1), (0, 2)}),
        (["L0H1", "L2H2"], {(0, 1), (2, 2)}),
        ("L 2 H 1", {(2, 1)}),
    ],
)
def test_selector_grammar(selector, expected):
    assert heads_of(selector) == expected


def test_rules_apply_in_order_later_wins():
    plan = HeadPlan.from_rules(
        [{"heads": "L0H1,L2", "policy": "prune"}, {"heads": "L2H3", "policy": "keep"},
         {"heads": "H0", "policy": "uniform"}, {"heads": "L2H0", "policy": "drop_inter"}],
        num_layers=3, num_heads=4,
    )
    expected = {(0, 0): "uniform", (0, 1): "prune", (1, 0): "uniform", (2, 0): "drop_inter", (2, 1): "prune",
                (2, 2): "prune", (2, 3): "keep"}
    for layer in range(3):
        for head in range(4):
            assert plan.policy_of(layer, head) == expected.get((layer, head), "keep"), (layer, head)
    assert plan.heads_with("prune") == [(0, 1), (2, 1), (2, 2)]
    assert plan.layer_groups(2) == {"drop_inter": [0], "prune": [1, 2], "keep": [3]}
    assert plan.counts() == {"keep": 6, "prune": 3, "uniform": 2, "drop_intra": 0, "drop_inter": 1, "mean": 0,
                             "resample": 0, "optimal": 0}
    assert plan.to_dict()["policies"]["L2H0"] == "drop_inter"
    assert plan.to_dict()["rules"][1] == {"heads": "L2H3", "policy": "keep"}


def test_empty_rules_keep_everything():
    plan = HeadPlan.from_rules([], 2, 2)
    assert plan.is_identity and plan == HeadPlan.keep_all(2, 2)


def test_cluster_selector_from_file_and_mapping(tmp_path):
    labels = {"L0H0": "dense", "L1H2": "dense", "L2H1": "vertical", "L3H0": "diagonal"}
    path = tmp_path / "clusters.json"
    path.write_text(json.dumps({"model": "x", "labels": labels}))
    assert heads_of("cluster:dense", clusters=headlab.core.plans.load_clusters(path)) == {(0, 0), (1, 2)}
    plan = HeadPlan.from_rules([{"heads": "cluster:dense,cluster:vertical", "policy": "prune"}], 4, 3, clusters=path)
    assert plan.heads_with("prune") == [(0, 0), (1, 2), (2, 1)]
    plan = HeadPlan.from_rules([{"heads": "cluster:diagonal", "policy": "uniform"}], 4, 3, clusters=labels)
    assert plan.heads_with("uniform") == [(3, 0)]


def test_top_and_bottom_selectors_rank_by_importance(tmp_path):
    rng = np.random.default_rng(0)
    scores = rng.random((4, 3))
    scores[1, 1] = scores[2, 2] = 2.0  # a tie at the top: the earlier head wins
    path = tmp_path / "importance.json"
    path.write_text(json.dumps({"model": "x", "importance": scores.tolist()}))
    flat = sorted((-scores[l, h], l, h) for l in range(4) for h in range(3))
    top = lambda k: {(l, h) for _, l, h in flat[:k]}  # noqa: E731
    bottom = lambda k: {(l, h) for _, l, h in sorted(flat, key=lambda t: (-t[0], t[1], t[2]))[:k]}  # noqa: E731
    importance = load_importance(path, 4, 3)
    assert heads_of("top:1", importance=importance) == {(1, 1)}
    for k in (0, 3, 5, 12):
        assert heads_of(f"top:{k}", importance=importance) == top(k)
        assert heads_of(f"bottom:{k}", importance=importance) == bottom(k)
    # 25% of 12 heads = 3; 10% of 12 = 1.2 -> 1; 12.5% = 1.5 -> 2 (half up)
    assert heads_of("top:25%", importance=importance) == top(3)
    assert heads_of("bottom:10%", importance=importance) == bottom(1)
    assert heads_of("top:12.5%", importance=importance) == top(2)
    plan = HeadPlan.from_rules([{"heads": "bottom:2", "policy": "prune"}], 4, 3, importance=path)
    assert set(plan.heads_with("prune")) == bottom(2)


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("L1X", "unknown selector token 'L1X'"),
        ("layer3", "unknown selector token 'layer3'"),
        ("", "empty head selector"),
        ("L4", "layer 4 .*valid layers are 0..3"),
        ("L0-9", "layer 9 .*valid layers are 0..3"),
        ("L1H3", "head 3 .*valid heads are 0..2"),
        ("L3-1", "empty layer range 3-1"),
        ("cluster:dense", "needs a clusters file"),
        ("top:3", "needs an importance file"),
        ("bottom:10%", "needs an importance file"),
        ("cluster:", "unknown selector token"),
        (5, "head selector 5 is not a string"),  # mask.heads=5 as Hydra reads it: a traceback
        (True, "head selector True is not a string"),
        ("L1H02", "write numbers without leading zeros \\(L1H2\\)"),  # one head, one spelling (one plan, one job)
        ("L01-2", "without leading zeros \\(L1-2\\)"),
    ],
)
def test_bad_selectors(selector, message):
    with pytest.raises(ValueError, match=message):
        HeadPlan.from_rules([{"heads": selector, "policy": "prune"}], 4, 3)


def test_bad_rank_counts():
    importance = np.zeros((4, 3))
    with pytest.raises(ValueError, match="between 0 and 100"):
        select_heads("top:150%", 4, 3, importance=importance)
    with pytest.raises(ValueError, match="whole number in 0..12"):
        select_heads("top:13", 4, 3, importance=importance)


def test_bad_policy_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown policy 'zero'; valid policies: keep, prune, uniform"):
        HeadPlan.from_rules([{"heads": "all", "policy": "zero"}], 2, 2)


@pytest.mark.parametrize("rule", [{"heads": "all"}, {"heads": "all", "policy": "prune", "extra": 1}, "L0"])
def test_bad_rule_shape(rule):
    with pytest.raises(ValueError, match="must have exactly the keys heads and policy"):
        HeadPlan.from_rules([rule], 2, 2)


def test_bad_cluster_and_importance_files(tmp_path):
    with pytest.raises(ValueError, match="clusters file '.*missing.json' does not exist"):
        HeadPlan.from_rules([], 2, 2, clusters=tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        HeadPlan.from_rules([], 2, 2, importance=broken)
    with pytest.raises(ValueError, match="cluster 'dense' is not in the clusters file; its clusters are: vertical"):
        HeadPlan.from_rules([{"heads": "cluster:dense", "policy": "prune"}], 2, 2, clusters={"L0H0": "vertical"})
    with pytest.raises(ValueError, match="head 'L5H0' is out of range .* 2 layers x 2 heads"):
        HeadPlan.from_rules([], 2, 2, clusters={"L5H0": "vertical"})
    with pytest.raises(ValueError, match=r"has shape \[3\]; the model needs \[2, 2\]"):
        HeadPlan.from_rules([], 2, 2, importance={"importance": [1, 2, 3]})
    with pytest.raises(ValueError, match="NaN"):
        HeadPlan.from_rules([], 1, 2, importance=[[1.0, float("nan")]])


def test_ablate_rejects_non_bert_models_and_wrong_plans(tiny_model):
    gpt2 = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not a supported BERT-family encoder"), \
            headlab.ablate(gpt2, HeadPlan.keep_all(1, 2)):
        pass
    with pytest.raises(ValueError, match="plan is for 2 layers x 4 heads; the model has 3 x 4"), \
            headlab.ablate(tiny_model, HeadPlan.keep_all(2, 4)):
        pass
    with pytest.raises(ValueError, match="renormalize must be true or false"), \
            headlab.ablate(tiny_model, HeadPlan.keep_all(3, 4), renormalize="yes"):
        pass
    with headlab.ablate(tiny_model, HeadPlan.keep_all(3, 4)), pytest.raises(ValueError, match="already inside"), \
            headlab.ablate(tiny_model, HeadPlan.keep_all(3, 4)):
        pass
    for gates, said in ((torch.ones(3, 3), r"gates are \[3, 3\]; the model has \[layers, heads\] = \[3, 4\]"),
                        (torch.ones(2, 1, 3, 4), r"gates are \[2, 1, 3, 4\]"),
                        (torch.ones(3, 4, dtype=torch.long), "gates must be a float tensor"),
                        ([[1.0] * 4] * 3, "gates must be a float tensor")):
        with pytest.raises(ValueError, match=said), headlab.ablate(tiny_model, HeadPlan.keep_all(3, 4), gates=gates):
            pass
    assert tiny_model.config._attn_implementation == "sdpa"


def test_drop_without_sentence_ids_fails_at_forward(tiny_model, inputs):
    plan = HeadPlan.from_rules([{"heads": "L1H2", "policy": "drop_inter"}], 3, 4)
    with headlab.ablate(tiny_model, plan), pytest.raises(ValueError, match="drop_intra/drop_inter need unit ids"):
        tiny_model(**inputs)
    wrong = torch.zeros(1, 3, dtype=torch.long)
    with headlab.ablate(tiny_model, plan), pytest.raises(ValueError, match=r"sentence_ids has shape \[1, 3\]"):
        tiny_model(**inputs, sentence_ids=wrong)


def test_a_clusters_file_must_fit_the_model(tmp_path):
    labels = {f"L{l}H{h}": "dense" if h else "vertical" for l in range(2) for h in range(2)}
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"labels": labels, "shape": [2, 2]}))  # a 2 x 2 model's file (mode=cluster's)
    rules = [{"heads": "cluster:vertical", "policy": "prune"}]
    with pytest.raises(UserError, match=r"2 layers x 2 heads; this model has 3 x 4"):
        HeadPlan.from_rules(rules, 3, 4, clusters=small)
    assert HeadPlan.from_rules(rules, 2, 2, clusters=small).heads_with("prune") == [(0, 0), (1, 0)]
    with pytest.raises(UserError, match=r"labels head L1H0 twice \('L1H0' and 'L01H00'\)"):
        HeadPlan.from_rules(rules, 2, 2, clusters={"L1H0": "vertical", "L01H00": "dense"})
    assert HeadPlan.from_rules(rules, 2, 2, clusters={"L01H00": "vertical"}).heads_with("prune") == [(1, 0)]
    with pytest.raises(UserError, match=r"no label for 1 of its heads \(L1H1\)"):
        HeadPlan.from_rules(rules, 2, 2, clusters={"labels": {k: v for k, v in labels.items() if k != "L1H1"},
                                                   "shape": [2, 2]})
    twice = tmp_path / "twice.json"
    twice.write_text('{"labels": {"L0H0": "vertical", "L0H0": "dense"}}')
    with pytest.raises(UserError, match=r"has the key 'L0H0' twice"):
        HeadPlan.from_rules(rules, 2, 2, clusters=twice)


@pytest.mark.parametrize("size", [0, -1, 2.5, True, None])
def test_plan_sizes_must_be_positive_whole_numbers(size):
    with pytest.raises(UserError, match="must be a positive whole number"):
        HeadPlan.from_rules([], size, 4)
    with pytest.raises(UserError, match="must be a positive whole number"):
        HeadPlan.from_rules([], 3, size)
