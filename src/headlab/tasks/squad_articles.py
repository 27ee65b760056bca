"""The bundled SQuAD articles: the SQuAD v1.1 and v2.0 development sets split by Wikipedia article.

    python -m headlab.tasks.squad_articles DIR    # DIR holds dev-v1.1.json and dev-v2.0.json (official layout)

writes ``src/headlab/tasks/data/squad_v1_articles/`` and ``squad_v2_articles/``: ``validation.json`` holds every
fifth article of the development set (the 1st, 6th, 11th, ...), ``train.json`` the others, each article whole and
unchanged (its paragraphs, questions, ids and answers), so no paragraph and no article is in both parts: a model
fine-tuned on ``train`` is scored on Wikipedia articles it never read. ``task=squad_articles`` (v1.1) and
``task=squad_v2_articles`` read them offline, and offline ``task=squad`` / ``task=squad_v2`` read their validation
split (the development set) as the two parts joined again in the source's order (``development_set``). The sources'
SHA-256 are checked against ``SOURCES``: the files are the official development sets as rebuilt from the SQuAD
explorer pages (CC BY-SA 4.0; the folders' README says how).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from headlab.tasks.demo_tasks import DATA_DIR, write_if_changed

EVERY = 5  # article i is evaluation when i % EVERY == 0
SOURCES = {  # file -> (its SHA-256, the folder it becomes)
    "dev-v1.1.json": ("49b0bf5ccd87ad05092e9089ffc447b4d35fd55f94617f627060ddcb7e1188a0", "squad_v1_articles"),
    "dev-v2.0.json": ("85f3df13534b3bd3bc23750de3920cc4037e0a8920e342092fafc0e370c5bcbb", "squad_v2_articles"),
}


def split_articles(squad: dict) -> dict[str, dict]:
    """``{"train": ..., "validation": ...}``: SQuAD JSON of the articles ``i % EVERY != 0`` / ``== 0``."""
    articles = squad["data"]
    parts = {"train": [a for i, a in enumerate(articles) if i % EVERY],
             "validation": [a for i, a in enumerate(articles) if not i % EVERY]}
    return {split: {"version": squad.get("version", ""), "data": chosen} for split, chosen in parts.items()}


def development_set(folder: Path) -> dict:
    """The development set ``folder`` (``squad_v1_articles`` ...) was split from: its articles in the source's order
    (``split_articles`` undone)."""
    parts = {split: json.loads((folder / f"{split}.json").read_text()) for split in ("train", "validation")}
    held, kept = (iter(parts[split]["data"]) for split in ("validation", "train"))
    total = sum(len(part["data"]) for part in parts.values())
    articles = [next(kept) if i % EVERY else next(held) for i in range(total)]
    return {"version": parts["validation"]["version"], "data": articles}


def counts(squad: dict) -> tuple[int, int, int]:
    """(articles, paragraphs, questions) of SQuAD JSON."""
    paragraphs = [p for a in squad["data"] for p in a["paragraphs"]]
    return len(squad["data"]), len(paragraphs), sum(len(p["qas"]) for p in paragraphs)


def write_squad_articles(source: Path, root: Path = DATA_DIR) -> list[Path]:
    """The split files of every source in ``SOURCES`` found in ``source`` (checked by SHA-256)."""
    written = []
    for name, (digest, folder) in SOURCES.items():
        data = (source / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise SystemExit(f"error: {source / name} is not the development set this split was made from "
                             f"(SHA-256 {digest})")
        for split, part in split_articles(json.loads(data)).items():
            text = json.dumps(part, ensure_ascii=False, separators=(",", ":")) + "\n"
            written.append(write_if_changed(root / folder / f"{split}.json", text))
    return written


if __name__ == "__main__":
    for path in write_squad_articles(Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/squad")):
        print(path)
