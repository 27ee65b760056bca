"""The whole study (``study=quick``, no logger) on a tiny model of each family besides BERT's, as ``test_study.py``
runs it on the tiny BERT, on the default task (``qnli_articles``: a pair classification task, where
test_study.py's is extractive QA); a file of its own so that its runs go to the other test worker."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT
from forked import HANG_GUARD, run_script
from test_study import STAGES, command, environment, summary_of

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("model", ["tiny_albert", "tiny_deberta", "tiny_modernbert"])
def test_the_study_runs_on_every_family(model, tmp_path):
    """The whole study on a tiny model of each family whose attention differs from BERT's (DistilBERT's runs in
    test_hub_recipes.py; RoBERTa's modules are BERT's, its tokenizer's pieces and units are tested in process):
    SentencePiece words, shared depths, disentangled attention, sliding windows; every feature finite."""
    folder = tmp_path / "study"
    words = [f"model={model}" if word == "model=tiny_random" else word for word in command(folder, "logger=none")
             if word != "task=demo_qa"]  # the default task: the study of a pair classification task
    result = run_script(words, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr[-3000:]
    for number, stage in enumerate(STAGES, start=1):
        assert f"[{number}/13] {stage}: " in result.stdout + result.stderr
    summary = summary_of(folder)
    assert summary["model"] == model and summary["findings"] and (folder / "study.md").is_file()
    for name in ("pretrained", "seed0"):
        with np.load(folder / f"features/{name}/features.npz") as features:
            for key in features.files:
                values = features[key]
                assert values.dtype.kind not in "fc" or np.isfinite(values).all(), (name, key)
        assert len(pd.read_csv(folder / f"syntax/{name}/syntax.csv")) > 1
    assert pd.read_csv(folder / "sweep/seed0/deltas_validation.csv", index_col=0).shape == (3, 4)  # every head
