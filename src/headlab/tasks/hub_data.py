"""Whether a hub data set can be had: offline, ``datasets`` reads it from its cache folder only. The lookup is the
one ``datasets`` makes (``HF_DATASETS_CACHE``, else ``HF_HOME/datasets``, else ``XDG_CACHE_HOME/huggingface/datasets``;
``<namespace>___<name>/<config>/<version>/<hash>/``), done on paths alone so that a task whose data is neither
cached nor reachable is told before torch, transformers or ``datasets`` load."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from headlab.errors import UserError

TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's and datasets' reading of an environment switch


def hub_offline() -> bool:
    """``datasets``' switch: ``HF_DATASETS_OFFLINE`` if set, else ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``."""
    own = os.environ.get("HF_DATASETS_OFFLINE")
    if own is not None:
        return own.upper() in TRUE
    return (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper() in TRUE


def datasets_cache() -> Path:
    home = os.getenv("HF_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(os.getenv("HF_DATASETS_CACHE", os.path.join(os.path.expanduser(home), "datasets"))))


def snake_case(name: str) -> str:
    """``datasets.naming.camelcase_to_snakecase``: the cache folder's spelling of a data set's name."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


def cached_folders(dataset: str, subset: str | None) -> list[Path]:
    """The cache folders that hold ``dataset`` (the config ``subset``, or any config)."""
    *namespace, name = dataset.split("/")
    root = datasets_cache() / "___".join([*namespace, snake_case(name)])
    return [path for path in root.glob(f"{subset or '*'}/*/*") if path.is_dir()]


# Hub data sets whose development set ships with headlab, split by article: (the bundled folder, its task)
BUNDLED = {"rajpurkar/squad": ("squad_v1_articles", "squad_articles"),
           "rajpurkar/squad_v2": ("squad_v2_articles", "squad_v2_articles")}
BUNDLED_SPLITS = ("validation",)  # offline and not cached, a bundled data set has its development set only


def bundled_offline(dataset: str, subset: str | None) -> bool:
    """Offline, ``dataset`` is not cached and its development set ships with headlab: its validation split is read
    from the bundled files (``headlab.tasks.squad_articles.development_set``)."""
    return dataset in BUNDLED and hub_offline() and not cached_folders(dataset, subset)


def not_found(task_name: str, dataset: str, why: str) -> UserError:
    bundled = f", or task={BUNDLED[dataset][1]} (bundled offline)" if dataset in BUNDLED else ""
    return UserError(
        f"task {task_name}: dataset {dataset!r} is neither in the Hugging Face cache nor reachable on the hub ({why}); "
        f"run once online to cache it, or give local files with task.data_files='{{train: PATH, validation: PATH}}'"
        f"{bundled}")


def check_hub_dataset(task_name: str, dataset: str, subset: str | None, splits: list[str]) -> None:
    """Offline, a data set (config) that is not in the cache is an error now (online the download may still work),
    unless every split of ``splits`` ships with headlab."""
    if bundled_offline(dataset, subset):
        missing = [split for split in splits if split not in BUNDLED_SPLITS]
        if missing:
            raise UserError(
                f"task {task_name}: offline, only the {', '.join(BUNDLED_SPLITS)} split of {dataset!r} (its "
                f"development set) ships with headlab, not {', '.join(missing)}; run once online to cache the data "
                f"set, or use task={BUNDLED[dataset][1]} (the development set split by article, bundled offline)")
    elif hub_offline() and not cached_folders(dataset, subset):
        where = datasets_cache() / "___".join([*dataset.split("/")[:-1], snake_case(dataset.split("/")[-1])])
        raise not_found(task_name, dataset, f"offline, and {where}/{subset or '*'} holds no copy")


def cached_rows(dataset: str, subset: str | None, split: str) -> int | None:
    """The number of rows of ``split`` in the newest cached copy (its ``dataset_info.json``), or None."""
    folders = sorted(cached_folders(dataset, subset), key=lambda path: path.stat().st_mtime)
    if not folders or (subset is None and len({path.parts[-3] for path in folders}) > 1):
        return None  # not cached, or several configs (datasets asks which)
    try:
        splits = json.loads((folders[-1] / "dataset_info.json").read_text())["splits"]
        return int(splits[split]["num_examples"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
