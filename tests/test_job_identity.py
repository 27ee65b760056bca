"""A job's identity (its folder and its hash) is what can change its result: a finished job rerun with only settings
that cannot (progress bars, the model summary, how often Lightning logs, the profiler, data loader workers, where
the tokenised data is cached) is skipped in the same folder; a setting that changes the result runs it again."""

from __future__ import annotations

from pathlib import Path

from conftest import run

from headlab.files import RESULT_NEUTRAL, without_keys

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
    assert all(key.split(".")[0] in ("trainer", "data") for key in RESULT_NEUTRAL)


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
