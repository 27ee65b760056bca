"""A model's shape and type read from its ``config.json`` as JSON equal what transformers reads from it."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from omegaconf import OmegaConf
from transformers import AutoConfig, BertConfig, BertModel, ElectraConfig, RobertaConfig

from headlab.core.model_files import config_json, model_shape
from headlab.core.models import load_model_reporting, load_tokenizer
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
    ('{"num_hidden_layers": 2}', "has no model_type"),
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
                        vocab_size=vocab_size or max(words.get_vocab().values()) + 1)  # its ids skip two numbers
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
    with pytest.raises(UserError, match="its tokenizer has ids up to 210, past the model's vocab_size 50"):
        load_tokenizer(cfg)
    # the tiny WordPiece list names "a" and "i" twice: 209 tokens, ids up to 210; 210 rows still miss the last id
    assert len(words) == 209
    cfg, _ = saved_bert(tmp_path / "one_short", vocab_size=210)
    with pytest.raises(UserError, match="its tokenizer has ids up to 210, past the model's vocab_size 210"):
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


def edit_config(folder, **fields):
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


@pytest.mark.parametrize(("fields", "expected"), [
    ({"num_hidden_layers": 3}, r"lack 32 of the encoder's weights \(encoder.layer.1.attention"),
    ({"model_type": "distilbert", "dim": 8, "n_layers": 1, "n_heads": 2, "hidden_dim": 16},
     r"lack 16 of the encoder's weights \(transformer.layer.0.attention.k_lin.bias"),
])
def test_weights_that_leave_encoder_parameters_random_are_refused(tmp_path, fields, expected):
    """transformers loads them with a warning: the layers the weights lack drawn at random, all of them for another
    model type's names (features and sweeps of noise); the task head alone is a note of the caller's."""
    cfg, _ = saved_bert(tmp_path / "model")
    BertConfig.from_pretrained(tmp_path / "model")  # saved whole
    edit_config(tmp_path / "model", **fields)
    with pytest.raises(UserError, match=expected + ".*not of the .* its config.json describes"):
        load_model_reporting(cfg)
    for head in ("sequence_classification", "question_answering"):  # the same through a task head's names
        with pytest.raises(UserError, match="of the encoder's weights"):
            load_model_reporting(cfg, head)


def test_weights_of_layers_the_config_lacks_are_refused_and_a_task_head_is_not(tmp_path):
    cfg, _ = saved_bert(tmp_path / "model")
    BertModel(BertConfig.from_pretrained(tmp_path / "model", num_hidden_layers=2)).save_pretrained(tmp_path / "model")
    edit_config(tmp_path / "model", num_hidden_layers=1)
    with pytest.raises(UserError, match=r"hold 16 weights of layers its config does not have \(encoder.layer.1."):
        load_model_reporting(cfg)
    edit_config(tmp_path / "model", num_hidden_layers=2)
    _, missing = load_model_reporting(cfg, "sequence_classification")
    assert sorted(missing) == ["classifier.bias", "classifier.weight"]  # the new task head: the caller's note


def test_weights_of_another_shape_are_named(tmp_path):
    cfg, _ = saved_bert(tmp_path / "model")
    edit_config(tmp_path / "model", vocab_size=300)
    with pytest.raises(UserError, match=r"1 weight\(s\) of another shape, embeddings.word_embeddings.weight "
                                        r"\[211, 8\] vs \[300, 8\]"):
        load_model_reporting(cfg)


def test_a_config_whose_fields_do_not_fit_its_model_type_is_a_user_error(tmp_path):
    cfg, _ = saved_bert(tmp_path / "model")
    edit_config(tmp_path / "model", model_type="modernbert", classifier_dropout=None)
    for load in (load_tokenizer, load_model_reporting):
        with pytest.raises(UserError, match="does not fit its model_type: .*classifier_dropout"):
            load(cfg)


def test_sharded_weights_with_a_shard_missing_or_truncated_are_refused(tmp_path):
    from transformers import BertModel as Bare

    cfg, _ = saved_bert(tmp_path / "model")
    Bare.from_pretrained(tmp_path / "model").save_pretrained(tmp_path / "model", max_shard_size="2KB")
    (tmp_path / "model/model.safetensors").unlink(missing_ok=True)
    shards = sorted((tmp_path / "model").glob("model-*.safetensors"))
    assert len(shards) > 2
    load_model_reporting(cfg)  # whole: loads
    data = shards[1].read_bytes()
    shards[1].write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=f"{shards[1].name}' is truncated"):
        load_model_reporting(cfg)
    shards[1].unlink()
    with pytest.raises(UserError, match=f"1 of the {len(shards)} weight files its index names are missing "
                                        f"\\({shards[1].name}\\)"):
        load_model_reporting(cfg)


def test_a_tokenizer_that_pads_with_another_id_than_the_config_is_refused(tmp_path):
    """RoBERTa weights with a BERT tokenizer: its [PAD] (0) is RoBERTa's <s>, and its [UNK] (1) RoBERTa's padding,
    from which RoBERTa counts its positions."""
    cfg, _ = saved_bert(tmp_path / "model")
    edit_config(tmp_path / "model", model_type="roberta", pad_token_id=1)
    with pytest.raises(UserError, match=r"its tokenizer pads with id 0 \(\[PAD\]\), its config.json says "
                                        r"pad_token_id 1 \(the model's padding, roberta's first position\)"):
        load_tokenizer(cfg)


def test_a_bert_with_an_xlm_r_tokenizer_runs_as_a_plain_forward(tmp_path):
    """multilingual-e5-small's layout: a BERT whose config says pad_token_id 0 and whose XLM-R tokenizer pads with 1.
    BERT reads that id nowhere: a padded batch through headlab's data path gives each sentence's logits alone."""
    import torch
    from transformers import BertForSequenceClassification

    from headlab.core.models import load_model
    from headlab.core.tiny_tokenizers import tiny_tokenizer
    from headlab.tasks.encoding import Collator

    words = tiny_tokenizer("xlm-roberta")
    assert words.pad_token_id == 1
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=8, intermediate_size=16,
                        vocab_size=max(words.get_vocab().values()) + 1, pad_token_id=0, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(tmp_path / "model")
    words.save_pretrained(tmp_path / "model")
    cfg = folder_cfg(tmp_path / "model")
    tokenizer = load_tokenizer(cfg)  # refused before
    sentences = ["the cat sat", "a dog and the cat sat on the mat today"]
    rows = [dict(tokenizer(text)) for text in sentences]
    batch = Collator(tokenizer.pad_token_id)(rows)
    assert (batch["input_ids"][0, len(rows[0]["input_ids"]):] == 1).all()  # padded with 1
    model = load_model(cfg, head="sequence_classification")
    padded = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    plain = BertForSequenceClassification.from_pretrained(tmp_path / "model").eval()
    for i, row in enumerate(rows):
        alone = plain(**{k: torch.tensor([v]) for k, v in row.items()}).logits[0]
        torch.testing.assert_close(padded[i], alone, rtol=0, atol=1e-5)


def test_weights_of_another_architecture_under_the_same_model_name_are_refused(tmp_path):
    """model.name_or_path=FOLDER keeps the preset's name: a RoBERTa checkpoint evaluated as a BERT folder's model
    loaded the checkpoint and recorded the folder; the shapes agree, the architectures do not."""
    from headlab.training.checkpoints import check_same_shape

    cfg, _ = saved_bert(tmp_path / "bert")
    RobertaConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=8, intermediate_size=16,
                  vocab_size=211).save_pretrained(tmp_path / "roberta")
    with pytest.raises(UserError, match=r"holds a roberta 1x2, hidden 8, vocab 211 model, but model=None "
                                        rf"\({tmp_path / 'bert'}\) is bert 1x2, hidden 8, vocab 211"):
        check_same_shape(tmp_path / "roberta", cfg, str(tmp_path / "roberta"))
    check_same_shape(tmp_path / "bert", cfg, str(tmp_path / "bert"))  # its own: passes


def test_a_random_preset_and_its_saved_folder_have_one_architecture(tmp_path):
    """Clusters of ``model=tiny_random ckpt_path=JOB`` were refused on the job's own ``model/`` given as
    ``model.name_or_path``: the preset recorded ``vocab None``, its saved config.json the tiny tokenizer's size."""
    from headlab.core.model_files import architecture
    from headlab.core.models import load_model_reporting

    preset = OmegaConf.load(ROOT / "conf/model/tiny_random.yaml")
    model, _ = load_model_reporting(preset, head="sequence_classification")
    model.save_pretrained(tmp_path / "model")
    load_tokenizer(preset).save_pretrained(tmp_path / "model")
    assert architecture(preset) == architecture(folder_cfg(tmp_path / "model")) == "bert 3x4, hidden 32, vocab 211"
