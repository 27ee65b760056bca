"""The bundled real-text tasks: SQuAD v1.1 / v2.0 development sets split by article, and the QNLI-style pairs built
from them, checked against their definitions (not against the generators' own helpers)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT

from headlab.tasks.loading import load_task_data
from headlab.tasks.qnli_articles import pairs
from headlab.tasks.squad_articles import split_articles

DATA = ROOT / "src/headlab/tasks/data"
SOURCE = ROOT.parent / "shared/data/squad"  # the official development sets, beside the checkout in CI


def read(folder: str, split: str) -> dict:
    return json.loads((DATA / folder / f"{split}.json").read_text())


@pytest.mark.parametrize(("version", "articles"), [("v1", (38, 10)), ("v2", (28, 7))])
def test_the_squad_articles_are_split_by_article(version, articles):
    """No article and no paragraph in both parts; every question of the development set in exactly one."""
    train, validation = (read(f"squad_{version}_articles", split) for split in ("train", "validation"))
    assert (len(train["data"]), len(validation["data"])) == articles
    titles = [{a["title"] for a in part["data"]} for part in (train, validation)]
    contexts = [{p["context"] for a in part["data"] for p in a["paragraphs"]} for part in (train, validation)]
    assert not titles[0] & titles[1] and not contexts[0] & contexts[1]
    ids = [q["id"] for part in (train, validation) for a in part["data"] for p in a["paragraphs"] for q in p["qas"]]
    assert len(ids) == len(set(ids)) == {"v1": 10570, "v2": 11873}[version]
    name = {"v1": "dev-v1.1.json", "v2": "dev-v2.0.json"}[version]
    if not (SOURCE / name).is_file():
        pytest.skip(f"{SOURCE / name} (the source) is not beside this checkout")
    source = json.loads((SOURCE / name).read_text())
    assert [a["title"] for a in validation["data"]] == [a["title"] for a in source["data"][::5]]
    assert split_articles(source) == {"train": train, "validation": validation}  # the articles unchanged


def test_the_squad_articles_load_as_tasks():
    from omegaconf import OmegaConf

    from headlab.cli.schema import register_configs

    register_configs()
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for task, questions in (("squad_articles", 2968), ("squad_v2_articles", 2239), ("qnli_articles", 5700)):
            cfg = compose("ablate", overrides=["model=tiny_random", f"task={task}"])
            data = load_task_data(cfg.task, ["validation"])
            assert len(data["validation"]) == questions, task
            assert OmegaConf.select(cfg, "task.dataset") is None


@pytest.mark.parametrize(("task", "name", "questions"), [("squad", "dev-v1.1.json", 10570),
                                                         ("squad_v2", "dev-v2.0.json", 11873)])
def test_offline_squad_validation_is_the_bundled_development_set(task, name, questions, tmp_path, monkeypatch):
    """Offline with nothing cached, task=squad's validation split is the whole development set in its own order (the
    two bundled parts joined again); its train split is refused in one line naming the bundled task."""
    from hydra import compose, initialize_config_dir

    from headlab.cli.schema import register_configs
    from headlab.errors import UserError
    from headlab.tasks.loading import read_squad_json

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("ablate", overrides=["model=tiny_random", f"task={task}"])
    validation = load_task_data(cfg.task, ["validation"])["validation"]
    assert len(validation) == questions
    with pytest.raises(UserError, match=f"only the validation split .* task={task}_articles"):
        load_task_data(cfg.task, ["train", "validation"])
    if not (SOURCE / name).is_file():
        pytest.skip(f"{SOURCE / name} (the source) is not beside this checkout")
    source = json.loads((SOURCE / name).read_text())
    rows = [(q["id"], a["title"], p["context"], q["question"], [x["text"] for x in q["answers"]],
             [x["answer_start"] for x in q["answers"]]) for a in source["data"] for p in a["paragraphs"]
            for q in p["qas"]]
    assert [(r["id"], r["title"], r["context"], r["question"], r["answers"]["text"], r["answers"]["answer_start"])
            for r in validation] == rows
    assert read_squad_json(SOURCE / name).to_list() == validation.to_list()


def _sentences(context: str) -> list[str]:
    """The sentences of ``context`` as ``unit=sentence`` cuts them (the documented rule, written out again)."""
    from headlab.core.units import split_sentences

    return [context[a:b] for a, b in split_sentences(context)]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_qnli_pairs_hold_the_answer_or_the_hardest_distractor(split):
    """Each question: one pair with the sentence holding its answer span (label 0) and one with the sentence of most
    shared words among those holding no annotator's answer text (label 1); no pair twice; the shipped file is what
    the generator writes."""
    squad = read("squad_v1_articles", split)
    rows = [json.loads(line) for line in (DATA / f"qnli_articles/{split}.jsonl").read_text().splitlines()]
    assert rows == pairs(squad)
    questions = {q["id"]: (q, p["context"]) for a in squad["data"] for p in a["paragraphs"] for q in p["qas"]}
    stop = set("""a an the of in on at to for from by with as and or but is are was were be been it its this that
    these those what which who whom whose when where why how did do does not no""".split())
    shared = lambda q, s: len({w for w in re.findall(r"\w+", q.lower()) if w not in stop}  # noqa: E731
                              & {w for w in re.findall(r"\w+", s.lower()) if w not in stop})
    assert [row["label"] for row in rows] == [0, 1] * (len(rows) // 2)
    assert [row["idx"] for row in rows] == list(range(len(rows)))
    for positive, negative in zip(rows[::2], rows[1::2]):
        question, context = questions[positive["id"].removesuffix("/0")]
        answer = question["answers"][0]
        start = context.index(positive["sentence"])
        assert start <= answer["answer_start"] and answer["answer_start"] + len(answer["text"]) <= start + len(
            positive["sentence"])
        candidates = [s for s in _sentences(context)
                      if all(a["text"].lower() not in s.lower() for a in question["answers"])]  # no annotator's
        best = max(shared(question["question"], s) for s in candidates)
        assert negative["sentence"] in candidates and shared(question["question"], negative["sentence"]) == best
        assert negative["sentence"] == next(s for s in candidates if shared(question["question"], s) == best)
        assert negative["id"] == f"{question['id']}/1" and positive["question"] == negative["question"]
    pairs_seen = [(" ".join(row["question"].lower().split()), row["sentence"]) for row in rows]
    assert len(set(pairs_seen)) == len(pairs_seen)  # no (question, sentence) pair twice, up to case and spaces
    assert len(rows) // 2 > 0.9 * len(questions)  # few questions left out (answers across sentences, no distractor)
    first = {questions[row["id"].removesuffix("/0").removesuffix("/1")][0]["id"] for row in rows[:400]}
    titles = {a["title"] for a in squad["data"] for p in a["paragraphs"] for q in p["qas"] if q["id"] in first}
    assert len(titles) >= 0.9 * len(squad["data"])  # the first rows sample nearly every article, not a few
