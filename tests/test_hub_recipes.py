"""Every recipe of README.md and docs/*.md that names a hub model or data set, or a GPU, runs end to end on CPU
against a local stand-in for the Hugging Face hub (tests/hub_standin.py: the real repo ids in the caches that
``huggingface_hub`` and ``datasets`` read offline), shortened by overrides (a few examples, two steps; a study of
the BERT-base stand-in: the stages that read the hub's model and task, ``BERT_STAGES``), with
``trainer=cpu`` for ``trainer=gpu`` / ``trainer=ddp``. The recipes that only a GPU can run are in ``GPU_ONLY`` and
in the README's list of what is not run here."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import hub_standin
import pytest
import yaml
from conftest import ROOT, in_parallel
from forked import HANG_GUARD, run_script
from test_docs_commands import COMMANDS
from test_docs_recipes import filled

pytestmark = pytest.mark.slow

GPU_ONLY = ("trainer.precision=16-mixed",  # fp16 autocast: CUDA only in Lightning
            "compile=true",  # runs on CPU, in a minute; tests/test_ablate.py checks compiled against eager
            "hydra/launcher=submitit_slurm")  # needs a cluster; tests/test_launchers.py runs submitit's local executor
ON_CPU = {"trainer=gpu": "trainer=cpu", "trainer=ddp": "trainer=cpu", "trainer.devices=4": None}
SMALL = {"train.py": ["trainer.max_steps=2", "trainer.val_check_interval=1.0", "trainer.num_sanity_val_steps=0",
                      "data.max_train_examples=16", "data.max_eval_examples=8"],
         "ablate.py": ["allow_random_head=true", "data.max_eval_examples=8", "importance.max_examples=8",
                       "features.max_sequences=8", "features.js_max_sequences=2", "cluster.stability_fits=2",
                       "cluster.perplexity=3", "syntax.max_sentences=40", "syntax.min_count=3",
                       "syntax.resamples=50", "report.resamples=50", "report.permutations=50"]}
SMALL_QA = ["task.max_length=128", "task.doc_stride=32"]  # SQuAD's windows: 384 tokens -> 128
# the study at study=quick's sizes and less (its stages' fields: conf/study/)
SMALL_STUDY = ["study.finetune.trainer.max_steps=2", "study.finetune.trainer.num_sanity_val_steps=0",
               "study.finetune.data.max_train_examples=16", "study.finetune.data.max_eval_examples=8",
               "study.features.features.max_sequences=8", "study.features.features.js_max_sequences=2",
               "study.cluster.cluster.stability_fits=2", "study.cluster.cluster.perplexity=3",
               "study.syntax.syntax.max_sentences=40", "study.syntax.syntax.min_count=3",
               "study.syntax.syntax.resamples=2000", "study.tables.data.max_eval_examples=8",  # the least a study takes
               "study.sweep.data.max_eval_examples=8", "study.importance.importance.max_examples=8",
               "study.prune_curve.importance.max_examples=8", "study.prune_curve.data.max_eval_examples=8",
               "study.prune_curve.prune_curve.random_seeds=[0]", "study.prune_curve.prune_curve.timing_rounds=1",
               "study.prune_curve.prune_curve.stop_below=0.99", "study.robustness.data.max_eval_examples=8",
               "study.robustness.mask.reference_examples=16", "study.robustness.shapley.resamples=2000",  # the least
               "study.robustness.mask.resamples=1",  # one draw per example (study=paper: 4, 2.5x the stage's work)
               "study.cluster.cluster.stability_repeats=1", "study.cluster.cluster.bootstrap_fits=2",
               "study.controls.sweep.draws=2", "study.controls.data.max_eval_examples=8",
               "study.refits.data.max_eval_examples=8", "study.prune_curve.prune_curve.step=0.5"]


# BERT's whole study runs in tests/test_study.py (each other family's in test_family_studies.py, DistilBERT's here):
# a study of the BERT-base stand-in runs the stages that read the hub's model and task, not the per-head ones
BERT_STAGES = "study.stages=[finetune,features,cluster,compare,syntax,tables,report]"


def hub_configs(group: str, field: str) -> dict[str, str]:
    """``{config name: repo id}`` of the configs in ``conf/<group>/`` that name a hub repo in ``field``."""
    found = {}
    for path in sorted((ROOT / "conf" / group).glob("*.yaml")):
        value = yaml.safe_load(path.read_text()).get(field)
        if isinstance(value, str) and value.count("/") == 1 and not value.startswith(("$", "/", ".")):
            found[path.stem] = value
    return found


HUB_MODELS, HUB_TASKS = hub_configs("model", "name_or_path"), hub_configs("task", "dataset")


def needs_hub_or_gpu(words: list[str]) -> bool:
    choices = dict(word.split("=", 1) for word in words[1:] if "=" in word)
    hub_data = choices.get("task") in HUB_TASKS and "task.data_files" not in choices  # own files: test_docs_recipes
    return (choices.get("model") in HUB_MODELS or hub_data
            or choices.get("trainer") in ("gpu", "ddp")
            or any("runs/features_squad" in word for word in words))  # features.md's report of SQuAD and MRPC jobs


def config_recipes() -> list[tuple[str, list[str]]]:
    """The hub commands that configs print in their comments (the study at the paper's sizes, Table 3's preset)."""
    found = []
    for name in ("conf/study/paper.yaml", "conf/experiment/guan2020_table3.yaml"):
        for number, line in enumerate((ROOT / name).read_text().splitlines(), start=1):
            if line.startswith("#") and "python ablate.py" in line:
                found.append((f"{Path(name).name}:{number}", shlex.split(line.split("python", 1)[1])))
    return found


RECIPES = [(where, words) for where, words in [*COMMANDS, *config_recipes()]
           if needs_hub_or_gpu(words) and not any(word in GPU_ONLY for word in words)]


def environment(home) -> dict[str, str]:
    """A user's offline environment whose Hugging Face caches are the stand-in."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
    return {**env, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}


