"""A model's shape and type read from its ``config.json`` as JSON equal what transformers reads from it."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from transformers import AutoConfig, BertConfig, BertModel, ElectraConfig, RobertaConfig

from headlab.core.model_files import config_json, model_shape
from headlab.core.models import load_tokenizer
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


def saved_bert(folder, vocab_size=None, tokenizer=True):
    """A tiny BERT saved with ``save_pretrained`` (its tiny tokenizer beside it unless ``tokenizer=False``)."""
    from headlab.core.tiny_tokenizers import tiny_tokenizer

    words = tiny_tokenizer("bert")
    config = BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=8, intermediate_size=16,
                        vocab_size=vocab_size or len(words))
    BertModel(config).save_pretrained(folder)
    if tokenizer:
        words.save_pretrained(folder)
    return folder_cfg(folder), words


def test_a_model_folder_without_a_tokenizer_is_refused_not_read_as_unknown_tokens(tmp_path):
    """transformers made a tokenizer of the five special tokens alone: training ran on [UNK] [UNK] ... and exited 0."""
    cfg, _ = saved_bert(tmp_path / "bare", tokenizer=False)
    with pytest.raises(UserError, match="has no tokenizer"):
        load_tokenizer(cfg)
    whole, words = saved_bert(tmp_path / "whole")
    assert load_tokenizer(whole)("Sana was born")["input_ids"] == words("Sana was born")["input_ids"]


def test_a_tokenizer_larger_than_the_embeddings_is_refused(tmp_path):
    """Its largest ids ran past the embeddings: an IndexError in the first forward, after the data was tokenised."""
    cfg, words = saved_bert(tmp_path / "small", vocab_size=50)
    with pytest.raises(UserError, match=f"its tokenizer has {len(words)} tokens, more than the model's vocab_size 50"):
        load_tokenizer(cfg)


def test_an_unreadable_tokenizer_config_is_a_user_error(tmp_path):
    cfg, _ = saved_bert(tmp_path / "broken")
    path = tmp_path / "broken/tokenizer_config.json"
    path.write_text(path.read_text()[:20])
    with pytest.raises(UserError, match="its tokenizer files cannot be read"):
        load_tokenizer(cfg)


def test_final_weights_get_the_mode_of_any_new_file(tmp_path):
    """transformers writes model.safetensors 0600: a group sharing the job folder could not read the weights."""
    import os

    from headlab.training.finetune import save_final_weights

    umask = os.umask(0o022)
    os.umask(umask)
    _, words = saved_bert(tmp_path / "source")
    folder = save_final_weights(BertModel.from_pretrained(tmp_path / "source"), words, tmp_path / "model")
    modes = {path.name: path.stat().st_mode & 0o777 for path in folder.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}
