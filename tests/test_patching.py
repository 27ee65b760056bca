"""``mode=patch``: every patch of the evaluator on every family's tiny classifier against a forward whose activation
is replaced by definition (``test_activation_sites.by_definition``), in float64; the job end to end; bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import ROOT, assert_one_error_line, run
from families import CONFIGS, batch, tiny_model
from test_activation_sites import HEAD_DIM, by_definition
from transformers import AutoModelForSequenceClassification

from headlab.analysis.patching.patch_evaluator import PatchEvaluator, patch_specs

PAIRS = ROOT / "src/headlab/tasks/data/demo_pairs/patch.jsonl"


def paired_batch(corrupt_labels: bool = True) -> dict[str, torch.Tensor]:
    """Three rows (11, 8 and 5 tokens) and other tokens at the same positions."""
    clean, corrupted = batch(1), batch(2)
    out = {"input_ids": clean["input_ids"], "attention_mask": clean["attention_mask"],
           "sentence_ids": clean["sentence_ids"], "corrupt_input_ids": corrupted["input_ids"],
           "labels": torch.tensor([0, 1, 1]), "example_index": torch.arange(3)}
    return out | ({"corrupt_labels": torch.tensor([1, 0, 0])} if corrupt_labels else {})


def patched_by_definition(model, name: str, spec, rows: dict, noising: bool) -> tuple:
    """The spec's patch by definition: the base run's output with the site's activation (its columns, at the valid
    positions chosen) taken from the source run, each by a hook on the module the definition names; and the corrupted
    run's output."""
    clean = {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"]}
    corrupted = clean | {"input_ids": rows["corrupt_input_ids"]}
    base, source = (clean, corrupted) if noising else (corrupted, clean)
    site, seen = spec.site, []
    with torch.no_grad():
        with by_definition(model.base_model, name, site.kind, site.layer, seen.append):
            source_out = model(**source)
        corrupted_out = source_out if source is corrupted else model(**corrupted)

        def replace(activation):
            new = activation.clone()
            cols = slice(site.head * HEAD_DIM, (site.head + 1) * HEAD_DIM) if site.kind == "head" else slice(None)
            for b in range(new.shape[0]):
                for t in range(new.shape[1]):
                    chosen = spec.position in (None, t) and spec.unit in (None, rows["sentence_ids"][b, t])
                    if rows["attention_mask"][b, t] and chosen:
                        new[b, t, cols] = seen[0][b, t, cols]
            return new

        with by_definition(model.base_model, name, site.kind, site.layer, replace):
            return model(**base), corrupted_out


def reference_logit_diffs(model, name: str, spec, rows: dict, noising: bool) -> np.ndarray:
    """The spec's patched logit difference by definition (``patched_by_definition``)."""
    patched, corrupted = patched_by_definition(model, name, spec, rows, noising)
    logits, corrupted_logits = patched.logits, corrupted.logits
    contrast = rows.get("corrupt_labels", corrupted_logits.argmax(-1))
    out = (logits.gather(1, rows["labels"][:, None]) - logits.gather(1, contrast[:, None]))[:, 0].numpy()
    if spec.position is not None:  # rows shorter than the position: nothing patched, no score
        out = np.where(rows["attention_mask"][:, spec.position].numpy() == 1, out, np.nan)
    if spec.unit is not None:  # rows without the unit
        out = np.where((rows["sentence_ids"] == spec.unit).any(-1).numpy(), out, np.nan)
    return out


def check_every_patch(name: str, direction: str, positions: int | None, per_forward: int, corrupt_labels=True,
                      units: int | None = None):
    model = tiny_model(name, AutoModelForSequenceClassification).double()
    config = model.config
    specs = patch_specs(["head", "attention", "mlp", "residual"], config.num_hidden_layers,
                        config.num_attention_heads, positions, units)
    rows = paired_batch(corrupt_labels)
    evaluator = PatchEvaluator(model, "classification", specs, direction, per_forward)
    evaluator.validation_step(rows, 0)
    evaluator.on_validation_epoch_end()
    for index, spec in enumerate(specs):
        expected = reference_logit_diffs(model, name, spec, rows, direction == "noising")
        np.testing.assert_allclose(evaluator.scores[index]["logit_diff"], expected, rtol=1e-9, atol=1e-12,
                                   err_msg=spec.name)
    clean = model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"]).logits.detach()
    picked = clean.gather(1, torch.stack([rows["labels"], rows.get("corrupt_labels", torch.zeros(3, dtype=int))], 1))
    if corrupt_labels:
        np.testing.assert_allclose(evaluator.scores["clean"]["logit_diff"], (picked[:, 0] - picked[:, 1]).numpy())
    return evaluator, specs


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_patch_equals_a_forward_with_that_activation_replaced(name):
    """Noising at every position, five patches per forward (stacked rows, started at the patched layer)."""
    check_every_patch(name, "noising", None, 5)


@pytest.mark.parametrize("name", ["bert", "albert-groups", "deberta-v2", "modernbert"])
def test_each_position_in_turn_denoising(name):
    """Denoising one position at a time, seven patches per forward; positions a row does not reach score NaN."""
    evaluator, specs = check_every_patch(name, "denoising", 11, 7)
    last = [i for i, spec in enumerate(specs) if spec.position == 10]
    assert all(np.isnan(evaluator.scores[i]["logit_diff"][1:]).all() for i in last)  # rows of 8 and 5 tokens


@pytest.mark.parametrize("name", ["bert", "albert", "deberta-v3"])
def test_each_unit_in_turn(name):
    """Noising the positions of one unit (sentence ids 0-5 of the batch) at a time; rows without it score NaN."""
    evaluator, specs = check_every_patch(name, "noising", None, 4, units=6)
    fifth = [i for i, spec in enumerate(specs) if spec.unit == 5]
    assert all(np.isnan(evaluator.scores[i]["logit_diff"][[0, 2]]).all() for i in fifth)  # only row 1 has unit 5


@pytest.mark.parametrize("name", ["bert", "albert-groups", "deberta-v2", "modernbert"])
def test_attribution_estimates_are_the_first_order_term_by_definition(name):
    """LD_base + sum over the patched positions and columns of (a_source - a_base) * dLD/da at the base run, the
    activations and gradients taken by hooks on the modules the definitions name."""
    model = tiny_model(name, AutoModelForSequenceClassification).double()
    config, rows = model.config, paired_batch()
    specs = [*patch_specs(["head", "attention", "mlp", "residual"], config.num_hidden_layers,
                          config.num_attention_heads), *patch_specs(["mlp"], config.num_hidden_layers, 1, units=3)]
    evaluator = PatchEvaluator(model, "classification", specs, "noising", 4, exact=False, attribution=True)
    evaluator.validation_step(rows, 0)
    evaluator.on_validation_epoch_end()
    clean = {"input_ids": rows["input_ids"], "attention_mask": rows["attention_mask"]}
    corrupted = clean | {"input_ids": rows["corrupt_input_ids"]}
    for index, spec in enumerate(specs):
        site, sources, seen = spec.site, [], []
        with torch.no_grad(), by_definition(model.base_model, name, site.kind, site.layer, sources.append):
            model(**corrupted)
        with by_definition(model.base_model, name, site.kind, site.layer, seen.append):
            logits = model(**clean).logits
        picked = logits.gather(1, torch.stack([rows["labels"], rows["corrupt_labels"]], 1))  # [batch, 2]
        logit_diff = picked[:, 0] - picked[:, 1]
        gradient = torch.autograd.grad(logit_diff.sum(), seen[0])[0]
        cols = slice(site.head * HEAD_DIM, (site.head + 1) * HEAD_DIM) if site.kind == "head" else slice(None)
        chosen = rows["attention_mask"].bool() & (True if spec.unit is None else rows["sentence_ids"] == spec.unit)
        terms = ((sources[0] - seen[0]) * gradient)[..., cols].sum(-1) * chosen  # [batch, seq]
        expected = (logit_diff + terms.sum(-1)).detach().numpy()
        if spec.unit is not None:
            expected = np.where(chosen.any(-1).numpy(), expected, np.nan)
        np.testing.assert_allclose(evaluator.scores[("estimate", index)]["logit_diff"], expected, rtol=1e-9,
                                   atol=1e-12, err_msg=spec.name)
    assert not any(isinstance(run, int) for run in evaluator.scores)  # no patched forward ran


def test_without_corrupted_labels_the_contrast_is_the_corrupted_runs_prediction():
    check_every_patch("bert", "noising", None, 1, corrupt_labels=False)


def test_the_residual_patched_everywhere_gives_the_source_run():
    """Noising the residual after a layer at every position is the corrupted run from there on; denoising, clean."""
    model = tiny_model("roberta", AutoModelForSequenceClassification).double()
    rows = paired_batch()
    for direction, source in (("noising", "corrupted"), ("denoising", "clean")):
        specs = [s for s in patch_specs(["residual"], 3, 4, None)]
        evaluator = PatchEvaluator(model, "classification", specs, direction, 3)
        evaluator.validation_step(rows, 0)
        evaluator.on_validation_epoch_end()
        for index in range(3):
            np.testing.assert_allclose(evaluator.scores[index]["logit_diff"],
                                       evaluator.scores[source]["logit_diff"], rtol=1e-12)


def test_patch_job_end_to_end(trained, tmp_path):
    """On the fine-tuned tiny BERT and the bundled pairs: the tables, the per-example scores they come from, the
    heatmaps, a rerun that finds the job done."""
    root, _ = trained
    args = ["mode=patch", f"ckpt_path={root / 'train'}", f"patch.pairs={PAIRS}", "data.max_eval_examples=24",
            "patch.resamples=200", f"hydra.run.dir={tmp_path / 'patch'}"]
    result = run("ablate.py", *args, cwd_tmp=root)
    folder = tmp_path / "patch"
    results = json.loads((folder / "results.json").read_text())
    table, per_example = pd.read_csv(folder / "effects.csv"), pd.read_parquet(folder / "patches.parquet")
    assert results["complete"] and len(table) == 3 * (4 + 3) == len(results["effects"])
    assert {"patch_heads.png", "patch_layers.png"} <= {p.name for p in folder.iterdir()}
    means = per_example.groupby("run")["logit_diff"].mean()
    clean, corrupted = means["clean"], means["corrupted"]
    assert results["summary"]["clean"]["logit_diff"] == pytest.approx(clean, rel=1e-12)
    assert results["summary"]["normaliser"] == pytest.approx(clean - corrupted, rel=1e-12)
    effects = table.set_index("site")["effect"]
    for site, value in effects.items():
        assert value == pytest.approx((means[site] - corrupted) / (clean - corrupted), rel=1e-9, abs=1e-12), site
    assert effects["L2.residual"] == pytest.approx(0.0, abs=1e-6)  # the corrupted run from the last layer on
    low, high = table["effect_low"], table["effect_high"]
    assert (low <= table["effect"] + 1e-12).all() and (table["effect"] <= high + 1e-12).all()
    assert "patch (noising, 21 patches, positions all, exact) on pairs" in result.stdout
    again = run("ablate.py", *args, cwd_tmp=root)
    assert "patch (noising" not in again.stdout  # complete results: nothing runs again
    by_unit = [*args[:-1], "patch.positions=units", "patch.sites=[mlp,head]", "patch.direction=denoising",
               "patch.method=both", f"hydra.run.dir={tmp_path / 'units'}"]
    result = run("ablate.py", *by_unit, cwd_tmp=root)
    units = pd.read_csv(tmp_path / "units/effects.csv")
    assert len(units) == (3 + 12) * (units["unit"].max() + 1) and units["unit"].max() >= 3  # [CLS], sentences
    assert (tmp_path / "units/patch_mlp.png").is_file() and units["estimate"].notna().any()
    assert (tmp_path / "units/patch_head.png").is_file()  # the heads x units
    agreement = json.loads((tmp_path / "units/results.json").read_text())["summary"]["attribution"]
    assert agreement["patches"] == units["estimate"].notna().sum() and "estimates vs exact: Spearman" in result.stdout
    paths = [*args[:-1], "patch.path.senders=L0H1,L1H0", "patch.path.receivers=L2H3", "patch.path.inputs=[query]",
             f"hydra.run.dir={tmp_path / 'paths'}"]
    run("ablate.py", *[a.replace("senders=L0H1,L1H0", "senders='L0H1,L1H0'") for a in paths], cwd_tmp=root)
    sites = pd.read_csv(tmp_path / "paths/effects.csv")["site"].tolist()
    assert sites == ["L0H1->L2H3 (query)", "L1H0->L2H3 (query)"]


BAD = [
    (["patch.sites=[ffn]"], "patch.sites='ffn' is not allowed; choose one of: head, attention, mlp, residual"),
    (["patch.direction=sideways"], "patch.direction='sideways' is not allowed"),
    (["patch.pairs=missing.jsonl"], "patch.pairs='missing.jsonl' does not exist"),
    (["patch.pairs=null"], "has no corrupt_<field> column"),
    (["task=demo_qa"], "task demo_qa is extractive QA"),
    (["mask=prune", "mask.heads=L0"], "mode=patch patches the full model's activations"),
    (["patch.path.senders=L2H0", "patch.path.receivers=L1"], "sender L2H0 has no receiver in a later layer"),
    (["patch.path.senders=L0H0", "patch.positions=each"], "path patching acts at every position"),
    (["patch.path.inputs=[attention]"], "patch.path.inputs='attention' is not allowed"),
    (["patch.path.inputs=query"], "patch.path.inputs=query is one value where a list is expected: write it in "
                                  "brackets, patch.path.inputs=[query]"),
    (["patch.path.senders=L9"], "patch.path.senders='L9': layer 9 in selector token 'L9' is out of range"),
    (["patch.path.senders=L0", "patch.path.receivers=Output"], "patch.path.receivers='Output': unknown selector "
                                                               "token 'Output'"),
    (["patch.path.senders=L0", "patch.path.receivers=null"], "patch.path.receivers=None is not a head selector"),
    (["patch.sites=[head,head]"], "patch.sites=['head', 'head'] names a kind twice"),
    ([f"patch.pairs={ROOT / 'src'}"], "is a folder"),
]


def test_path_selectors_may_be_lists_as_plans_selectors_are():
    """plans.md writes a union as a list ([L0H1,L2]); patch.path.senders=[L1,L2] failed in OmegaConf's words."""
    from omegaconf import OmegaConf

    from headlab.analysis.patching.checks import path_heads
    from headlab.analysis.patching.schema import PatchConfig

    cfg = OmegaConf.merge(OmegaConf.structured(PatchConfig), {"path": {"senders": ["L0H1", "L1H0"],
                                                                       "receivers": ["L2H3"]}})
    OmegaConf.to_object(cfg)  # the schema's checks
    assert path_heads(cfg, 3, 4) == ([(0, 1), (1, 0)], [(2, 3)])
    cfg.path.senders, cfg.path.receivers = "L0H1,L1H0", "L2H3"
    assert path_heads(cfg, 3, 4) == ([(0, 1), (1, 0)], [(2, 3)])


def pairs_with(tmp_path, change: dict, suffix: str = ".jsonl"):
    """The first four bundled pairs, the third with ``change`` (a field set to a value, or removed for None)."""
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines()[:4]]
    rows[2] = {k: v for k, v in (rows[2] | change).items() if v is not None}
    path = tmp_path / f"pairs{suffix}"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return f"patch.pairs={path}"


