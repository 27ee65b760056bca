"""What a model's files say before any weights load, read as JSON and bytes (no torch, no transformers): its
``config.json`` (the shape a plan is checked against, the model type) and whether a saved folder holds whole weights.

A hub name is looked up the way ``from_pretrained`` does it (``huggingface_hub.hf_hub_download``: the cache, and the
hub unless ``HF_HUB_OFFLINE=1``), so a typo answers in a second, not after torch and transformers have loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headlab.core.families import family_for
from headlab.errors import UserError
from headlab.files import read_json

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")

def looks_local(name_or_path: str) -> bool:
    return name_or_path.startswith(("/", "./", "../", "~")) or Path(name_or_path).exists()


def hub_error(name_or_path: str) -> UserError:
    return UserError(
        f"model {name_or_path!r} is neither in the Hugging Face cache nor reachable on the hub; run once online "
        "to cache it, or set model.name_or_path to a local folder saved with save_pretrained"
    )


def check_name_or_path(name_or_path: str | None) -> bool:
    """Whether ``name_or_path`` names a local folder (True) or a hub model (False); ``UserError`` when it is empty
    or a local folder that does not exist."""
    if not name_or_path:
        raise UserError("model.name_or_path is empty: give a hub model name or a local folder (or random_init=true)")
    local = looks_local(name_or_path)
    if local and not Path(name_or_path).expanduser().is_dir():
        raise UserError(f"model folder {name_or_path!r} does not exist")
    return local


def config_file(name_or_path: str | None) -> Path:
    """The ``config.json`` of a hub name (cached, or fetched as ``from_pretrained`` would) or of a local folder."""
    if check_name_or_path(name_or_path):
        folder = Path(name_or_path).expanduser()
        if not (folder / "config.json").is_file():
            raise UserError(f"model folder {name_or_path!r} cannot be loaded: it has no config.json (not a folder "
                            "saved with save_pretrained)")
        return folder / "config.json"
    from huggingface_hub import hf_hub_download  # ~0.4 s: only for hub names

    try:
        return Path(hf_hub_download(name_or_path, "config.json"))
    except (OSError, ValueError):  # not cached offline, unreachable, no such repo, or not a valid repo id
        raise hub_error(name_or_path) from None


def config_json(model_cfg: Any) -> dict[str, Any]:
    """The model's config as saved (a random model: its ``config`` fields, ``model_type`` bert unless given), checked
    to be a supported encoder, with ``num_hidden_layers`` and ``num_attention_heads`` whatever its family calls them."""
    if model_cfg.get("random_init"):
        config, where = {"model_type": "bert"} | dict(model_cfg.config), "model.config"
    else:
        path = config_file(model_cfg.name_or_path)
        config, where = read_json(path, "model config"), repr(str(path))
        if not isinstance(config, dict):
            raise UserError(f"{where} is not a model config (a JSON object)")
    if "model_type" not in config:
        raise UserError(f"{where} has no model_type: not a config.json that save_pretrained writes (BERT's says "
                        "\"model_type\": \"bert\")")
    layers, heads = family_for(config.get("model_type")).shape(config, where)
    return config | {"num_hidden_layers": layers, "num_attention_heads": heads}


def architecture(model_cfg: Any) -> str:
    """What makes a model's heads its own, from ``config.json`` alone: ``bert 6x12, hidden 384, vocab 30522``. Jobs
    record it beside ``model.name`` (which a folder given by ``model.name_or_path`` does not change), and a clusters,
    importance or syntax file of another architecture is refused: a fine-tuned model keeps its pre-trained one."""
    config = config_json(model_cfg)
    if model_cfg.get("random_init"):  # the vocabulary its tiny tokenizer gives it, as its saved config.json says
        from headlab.core.tiny_tokenizers import tiny_config_fields

        config = {"vocab_size": tiny_config_fields(config["model_type"])["vocab_size"]} | config
    hidden = _hidden_size(config)
    return (f"{config['model_type']} {config['num_hidden_layers']}x{config['num_attention_heads']}, hidden {hidden}, "
            f"vocab {config.get('vocab_size')}")


def model_shape(model_cfg: Any) -> tuple[int, int]:
    """``(num_layers, num_heads)`` from the model's ``config.json`` alone."""
    config = config_json(model_cfg)
    return config["num_hidden_layers"], config["num_attention_heads"]


