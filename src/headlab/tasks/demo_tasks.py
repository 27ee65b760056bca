"""Generator of the two bundled demo tasks (deterministic; the output is committed).

    python -m headlab.tasks.demo_tasks            # rewrites src/headlab/tasks/data/demo_{qa,pairs}/

* ``demo_qa`` (SQuAD v1.1 JSON): each context is 4-6 sentences of one shape about invented
  people, places and years ("Mira Okafor was born in Varnholm in 1942."). Each question
  asks for the place, the year or the person of one sentence; the other sentences are
  distractors of the same shape, so the answer needs the question linked to the right sentence.
* ``demo_pairs`` (GLUE-like JSON lines: sentence1, sentence2, label, idx): sentence1 is 2-3
  such facts; label 1 if sentence2 restates one of them, 0 if it mixes the parts of two
  facts or changes one part. Balanced classes.
* ``demo_pairs/patch.jsonl`` (activation patching's paired data, ``ablate.py mode=patch``): the first
  ``PATCH_EXAMPLES`` validation pairs whose claim is true (label 1), each with ``corrupt_sentence2``, the claim with
  its year replaced by the year of the next fact of sentence1 (so it no longer restates a fact: ``corrupt_label`` 0).
  A year is four digits in every tokenizer's vocabulary or spelling, so both claims tokenise to the same length.
* ``demo_qa/patch.json`` (SQuAD JSON, paired): the first ``PATCH_EXAMPLES`` validation questions that ask when or
  where of a fact whose two questions differ in that word alone ("When was Mira Okafor born?"), each with
  ``corrupt_question``, the other question, and ``corrupt_answers``, its answer (the place for the year, and the
  reverse): the same context and the same number of tokens, two answers in one sentence.
* ``demo_syntax`` (CoNLL-U, train and dev), the bundled treebank, is written by
  ``python -m headlab.analysis.syntax.demo_treebank`` (the syntax question's own data).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
SPLITS = {"train": 0, "validation": 1}  # split -> seed offset
QA_PARAGRAPHS = {"train": 700, "validation": 120}
PAIR_EXAMPLES = {"train": 3000, "validation": 500}
PATCH_EXAMPLES = 100

FIRST = """Mira Jon Ada Tomas Lena Ravi Ines Oskar Yuki Amara Pavel Noor Elif Bruno Sana Milo Freya Kofi Ilse
Dario Hana Viktor Zora Emeka Lotte Arjun Maren Idris Selma Teo""".split()
LAST = """Okafor Bell Moreau Lindqvist Haddad Novak Castell Brandt Ferreira Osei Varga Kimura Duval Petrov
Almeida Strand Mbeki Rossi Tanaka Weller Quint Abara Holm Sorensen Vidal Kowal""".split()
SYLLABLES = "var hol quess mar den tal ost brin cor lun sev ark mel dor fen gal tor vish ren bel".split()
ENDINGS = "holm ant ora ville berg mouth ford ia stad grad".split()
# (fact template, question about the place, about the year, about the person)
FACTS = [
    ("{person} was born in {place} in {year}.", "Where was {person} born?", "When was {person} born?",
     "Who was born in {place}?"),
    ("{person} moved to {place} in {year}.", "Where did {person} move to?", "When did {person} move to {place}?",
     "Who moved to {place}?"),
    ("{person} opened a bakery in {place} in {year}.", "Where did {person} open a bakery?",
     "When did {person} open a bakery?", "Who opened a bakery in {place}?"),
    ("{person} won a chess prize in {place} in {year}.", "Where did {person} win a chess prize?",
     "When did {person} win a chess prize?", "Who won a chess prize in {place}?"),
]


def _place(rng: random.Random) -> str:
    return (rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + rng.choice(ENDINGS)).capitalize()


def _facts(rng: random.Random, count: int) -> list[dict]:
    """``count`` facts with distinct people, places and years."""
    people = rng.sample([f"{f} {l}" for f in FIRST for l in LAST], count)
    places, years = {}, rng.sample(range(1900, 2021), count)  # a dict keeps insertion order (a set would not)
    while len(places) < count:
        places[_place(rng)] = None
    return [
        {"template": rng.randrange(len(FACTS)), "person": person, "place": place, "year": str(year)}
        for person, place, year in zip(people, places, years)
    ]


def _sentence(fact: dict) -> str:
    return FACTS[fact["template"]][0].format(**fact)


def qa_split(split: str) -> dict:
    rng = random.Random(1000 + SPLITS[split])
    articles = []
    for p in range(QA_PARAGRAPHS[split]):
        facts = _facts(rng, rng.randint(4, 6))
        sentences = [_sentence(f) for f in facts]
        context = " ".join(sentences)
        qas = []
        for q, index in enumerate(rng.sample(range(len(facts)), 3)):
            fact = facts[index]
            kind = rng.choice(("place", "year", "person"))
            question = FACTS[fact["template"]][1 + ("place", "year", "person").index(kind)].format(**fact)
            sentence_start = len(" ".join(sentences[:index])) + (1 if index else 0)
            answer_start = sentence_start + sentences[index].index(fact[kind])
            assert context[answer_start : answer_start + len(fact[kind])] == fact[kind]
            qas.append({"id": f"{split}-{p}-{q}", "question": question,
                        "answers": [{"text": fact[kind], "answer_start": answer_start}]})
        articles.append({"title": f"demo-{split}-{p}", "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": "1.1", "data": articles}


def pairs_split(split: str) -> list[dict]:
    rng = random.Random(2000 + SPLITS[split])
    rows = []
    for idx in range(PAIR_EXAMPLES[split]):
        facts = _facts(rng, rng.randint(2, 3))
        claim = dict(rng.choice(facts))
        label = idx % 2
        if not label:  # a wrong claim: one part swapped with another fact's, or changed
            other = rng.choice([f for f in facts if f is not claim and f["person"] != claim["person"]])
            part = rng.choice(("place", "year", "person"))
            true_value = claim[part]
            while claim[part] == true_value:
                claim[part] = other[part] if rng.random() < 0.5 else _facts(rng, 1)[0][part]
        rows.append({"sentence1": " ".join(_sentence(f) for f in facts), "sentence2": _sentence(claim),
                     "label": label, "idx": idx})
    return rows


def patch_pairs(rows: list[dict]) -> list[dict]:
    """The paired rows of ``demo_pairs/patch.jsonl`` (module docstring) from the validation rows."""
    out = []
    for row in rows:
        if row["label"] != 1:
            continue
        years = re.findall(r"\b\d{4}\b", row["sentence1"])  # one per fact, in order, distinct
        year = re.findall(r"\b\d{4}\b", row["sentence2"])[0]
        other = years[(years.index(year) + 1) % len(years)]
        out.append(row | {"corrupt_sentence2": row["sentence2"].replace(year, other), "corrupt_label": 0})
        if len(out) == PATCH_EXAMPLES:
            break
    return out


SWAPPED = {"When": "Where", "Where": "When"}
FACT_PARTS = re.compile(r"(?P<person>[A-Z]\w+ [A-Z]\w+) (?:was born|opened a bakery|won a chess prize) in "
                        r"(?P<place>\w+) in (?P<year>\d{4})\.")  # the facts whose when / where questions pair up
QUESTION = re.compile(r"(?P<word>When|Where) (?:was|did) (?P<person>.+?) (?:born|open a bakery|win a chess prize)\?")


def qa_patch_pairs(squad: dict) -> dict:
    """``demo_qa/patch.json`` (module docstring) from the validation split's SQuAD JSON."""
    articles, count = [], 0
    for article in squad["data"]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            context, qas = paragraph["context"], []
            facts = {m["person"]: m for m in FACT_PARTS.finditer(context)}
            for qa in paragraph["qas"]:
                asked = QUESTION.fullmatch(qa["question"])
                if asked is None or asked["person"] not in facts or count == PATCH_EXAMPLES:
                    continue
                other = "place" if asked["word"] == "When" else "year"
                fact = facts[asked["person"]]
                qas.append(qa | {"corrupt_question": SWAPPED[asked["word"]] + qa["question"][len(asked["word"]):],
                                 "corrupt_answers": [{"text": fact[other], "answer_start": fact.start(other)}]})
                count += 1
            if qas:
                paragraphs.append({"context": context, "qas": qas})
        if paragraphs:
            articles.append({"title": article["title"], "paragraphs": paragraphs})
    return {"version": "1.1", "data": articles}


def write_if_changed(path: Path, text: str) -> Path:
    """Write ``text`` unless the file holds it already (an unchanged file keeps its modification time, which HF
    ``datasets``' cache of local files goes by)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def write_demo_tasks(root: Path = DATA_DIR) -> list[Path]:
    written = []
    for split in SPLITS:
        written.append(write_if_changed(root / "demo_qa" / f"{split}.json",
                                        json.dumps(qa_split(split), indent=None) + "\n"))
        written.append(write_if_changed(root / "demo_pairs" / f"{split}.jsonl",
                                        "".join(json.dumps(row) + "\n" for row in pairs_split(split))))
    written.append(write_if_changed(root / "demo_pairs" / "patch.jsonl", "".join(
        json.dumps(row) + "\n" for row in patch_pairs(pairs_split("validation")))))
    written.append(write_if_changed(root / "demo_qa" / "patch.json",
                                    json.dumps(qa_patch_pairs(qa_split("validation")), indent=None) + "\n"))
    return written


if __name__ == "__main__":
    for path in write_demo_tasks():
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
