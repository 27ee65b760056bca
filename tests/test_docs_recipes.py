"""The recipes of README.md and docs/*.md that name other jobs' folders (``ckpt_path=JOB``, ``CLUSTERS_DIR``,
``SWEEP_DIR``, ``runs/...``, a multirun's folder) run as written on the tiny model in a working folder, the
placeholders replaced by real jobs and a few overrides added that make them small (``model=tiny_random``, a few
examples). They come in two parts, a class each, so that the two test workers run them side by side (``--dist
loadscope``): the recipes that read what other recipes write (``runs/``, the Guan multirun and its reports), in the
documents' order with the writers first, and the rest. The recipes that need a GPU, the hub or
several processes only compose (tests/test_docs_commands.py); the study runs in tests/test_study.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from forked import run_script
from test_docs_commands import COMMANDS, is_cheap
from test_syntax_spacy import train_parser

pytestmark = pytest.mark.slow

NEEDS_MORE = ("trainer=gpu", "trainer=ddp", "model=bert", "model=roberta", "compile=true", "precision",
              "hydra/launcher", "task=squad", "task=mrpc", "task=mnli", "study.",
              "_squad")  # report.heads of SQuAD and MRPC jobs
# the tiny random BERT in MiniLM's shape (6 layers x 12 heads), so the documents' head selectors exist
TINY = ["model=tiny_random", "model.config.num_hidden_layers=6", "model.config.num_attention_heads=12",
        "model.config.hidden_size=48"]
SMALL = {"train.py": [*TINY, "trainer.max_steps=2", "trainer.val_check_interval=1.0", "trainer.num_sanity_val_steps=0",
                      "data.max_train_examples=32", "data.max_eval_examples=16"],
         "ablate.py": [*TINY, "allow_random_head=true", "data.max_eval_examples=12", "importance.max_examples=12",
                       "features.max_sequences=12", "features.js_max_sequences=2", "cluster.stability_fits=2",
                       "cluster.perplexity=3", "prune_curve.random_seeds=[0]", "prune_curve.timing_rounds=1",
                       "prune_curve.stop_below=0.99", "report.resamples=50", "report.permutations=50",
                       "syntax.resamples=50", "syntax.min_count=3", "syntax.max_sentences=60",
                       "shapley.max_permutations=4", "shapley.resamples=100", "mask.reference_examples=12",
                       "gates.max_steps=2", "gates.max_examples=16", "gates.chg_fits=1"]}


def recipes() -> list[tuple[str, list[str]]]:
    """The documented commands this test runs: not cheap (those run as written already), not the study, none that
    needs more than a CPU and the bundled data; those that write ``runs/`` first (the others read them)."""
    chosen = []
    for where, words in COMMANDS:
        text = " ".join(words)
        if is_cheap(words) or any(marker in text for marker in NEEDS_MORE):
            continue
        if words[0] == "ablate.py" and not any(w.startswith(("mode=", "experiment=")) for w in words):
            continue  # the study (mode=study is the default)
        chosen.append((where, words))
    return sorted(chosen, key=lambda recipe: not any(w.startswith("hydra.run.dir=runs/") for w in recipe[1]))


# the default task first: the jobs a recipe's placeholders stand for, per task
TASKS = ("qnli_articles", "demo_qa", "demo_pairs")


def recipe_task(words: list[str]) -> str:
    """The task a recipe runs (``task=NAME``, else the default); its placeholders stand for that task's jobs."""
    named = [word.split("=", 1)[1] for word in words if word.startswith("task=")]
    return named[-1] if named and named[-1] in TASKS else TASKS[0]