BAD_FILES = [
    ({"corrupt_label": 5}, "row 3: corrupt_label=5 is not a class 0..1 of task demo_pairs"),
    ({"corrupt_label": "zero"}, "row 3: corrupt_label='zero' is not a class 0..1"),
    ({"corrupt_label": 0.5}, "row 3: corrupt_label=0.5 is not a class 0..1"),
    ({"corrupt_sentence2": ""}, "row 3 has no text in 'corrupt_sentence2'"),
    ({"corrupt_label": 1}, "row 3: corrupt_label=1 is the row's label; the logit difference of a class against itself"),
    ({"corrupt_sentense1": "Ada Bell was born in 1952."},  # misspelt: that text would stay clean, without a word
     "has column(s) ['corrupt_sentense1'], which name no field of task demo_pairs; the corrupted texts and label are "
     "corrupt_sentence1, corrupt_sentence2, corrupt_label"),
]


@pytest.mark.parametrize("change, expected", BAD_FILES, ids=[e[:24] for _, e in BAD_FILES])
def test_bad_pairs_files_are_one_line(tmp_path, change, expected):
    result = run("ablate.py", "mode=patch", "allow_random_head=true", pairs_with(tmp_path, change),
                 f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path, check=False)
    assert_one_error_line(result, expected)