def head_width(model_cfg: Any) -> int:
    """The width of a head's context vector (what ``prune`` zeroes), from ``config.json`` alone."""
    config = config_json(model_cfg)
    return int(config.get("head_dim") or _hidden_size(config) // config["num_attention_heads"])


def _hidden_size(config: dict[str, Any]) -> Any:
    return config.get("hidden_size", config.get("dim"))  # DistilBERT's name


def check_fits_positions(model_cfg: Any, length: int, what: str = "task.max_length") -> None:
    """A ``UserError`` when sequences of ``length`` tokens would run past the model's position embeddings."""
    config = config_json(model_cfg)
    positions = family_for(config["model_type"]).positions(config)
    if positions is not None and length > positions:
        raise UserError(f"{what}={length} is longer than the {positions} positions model {model_cfg.get('name')!r} "
                        f"has (max_position_embeddings in its config); set {what} to at most {positions}")


def check_weights_folder(folder: str | Path, what: str) -> None:
    """A ``UserError`` naming ``what`` when a local ``save_pretrained`` folder has no weights file or a truncated
    ``model.safetensors`` (its header, or the tensors it lists, run past the end of the file). Reads the header only."""
    folder = Path(folder)
    found = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not found:
        raise UserError(f"{what}: {str(folder)!r} has no weights file ({' or '.join(WEIGHT_FILES[::2])}); it was not "
                        "saved whole: train or save it again")
    if found[0] == "model.safetensors":
        check_safetensors(folder / "model.safetensors", what)
    elif found[0] == "model.safetensors.index.json":  # sharded: every shard the index names, each whole
        index = read_json(folder / found[0], "weights index")
        shards = sorted(set((index.get("weight_map") or {}).values())) if isinstance(index, dict) else []
        if not shards:
            raise UserError(f"{what}: {str(folder / found[0])!r} names no weight files (no weight_map); train or "
                            "save it again")
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            raise UserError(f"{what}: {len(missing)} of the {len(shards)} weight files its index names are missing "
                            f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); copy the whole folder")
        for name in shards:
            check_safetensors(folder / name, what)


def check_safetensors(path: Path, what: str) -> None:
    """A ``UserError`` naming ``what`` when a safetensors file is unreadable or truncated (its header, or the tensors
    it lists, run past the end of the file). Reads the header only."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if len(handle.read(min(length, size))) != length or length == 0:
                raise ValueError("the header runs past the end of the file")
            handle.seek(8)
            header = json.loads(handle.read(length))
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise UserError(f"{what}: {str(path)!r} is not a readable safetensors file ({error}); train or save it "
                        "again") from None
    if 8 + length + end > size:
        raise UserError(f"{what}: {str(path)!r} is truncated ({size} bytes; its tensors need {8 + length + end}); "
                        "train or save it again")


# A tokenizer's vocabulary, in the formats transformers saves (WordPiece, byte-level BPE, SentencePiece, fast).
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "spm.model",
                    "tokenizer.model")


def check_tokenizer_folder(folder: str | Path, what: str) -> None:
    """A ``UserError`` naming ``what`` when a local model folder has no tokenizer vocabulary: transformers then
    builds a tokenizer of its special tokens alone, and every word becomes ``[UNK]``."""
    folder = Path(folder).expanduser()
    if not any((folder / name).is_file() for name in VOCABULARY_FILES):
        raise UserError(f"{what}: {str(folder)!r} has no tokenizer (none of {', '.join(VOCABULARY_FILES)}); save the "
                        "model's tokenizer there too (tokenizer.save_pretrained)")


def check_tokenizer_fits(tokenizer: Any, config: dict[str, Any], what: str) -> None:
    """A ``UserError`` naming ``what`` when the tokenizer's ids run past the model's embeddings rows, or, for a
    family whose positions count from the padding id (RoBERTa's), it pads with another id than the config's
    ``pad_token_id``: a tokenizer of another model. (A BERT with an XLM-R tokenizer, multilingual-e5's layout, pads
    with 1 where its config says 0: BERT reads that id nowhere, the attention mask hides the padding.)"""
    from headlab.core.families import MODEL_TYPES

    padding, pads = config.get("pad_token_id"), tokenizer.pad_token_id
    family = MODEL_TYPES.get(config.get("model_type"))
    if family is not None and family.positions_from_padding and isinstance(padding, int) and \
            isinstance(pads, int) and padding != pads:
        raise UserError(f"{what}: its tokenizer pads with id {pads} ({tokenizer.pad_token}), its config.json says "
                        f"pad_token_id {padding} (the model's padding, {family.name}'s first position): a tokenizer "
                        "of another model? give the model's own tokenizer")
    rows = config.get("vocab_size")
    ids = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)  # ids may skip numbers
    if isinstance(rows, int) and ids > rows:
        raise UserError(f"{what}: its tokenizer has ids up to {ids - 1}, past the model's vocab_size {rows} (its "
                        "embeddings): a tokenizer of another model? give the model's own tokenizer")
