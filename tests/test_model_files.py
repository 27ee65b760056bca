"""A model's shape and type read from its ``config.json`` as JSON equal what transformers reads from it."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from transformers import AutoConfig, BertConfig, ElectraConfig, RobertaConfig

from headlab.core.model_files import config_json, model_shape
from headlab.errors import UserError


def folder_cfg(path):
    return OmegaConf.create({"name_or_path": str(path), "random_init": False})


@pytest.mark.parametrize("config", [BertConfig(num_hidden_layers=3, num_attention_heads=4, hidden_size=16),
                                    RobertaConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=8),
                                    ElectraConfig(num_hidden_layers=5, num_attention_heads=1, hidden_size=8)])
def test_shape_of_a_saved_folder_is_transformers_own(tmp_path, config):
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert model_shape(folder_cfg(tmp_path)) == (loaded.num_hidden_layers, loaded.num_attention_heads)


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra"])
def test_a_config_without_its_shape_gets_the_defaults_transformers_fills_in(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert model_shape(folder_cfg(tmp_path)) == (loaded.num_hidden_layers, loaded.num_attention_heads)


def test_a_random_model_is_bert_with_its_config_fields():
    cfg = OmegaConf.create({"random_init": True, "config": {"num_hidden_layers": 3, "num_attention_heads": 4}})
    assert model_shape(cfg) == (3, 4)
    assert model_shape(OmegaConf.create({"random_init": True, "config": {}})) == (12, 12)  # BertConfig's


@pytest.mark.parametrize(("content", "expected"), [
    ('{"model_type": "gpt2", "n_layer": 2}', "model_type 'gpt2' is not a supported"),
    ('{"model_type": "bert", "num_hidden_layers": "3"}', "num_hidden_layers='3' is not a positive integer"),
    ('{"model_type": "bert", "num_attention_heads": 0}', "num_attention_heads=0 is not a positive integer"),
    ("[1, 2]", "is not a model config"),
    ("{not json", "config.json"),
])
def test_a_bad_config_json_is_a_user_error(tmp_path, content, expected):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(UserError, match=expected):
        config_json(folder_cfg(tmp_path))


def test_missing_folders_files_and_hub_names(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="does not exist"):
        model_shape(folder_cfg(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="has no config.json"):
        model_shape(folder_cfg(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    for name in ("someone/no-such-model", "not a repo id!"):
        with pytest.raises(UserError, match="neither in the Hugging Face cache nor reachable"):
            model_shape(OmegaConf.create({"name_or_path": name, "random_init": False}))