def placeholders(folder, task: str) -> dict[str, str]:
    """Placeholder or example path -> the real folder it stands for (the jobs of ``task``)."""
    jobs = folder / "jobs" / task
    job, clusters, sweep = jobs / "train", jobs / "cluster", jobs / "sweep"
    return {"outputs/study/qnli_articles/minilm/finetuned/finetune/seed0": str(job),
            "outputs/train/qnli_articles/minilm/defaults": str(job),
            "outputs/train/demo_qa/minilm/defaults": str(job), "outputs/train/demo_qa/minilm/...": str(job),
            "outputs/ablate/sweep_heads/...": str(sweep),
            "outputs/ablate/multirun/guan2020_table2/demo_qa/minilm/train-1a2b3c4d": "@MULTIRUN@",
            "CLUSTERS_DIR": str(clusters), "SWEEP_DIR": str(sweep), "JOB": str(job),
            "mask.clusters=clusters.json": f"mask.clusters={clusters}/clusters.json",
            "wiki.txt": str(folder / "wiki.txt"), "en_ewt-ud-dev.conllu": str(folder / "dev.conllu"),
            "my_sentences.txt": str(folder / "sentences.txt"), "en_core_web_trf": str(folder / "parser"),
            "data/train.tsv": str(folder / "own/train.tsv"), "data/dev.tsv": str(folder / "own/dev.tsv")}


def filled(word: str, replace: dict[str, str], folder) -> str:
    for placeholder in sorted(replace, key=len, reverse=True):
        word = word.replace(placeholder, replace[placeholder])
    if "@MULTIRUN@" in word:  # the example folder of a report: the multirun an earlier recipe made
        made = sorted((folder / "outputs/ablate/multirun/guan2020_table2").glob("*/*/*"))
        word = word.replace("@MULTIRUN@", str(made[0]) if made else "none-made")
    return word


