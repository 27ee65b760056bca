"""The bundled demo treebank ``demo_syntax``: English sentences with gold UD trees, built from templates.

    python -m headlab.analysis.syntax.demo_treebank       # rewrites src/headlab/tasks/data/demo_syntax/ (deterministic)

Each template is a sentence shape with its tree written out once (``relation:head`` per word, heads 1-based); its
slots are filled from small vocabularies of invented names and places (which split into several word pieces),
nouns, adjectives, adverbs and verbs. Between them the templates have every relation of Clark et al.'s tables and
Pande et al.'s syntactic roles: nsubj, obj, iobj, amod, advmod, det, case, nmod, obl, nmod:poss (with a separate
``'s``), aux, aux:pass, nsubj:pass, cop, mark, cc, conj, punct, root, xcomp, advcl, acl:relcl; arcs up to 7 words
long and a non-projective one (an extraposed relative clause: "A man arrived who was tired .").
"""

from __future__ import annotations

import random
from pathlib import Path

from headlab.tasks.demo_tasks import DATA_DIR, write_if_changed

SPLITS = {"train": (3000, 900), "dev": (3001, 300)}  # split -> (seed, sentences)

VOCABULARY = {
    "NAME": "Mira Jon Ada Tomas Lena Ravi Ines Oskar Yuki Amara Pavel Noor Elif Bruno Sana Milo".split(),
    "NOUN": "book letter dog house car garden key box song map table lamp coat river horse bridge".split(),
    "ADJ": "old small red quiet bright heavy long new strange green".split(),
    "ADV": "quickly slowly carefully often quietly never".split(),
    "DET": "the this every that".split(),
    "VT": "found read painted sold bought carried opened lost".split(),  # transitive, past tense
    "VD": "gave sent showed handed".split(),  # ditransitive
    "VI": "slept arrived laughed waited".split(),  # intransitive
    "VPP": "written painted sold found carried opened".split(),  # past participle
    "VB": "read sell paint buy carry open".split(),  # base form
}
UPOS = {"NAME": "PROPN", "PLACE": "PROPN", "NOUN": "NOUN", "ADJ": "ADJ", "ADV": "ADV", "DET": "DET", "VT": "VERB",
        "VD": "VERB", "VI": "VERB", "VPP": "VERB", "VB": "VERB", "'s": "PART", ".": "PUNCT", "in": "ADP",
        "of": "ADP", "by": "ADP", "the": "DET", "a": "DET", "was": "AUX", "is": "AUX", "will": "AUX", "has": "AUX",
        "because": "SCONJ", "and": "CCONJ", "it": "PRON", "who": "PRON", "very": "ADV", "to": "PART",
        "arrived": "VERB", "wanted": "VERB", "garden": "NOUN"}
SYLLABLES = "var hol quess mar den tal ost brin cor lun sev ark mel dor fen gal tor vish".split()
ENDINGS = "holm ant ora ville berg mouth ford stad".split()

# (words, "relation:head" per word); upper-case words are slots.
TEMPLATES = [
    ("DET ADJ NOUN ADV VT DET ADJ NOUN .", "det:3 amod:3 nsubj:5 advmod:5 root:0 det:8 amod:8 obj:5 punct:5"),
    ("NAME VD NAME DET ADJ NOUN .", "nsubj:2 root:0 iobj:2 det:6 amod:6 obj:2 punct:2"),
    ("NAME 's NOUN VT DET NOUN in the PLACE garden .",
     "nmod:poss:3 case:1 nsubj:4 root:0 det:6 obj:4 case:10 det:10 compound:10 obl:4 punct:4"),
    ("DET NOUN was VPP by NAME .", "det:2 nsubj:pass:4 aux:pass:4 root:0 case:6 obl:4 punct:4"),
    ("DET NOUN is very ADJ .", "det:2 nsubj:5 cop:5 advmod:5 root:0 punct:5"),
    ("NAME will VB DET NOUN because NAME has VPP it .",
     "nsubj:3 aux:3 root:0 det:5 obj:3 mark:9 nsubj:9 aux:9 advcl:3 obj:9 punct:3"),
    ("NAME VT DET NOUN and DET ADJ NOUN .", "nsubj:2 root:0 det:4 obj:2 cc:8 det:8 amod:8 conj:4 punct:2"),
    ("DET NOUN of DET ADJ NOUN in PLACE is ADJ .",
     "det:2 nsubj:10 case:6 det:6 amod:6 nmod:2 case:8 nmod:6 cop:10 root:0 punct:10"),
    ("a NOUN arrived who was ADJ .", "det:2 nsubj:3 root:0 nsubj:6 cop:6 acl:relcl:2 punct:3"),
    ("NAME wanted to VB DET ADJ NOUN .", "nsubj:2 root:0 mark:4 xcomp:2 det:7 amod:7 obj:4 punct:2"),
    ("NAME VI ADV in PLACE .", "nsubj:2 root:0 advmod:2 case:5 obl:2 punct:2"),
    ("NAME and NAME VI ADV .", "nsubj:4 cc:3 conj:1 root:0 advmod:4 punct:4"),
    ("NAME 's ADJ NOUN was VPP ADV .", "nmod:poss:4 case:1 amod:4 nsubj:pass:6 aux:pass:6 root:0 advmod:6 punct:6"),
]


def _place(rng: random.Random) -> str:
    return (rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + rng.choice(ENDINGS)).capitalize()


def _fill(slot: str, rng: random.Random) -> str:
    return _place(rng) if slot == "PLACE" else rng.choice(VOCABULARY[slot]) if slot in VOCABULARY else slot


def sentence_lines(number: int, split: str, rng: random.Random) -> list[str]:
    """One sentence in CoNLL-U: a ``sent_id`` and ``text`` comment, a line per word, a blank line."""
    shape, tree = rng.choice(TEMPLATES)
    slots = shape.split()
    words = [_fill(slot, rng) for slot in slots]
    words[0] = words[0][:1].upper() + words[0][1:]
    arcs = [arc.rsplit(":", 1) for arc in tree.split()]
    assert len(arcs) == len(words), shape
    lines = [f"# sent_id = demo-{split}-{number}"]
    no_space = [index + 1 < len(words) and words[index + 1] in (".", "'s") for index in range(len(words))]
    lines.append("# text = " + "".join(w + ("" if glued else " ") for w, glued in zip(words, no_space)).strip())
    for index, (word, slot, (relation, head)) in enumerate(zip(words, slots, arcs), start=1):
        upos = UPOS[slot]
        misc = "SpaceAfter=No" if no_space[index - 1] else "_"
        lines.append("\t".join([str(index), word, "_", upos, "_", "_", head, relation, "_", misc]))
    return [*lines, ""]


def treebank_split(split: str) -> str:
    seed, count = SPLITS[split]
    rng = random.Random(seed)
    return "\n".join(line for number in range(count) for line in sentence_lines(number, split, rng)) + "\n"


def write_demo_treebank(root: Path = DATA_DIR) -> list[Path]:
    return [write_if_changed(root / "demo_syntax" / f"{split}.conllu", treebank_split(split)) for split in SPLITS]


if __name__ == "__main__":
    for path in write_demo_treebank():
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
