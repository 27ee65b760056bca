"""Models and tokenizers from a ``model`` config group entry.

A model config is either a checkpoint (``name_or_path``: a hub name or a folder) or a
random encoder (``random_init: true`` with a ``config`` of its config class's fields, ``model_type`` bert unless
given), which comes with a small tokenizer of its model type built in code (``tiny_tokenizers``) so that tests need
no download.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from rich.console import Console
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
)
from transformers.utils import logging as hf_logging

from headlab.core.families import family_for
from headlab.core.model_files import (
    check_name_or_path,
    check_tokenizer_fits,
    check_tokenizer_folder,
    check_weights_folder,
    config_json,
    hub_error,
)
from headlab.core.tiny_tokenizers import tiny_config_fields, tiny_tokenizer
from headlab.errors import UserError

log = logging.getLogger(__name__)

HEADS = {
    None: AutoModel,
    "sequence_classification": AutoModelForSequenceClassification,
    "question_answering": AutoModelForQuestionAnswering,
}

def from_hub_or_folder(loader: Any, name_or_path: str | None, **kwargs: Any) -> Any:
    """``loader.from_pretrained(name_or_path)``; ``UserError`` for a missing folder or an unreachable hub model."""
    local = check_name_or_path(name_or_path)
    try:
        return loader.from_pretrained(name_or_path, **kwargs)
    except StrictDataclassError as error:  # a config field of the wrong type for its model type
        raise UserError(f"the config.json of {name_or_path!r} does not fit its model_type: "
                        f"{' '.join(str(error).split())[:300]}") from None
    except OSError as error:
        if local:
            raise UserError(f"model folder {name_or_path!r} cannot be loaded: {' '.join(str(error).split())}") from None
        raise hub_error(name_or_path) from None


def model_config(cfg: Any) -> PretrainedConfig:
    """The model's config (no weights are read), checked to be of a supported family."""
    if cfg.get("random_init"):
        fields = dict(cfg.config)
        model_type = fields.pop("model_type", "bert")
        family_for(model_type)
        return AutoConfig.for_model(model_type, **(tiny_config_fields(model_type) | fields))
    config = from_hub_or_folder(AutoConfig, cfg.name_or_path)
    family_for(config.model_type)
    return config


def apply_runtime_options(model, cfg: Any) -> None:
    """The top-level ``compile`` option of train.py and ablate.py, in place.

    ``compile`` uses ``Module.compile()``: state-dict keys and checkpoints stay those of the plain model.
    """
    if cfg.get("compile"):
        model.compile()
        log.info("compile=true: torch.compile compiles the model on its first batches (and once more per plan)")


def load_tokenizer(cfg: Any):
    """The checkpoint's tokenizer; a random model's: the tiny one of its model type (``tiny_tokenizers``)."""
    if cfg.get("random_init"):
        return tiny_tokenizer(dict(cfg.get("config") or {}).get("model_type", "bert"))
    where = f"model.name_or_path={cfg.name_or_path!r}"
    config = config_json(cfg)  # its errors first: transformers reads config.json for the tokenizer too
    if check_name_or_path(cfg.name_or_path):
        check_tokenizer_folder(cfg.name_or_path, where)
    try:
        tokenizer = from_hub_or_folder(AutoTokenizer, cfg.name_or_path)
    except UserError:
        raise
    except ValueError as error:  # a tokenizer_config.json / tokenizer.json that is not JSON
        raise UserError(f"{where}: its tokenizer files cannot be read ({' '.join(str(error).split())}); save the "
                        "tokenizer again (save_pretrained)") from None
    check_tokenizer_fits(tokenizer, config, where)
    return tokenizer


def load_model(cfg: Any, head: str | None = None, overrides: dict[str, Any] | None = None):
    """The model in eval mode; ``head`` picks a task head (see ``HEADS``), ``overrides`` sets config fields."""
    return load_model_reporting(cfg, head, overrides)[0]