def run(folder, home, script: str, *words: str, small: bool = True) -> subprocess.CompletedProcess:
    flags = [w for w in words if w.startswith("-")]  # -m before the overrides
    words = [ON_CPU.get(w, w) for w in words if w not in flags and ON_CPU.get(w, w) is not None]
    if small:
        study = any(w.startswith("study=") for w in words)
        words += SMALL_STUDY if study else SMALL[script]
        if study and "model=bert_base_uncased" in words and not any(w.startswith("study.stages=") for w in words):
            words.append(BERT_STAGES)
        if any(w in ("task=squad", "task=squad_v2") for w in words):
            words += SMALL_QA
    extra = [f"data.cache_dir={folder / 'cache'}", "logger=csv"]
    if script == "ablate.py":
        extra.append(f"baseline_dir={folder / 'baselines'}")
    return run_script([sys.executable, str(ROOT / script), *flags, *words, *extra], cwd=folder,
                          env=environment(home), capture_output=True, text=True, timeout=HANG_GUARD)


def prepared_jobs(folder, home) -> dict[str, str]:
    """The jobs the recipes name, made from the stand-in's models: the clusters of the SQuAD-tuned BERT-large
    (``mask.clusters=clusters.json``), and ``runs/{features,cluster,importance,sweep_prune}_{squad,mrpc}`` of
    bert-base (the report of features.md); returns the placeholders' replacements."""
    large = ["model=bert_large_wwm_squad", "task=squad", "ckpt_path=null"]
    first, then = [["train.py", f"hydra.run.dir={folder / 'jobs/train'}"]], []  # JOB: MiniLM, the default task
    for name, task in (("large", "squad"), ("squad", "squad"), ("mrpc", "mrpc")):
        model = large if name == "large" else ["model=bert_base_uncased", f"task={task}"]
        runs = folder / ("jobs" if name == "large" else "runs")
        first.append(["ablate.py", "mode=features", *model, f"hydra.run.dir={runs / f'features_{name}'}"])
        then.append(["ablate.py", "mode=cluster", f"cluster.features={runs / f'features_{name}'}",
                     "cluster.names=[dense,diagonal,dense_vertical,vertical]",
                     f"hydra.run.dir={runs / f'cluster_{name}'}"])
        if name != "large":
            first += [["ablate.py", "mode=importance", *model, f"hydra.run.dir={runs / f'importance_{name}'}"],
                      ["ablate.py", "mode=sweep_heads", *model, "mask.policy=prune",
                       f"hydra.run.dir={runs / f'sweep_prune_{name}'}"]]
    for round_ in (first, then):
        results = in_parallel(lambda words: run(folder, home, *words), round_)
        for words, result in zip(round_, results):
            assert result.returncode == 0, f"{' '.join(words)}\n{result.stderr[-2000:]}"
    treebank = ROOT / "src/headlab/tasks/data/ud_ewt"
    clusters = f"mask.clusters={folder / 'jobs/cluster_large/clusters.json'}"
    return {"mask.clusters=clusters.json": clusters, "mask.clusters=FILE": clusters,
            "en_ewt-ud-dev.conllu": str(treebank / "dev.conllu"),
            "en_ewt-ud-train.conllu": str(treebank / "train.conllu"), "JOB": str(folder / "jobs/train")}


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return hub_standin.build(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def prepared(standin, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hub_recipes")
    return folder, prepared_jobs(folder, standin)


def test_the_standin_holds_every_hub_name_of_the_configs():
    assert set(HUB_MODELS.values()) == set(hub_standin.MODELS), HUB_MODELS
    datasets = {(repo, yaml.safe_load((ROOT / f"conf/task/{name}.yaml").read_text()).get("subset"))
                for name, repo in HUB_TASKS.items()}
    assert datasets == {("nyu-mll/glue", config) for config in hub_standin.GLUE} | {
        (repo, None) for repo in hub_standin.SQUAD}


def test_every_hub_task_and_model_loads_from_the_standin(standin, tmp_path):
    """Each task's splits through ``load_task_data`` and each model with its tokenizer, as a user's offline run
    reads them (one process: the hub's code paths, not a mock)."""
    script = f"""
import json
from omegaconf import OmegaConf
from headlab.core.models import load_model, load_tokenizer
from headlab.tasks.loading import load_task_data
counts = {{}}
for name in {sorted(HUB_TASKS)!r}:
    data = load_task_data(OmegaConf.load("{ROOT}/conf/task/" + name + ".yaml"))
    counts[name] = {{split: len(rows) for split, rows in data.items()}}
for name in {sorted(HUB_MODELS)!r}:
    cfg = OmegaConf.load("{ROOT}/conf/model/" + name + ".yaml")
    model, tokenizer = load_model(cfg), load_tokenizer(cfg)
    ids = tokenizer("The cat sat.", "It was late.")["input_ids"]
    counts[name] = [model.config.num_hidden_layers, model.config.num_attention_heads, len(ids),
                    tokenizer.convert_ids_to_tokens(ids)]
print(json.dumps(counts))
"""
    result = run_script([sys.executable, "-c", script], cwd=tmp_path, env=environment(standin),
                            capture_output=True, text=True, timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["mnli"] == {"train": 48, "validation_matched": 24, "validation_mismatched": 24}
    assert counts["squad"] == counts["squad_v2"] == {"train": 48, "validation": 24}
    assert all(counts[name] == {"train": 48, "validation": 24} for name in HUB_TASKS if name not in
               ("mnli", "squad", "squad_v2")), counts
    shapes = {name: counts[name][:2] for name in HUB_MODELS}
    assert shapes == {"bert_base_uncased": [12, 12], "bert_large_uncased": [24, 16],
                      "bert_large_wwm_squad": [24, 16], "roberta_base": [12, 12], "xlm_roberta_base": [12, 12],
                      "electra_base": [12, 12], "distilbert_base_uncased": [6, 12], "albert_base_v2": [12, 12],
                      "modernbert_base": [22, 12], "deberta_v3_base": [12, 12]}  # each family's config names
    assert counts["bert_base_uncased"][2] == 11  # [CLS] the cat sat . [SEP] it was late . [SEP]: WordPiece
    xlmr = counts["xlm_roberta_base"][3]  # a pair as XLM-R puts it: <s> A </s></s> B </s>
    assert xlmr[0] == "<s>" and xlmr[-1] == "</s>" and "</s>,</s>" in ",".join(xlmr) and xlmr.count("</s>") == 3


def test_the_documents_have_hub_and_gpu_recipes():
    text = [" ".join(words) for _, words in RECIPES]
    assert len(RECIPES) >= 14 and any("study=paper" in t for t in text) and any("task=squad" in t for t in text)
    assert "ablate.py model=bert_base_uncased task=squad trainer=gpu study=paper" in text  # conf/study/paper.yaml


@pytest.mark.parametrize("recipe", RECIPES, ids=[where for where, _ in RECIPES])
def test_recipe_runs_on_cpu_against_the_standin(standin, prepared, recipe):
    folder, replace = prepared
    where, words = recipe
    line = [filled(word, replace, folder) for word in words[1:]]
    result = run(folder, standin, words[0], *line)
    assert result.returncode == 0, f"{where}: {words[0]} {' '.join(line)}\n{result.stderr.strip()[-2000:]}"


def test_the_cache_lookup_before_imports_finds_what_datasets_finds(standin, monkeypatch):
    """``tasks/hub_data.py`` (paths only, before ``datasets`` loads) finds every task of the stand-in, spells the
    cache folders as ``datasets`` does, and tells an uncached config offline only."""
    from datasets.naming import camelcase_to_snakecase

    from headlab.errors import UserError
    from headlab.tasks.hub_data import cached_folders, cached_rows, check_hub_dataset, snake_case

    for name in ("glue", "squad_v2", "SQuAD", "WikiText103", "ag_news", "HotpotQA", "mC4x"):
        assert snake_case(name) == camelcase_to_snakecase(name), name
    monkeypatch.setenv("HF_HOME", str(standin))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for name, repo in HUB_TASKS.items():
        subset = yaml.safe_load((ROOT / f"conf/task/{name}.yaml").read_text()).get("subset")
        assert len(cached_folders(repo, subset)) == 1, name
        check_hub_dataset(name, repo, subset, ["train", "validation"])
        assert cached_rows(repo, subset, "train") == 48, name  # what val_check_interval is checked against
    with pytest.raises(UserError, match=r"'nyu-mll/glue' is neither in .*/nyu-mll___glue/ax holds no copy"):
        check_hub_dataset("ax", "nyu-mll/glue", "ax", ["validation"])
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")  # datasets' own switch wins: online, the download may work
    check_hub_dataset("ax", "nyu-mll/glue", "ax", ["validation"])
    monkeypatch.setenv("HF_DATASETS_CACHE", str(standin / "elsewhere"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(UserError, match="elsewhere/nyu-mll___glue/mrpc"):
        check_hub_dataset("mrpc", "nyu-mll/glue", "mrpc", ["train"])
