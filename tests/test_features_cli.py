"""``ablate.py mode=features`` end to end on the tiny BERT: a text file and a task split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run, wandb_log
from omegaconf import OmegaConf

import headlab
from headlab.analysis.types.feature_data import read_text_lines
from headlab.analysis.types.features import AttentionFeatures, attention_features
from headlab.analysis.types.features_run import encoder
from headlab.core.models import load_model, load_tokenizer
from headlab.errors import UserError
from headlab.training.checkpoint_loading import load_checkpoint
from headlab.training.checkpoints import Checkpoint

LINES = ["The doctor, Smith.", "", "Who was the doctor?\tIt was Smith. He lives here.",
         "The city is old.", "Is it old?\tThe river rose by two metres overnight, and the bridge was closed."]


def test_features_of_a_text_file_equal_the_api_on_the_same_sequences(tmp_path, tiny_cfg):
    text = tmp_path / "lines.txt"
    text.write_text("\n".join(LINES) + "\n")
    job = tmp_path / "job"
    result = run("ablate.py", "mode=features", f"features.text_file={text}", "features.batch_size=3",
                 "features.max_length=12", f"hydra.run.dir={job}", "logger=wandb", cwd_tmp=tmp_path)
    assert b"heads.table.json" in wandb_log(job)
    tokenizer, model = load_tokenizer(tiny_cfg), load_model(tiny_cfg)
    rows = [line.split("\t") for line in LINES if line]
    long = sum(len(tokenizer(*row)["input_ids"]) > 12 for row in rows)
    assert 0 < long < 4
    assert f"note: {long} of 4 sequences were longer than 12 tokens and were truncated" in result.stdout
    summary = json.loads((job / "results.json").read_text())
    assert (summary["num_sequences"], summary["truncated"], summary["complete"]) == (4, long, True)
    assert summary["source"]["kind"] == "text_file" and summary["task"] == "lines.txt"  # not the default task
    for name in summary["files"]:
        assert (job / name).is_file(), name

    encoded = [tokenizer(*row, truncation=True, max_length=12, return_tensors="pt") for row in rows]
    expected = attention_features(model, tokenizer, encoded)  # one sequence per batch, no padding
    saved = AttentionFeatures.from_arrays(dict(np.load(job / "features.npz")))
    np.testing.assert_allclose(saved.distance, expected.distance, atol=1e-6)
    np.testing.assert_allclose(saved.js, expected.js, atol=1e-6)
    for name, values in expected.sieve.items():
        np.testing.assert_allclose(saved.sieve[name], values, atol=1e-5)
    table = pd.read_parquet(job / "heads.parquet")
    assert len(table) == 12 and list(table.columns[:3]) == ["layer", "head", "name"]
    np.testing.assert_allclose(table["clark_entropy"], expected.clark["entropy"].reshape(-1), atol=1e-6)
    assert {"role_local", "role_delimiter", "role_block"} <= set(table.columns)
    assert np.load(job / "features.npz")["source"].tolist() == [1, 3, 4, 5]  # line numbers, blank line skipped

    again = run("ablate.py", "mode=features", f"features.text_file={text}", "features.batch_size=3",
                "features.max_length=12", f"hydra.run.dir={job}", cwd_tmp=tmp_path)
    assert "already done" in again.stdout


def test_features_of_a_task_split_sample_the_examples_with_the_seed(tmp_path, tokenizer):
    job = tmp_path / "job"
    result = run("ablate.py", "mode=features", "features.max_sequences=30", "features.families=[distance,clark]",
                 f"hydra.run.dir={job}", cwd_tmp=tmp_path)
    summary = json.loads((job / "results.json").read_text())
    assert summary["num_sequences"] == 30 and summary["families"] == ["distance", "clark"]
    source = np.load(job / "features.npz")["source"]
    assert len(set(source.tolist())) == 30 and source.max() > 40  # a random sample, not the first 30
    assert not (job / "sieve_roles.csv").exists()
    # the pairs longer than task.max_length (128), counted on the sampled examples untruncated
    rows = pd.read_json(Path(headlab.__file__).parent / "tasks/data/demo_pairs/validation.jsonl", lines=True)
    long = sum(len(tokenizer(rows.sentence1[i], rows.sentence2[i])["input_ids"]) > 128 for i in source.tolist())
    assert 0 < long < 30 and summary["truncated"] == long
    assert f"note: {long} of 30 sequences were longer than 128 tokens and were truncated" in result.stdout


def test_features_of_a_fine_tuned_job_load_its_encoder_without_a_load_report(trained):
    """The task head's weights go unused (and a QA model has no pooler): no transformers load report about them."""
    root, _ = trained
    job = root / "features_quiet"
    result = run("ablate.py", "mode=features", f"ckpt_path={root / 'train'}", "features.max_sequences=8",
                 "features.families=[distance]", f"hydra.run.dir={job}", cwd_tmp=root)
    output = result.stdout + result.stderr
    assert "LOAD REPORT" not in output and "classifier" not in output
    assert [line for line in output.splitlines() if "note:" in line and "truncated" not in line] == []
    assert json.loads((job / "results.json").read_text())["checkpoint"]["kind"] == "job"