@pytest.mark.parametrize("overrides, expected", BAD, ids=[e[:30] for _, e in BAD])
def test_bad_patch_input_is_one_line(tmp_path, overrides, expected):
    result = run("ablate.py", "mode=patch", "allow_random_head=true", f"patch.pairs={PAIRS}", *overrides,
                 f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path, check=False)
    assert_one_error_line(result, expected)


@pytest.mark.parametrize("corrupted, expected", [
    ("Ada was born.", "split 'pairs' row 2: the clean and corrupted inputs tokenise to 31 and 23 tokens"),
    ("Ada Bell was born. In 1950", "split 'pairs' row 2: the clean and corrupted inputs have another unit "
                                   "layout from token 25 on (unit 1 against 2)"),
    ("Ada Bell was born in 1950.", "every example's corrupted text tokenises as its clean text does (2 examples)"),
    ("Ada Bell was born in 1952.", "split 'pairs' row 1: the corrupted text tokenises as the clean text does (1 of 2 "
                                   "examples do)"),
], ids=["length", "units", "identical", "one identical"])
def test_pairs_unlike_their_clean_inputs_are_refused_before_the_model_loads(tmp_path, corrupted, expected):
    row = {"sentence1": "Ada Bell was born in 1950.", "sentence2": "Ada Bell was born in 1950.", "label": 1}
    pairs = tmp_path / "pairs.jsonl"
    first = "Ada Bell was born in 1950." if "tokenises as" in expected else "Ada Bell was born in 1951."
    pairs.write_text("".join(json.dumps(row | {"corrupt_sentence2": text}) + "\n" for text in (first, corrupted)))
    result = run("ablate.py", "mode=patch", "allow_random_head=true", f"patch.pairs={pairs}", "patch.positions=units",
                 f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=tmp_path, check=False)
    assert_one_error_line(result, expected)
    assert "GPU available" not in result.stdout + result.stderr  # no trainer, so no model, was made


