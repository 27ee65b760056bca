"""``qnli_articles``: question-sentence pairs from the bundled SQuAD articles, built as GLUE's QNLI was from SQuAD.

    python -m headlab.tasks.qnli_articles    # rewrites src/headlab/tasks/data/qnli_articles/ from squad_v1_articles/

GLUE's QNLI (Wang et al. 2018) pairs each SQuAD question with sentences of its paragraph and asks whether the
sentence contains the answer, keeping pairs of high lexical overlap so that a shared word does not give the answer
away. Here, for each question of ``squad_v1_articles`` (the split by article carries over: no paragraph in both
parts):

* the paragraph is cut into sentences by ``headlab.core.units.split_sentences`` (the rule of ``unit=sentence``);
* the **positive** pair (label 0, ``entailment``) is the question with the sentence that holds its first answer's
  character span whole; a question whose answer crosses a sentence boundary is left out;
* the **negative** pair (label 1, ``not_entailment``) is the question with the sentence of the paragraph that holds
  none of its answers' texts (no annotator's, anywhere, in any case) and shares the most words with the question
  (lower-cased word tokens, ``STOP_WORDS`` left out; the first such sentence on a tie): the hardest distractor by
  overlap; a question whose paragraph has no such sentence is left out;
* a question whose positive or negative pair repeats a pair already taken (the same question asked twice of one
  paragraph, up to case and spaces) is left out: no (question, sentence) pair appears twice.

So the classes are balanced (chance: 50% accuracy) and every question appears once with each label, its two rows
adjacent. The questions are in a seeded random order (``ORDER_SEED``), not by article, so that the first N rows (a
study's ``data.max_eval_examples``) sample every article. Columns as GLUE's: ``question``, ``sentence``, ``label``,
``idx``; and ``id``, the SQuAD question's id with ``/0`` or ``/1``.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from headlab.core.units import split_sentences
from headlab.tasks.demo_tasks import DATA_DIR, write_if_changed

SOURCE, FOLDER = "squad_v1_articles", "qnli_articles"
ENTAILMENT, NOT_ENTAILMENT = 0, 1  # GLUE QNLI's labels
ORDER_SEED = 0
STOP_WORDS = frozenset("""a an the of in on at to for from by with as and or but is are was were be been it its this
that these those what which who whom whose when where why how did do does not no""".split())
_WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    """The distinct lower-cased word tokens of ``text`` outside ``STOP_WORDS``."""
    return {word for word in _WORD.findall(text.lower()) if word not in STOP_WORDS}


def question_pairs(context: str, question: str, answers: list[dict]) -> tuple[str, str] | None:
    """(the sentence holding the first answer's span, the sentence holding no answer's text that shares most words
    with the question), or None when the first answer crosses a sentence boundary or every sentence holds an
    answer's text. ``answers``: SQuAD's, ``[{"text", "answer_start"}]``, one per annotator."""
    spans = split_sentences(context)
    sentences = [context[a:b] for a, b in spans]
    start, texts = answers[0]["answer_start"], {answer["text"].lower() for answer in answers}
    end = start + len(answers[0]["text"])
    holding = [i for i, (a, b) in enumerate(spans) if a <= start and end <= b]
    others = [i for i, sentence in enumerate(sentences) if not any(text in sentence.lower() for text in texts)]
    if not holding or not others:
        return None
    asked = words(question)
    hardest = max(others, key=lambda i: (len(asked & words(sentences[i])), -i))
    return sentences[holding[0]], sentences[hardest]


def pairs(squad: dict) -> list[dict]:
    """The rows of one split (module docstring): each question's two rows, the questions in a seeded order."""
    questions, taken = [], set()  # taken: the (question, sentence) pairs so far
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                found = question_pairs(paragraph["context"], qa["question"], qa["answers"])
                asked = " ".join(qa["question"].lower().split())  # a question asked twice, up to case and spaces
                if found is not None and not taken & {(asked, sentence) for sentence in found}:
                    taken |= {(asked, sentence) for sentence in found}
                    questions.append([{"question": qa["question"], "sentence": sentence, "label": label,
                                       "id": f"{qa['id']}/{label}"}
                                      for label, sentence in zip((ENTAILMENT, NOT_ENTAILMENT), found)])
    random.Random(ORDER_SEED).shuffle(questions)
    rows = [row for question in questions for row in question]
    return [row | {"idx": idx} for idx, row in enumerate(rows)]


def write_qnli_articles(root: Path = DATA_DIR) -> list[Path]:
    written = []
    for split in ("train", "validation"):
        squad = json.loads((root / SOURCE / f"{split}.json").read_text())
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in pairs(squad))
        written.append(write_if_changed(root / FOLDER / f"{split}.jsonl", text))
    return written


if __name__ == "__main__":
    for path in write_qnli_articles():
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
