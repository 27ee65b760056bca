"""Writer of the bundled UD English EWT slice (deterministic; the output is committed, with its licence beside it).

    python -m headlab.analysis.syntax.ud_ewt_slice PATH/en_ewt-ud-test.conllu  # rewrites src/headlab/tasks/data/ud_ewt/

The Universal Dependencies English Web Treebank's test split (2,077 sentences of weblogs, newsgroups, emails,
reviews and Yahoo! answers, gold trees; CC BY-SA 4.0) is cut into two disjoint slices, each sentence copied as it
is (comments and all ten columns): ``dev.conllu``, every fourth sentence from the first (520 sentences, all five
genres): the sentences ``mode=syntax`` scores by default; ``train.conllu``, every fourth from the third (519): what
the attention probe learns from when the scored treebank is this one. ``LICENSE.txt`` and ``README.md`` (the
attribution) go with them, as the licence asks of a derived file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from headlab.tasks.demo_tasks import DATA_DIR, write_if_changed

FOLDER = DATA_DIR / "ud_ewt"
SLICES = {"dev": 0, "train": 2}  # file -> which sentence of every four
README = """# UD English EWT, a slice of its test split

`dev.conllu` (520 sentences: the 1st, 5th, 9th, ... of the test split) and `train.conllu` (519: the 3rd, 7th,
11th, ...) are sentences of the test split of the Universal Dependencies English Web Treebank
(UniversalDependencies/UD_English-EWT, release 2.16 line, commit 15d613d8447b3478787d4c278730a1e48a945efb), copied
unchanged, in their order. headlab scores `dev.conllu` in `mode=syntax` by default; its attention probe trains on
`train.conllu`.

Licence: Creative Commons Attribution-ShareAlike 4.0 International (`LICENSE.txt`); these two files are shared under
the same licence. Attribution: Natalia Silveira, Timothy Dozat, Marie-Catherine de Marneffe, Samuel Bowman, Miriam
Connor, John Bauer and Christopher D. Manning (2014), "A Gold Standard Dependency Corpus for English", LREC 2014;
and the UD English EWT contributors. The slices are made by `python -m headlab.analysis.syntax.ud_ewt_slice
en_ewt-ud-test.conllu`.
"""


def sentence_blocks(text: str) -> list[str]:
    """The sentences of a CoNLL-U text, each its lines (comments included) without the blank line after it."""
    return [block.strip("\n") for block in text.replace("\r\n", "\n").split("\n\n") if block.strip()]


def write_slices(source: Path, folder: Path = FOLDER) -> list[Path]:
    blocks = sentence_blocks(source.read_text(encoding="utf-8"))
    written = [write_if_changed(folder / f"{name}.conllu", "".join(f"{block}\n\n" for block in blocks[start::4]))
               for name, start in SLICES.items()]
    written.append(write_if_changed(folder / "README.md", README))
    written.append(write_if_changed(folder / "LICENSE.txt", (source.parent / "LICENSE.txt").read_text()))
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m headlab.analysis.syntax.ud_ewt_slice PATH/en_ewt-ud-test.conllu")
    for path in write_slices(Path(sys.argv[1])):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