@pytest.mark.parametrize("positions", ["all", "each"])
def test_a_corruption_that_moves_a_sentence_boundary_patches_at_every_position(trained, tmp_path, positions):
    """A full stop moved (the same length, the boundary one word earlier) was refused at every ``patch.positions``;
    the units play a part only at ``units``. The clean and corrupted runs' logit differences are a plain HF
    forward's."""
    root, _ = trained
    rows = [{"sentence1": "Ada Bell was born in 1950.", "sentence2": clean, "label": 1, "corrupt_sentence2": moved,
             "corrupt_label": 0} for clean, moved in (("Ada Bell was born in 1950.", "Ada Bell was born. In 1950"),
                                                      ("Tom Hill was born in 1931.", "Tom Hill was born. In 1931"))]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run("ablate.py", "mode=patch", f"ckpt_path={root / 'train'}", f"patch.pairs={pairs}",
        f"patch.positions={positions}", "patch.sites=[mlp]", f"hydra.run.dir={tmp_path / 'job'}", cwd_tmp=root)
    scores = pd.read_parquet(tmp_path / "job/patches.parquet")
    from transformers import AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(root / "train/model").eval().double()
    tokenizer = AutoTokenizer.from_pretrained(root / "train/model")
    for run_name, field in (("clean", "sentence2"), ("corrupted", "corrupt_sentence2")):
        with torch.no_grad():
            logits = torch.cat([model(**tokenizer(row["sentence1"], row[field], return_tensors="pt")).logits
                                for row in rows])
        expected = (logits[:, 1] - logits[:, 0]).numpy()  # the label's logit minus the corrupted label's
        found = scores[scores["run"] == run_name].sort_values("example")["logit_diff"].to_numpy()
        np.testing.assert_allclose(found, expected, rtol=1e-4, atol=1e-5)