def run(folder, script: str, *words: str) -> subprocess.CompletedProcess:
    flags = [w for w in words if w.startswith("-")]  # -m before the overrides
    extra = [f"data.cache_dir={folder / 'cache'}", "logger=csv"]
    if script == "ablate.py":
        extra.append(f"baseline_dir={folder / 'baselines'}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
    return run_script([sys.executable, str(ROOT / script), *flags, *(w for w in words if w not in flags),
                           *SMALL[script], *extra], cwd=folder, env=env, capture_output=True, text=True)


CHAINED = ("runs/", "guan2020_table2", "mode=report")  # what other recipes write, or reads what they write


def recipe_part(chained: bool) -> list[tuple[str, list[str]]]:
    """The recipes that write or read each other's folders (``chained``), or the others."""
    return [recipe for recipe in recipes() if any(mark in " ".join(recipe[1]) for mark in CHAINED) == chained]


def named_inputs(folder, recipes) -> set[str]:
    """The prepared inputs the recipes' placeholders stand for: ``TASK/train``, ``TASK/cluster``, ``TASK/sweep``
    (each task's jobs) and ``parser`` (a part builds only these: each costs seconds)."""
    named = set()
    for _, words in recipes:
        task = recipe_task(words)
        for placeholder, value in placeholders(folder, task).items():
            if not any(placeholder in word for word in words[1:]):
                continue
            job = re.search(rf"{re.escape(str(folder / 'jobs'))}/(\w+/\w+)", value)
            named |= {job[1]} if job else {"parser"} if value == str(folder / "parser") else set()
        if "syntax.parser=spacy" in words:
            named.add("parser")
    return named


def prepare_folder(folder, recipes) -> dict[str, dict[str, str]]:
    """The inputs the recipes name, made in ``folder``: texts, a treebank, the README's own data, and of the spaCy
    parser and the jobs the placeholders stand for those that ``recipes`` name; returns each task's placeholders'
    replacements."""
    (folder / "wiki.txt").write_text("The cat sat on the mat.\nA dog barked.\tIt was late.\n" * 4)
    shutil.copy(ROOT / "src/headlab/tasks/data/demo_syntax/dev.conllu", folder / "dev.conllu")
    (folder / "sentences.txt").write_text("Mira 's dog found the key .\nThe man who left saw a red coat .\n" * 4)
    (folder / "own").mkdir()
    for split in ("train", "dev"):  # the README's own data: reviews and their stars
        (folder / f"own/{split}.tsv").write_text("review\tstars\n" + "".join(
            f"review {i} was {'fine' if i % 2 else 'poor'}\t{i % 2}\n" for i in range(24)))
    named = named_inputs(folder, recipes)
    if "parser" in named:  # syntax.parser=spacy: a pipeline trained here stands for en_core_web_sm / trf
        train_parser(folder / "parser")
    for task in TASKS:  # the jobs the placeholders name, for each task a recipe may run
        jobs = folder / "jobs" / task
        setup = [("train.py", [f"task={task}", f"hydra.run.dir={jobs / 'train'}"])] * bool(
            {f"{task}/{kind}" for kind in ("train", "cluster", "sweep")} & named)
        if f"{task}/cluster" in named:
            setup += [("ablate.py", ["mode=features", f"task={task}", f"ckpt_path={jobs / 'train'}",
                                     f"hydra.run.dir={jobs / 'f'}"]),
                      ("ablate.py", ["mode=cluster", f"task={task}", f"cluster.features={jobs / 'f'}",
                                     f"hydra.run.dir={jobs / 'cluster'}",
                                     "cluster.names=[dense,diagonal,dense_vertical,vertical]"])]
        if f"{task}/sweep" in named:
            setup.append(("ablate.py", ["mode=sweep_heads", f"task={task}", f"ckpt_path={jobs / 'train'}",
                                        "mask.policy=prune", f"hydra.run.dir={jobs / 'sweep'}"]))
        for script, words in setup:
            result = run(folder, script, *words)
            assert result.returncode == 0, result.stderr[-2000:]
    return {task: placeholders(folder, task) for task in TASKS}


def run_recipe(folder, replace: dict[str, dict[str, str]], where: str, words: list[str]) -> None:
    """One recipe as written, its placeholders filled with its task's jobs; an assertion error with its command and
    error if it fails."""
    line = [filled(word, replace[recipe_task(words)], folder) for word in words[1:]]
    if "syntax.parser=spacy" in line and not any(w.startswith("syntax.spacy_model=") for w in line):
        line.append(f"syntax.spacy_model={folder / 'parser'}")
    if "mode=cluster" in line and not any(w.startswith(("cluster.k=", "cluster.names=")) for w in line):
        # a tiny random model's heads do not separate into types (clusterN): named by hand, as a user would
        line.append("cluster.names=[dense,diagonal,dense_vertical,vertical]")
    result = run(folder, words[0], *line)
    assert result.returncode == 0, f"{where}: {words[0]} {' '.join(line)}\n{result.stderr.strip()[-1500:]}"



class RecipePart:
    """A part of the recipes, run in one working folder prepared once for the part (a class: a worker's share)."""

    RECIPES: tuple = ()
    MINIMUM = 1  # how many the part must hold (the documents have them)

    def pytest_generate_tests(self, metafunc):
        if "recipe" in metafunc.fixturenames:
            metafunc.parametrize("recipe", self.RECIPES, ids=[where for where, _ in self.RECIPES])

    @pytest.fixture(scope="class")
    def prepared(self, tmp_path_factory):
        folder = tmp_path_factory.mktemp("recipes")
        return folder, prepare_folder(folder, self.RECIPES)

    def test_the_part_holds_its_recipes(self):
        assert len(self.RECIPES) >= self.MINIMUM, self.RECIPES

    def test_recipe_runs_as_written(self, prepared, recipe):
        run_recipe(*prepared, *recipe)


class TestChainedRecipes(RecipePart):
    """The recipes that write and read each other's folders, in the documents' order with the writers first."""

    RECIPES, MINIMUM = tuple(recipe_part(chained=True)), 10


class TestSingleRecipes(RecipePart):
    """The recipes that read only the prepared jobs, each on its own."""

    RECIPES, MINIMUM = tuple(recipe_part(chained=False)), 15
