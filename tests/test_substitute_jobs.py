"""``ablate.py`` with ``mean`` and ``resample`` heads end to end on the tiny fine-tuned BERT: every record against the
float64 reference applied by hand to each example alone (the means over the reference set's tokens, each draw's
source example run alone), the draws' properties, the means' cache, and the bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT, assert_one_error_line, run
from reference import bert_contexts, bert_forward, classifier_logits, params_of
from transformers import AutoModelForSequenceClassification, AutoTokenizer

DATA = ROOT / "src/headlab/tasks/data/demo_pairs"


def encoded(tokenizer, split: str, count: int) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` examples of a demo_pairs split, each alone (no padding), as the task tokenises them."""
    rows = [json.loads(line) for line in (DATA / f"{split}.jsonl").read_text().splitlines()[:count]]
    out = []
    for row in rows:
        enc = tokenizer(row["sentence1"], row["sentence2"], truncation=True, max_length=128, return_tensors="pt")
        out.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                    "token_type_ids": enc["token_type_ids"], "label": torch.tensor([row["label"]])})
    return out


def reference_logits(params, config, example, policy_of, substitutes) -> torch.Tensor:
    hidden = bert_forward(params, config, example["input_ids"], example["attention_mask"],
                          example["token_type_ids"], policy_of, substitutes=substitutes)
    return classifier_logits(params, hidden)[0]  # [labels]


@pytest.mark.slow
def test_mean_and_resample_records_equal_the_definitions(trained):
    root, _ = trained
    folder = root / "train/model"
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    params, config = params_of(model), model.config
    evaluated, reference = encoded(tokenizer, "validation", 16), encoded(tokenizer, "train", 12)

    def job(name, *overrides):
        run("ablate.py", "mode=eval", f"ckpt_path={root / 'train'}", f"hydra.run.dir={root / name}",
            "data.max_eval_examples=16", *overrides, cwd_tmp=root)
        return pd.read_parquet(root / name / "records.parquet")

    # mean: L0H1 and layer 2 take their means over the first 12 training examples' tokens
    records = job("mean", "mask=mean", "mask.heads=[L0H1,L2]", "mask.reference=train", "mask.reference_examples=12")
    contexts = [bert_contexts(params, config, example)[:, 0, :] for example in reference]  # [layers, n, heads, dim]
    means = torch.cat(contexts, dim=1).mean(1)  # [layers, heads, head_dim]: over every token of the set
    mean_heads = {(0, 1), (2, 0), (2, 1), (2, 2), (2, 3)}
    policy_of = lambda layer, head: "mean" if (layer, head) in mean_heads else "keep"  # noqa: E731
    for example, record in zip(evaluated, records.itertuples()):
        n = example["input_ids"].shape[1]
        logits = reference_logits(params, config, example, policy_of,
                                  lambda layer, b, h, policy, n=n: means[layer, h].expand(n, -1))
        assert record.loss == pytest.approx(float(F.cross_entropy(logits[None], example["label"])), rel=1e-5)
        assert record.prediction == int(logits.argmax())
    assert len(records) == 16

    # resample: layer 1 takes another validation example's heads, two draws averaged
    records = job("resample", "mask=resample", "mask.heads=L1", "mask.reference_examples=16", "mask.resamples=2")
    own = [bert_contexts(params, config, example)[:, 0] for example in evaluated]  # [layers, n, heads, dim] each
    means = torch.cat(own, dim=1).mean(1)
    sources = np.array(records["sources"].tolist())  # [examples, draws]
    changed = 0
    for e, (example, record) in enumerate(zip(evaluated, records.itertuples())):
        n = example["input_ids"].shape[1]
        probabilities, losses = [], []
        for source in sources[e]:
            def substitute(layer, b, h, policy, source=source, n=n):
                taken = own[source][layer, :, h]  # [source n, head_dim]
                return torch.cat([taken, means[layer, h].expand(max(0, n - len(taken)), -1)])[:n]
            logits = reference_logits(params, config, example, lambda layer, head: "resample" if layer == 1
                                      else "keep", substitute)
            probabilities.append(logits.softmax(-1))
            losses.append(float(F.cross_entropy(logits[None], example["label"])))
        assert record.loss == pytest.approx(np.mean(losses), rel=1e-5)
        assert record.prediction == int(torch.stack(probabilities).mean(0).argmax())
        changed += len({round(x, 6) for x in losses}) > 1
    assert changed > 5  # the draws differ in what they give: the averaging is tested
    assert (sources != np.arange(16)[:, None]).all()  # never an example's own heads
    for draw in range(2):
        assert sorted(sources[:, draw]) == list(range(16))  # the evaluated split is the reference set: a derangement
    assert (sources[:, 0] != sources[:, 1]).any()
    means_files = set((root / "baselines/means").glob("*.npz"))  # (other tests' jobs on this checkpoint add theirs)
    again = job("resample_again", "mask=resample", "mask.heads=L1", "mask.reference_examples=16", "mask.resamples=2")
    assert (np.array(again["sources"].tolist()) == sources).all()  # seeded
    other = job("resample_seed", "mask=resample", "mask.heads=L1", "mask.reference_examples=16", "seed=1")
    assert (np.array(other["sources"].tolist())[:, 0] != sources[:, 0]).any()
    assert set((root / "baselines/means").glob("*.npz")) == means_files  # the same reference set: its means reused
    copy = root / "validation_copy.jsonl"  # the split's own file, or a copy: deranged the same way
    copy.write_bytes((DATA / "validation.jsonl").read_bytes())
    by_file = job("resample_file", "mask=resample", "mask.heads=L1", "mask.reference_examples=16",
                  "mask.resamples=2", f"mask.reference={copy}")
    assert (np.array(by_file["sources"].tolist()) == sources).all()
    # identity by content, whatever the reference is called: the evaluated file as the training split ...
    as_train = job("resample_as_train", "mask=resample", "mask.heads=L1", "mask.reference_examples=16",
                   "mask.resamples=2", "mask.reference=train", f"task.data_files={{train: {copy}, validation: {copy}}}")
    assert (np.array(as_train["sources"].tolist()) == sources).all()
    # ... or its examples in another order (reference row 15 - e is example e): never an example's own inputs
    rows = copy.read_text().splitlines()[:16]
    assert len(set(rows)) == 16
    backwards = root / "validation_backwards.jsonl"
    backwards.write_text("\n".join(rows[::-1]) + "\n")
    turned = job("resample_backwards", "mask=resample", "mask.heads=L1", "mask.reference_examples=16",
                 "mask.resamples=4", f"mask.reference={backwards}")
    drawn = np.array(turned["sources"].tolist())  # [examples, draws]
    assert not (drawn == (15 - np.arange(16))[:, None]).any() and len(set(drawn.ravel())) > 8