def test_a_hub_task_offline_reads_its_pairs_from_the_paired_file(tmp_path):
    """``task=sst2`` offline with an empty cache and ``patch.pairs=FILE``: the schema asked for the hub data set, which
    the paired file replaces. Its scores are those of the same rows given as the task's own validation file."""
    import os
    import sys

    from forked import HANG_GUARD, run_script

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"sentence": f"Ada Bell was born in {year}.", "label": 1, "corrupt_sentence":
                                         f"Ada Bell was born in {year + 1}.", "corrupt_label": 0}) + "\n"
                             for year in (1950, 1930, 1911)))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    common = [sys.executable, str(ROOT / "ablate.py"), "mode=patch", "model=tiny_random", "task=sst2",
              "allow_random_head=true", "patch.sites=[residual]", f"data.cache_dir={tmp_path / 'cache'}"]
    scores = []
    for name, given in (("pairs", [f"patch.pairs={pairs}"]),
                        ("files", [f"task.data_files={{train: {pairs}, validation: {pairs}}}"])):
        result = run_script([*common, *given, f"hydra.run.dir={tmp_path / name}"], cwd=ROOT, env=env,
                            timeout=HANG_GUARD, fresh=True)
        assert result.returncode == 0, result.stderr[-2000:]
        scores.append(pd.read_parquet(tmp_path / name / "patches.parquet"))
    assert len(scores[0]) == len(scores[1]) > 0
    np.testing.assert_allclose(scores[0]["logit_diff"], scores[1]["logit_diff"], rtol=1e-6, atol=1e-7)