def test_a_task_head_missing_from_the_weights_is_an_error_or_one_note(tmp_path, tiny_cfg, capfd):
    """Bare encoder weights under a classification head: an error, or (allow_random_head) one note naming the random
    head weights; never transformers' multi-line load report."""
    load_model(tiny_cfg).save_pretrained(tmp_path / "bare")
    checkpoint, task = Checkpoint("pretrained", str(tmp_path / "bare")), OmegaConf.create(
        {"name": "pairs", "type": "classification", "num_labels": 2})
    with pytest.raises(UserError, match="has no trained sequence_classification head"):
        load_checkpoint(checkpoint, tiny_cfg, task)
    load_checkpoint(checkpoint, tiny_cfg, task, allow_random_head=True)
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "MISSING" not in out + err
    assert [line for line in out.splitlines() if line.startswith("note:")] == [
        f"note: 2 weight(s) not in {tmp_path / 'bare'}, initialised at random: classifier.bias, classifier.weight"]


def test_encoder_weights_missing_from_a_checkpoint_are_refused_and_a_missing_pooler_is_not(tmp_path, tiny_cfg,
                                                                                          capsys):
    """A save_pretrained folder without the pooler (not needed: loads, no note) and without one encoder weight too
    (needed: drawn at random it would make that head's features noise, so the folder is refused, the weight named)."""
    model = load_model(tiny_cfg)
    weights = {k: v for k, v in model.state_dict().items() if not k.startswith("pooler.")}
    model.save_pretrained(tmp_path / "weights", state_dict=weights)
    job = OmegaConf.create({"model": tiny_cfg, "seed": 0})
    loaded = encoder(Checkpoint("pretrained", str(tmp_path / "weights")), job)
    assert capsys.readouterr().out == ""
    assert torch.equal(loaded.encoder.layer[1].attention.self.query.weight,
                       model.encoder.layer[1].attention.self.query.weight)
    weights = {k: v for k, v in model.state_dict().items()
               if not k.startswith("pooler.") and k != "encoder.layer.0.attention.self.query.weight"}
    model.save_pretrained(tmp_path / "weights", state_dict=weights)
    with pytest.raises(UserError, match=r"lack 1 of the encoder's weights \(encoder.layer.0.attention.self.query"):
        encoder(Checkpoint("pretrained", str(tmp_path / "weights")), job)


@pytest.mark.parametrize(("line", "expected"), [("\tonly the second", "has a tab with nothing before it"),
                                                 ("only the first\t", "has a tab with nothing after it"),
                                                 ("one\ttwo\tthree", "has 3 tab-separated texts")])
def test_a_line_that_is_neither_a_sequence_nor_a_pair_is_named(tmp_path, line, expected):
    text = tmp_path / "lines.txt"
    text.write_text(f"A sentence.\n\nQuestion?\tAnswer.\n{line}\n")
    with pytest.raises(UserError, match=f"line 4 {expected}"):
        read_text_lines(text)
    text.write_text("A sentence.\n\nQuestion?\tAnswer.\n")
    assert read_text_lines(text) == [(1, ["A sentence."]), (3, ["Question?", "Answer."])]


def test_line_numbers_count_newlines_only(tmp_path):
    """A form feed, U+2028 or a lone carriage return inside a line is no line break (str.splitlines took them for
    one, and every later line number in errors was off); Windows line ends are."""
    text = tmp_path / "lines.txt"
    text.write_bytes("One\x0cpage.\r\nA\u2028b\rc.\tAnswer.\nx\ty\tz\n".encode())
    with pytest.raises(UserError, match="line 3 has 3 tab-separated texts"):
        read_text_lines(text)
    text.write_bytes("One\x0cpage.\r\nA\u2028b.\tAnswer.".encode())
    assert read_text_lines(text) == [(1, ["One\x0cpage."]), (2, ["A\u2028b.", "Answer."])]