@pytest.mark.parametrize(("overrides", "expected"), [
    (["mask=mean", "mask.heads=L0", "mask.reference_examples=5000"],
     "mask.reference=validation (split validation) has 500 examples; mask.reference_examples=5000 needs that many"),
    (["mask=resample", "mask.heads=L0", "mask.reference_examples=1"],
     "mask.reference_examples=1: resample needs at least 2 reference examples"),
    (["mask=mean", "mask.heads=L0", "mask.reference=missing.jsonl"],
     "mask.reference='missing.jsonl' is neither train, validation nor an existing data file"),
    (["mask=mean", "mask.heads=L0", "mask.mean_over=words"], "mask.mean_over='words' is not allowed"),
    (["mask=resample", "mask.heads=L0", "mask.resamples=0"], "mask.resamples=0 is out of range"),
    (["mask=mean", "mask.heads=L0", "mask.reference=EMPTY"], "empty.jsonl' is an empty file; give a data file"),
    (["mask=mean", "mask.heads=L0", "mask.mean_over=positions", "mask.reference=SHORT", "mask.reference_examples=1"],
     "mask.mean_over=positions: split validation has inputs of"),
])
def test_bad_reference_settings_fail_before_the_weights_load(trained, overrides, expected):
    root, _ = trained
    empty, short = root / "empty.jsonl", root / "short.jsonl"
    empty.write_text("")
    short.write_text(json.dumps({"sentence1": "Yes.", "sentence2": "No.", "label": 0}) + "\n")
    overrides = [o.replace("EMPTY", str(empty)).replace("SHORT", str(short)) for o in overrides]
    result = run("ablate.py", "mode=eval", f"ckpt_path={root / 'train'}", f"hydra.run.dir={root / 'bad'}",
                 *overrides, cwd_tmp=root, check=False)
    assert_one_error_line(result, expected)


def test_the_table2_ablations_preset_takes_each_type_away_three_ways(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from headlab.analysis.jobs.checks import job_mask
    from headlab.cli.schema import register_configs
    from headlab.core.masks import plan_from_mask

    register_configs()
    clusters = tmp_path / "clusters.json"
    types = ["dense", "diagonal", "dense_vertical", "vertical"]
    clusters.write_text(json.dumps({"labels": {f"L{l}H{h}": types[h] for l in range(3) for h in range(4)},
                                    "shape": [3, 4]}))
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("ablate", overrides=["model=tiny_random", "experiment=guan2020_table2_ablations",
                                           f"mask.clusters={clusters}"])
    assert len(cfg.plans) == 13
    for name in cfg.plans:
        with open_dict(cfg):
            cfg.plan = name
        plan = plan_from_mask(job_mask(cfg), 3, 4)
        policy, _, type_ = name.partition("_")
        if name == "baseline":
            assert plan.is_identity
            continue
        assert plan.heads_with(policy) == [(layer, types.index(type_)) for layer in range(3)], name