def test_labels_written_as_floats_are_their_classes(tmp_path):
    """``corrupt_label: 0.0`` was refused where ``mode=eval`` takes ``label: 1.0`` as class 1: the same scores as the
    file with integers."""
    scores = []
    for kind, (label, corrupt) in (("int", (1, 0)), ("float", (1.0, 0.0))):
        pairs = tmp_path / f"{kind}.jsonl"
        pairs.write_text("".join(json.dumps({"sentence1": "Ada Bell was born.", "sentence2": f"Ada was born in {y}.",
                                             "label": label, "corrupt_sentence2": f"Ada was born in {y + 1}.",
                                             "corrupt_label": corrupt}) + "\n" for y in (1950, 1930)))
        run("ablate.py", "mode=patch", "allow_random_head=true", f"patch.pairs={pairs}", "patch.sites=[residual]",
            f"hydra.run.dir={tmp_path / kind}", cwd_tmp=tmp_path)
        scores.append(pd.read_parquet(tmp_path / kind / "patches.parquet"))
    pd.testing.assert_frame_equal(scores[0], scores[1])


def test_one_pair_says_it_has_no_standard_error():
    """With one pair the runs' difference has no standard error: the warning says so (it read "within 2 standard
    errors (nan)" of a difference of 0.48); with several, the noise warning reads the paired standard error."""
    from types import SimpleNamespace

    from headlab.analysis.patching.effects import effects

    specs = patch_specs(["residual"], 1, 4, None)
    options = SimpleNamespace(direction="noising", method="exact", resamples=100, confidence=0.95)

    def summary(clean, corrupted):
        run = lambda values: {"logit_diff": np.array(values), "loss": np.zeros(len(values)),  # noqa: E731
                              "prediction": np.ones(len(values), dtype=int)}
        scores = {"clean": run(clean), "corrupted": run(corrupted), 0: run(corrupted),
                  "labels": {"label": np.ones(len(clean), dtype=int)}}
        return effects(scores, specs, options, 0, "classification")[1]

    assert summary([0.5], [0.02])["warning"].startswith("one pair: the clean and corrupted runs' logit differences "
                                                        "are +0.48 apart, with no standard error")
    assert "warning" not in summary([0.5, 0.6, 0.55], [0.02, 0.01, 0.03])
    noisy = summary([0.5, -0.4, 0.1], [0.0, 0.1, 0.05])["warning"]  # differences 0.5, -0.5, 0.05: se 0.289
    assert "within 2 standard errors (0.289)" in noisy


def test_the_summary_line_shows_a_rounded_zero_without_its_sign(tmp_path):
    """A largest change of -1e-5 read "-0.000" (a change that is not there); a rounded -0.0015 keeps its sign."""
    from types import SimpleNamespace

    from headlab.analysis.patching.patch_run import summary_line

    options = SimpleNamespace(direction="denoising", positions="all", method="exact")
    summary = {"clean": {"logit_diff": -1e-6}, "corrupted": {"logit_diff": -2.5}}
    line = summary_line(pd.DataFrame({"site": ["L0H1"], "effect": [-1e-5]}), summary, options, "validation", tmp_path)
    assert "clean 0.0000, corrupted -2.5000; largest change: L0H1 (effect 0.000)" in line
    line = summary_line(pd.DataFrame({"site": ["L0H1"], "effect": [-0.0015]}), summary, options, "validation", tmp_path)
    assert "(effect -0.002)" in line
