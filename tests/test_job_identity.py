"""A job's identity (its folder and its hash) is what can change its result: a finished job rerun with only settings
that cannot (progress bars, the model summary, how often Lightning logs, the profiler, data loader workers, where
the tokenised data is cached) is skipped in the same folder; a setting that changes the result runs it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run
from omegaconf import OmegaConf

from headlab.analysis.jobs.identity import resumable
from headlab.files import RESULT_NEUTRAL, without_keys, write_json_atomic

NEUTRAL = ["trainer.enable_progress_bar=true", "trainer.enable_model_summary=false", "trainer.log_every_n_steps=7",
           "trainer.profiler=simple", "data.num_workers=1"]


def only_results(root: Path) -> Path:
    """The one ``results.json`` under ``root/outputs``."""
    found = list((root / "outputs").rglob("results.json"))
    assert len(found) == 1, found
    return found[0]


def test_settings_that_cannot_change_a_result_are_no_part_of_its_hash():
    config = {"trainer": {"enable_progress_bar": True, "max_steps": 4, "profiler": None},
              "data": {"num_workers": 2, "cache_dir": "c", "batch_size": 8}, "seed": 0}
    assert without_keys(config) == {"trainer": {"max_steps": 4}, "data": {"batch_size": 8}, "seed": 0}
    assert all(key.split(".")[0] in ("trainer", "data", "model") for key in RESULT_NEUTRAL)
    assert without_keys({"model": {"name": "m", "pretraining": "masked LM"}}) == {"model": {"name": "m"}}


def test_keys_added_later_stay_out_of_the_hash_at_their_default():
    """``mask.constants``, ``importance.learned`` and ``study.gates`` came after jobs had been hashed: at their defaults
    a job's hashed config is the one it had without them (its results stay done); set, they count. (The hashes of an
    eval, importance, prune_curve, sweep and train.py job were checked equal to the previous commit's by hand.)"""
    from headlab.analysis.jobs.identity import hashed_part
    from headlab.files import ADDED_KEYS, without_added_keys

    before = {"mode": "importance", "mask": {"rules": [], "unit": "sentence"}, "importance": {"max_examples": 20}}
    added = {"mode": "importance", "mask": {"rules": [], "unit": "sentence", "constants": None},
             "importance": {"max_examples": 20, "learned": None}}
    assert hashed_part(added) == hashed_part(before) and without_added_keys({"study": {"gates": {}}}) == {"study": {}}
    assert hashed_part({**added, "importance": {"max_examples": 20, "learned": ["job"]}}) != hashed_part(before)
    assert set(ADDED_KEYS) == {"mask.constants", "importance.learned", "study.gates"}


def test_an_evaluation_rerun_with_only_neutral_settings_changed_is_skipped(tmp_path):
    args = ["mode=eval", "allow_random_head=true", "mask=prune", "mask.heads=L0"]
    run("ablate.py", *args, cwd_tmp=tmp_path, cwd=tmp_path)
    results = only_results(tmp_path)
    first = results.read_bytes()
    again = run("ablate.py", *args, *NEUTRAL, f"data.cache_dir={tmp_path / 'elsewhere'}", cwd_tmp=tmp_path,
                cwd=tmp_path).stdout
    assert "already done" in again and "settings changed" not in again
    assert only_results(tmp_path) == results and results.read_bytes() == first
    other = run("ablate.py", *args, *NEUTRAL, "data.max_eval_examples=30", f'hydra.run.dir="{results.parent}"',
                cwd_tmp=tmp_path, cwd=tmp_path).stdout
    assert "already done" not in other and "data.max_eval_examples 40 -> 30" in other
    assert results.read_bytes() != first


def test_a_fine_tuning_rerun_with_only_neutral_settings_changed_is_skipped(tmp_path):
    args = ["data.batch_size=8", "data.max_train_examples=32", "trainer.max_steps=2", "trainer.val_check_interval=2",
            "trainer.num_sanity_val_steps=0"]
    run("train.py", *args, cwd_tmp=tmp_path, cwd=tmp_path)
    results = only_results(tmp_path)
    first = results.read_bytes()
    again = run("train.py", *args, *NEUTRAL, cwd_tmp=tmp_path, cwd=tmp_path).stdout
    assert "already done" in again and only_results(tmp_path) == results and results.read_bytes() == first
    other = run("train.py", *args, *NEUTRAL, "optim.lr=0.001", f'hydra.run.dir="{results.parent}"', cwd_tmp=tmp_path,
                cwd=tmp_path).stdout
    assert "already done" not in other and "settings changed" in other and "optim.lr" in other


def test_a_job_run_in_a_folder_of_other_results_removes_them_before_it_writes(tmp_path):
    """Rerun in its folder with another setting and killed part-way, a job left the earlier run's complete
    ``results.json`` beside its own first files: the earlier command then read "already done" over a mix of both."""
    @resumable
    def job(cfg, identity):
        (identity.output_dir / "table.csv").write_text(f"min_count {cfg.syntax.min_count}\n")
        if cfg.syntax.min_count == 1:
            raise KeyboardInterrupt  # killed after its first file
        summary = identity.complete({"kind": "syntax", "rows": cfg.syntax.min_count})
        write_json_atomic(identity.output_dir / "results.json", summary)
        return summary

    earlier, other = (OmegaConf.create({"mode": "syntax", "seed": 0, "syntax": {"min_count": count}})
                      for count in (5, 1))
    assert job(earlier, tmp_path)["rows"] == 5
    with pytest.raises(KeyboardInterrupt):
        job(other, tmp_path)
    assert not (tmp_path / "results.json").exists()  # the folder no longer reads as the earlier run, done
    assert job(earlier, tmp_path)["rows"] == 5  # run again, not "already done" over the other run's table
    assert (tmp_path / "table.csv").read_text() == "min_count 5\n"
    assert json.loads((tmp_path / "results.json").read_text())["complete"]
