"""The real all-MiniLM-L6-v2 (6 x 12 heads) under every policy, against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT, assert_close_rel
from omegaconf import OmegaConf
from reference import bert_forward, params_of

import headlab
from headlab.cli.schema import register_configs
from headlab.core.models import load_model, load_tokenizer
from headlab.core.units import unit_ids

pytestmark = pytest.mark.slow

TEXTS = ["Dr. Moreau was born in Lyon. She moved to Oslo at 3.5 years old!", "Who won?"]
PAIRS = ["Where did she grow up?", "The team from Porto won. They had trained for years."]
RULES = [
    {"heads": "L0", "policy": "drop_intra"},
    {"heads": "L1H0-5", "policy": "prune"},
    {"heads": "L1H6-11,L2H3", "policy": "uniform"},
    {"heads": "L3,L4H1", "policy": "drop_inter"},
    {"heads": "H11", "policy": "keep"},
]


@pytest.fixture(scope="module")
def minilm():
    register_configs()
    cfg = OmegaConf.load(ROOT / "conf/model/minilm.yaml")
    return load_tokenizer(cfg), load_model(cfg)


@pytest.mark.parametrize("renormalize", [False, True])
def test_minilm_mixed_plan_matches_reference(minilm, renormalize):
    tokenizer, model = minilm
    enc = tokenizer(TEXTS, PAIRS, padding=True, return_offsets_mapping=True, return_tensors="pt")
    inputs = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    units = unit_ids(enc, TEXTS, PAIRS)
    plan = headlab.HeadPlan.from_rules(RULES, 6, 12)
    with torch.no_grad(), headlab.ablate(model, plan, renormalize=renormalize):
        out = model(**inputs, sentence_ids=units).last_hidden_state
    expected = bert_forward(params_of(model), model.config, inputs["input_ids"], inputs["attention_mask"],
                            inputs["token_type_ids"], plan.policy_of, units, renormalize)
    valid = inputs["attention_mask"].bool()
    assert_close_rel(out[valid], expected[valid])
    with torch.no_grad():
        stock = model(**inputs).last_hidden_state
    assert (out - stock)[valid].abs().max() > 1e-2  # the plan really changed the model


def test_minilm_keep_plan_equals_stock(minilm):
    tokenizer, model = minilm
    inputs = tokenizer(TEXTS, PAIRS, padding=True, return_tensors="pt")
    with torch.no_grad():
        stock = model(**inputs).last_hidden_state
        with headlab.ablate(model, headlab.HeadPlan.keep_all(6, 12)):
            patched = model(**inputs).last_hidden_state
    torch.testing.assert_close(patched, stock, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("document", ["README.md", "docs/plans.md"])
def test_python_example_runs(document):
    """The Python block of the README and of docs/plans.md runs as written (on the embedded MiniLM)."""
    text = (ROOT / document).read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(block, document, "exec"), namespace)
    assert namespace["plan"].policy_of(0, 1) == "prune"
    assert namespace["out"].last_hidden_state.shape[0] == 1


def test_minilm_features_have_the_known_broad_shape(minilm):
    """Clark et al. 2019 and Guan et al. 2020 on BERT: heads that put most of their attention on [CLS] / [SEP]
    (vertical), heads that attend to the next or previous token (diagonal), broad heads near uniform entropy."""
    tokenizer, model = minilm
    texts = [f"{a} {b}" for a, b in zip(TEXTS, PAIRS)] * 4
    batches = [tokenizer(texts[i:i + 4], PAIRS * 2, padding=True, return_tensors="pt") for i in range(0, 8, 4)]
    features = headlab.attention_features(model, tokenizer, batches)
    clark = features.clark
    special = clark["cls"] + clark["sep"]
    assert (special > 0.5).sum() >= 10, "vertical heads: most attention on [CLS]/[SEP]"
    assert max(clark["next"].max(), clark["prev"].max()) > 0.7, "a diagonal head: the next or previous token"
    assert (clark["entropy"] > 2.5).any(), "broad heads"
    assert features.distance.shape == (6, 12, 21)
    torch.testing.assert_close(torch.tensor(features.distance.sum(-1)), torch.ones(6, 12, dtype=torch.float64),
                               rtol=0, atol=1e-5)
    assert (features.sieve["delimiter"].mean(0) > 3).sum() >= 10  # delimiter roles are common (Pande et al.)
