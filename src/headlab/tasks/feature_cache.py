"""Where a split's tokenised features are cached, and the check that a cached file is what a job asks for.

A features file ``<cache_dir>/<task>/<split>-<key>.arrow`` is named by a hash of everything that decides its
content: the raw data (``datasets``' fingerprint), every setting of the encoding, and the tokenizer by what it
*is*, not by its name: its vocabulary, merges, normalisation, pre-tokenisation and post-processing, special and
added tokens, the inputs it returns, its padding and truncation sides and model maximum length
(``tokenizer_digest``). Two tokenizers with one name (locally built ones have ``name_or_path=''``; a hub tokenizer
re-saved or whose files changed under the same path) therefore never share a file. Beside it, ``<...>.key.json``
records that key's content; a features file whose record is missing or differs is made again. Jobs that share a
cache (a parallel sweep) take turns on a file under a lock beside it: one makes it while the others wait, then read
it (without the lock, a second job removed a file the first had just written and was about to read).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock

from headlab.files import config_hash, write_json_atomic

FEATURES_VERSION = 3  # part of the key: bump when the feature columns change (3: the tokenizer's content)
# The backend's runtime state: set by each call's padding / truncation arguments, not part of what the tokenizer is.
CALL_STATE = ("padding", "truncation")


def tokenizer_digest(tokenizer: Any) -> str:
    """A SHA-256 of what decides a tokenizer's encodings (module docstring); equal for a tokenizer and its
    ``save_pretrained`` copy, different for any change of vocabulary, rules or settings."""
    state = {
        "class": type(tokenizer).__name__,
        "model_input_names": list(tokenizer.model_input_names),
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
        "model_max_length": str(tokenizer.model_max_length),
        "special_tokens": {name: str(token) for name, token in sorted(tokenizer.special_tokens_map.items())},
        "special_ids": list(tokenizer.all_special_ids),
    }
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # vocabulary, merges, normaliser, pre-tokeniser, post-processor, added tokens
        rules = json.loads(backend.to_str())
        state["backend"] = {key: value for key, value in rules.items() if key not in CALL_STATE}
    else:  # a Python tokenizer: its vocabulary and the options it was built with
        state["vocab"] = sorted(tokenizer.get_vocab().items())
        state["options"] = {key: str(value) for key, value in sorted(tokenizer.init_kwargs.items())
                            if key != "name_or_path"}
    text = json.dumps(state, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


@contextmanager
def features_file(cache_dir: str | Path, task_name: str, split: str, key: dict[str, Any]) -> Iterator[Path]:
    """The features file of ``key`` (the content of the cache key, JSON-able), held under its lock while the caller
    reads or writes it: a file whose recorded key is missing or differs is removed first, so ``datasets.map`` makes it
    again, and the key is recorded when the caller's block ends without an error."""
    path = Path(cache_dir) / task_name / f"{split}-{config_hash(key)}.arrow"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f"{path.stem}.lock")
    try:
        with FileLock(lock):
            if path.exists() and _recorded(path) != _plain(key):
                path.unlink()
            yield path
            if _recorded(path) != _plain(key):
                write_json_atomic(_key_file(path), _plain(key))
    finally:  # no empty lock file stays; a job that waited on it reads the finished file once it holds it
        lock.unlink(missing_ok=True)


def _key_file(path: Path) -> Path:
    return path.with_name(f"{path.stem}.key.json")


def _recorded(path: Path) -> Any:
    try:
        return json.loads(_key_file(path).read_text())
    except (OSError, ValueError):
        return None


def _plain(key: dict[str, Any]) -> Any:
    """``key`` as it reads back from JSON (lists for tuples)."""
    return json.loads(json.dumps(key, sort_keys=True, default=str))