def load_model_reporting(cfg: Any, head: str | None = None, overrides: dict[str, Any] | None = None,
                         quiet: bool = False, seed: int | None = None):
    """``(model, missing)``: ``load_model``'s model and the parameters the weights did not have (newly initialised;
    every parameter of a ``random_init`` model). A size mismatch with the weights is a ``UserError``.
    ``quiet``: no transformers load report of missing or unused weights (the caller says what matters).
    ``seed``: the missing weights are drawn from it, the caller's random state untouched (None: drawn from that
    state, as fine-tuning wants: its ``seed`` then also varies the new head)."""
    if head not in HEADS:
        raise ValueError(f"unknown model head {head!r}; valid heads: {', '.join(map(str, HEADS))}")
    config = model_config(cfg)
    for name, value in (overrides or {}).items():
        setattr(config, name, value)
    if cfg.get("random_init"):
        with torch.random.fork_rng(devices=[]):  # the weights' own seed; the caller's RNG (its seed) is untouched
            torch.manual_seed(cfg.get("seed", 0))
            model = HEADS[head].from_config(config)
        return model.eval(), [name for name, _ in model.named_parameters()]
    if Path(cfg.name_or_path).is_dir():
        check_weights_folder(cfg.name_or_path, f"model.name_or_path={cfg.name_or_path!r}")
    verbosity = hf_logging.get_verbosity()
    try:
        if quiet:
            hf_logging.set_verbosity_error()
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            model, info = HEADS[head].from_pretrained(cfg.name_or_path, config=config, output_loading_info=True)
    except RuntimeError as error:  # ignore_mismatched_sizes=False: weights of another shape
        raise UserError(f"the weights in {cfg.name_or_path!r} do not fit a {head or 'bare'} {config.model_type} "
                        f"model of its config{' with ' + str(dict(overrides)) if overrides else ''}: "
                        f"{_mismatches(HEADS[head], cfg.name_or_path, config) or ' '.join(str(error).split())[:300]}"
                        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    check_encoder_weights(model, info, cfg.name_or_path)
    return model.eval(), list(info["missing_keys"])


def _mismatches(loader: Any, name_or_path: str, config: PretrainedConfig) -> str:
    """The first weights whose shapes differ from the config's, ``name [saved] vs [config]`` (transformers' own
    message points at a load report that a quiet load does not print): the load again, told to ignore them."""
    hf_logging.set_verbosity_error()
    try:
        _, info = loader.from_pretrained(name_or_path, config=config, output_loading_info=True,
                                         ignore_mismatched_sizes=True)
    except Exception:
        return ""
    found = [f"{key} {list(saved)} vs {list(wanted)}" for key, saved, wanted in info.get("mismatched_keys", [])]
    return f"{len(found)} weight(s) of another shape, {'; '.join(found[:3])}{' ...' if len(found) > 3 else ''}" \
        if found else ""


def check_encoder_weights(model: torch.nn.Module, info: dict[str, Any], name_or_path: str) -> None:
    """A ``UserError`` when the weights lack a parameter of the encoder (its pooler aside), or hold one of a layer the
    config does not have: weights of another model type or depth, which transformers loads with a warning, the
    encoder partly random or cut short. A missing task head is the caller's to note (fine-tuning makes one)."""
    prefix = "" if model.base_model is model else f"{model.base_model_prefix}."
    encoder = {prefix + name for name, _ in model.base_model.named_parameters(remove_duplicate=False)}
    missing = sorted(key for key in info["missing_keys"] if key in encoder and "pooler." not in key)

    def pattern(key: str) -> str:  # encoder.layer.3.attention... -> encoder.layer.#.attention...
        return re.sub(r"\.\d+\.", ".#.", "." + key.removeprefix(prefix) + ".")

    patterns = {pattern(name) for name in encoder}
    extra = sorted(key for key in info["unexpected_keys"] if pattern(key) in patterns)
    if missing or extra:
        config = model.config
        keys = missing or extra
        named = f"{', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
        what = f"lack {len(keys)} of the encoder's weights ({named})" if missing else \
            f"hold {len(keys)} weights of layers its config does not have ({named})"
        raise UserError(f"the weights in {name_or_path!r} {what}: they are not of the {config.model_type} its "
                        "config.json describes (another model type or depth?); give the folder its own config.json")


def weights_hash(model: torch.nn.Module) -> str:
    """Short sha256 of every tensor of the state dict (names, dtypes, shapes and bytes): which weights these are."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


# Config fields that say where a model came from or how it is labelled, not what it computes (``model_hash``)
PROVENANCE_FIELDS = ("_name_or_path", "transformers_version", "_commit_hash", "id2label", "label2id")


def model_hash(model: torch.nn.Module) -> str:
    """Short sha256 of the weights (``weights_hash``) and of the config that computes with them (activation, norm
    epsilon, position embeddings, dropout ...), not of where they were loaded from: which model this is, for the
    caches of what it computes (a baseline, head means)."""
    config = {k: v for k, v in model.config.to_dict().items() if k not in PROVENANCE_FIELDS}
    text = json.dumps({"weights": weights_hash(model), "config": config}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def note_random_weights(missing: list[str], weights: Any) -> None:
    """One ``note:`` line naming the weights ``weights.name_or_path`` did not have (initialised at random), instead
    of transformers' load report; nothing for a ``random_init`` model, random by request."""
    if missing and not weights.get("random_init"):
        missing = sorted(missing)  # transformers reports them as a set
        Console().print(f"note: {len(missing)} weight(s) not in {weights.name_or_path}, initialised at random: "
                        f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}", markup=False, soft_wrap=True)
