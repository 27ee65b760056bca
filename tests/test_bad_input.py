"""Bad commands, as a new user types them: one ``error:`` line naming the bad value, exit status 2, no traceback.

(Errors found once Lightning or the data loader has started come after their log lines; the error is still
the one ``error:`` line and the last one.)

Every case runs the real entry script in a fresh process, offline and with an empty Hugging Face
cache, so a hub name cannot be found and nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ROOT, assert_one_error_line, in_parallel
from forked import HANG_GUARD, run_script

TINY = {"train.py": ["model=tiny_random", "logger=none", "task=demo_pairs"],
        "ablate.py": ["model=tiny_random", "logger=none", "task=demo_pairs"]}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_files(tmp_path_factory.mktemp("bad_files"))


def make_files(folder):
    """Input files with something wrong in each (``benchmarks/bad_input_speed.py`` times the cases too)."""
    (folder / "not_json.json").write_text("{labels: L0H0 -> dense")
    (folder / "importance_3x3.json").write_text(json.dumps({"importance": [[0.1] * 3] * 3}))  # the model is 3 x 4
    (folder / "clusters_l7.json").write_text(json.dumps({"labels": {"L7H0": "dense"}}))  # no layer 7
    (folder / "clusters_ok.json").write_text(json.dumps({"labels": {"L0H0": "dense", "L1H1": "vertical"}}))
    (folder / "clusters_unnamed.json").write_text(json.dumps({"labels": {"L0H0": "dense", "L1H1": ""}}))
    (folder / "garbage.ckpt").write_bytes(b"\x00not a checkpoint")
    (folder / "empty_dir").mkdir()
    (folder / "empty.jsonl").write_text("\n")
    (folder / "header_only.csv").write_text("sentence1,sentence2,label\n")
    (folder / "blank.txt").write_text("\n  \n\n")
    (folder / "a_pair.txt").write_text("One sentence.\nA question?\tAn answer.\n")
    (folder / "three_texts.txt").write_text("One\x0csentence.\r\nA question?\u2028\tAn answer.\nx\ty\tz\n")  # 3 lines
    (folder / "features_job").mkdir()  # what mode=cluster reads before anything loads
    (folder / "features_job/features.npz").write_bytes(b"")
    (folder / "features_job/results.json").write_text(json.dumps({"families": ["distance"], "shape": [3, 4]}))
    for name, shape in (("clusters_3x4", [3, 4]), ("clusters_2x2", [2, 2])):
        (folder / name).mkdir()
        labels = {f"L{l}H{h}": f"cluster{h % 2}" for l in range(shape[0]) for h in range(shape[1])}
        model = "tiny_random" if name == "clusters_2x2" else name  # the 2 x 2 file names the model: its shape differs
        (folder / name / "clusters.json").write_text(json.dumps({"model": model, "shape": shape, "labels": labels}))
    roberta = "roberta 3x4, hidden 16, vocab 650"
    for name, shape, built in (("constants_2x2", [2, 2, 8], None), ("constants_roberta", [3, 4, 8], roberta),
                               ("constants_width", [3, 4, 5], None)):  # tiny_random: 3 x 4 heads of width 8
        record = {"kind": "optimal_constants", "model": "tiny_random", "shape": shape,
                  "constants": np.zeros(shape).tolist(), **({"architecture": built} if built else {})}
        (folder / f"{name}.json").write_text(json.dumps(record))
    (folder / "prune_curve_24").mkdir()  # a finished curve of this model and task, scored on 24 examples
    (folder / "prune_curve_24/prune_curve.csv").write_text("step,split\n")
    (folder / "prune_curve_24/results.json").write_text(json.dumps({
        "kind": "prune_curve", "complete": True, "model": "tiny_random", "task": "demo_pairs",
        "config": {"data": {"max_eval_examples": 24}}}))
    ragged = np.zeros((3, 4, 8)).tolist()
    ragged[1][2] = [0.0] * 3
    texts = np.zeros((3, 4, 8)).tolist()
    texts[0][0][0] = "abc"
    for name, values in (("constants_ragged", ragged), ("constants_text", texts)):
        (folder / f"{name}.json").write_text(json.dumps({"kind": "optimal_constants", "constants": values}))
    (folder / "clusters_roberta").mkdir()  # tiny_random's name and shape, but a RoBERTa's heads (a folder's model)
    labels = {f"L{l}H{h}": f"cluster{h % 2}" for l in range(3) for h in range(4)}
    (folder / "clusters_roberta/clusters.json").write_text(json.dumps({
        "model": "tiny_random", "architecture": "roberta 3x4, hidden 16, vocab 650", "shape": [3, 4],
        "labels": labels}))
    (folder / "clusters_some").mkdir()  # labels 2 of a 3 x 4 model's heads
    (folder / "clusters_some/clusters.json").write_text(json.dumps({"model": "m", "shape": [3, 4], "labels": {
        "L0H0": "cluster0", "L0H1": "cluster1"}}))
    (folder / "clusters_twice.json").write_text('{"labels": {"L0H0": "dense", "L0H1": "vertical", "L0H0": "x"}}')
    (folder / "clusters_spellings.json").write_text(json.dumps({"labels": {"L0H0": "dense", "L00H0": "vertical"}}))
    (folder / "features_list").mkdir()  # a results.json that is a list
    (folder / "features_list/features.npz").write_bytes(b"")
    (folder / "features_list/results.json").write_text("[1, 2]")
    (folder / "features_2x2").mkdir()  # features of a 2 x 2 model beside the results of a 3 x 4 one
    np.savez(folder / "features_2x2/features.npz", shape=np.array([2, 2, 5, 0]), families=np.array(["distance"]),
             distance=np.full((2, 2, 21), 1 / 21), distance_sequences=np.full((5, 2, 2, 21), 1 / 21))
    (folder / "features_2x2/results.json").write_text(json.dumps({"families": ["distance"], "shape": [3, 4],
                                                                   "model": "tiny_random"}))
    (folder / "no_sentence2.jsonl").write_text('{"sentence1": "A cat.", "sentence2": "A dog.", "label": 0}\n'
                                              '{"sentence1": "A cow.", "label": 1}\n')
    (folder / "one_row.jsonl").write_text('{"sentence1": "A cat.", "sentence2": "A dog.", "label": 2.5}\n')
    (folder / "three_rows.jsonl").write_text("".join(json.dumps({"sentence1": f"Row {i}.", "sentence2": "A row.",
                                                                 "label": i % 2}) + "\n" for i in range(3)))
    for name, cut in (("job_truncated", True), ("job_no_weights", False)):  # a train.py job whose model/ is broken
        job = folder / name
        (job / "model").mkdir(parents=True)
        (job / "results.json").write_text(json.dumps({"kind": "train", "complete": True, "model": "tiny_random",
                                                      "task": "demo_pairs"}))
        (job / "model/config.json").write_text(json.dumps({"model_type": "bert"}))
        if cut:
            header = json.dumps({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
            (job / "model/model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 99)
    from safetensors.torch import save_file

    for name, shape in (("job_electra/model", (3, 4)), ("weights_2x2", (2, 2)), ("weights_3x4", (3, 4))):
        (folder / name).mkdir(parents=True)
        (folder / name / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": shape[0],
                                                               "num_attention_heads": shape[1], "hidden_size": 8}))
        save_file({"w": torch.zeros(1)}, folder / name / "model.safetensors")
    (folder / "job_electra/results.json").write_text(json.dumps({"kind": "train", "complete": True,
                                                                 "model": "tiny_electra", "task": "demo_pairs"}))
    (folder / "job_no_config/model").mkdir(parents=True)  # weights without their config.json, a best.ckpt beside
    (folder / "job_no_config/checkpoints").mkdir()
    (folder / "job_no_config/checkpoints/best.ckpt").write_bytes(b"")
    (folder / "job_no_config/results.json").write_text((folder / "job_electra/results.json").read_text().replace(
        "tiny_electra", "tiny_random"))
    save_file({"w": torch.zeros(1)}, folder / "job_no_config/model/model.safetensors")
    torch.save({"hyper_parameters": {"model": {"name": "tiny_random"}, "task": {"name": "demo_qa"}},
                "state_dict": {}}, folder / "qa.ckpt")
    (folder / "cut.ckpt").write_bytes((folder / "qa.ckpt").read_bytes()[:200])
    qa = {"id": "q1", "question": "Who?", "answers": [{"text": "Ada", "answer_start": 0}]}
    (folder / "qa_ids_twice.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "Ada wrote it.", "qas": [qa, {**qa, "id": "q2"}]}, {"context": "Ada read it.", "qas": [qa]}]}]}))
    (folder / "qa_no_question.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": []}]}))
    (folder / "qa_no_context.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"qas": [qa]}]}]}))
    (folder / "qa_blank_context.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "Ada wrote it.", "qas": [qa]}, {"context": "   ", "qas": [{**qa, "id": "q2", "answers": [
            {"text": " ", "answer_start": 0}]}]}]}]}))
    (folder / "qa_unanswerable.json").write_text(json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "Ada wrote it.", "qas": [qa, {**qa, "id": "q2", "answers": []}]}]}]}))
    (folder / "sweep_foreign/job").mkdir(parents=True)  # a results.json that only looks like an evaluation
    (folder / "sweep_foreign/job/results.json").write_text(json.dumps({"complete": True, "kind": "eval"}))
    (folder / "cluster_job").mkdir()  # a mode=cluster job where report.heads wants a features job
    (folder / "cluster_job/heads.parquet").write_bytes(b"")
    (folder / "cluster_job/results.json").write_text(json.dumps({"kind": "cluster", "model": "m", "task": "t"}))
    return folder


# (script, overrides, text the error line must contain). FILES stands for the fixture's folder.
CASES = [
    # top level and typing at composition
    ("train.py", ["seed=abc"], "'abc'"),
    ("train.py", ["foo=1"], "'foo'"),
    ("train.py", ["experiment=single_head"], "experiment=single_head is an ablate.py preset"),  # names the run
    ("train.py", ["ckpt_path=/no/such.ckpt"], "/no/such.ckpt"),
    ("ablate.py", ["ckpt_path=/runs/lr=1e-4,seed=0"],  # a multirun job's directory, unquoted
     "needs quotes inside the argument: 'ckpt_path=\"/runs/lr=1e-4,seed=0\"'"),
    ("ablate.py", ["mode=compare", "compare.names=[seed 0 (F1 99.0),seed 1]"],
     "list items with '=', ',', spaces or brackets need quotes inside the argument: \"compare.names=['item one',"),
    ("ablate.py", ["mode=nope"], "mode='nope'"),
    ("train.py", ["attention_route=flex"], "attention_route: the fused FlexAttention route was retired"),
    ("ablate.py", ["+attention_route=sdpa"], "attention_route: the fused FlexAttention route was retired"),
    ("train.py", ["+learning_rate=1e-4"], "learning_rate is not an option here ('+learning_rate=...' added it)"),
    ("ablate.py", ["attention_route=sdpa"], "attention_route: the fused FlexAttention route was retired"),
    # model
    # seeds: what seed_everything takes, checked before anything is written (finetune/seed-1/ was left behind)
    ("train.py", ["seed=-1"], "seed=-1 is not a seed: give an integer from 0 to 4294967295"),
    ("ablate.py", ["seed=-1", "mode=eval"], "seed=-1 is not a seed"),
    ("ablate.py", ["mode=study", "study.seeds=[-1]"], "study.seeds[0]=-1 is not a seed"),
    ("ablate.py", ["mode=study", "study.seeds=[0,4294967296]"], "study.seeds[1]=4294967296 is not a seed"),
    # (prune_curve failed after the whole curve had run)
    ("ablate.py", ["mode=prune_curve", "prune_curve.random_seeds=[0,-1]"], "random_seeds[1]=-1 is not a seed"),
    ("ablate.py", ["mode=prune_curve", "prune_curve.random_seeds=[3,3]"], "random_seeds=[3, 3] names a seed twice"),
    ("ablate.py", ["mode=report", "sweep_dir=.", "report.seed=-2"], "report.seed=-2 is not a seed"),
    ("train.py", ["model.seed=-1"], "model.seed=-1 is not a seed"),
    ("ablate.py", ["mode=study", "study.stages=[]"], "study.stages=[] names no stage"),
    ("ablate.py", ["mode=study", "study.stages=[finetune,features,finetune]"], "study.stages names finetune twice"),
    ("train.py", ["model=nope"], "model/nope"),
    ("train.py", ["model.random_init=false", "model.name_or_path=/no/such/model"], "/no/such/model"),
    ("ablate.py", ["model=tiny_random", "model.name_or_path=FILES", "mode=eval"],  # a folder a random model ignored
     "is not read by a random model (model.random_init=true)"),
    ("ablate.py", ["model=bert_base_uncased"], "google-bert/bert-base-uncased"),  # not cached, hub offline
    # task
    ("train.py", ["task=nope"], "task/nope"),
    ("train.py", ["task.main_metric=pearson"], "pearson"),
    ("train.py", ["task.data_files.train=/no/such.jsonl"], "/no/such.jsonl"),
    ("train.py", ["task=demo_pairs", "task.data_files=/no/dev.csv"], "task.data_files='/no/dev.csv': give a file per "
     "split, e.g. \"task.data_files={train: train.csv, validation: dev.csv}\""),  # one path (or the shell's braces)
    ("train.py", ["task=demo_qa", "task.version=v3"], "v3"),
    ("train.py", ["task=demo_qa", "task.data_files.validation=FILES/qa_ids_twice.json"],
     "qa_ids_twice.json': question id 'q1' is given to 2 questions (questions 1 and 3); each question needs an id"),
    ("ablate.py", ["mode=eval", "task=demo_qa", "task.data_files.validation=FILES/qa_no_question.json"],
     "qa_no_question.json' has no question; task demo_qa expects"),
    ("ablate.py", ["mode=eval", "task=demo_qa", "task.data_files.validation=FILES/qa_no_context.json"],
     "qa_no_context.json' is not SQuAD JSON (KeyError: 'context')"),
    ("ablate.py", ["mode=eval", "task=demo_qa", "task.data_files.validation=FILES/qa_blank_context.json"],
     "qa_blank_context.json': question 2 (id 'q2') has a context without text"),
    ("train.py", ["task=demo_qa", "task.data_files.validation=FILES/qa_unanswerable.json"],
     "qa_unanswerable.json': question 2 (id 'q2') has no gold answer; SQuAD v1.1 scores each question against its "
     "answers (task.version=v2 takes unanswerable questions)"),
    ("train.py", ["task=mrpc"], "nyu-mll/glue"),  # hub data set, not cached, hub offline
    ("train.py", ["task=squad"], "not train; run once online to cache the data set, or use task=squad_articles"),
    ("train.py", ["task.train_split=validation"], "task.train_split=validation is also in task.eval_splits"),
    ("ablate.py", ["mode=study", "task=squad", "study=quick"], "only the validation split of 'rajpurkar/squad'"),
    # mask: groups, values, the selector grammar, files
    ("ablate.py", ["mask=zero"], "mask/zero"),
    ("ablate.py", ["mask=prune"], "mask.heads"),
    ("ablate.py", ["mask.unit=word"], "'word'"),
    ("ablate.py", ["mask.renormalize=maybe"], "'maybe'"),
    ("train.py", ["mask=rules", "mask.rules=[{heads: L0}]"], "{'heads': 'L0'}"),
    ("train.py", ["mask=rules", "mask.rules=[{heads: L0, policy: zero}]"], "'zero'"),
    ("ablate.py", ["mask=prune", "mask.heads=L9"], "layer 9"),
    ("ablate.py", ["mask=uniform", "mask.heads=L0H7"], "head 7"),
    ("ablate.py", ["mask=prune", "mask.heads=L0:H1"], "'L0:H1'"),
    ("ablate.py", ["mask=prune", "mask.heads=L0H1,L2"], "mask.heads=L0H1,L2"),  # a sweep without -m
    ("ablate.py", ["mask=prune", "mask.heads=top:5"], "top:5"),
    ("ablate.py", ["mask=prune", "mask.heads=top:5", "mask.importance=FILES/importance_3x3.json"], "[3, 3]"),
    ("ablate.py", ["mask=prune", "mask.heads=cluster:dense", "mask.clusters=FILES/not_json.json"], "not_json.json"),
    ("ablate.py", ["mask=prune", "mask.heads=cluster:dense", "mask.clusters=FILES/missing.json"], "missing.json"),
    ("ablate.py", ["mask=prune", "mask.heads=cluster:dense", "mask.clusters=FILES"], "is a folder, not a file"),
    ("ablate.py", ["task=sst2", "task.data_files={train: FILES, validation: FILES}"], "is a folder, not a file"),
    ("ablate.py", ["mask=prune", "mask.heads=cluster:dense", "mask.clusters=FILES/clusters_l7.json"], "'L7H0'"),
    ("ablate.py", ["mask=prune", "mask.heads=cluster:diagonal", "mask.clusters=FILES/clusters_ok.json"], "'diagonal'"),
    ("ablate.py", ["mask=prune", "mask.heads=cluster:dense", "mask.clusters=FILES/clusters_unnamed.json"],
     "cluster label of L1H1 in"),  # an empty type name
    # ablate.py mode=eval / sweep_heads: checkpoints, plans, presets (checked before weights load)
    ("ablate.py", ["mode=eval", "ckpt_path=/no/such.ckpt"], "/no/such.ckpt"),
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/not_json.json"], "not a .ckpt"),
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/garbage.ckpt"], "not a readable Lightning checkpoint"),
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/empty_dir"], "neither results.json"),
    ("ablate.py", ["mode=eval"], "allow_random_head=true"),  # tiny_random's own weights: no trained head
    ("ablate.py", ["mode=eval", "mask=prune", "mask.heads=L3H0"], "layer 3"),
    ("ablate.py", ["mode=eval", "mask.heads=L0"], "needs a policy"),
    ("ablate.py", ["mode=eval", "plan=nope"], "plan='nope'"),
    ("ablate.py", ["experiment=nope"], "experiment/nope"),
    ("ablate.py", ["mode=sweep_heads"], "mask.policy"),
    ("ablate.py", ["mode=sweep_heads", "mask=prune", "mask.heads=L0"], "mask.heads='L0'"),
    ("ablate.py", ["mode=sweep_heads", "mask.policy=prune", "sweep.family=rows"], "'rows'"),
    ("ablate.py", ["mode=sweep_heads", "mask.policy=prune", "sweep.family=random"], "sweep.sizes=[N, ...]"),
    ("ablate.py", ["mode=sweep_heads", "mask.policy=prune", "sweep.sizes=[3]"], "sweep.family=single_head"),
    ("ablate.py", ["mode=sweep_heads", "allow_random_head=true", "mask.policy=prune", "sweep.family=random",
                   "sweep.sizes=[13]"], "13 heads is more than the model's 12"),
    ("ablate.py", ["mode=sweep_heads", "mask.policy=prune", "sweep.family=random", "sweep.sizes=[0]"],
     "sweep.sizes=0"),
    ("ablate.py", ["mode=sweep_heads", "mask.policy=prune", "sweep.family=random", "sweep.sizes=[2]",
                   "sweep.draws=0"], "sweep.draws=0"),
    ("ablate.py", ["mode=sweep_heads", "mask.policy=prune", "sweep.family=random", "sweep.sizes=[2]",
                   "sweep.draws=1000000000"], "it must be in [1, 10000]"),
    ("ablate.py", ["mode=sweep_heads", "mask.policy=prune", "sweep.family=random", "sweep.sizes=[2]",
                   "sweep.seed=-1"], "sweep.seed=-1 is not a seed"),
    ("ablate.py", ["mode=sweep_heads", "mask.policy=prune", "sweep.family=random", "sweep.sizes=[3,3]"],
     "names 3 twice"),
    ("ablate.py", ["mode=study", "study.controls.sweep.seed=-1"], "study.controls.sweep.seed=-1 is not a seed"),
    ("ablate.py", ["mode=study", "study.controls.sweep.draws=0"], "study.controls.sweep.draws=0 is out of range"),
    ("ablate.py", ["mode=study", "study.stages=[finetune,sweep,gates,report]", "study.gates.gates.split=validation"],
     "study.gates.gates.split=validation is an evaluation split of task demo_pairs"),  # before the stages ahead of it
    ("ablate.py", ["mode=study", "study.cluster=abc"], "study.cluster=abc: Cannot assign str to Dict"),
    ("ablate.py", ["mode=study", "study.cluster.cluster.k=abc"],
     "study.cluster.cluster.k: Value 'abc' of type 'str' could not be converted to Integer"),
    # ablate.py mode=importance / prune_curve
    ("ablate.py", ["mode=importance", "allow_random_head=true", "importance.split=test"], "'test'"),
    ("ablate.py", ["mode=importance", "allow_random_head=true", "importance.sweep=/no/such/sweep"], "/no/such/sweep"),
    ("ablate.py", ["mode=importance", "allow_random_head=true", "importance.sweep=FILES/empty_dir",
                   "importance.learned=[FILES/empty_dir,FILES/empty_dir]"], "importance.learned names"),
    ("ablate.py", ["mode=importance", "importance.granularity=per_token"], "'per_token'"),
    ("ablate.py", ["mode=importance", "importance.policies=[keep]"], "'keep'"),
    ("ablate.py", ["mode=importance", "importance.max_examples=0"], "importance.max_examples=0"),
    ("ablate.py", ["mode=prune_curve", "prune_curve.step=0"], "prune_curve.step=0"),
    ("ablate.py", ["mode=prune_curve", "prune_curve.estimator=random"], "'random'"),
    ("ablate.py", ["mode=prune_curve", "allow_random_head=true", "mask=prune", "mask.heads=L0"], "use mask=none"),
    ("ablate.py", ["mode=prune_curve", "allow_random_head=true", "prune_curve.min_heads_per_layer=4"],
     "min_heads_per_layer=4"),
    # ablate.py mode=gates
    ("ablate.py", ["mode=gates", "gates.lambdas=[0.01,-0.1]"], "gates.lambdas[1]=-0.1: a penalty per expected open"),
    ("ablate.py", ["mode=gates"], "mode=gates needs a model fine-tuned for task demo_pairs"),  # not allow_random_head
    ("ablate.py", ["mode=gates", "allow_random_head=true"],
     "has random weights and ckpt_path=null: mode=gates needs a model fine-tuned for task demo_pairs"),
    ("ablate.py", ["mode=gates", "model=minilm"], "the model's own weights (BertModel) have no "
     "*ForSequenceClassification head: not fine-tuned for task demo_pairs"),  # the pre-trained model
    ("ablate.py", ["mode=gates", "allow_random_head=true", "gates.split=test"],
     "gates.split=test: task demo_pairs has no such split (its files: train, validation)"),
    ("ablate.py", ["mode=gates", "allow_random_head=true", "gates.split=validation"],
     "gates.split=validation is an evaluation split of task demo_pairs"),
    ("ablate.py", ["mode=gates", "allow_random_head=true", "task.eval_splits=[validation,train]"],
     "gates.split=train is an evaluation split of task demo_pairs: the gates would be scored on the examples they "
     "were fit on; drop it from task.eval_splits"),
    ("ablate.py", ["mode=gates", "allow_random_head=true", "mask=prune", "mask.heads=L0"], "use mask=none"),
    # optimal heads and their constants file
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=optimal", "mask.heads=L0"],
     "optimal heads take the constants a mode=gates gates.method=optimal job learned: give mask.constants="),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=optimal", "mask.heads=L0",
                   "mask.constants=FILES/constants_roberta.json"], "was computed on a model of another architecture"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=optimal", "mask.heads=L0",
                   "mask.constants=FILES/constants_2x2.json"],
     "holds constants of 2 x 2 x 8 (layers x heads x head width); this model's are 3 x 4 x 8"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=optimal", "mask.heads=L0",  # no architecture recorded
                   "mask.constants=FILES/constants_width.json"], "holds constants of 3 x 4 x 5"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=optimal", "mask.heads=L0",
                   "mask.constants=FILES/constants_ragged.json"], "got lists of unequal lengths or values that are"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=optimal", "mask.heads=L0",
                   "mask.constants=FILES/constants_text.json"], "got lists of unequal lengths or values that are"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=prune", "mask.heads=L0",
                   "mask.constants=FILES/constants_2x2.json"], "is read by optimal heads only"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=prune", "mask.heads=cluster:closed",
                   "mask.clusters=FILES/constants_width.json"], "of kind 'optimal_constants', not a clusters"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=optimal", "mask.heads=L0",
                   "mask.constants=FILES/clusters_ok.json"], "is not a constants file"),
    ("ablate.py", ["mode=gates", "gates.method=chg", "gates.chg_lambda=-0.1"], "gates.chg_lambda=-0.1 must be above 0"),
    ("ablate.py", ["mode=gates", "gates.method=chg", "gates.train_model=true"],
     "gates.method=chg learns its parameters on the frozen model"),
    ("ablate.py", ["mode=gates", "allow_random_head=true", "gates.prune_curve=FILES/empty_dir"],
     "not a finished mode=prune_curve job directory"),
    ("ablate.py", ["mode=gates", "allow_random_head=true", "gates.prune_curve=FILES/prune_curve_24"],
     "was scored on data.max_eval_examples=24; this job scores 8: give data.max_eval_examples=24"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=prune", "mask.heads=top:2",
                   "mask.importance=FILES/importance_3x3.json", "mask.importance_estimator=fisher"], "'fisher'"),
    # ablate.py mode=features
    ("ablate.py", ["mode=features", "features.text_file=/no/such.txt"], "/no/such.txt"),
    ("ablate.py", ["mode=features", "features.text_file=FILES/blank.txt"], "is empty"),
    ("ablate.py", ["mode=features", "features.text_file=FILES/three_texts.txt"], "line 3 has 3 tab-separated texts"),
    ("ablate.py", ["mode=features", "features.text_file=FILES/a_pair.txt", "features.max_length=4"],  # a text lost
     "features.max_length=4 is too short for the pairs of features.text_file="),
    ("ablate.py", ["mode=features", "features.split=test"], "'test' is not allowed; choose one of: train, validation"),
    ("ablate.py", ["mode=features", "features.families=[distance,syntax]"], "'syntax'"),
    ("ablate.py", ["mode=features", "features.max_sequences=0"], "features.max_sequences=0"),
    ("ablate.py", ["mode=features", "features.sieve_correction=bonferroni"], "'bonferroni'"),
    ("ablate.py", ["mode=features", "features.sieve_tau=-1"], "features.sieve_tau=-1.0 must be above 0"),
    # ablate.py mode=cluster / compare, and the clusters a preset needs
    ("ablate.py", ["mode=cluster"], "cluster.features=DIR"),
    ("ablate.py", ["mode=cluster", "cluster.features=FILES/empty_dir"], "no features.npz"),
    ("ablate.py", ["mode=cluster", "cluster.features=FILES/features_job", "cluster.k=13"], "cluster.k=13"),
    ("ablate.py", ["mode=cluster", "cluster.method=dbscan"], "'dbscan'"),
    ("ablate.py", ["mode=cluster", "cluster.min_stability=95"], "cluster.min_stability=95"),
    ("ablate.py", ["mode=compare", "compare.runs=[FILES/clusters_3x4]"], "two or more"),
    ("ablate.py", ["mode=compare", "compare.runs=[FILES/clusters_3x4,FILES/clusters_2x2]"], "different shapes"),
    ("ablate.py", ["mode=compare", "compare.runs=[FILES/clusters_3x4,FILES/clusters_some]"],
     "no label for 10 of its heads (L0H2, L0H3, L1H0, L1H1, ...)"),
    ("ablate.py", ["experiment=guan2020_table2", "hydra.mode=RUN", "plan=prune_dense", "allow_random_head=true",
                   "mask.clusters=FILES/clusters_3x4/clusters.json"], "need clusters named dense, dense_vertical"),
    ("ablate.py", ["mode=eval", "mask=prune", "mask.heads=cluster:cluster0", "allow_random_head=true",
                   "mask.clusters=FILES/clusters_2x2/clusters.json"], "2 layers x 2 heads; this model has 3 x 4"),
    ("ablate.py", ["mode=eval", "mask=prune", "mask.heads=cluster:dense", "allow_random_head=true",
                   "mask.clusters=FILES/clusters_twice.json"], "has the key 'L0H0' twice"),
    ("train.py", ["mask=prune", "mask.heads=cluster:cluster0", "mask.clusters=FILES/clusters_3x4/clusters.json"],
     "was computed on model clusters_3x4; this job's model is tiny_random"),  # same shape, another model
    ("ablate.py", ["mode=eval", "mask=prune", "mask.heads=cluster:cluster0", "allow_random_head=true",
                   "mask.clusters=FILES/clusters_roberta/clusters.json"],
     "was computed on a model of another architecture (roberta 3x4, hidden 16, vocab 650); this job's model "
     "tiny_random is bert 3x4"),  # the same model.name: model.name_or_path=FOLDER keeps the preset's
    ("ablate.py", ["mode=demo", "mask=prune", "mask.heads=cluster:cluster0",
                   "mask.clusters=FILES/clusters_roberta/clusters.json"], "of another architecture (roberta 3x4"),
    ("ablate.py", ["mode=compare", "compare.runs=[FILES/clusters_3x4,FILES/clusters_roberta]"],
     "compare.runs come from different models (clusters_3x4 (architecture not recorded), tiny_random (roberta 3x4"),
    ("ablate.py", ["mode=features", "mask=prune", "mask.heads=L0H0"], "mode=features takes no mask (given [{"),
    ("ablate.py", ["mode=prune_curve", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"],
     "mode=prune_curve runs in one process; trainer.strategy=ddp, trainer.devices=2"),  # its processes hung
    ("ablate.py", ["mode=eval", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
                   "trainer.strategy=ddp_spawn"], "trainer.strategy=ddp_spawn: headlab's DDP starts its processes"),
    ("ablate.py", ["mode=eval", "trainer=ddp", "trainer.accelerator=cpu"],
     "trainer.devices=-1 is not valid with trainer.accelerator=cpu: give a number of processes > 0 or auto (-1, "
     "every GPU, is trainer=ddp's default)"),
    ("ablate.py", ["mode=eval", "mask=prune", "mask.heads=cluster:dense", "allow_random_head=true",
                   "mask.clusters=FILES/clusters_spellings.json"], "labels head L0H0 twice ('L0H0' and 'L00H0')"),
    ("ablate.py", ["mode=cluster", "cluster.features=FILES/features_job"], "features.npz' is not readable"),
    ("ablate.py", ["mode=cluster", "cluster.features=FILES/features_list"], "is not the results of a mode=features"),
    ("ablate.py", ["mode=cluster", "cluster.features=FILES/features_2x2"], "holds 2 x 2 heads, but its results.json"),
    # broken files where a job's weights, checkpoints or results should be
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/job_truncated"], "model.safetensors' is truncated ("),
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/job_no_weights"], "has no weights file"),
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/job_electra/model"],  # a job's model/: the job's record counts
     "was trained with model=tiny_electra (this config: model=tiny_random)"),
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/weights_2x2"], "holds a model of 2 layers x 2 heads, but "
     "model=tiny_random has 3 x 4"),
    # model.config builds a random model: folder weights keep their config.json (the override was recorded, not used)
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/weights_3x4", "+model.config.layer_norm_eps=0.5"],
     "weights_3x4' loads weights with their own config.json (layer_norm_eps=1e-12), which model.config does not"),
    ("ablate.py", ["mode=eval", "model=minilm", "+model.config.hidden_act=relu"],
     "model.config.hidden_act='relu': model.name_or_path="),
    ("ablate.py", ["mode=eval", "ckpt_path=FILES/job_no_config"], "its model/ has no config.json (not saved whole); "
     "pass its checkpoints/best.ckpt instead"),
    ("train.py", ["model.random_init=false", "model.name_or_path=FILES/job_truncated/model"], "is truncated"),
    ("train.py", ["ckpt_path=FILES/qa.ckpt"], "was trained with task=demo_qa (this config: task=demo_pairs)"),
    ("train.py", ["ckpt_path=FILES/cut.ckpt"], "cut.ckpt' is not a readable Lightning checkpoint"),
    ("train.py", ["task.data_files.validation=FILES/no_sentence2.jsonl"], "row 2 has no text in 'sentence2'"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "task.data_files.validation=FILES/empty.jsonl"],
     "empty.jsonl' has no rows; task demo_pairs needs rows with sentence1, sentence2, label"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "task.data_files.validation=FILES/header_only.csv"],
     "header_only.csv' has no rows"),
    ("ablate.py", ["mode=eval", "task=stsb", "allow_random_head=true",
                   "task.data_files={train: FILES/three_rows.jsonl, validation: FILES/one_row.jsonl}"],
     "split 'validation' has 1 example to score; Pearson and Spearman correlations need at least 2"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/sweep_foreign"], "job: results.json is not one of ablate.py's"),
    ("ablate.py", ["mode=report", "report.heads=[{features: FILES/cluster_job}]"], "is a mode=cluster job, not a"),
    # ablate.py mode=report
    ("ablate.py", ["mode=report"], "sweep_dir=DIR"),
    ("ablate.py", ["mode=report", "sweep_dir=/no/such/sweep"], "/no/such/sweep"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/blank.txt"], "blank.txt' is a file, not a directory"),
    ("ablate.py", ["mode=report", "sweep_dir="], "sweep_dir='' names no directory"),  # (read the working directory)
    ("ablate.py", ["mode=report", "sweep_dir=FILES/cluster_job"], "other jobs' results (cluster), which mode=report"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/empty_dir"], "holds no finished evaluation"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/empty_dir", "report.ci_method=normal"], "'normal'"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/empty_dir", "report.correction=bonferroni"], "'bonferroni'"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/empty_dir", "report.ci=bonferroni"], "'bonferroni'"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/empty_dir", "report.formats=[gif]"], "'gif'"),
    # trainer, logger, data, optim: types and ranges
    ("train.py", ["trainer.precision=bf17"], "'bf17'"),
    ("train.py", ["trainer.max_epochs=-3"], "max_epochs=-3"),
    ("train.py", ["trainer.val_check_interval=5000"], "val_check_interval=5000"),
    ("train.py", ["trainer.accelerator=tpu2"], "'tpu2'"),
    ("train.py", ["trainer.devices=0"], "devices=0"),  # Lightning's own checks of its arguments
    ("train.py", ["trainer.strategy=nope"], "'nope'"),
    ("train.py", ["logger=wandb", "logger.offline=maybe"], "'maybe'"),
    ("train.py", ["logger=nope"], "logger/nope"),
    ("train.py", ["data.max_train_examples=0"], "max_train_examples=0"),
    ("train.py", ["data.batch_size=-1"], "batch_size=-1"),
    ("train.py", ["optim.lr=abc"], "'abc'"),
    ("train.py", ["optim.lr=0"], "optim.lr=0.0"),
    ("train.py", ["optim.warmup_ratio=1.5"], "warmup_ratio=1.5"),
    # the model's family and size
    ("train.py", ["task.max_length=600"], "task.max_length=600 is longer than the 512 positions model 'tiny_random'"),
    ("ablate.py", ["mode=eval", "model=tiny_roberta", "task.max_length=513", "mask=prune", "mask.heads=L0H0"],
     "task.max_length=513 is longer than the 512 positions model 'tiny_roberta'"),  # 514 embeddings, 2 before
    ("ablate.py", ["mode=eval", "model=tiny_albert", "mask=prune", "mask.heads=L3H0"], "L3H0"),  # 3 shared depths
    ("train.py", ["model=tiny_distilbert", "model.config.n_heads=5"], "n_heads=5 does not divide dim=32"),
    ("train.py", ["model=tiny_random", "+model.config.model_type=gpt2"], "model_type 'gpt2' is not a supported"),
    ("ablate.py", ["mode=eval", "model=tiny_deberta", "model.config.model_type=deberta", "mask=prune",
                   "mask.heads=L0H0"], "model_type 'deberta' is not a supported"),  # DeBERTa v1: other modules
    ("ablate.py", ["mode=eval", "model=tiny_deberta", "mask=prune", "mask.heads=L3H0"], "L3H0"),
    # counts that multiply what a forward or the statistics hold at once: resample draws, bootstrap resamples
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=resample", "mask.heads=L0", "mask.resamples=100000000"],
     "mask.resamples=100000000 is out of range; it must be in [1, 100]: a forward takes the batch once per draw"),
    ("ablate.py", ["mode=study", "study.robustness.mask.resamples=1000"],
     "study.robustness.mask.resamples=1000 is out of range"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/empty_dir", "report.resamples=10000000"],
     "report.resamples=10000000 is out of range; it must be in [1, 100000]: at 100000 the resampling's own Monte"),
    ("ablate.py", ["mode=report", "sweep_dir=FILES/empty_dir", "report.permutations=200000"],
     "report.permutations=200000 is out of range; it must be in [1, 100000]"),
    ("ablate.py", ["mode=syntax", "syntax.resamples=1000000"], "syntax.resamples=1000000 is out of range"),
    # the verdicts' settings, and the unit of sampling
    ("ablate.py", ["mode=study", "study.findings.margin=0"], "study.findings.margin=0.0 must be above 0 and below 100"),
    ("ablate.py", ["mode=syntax", "syntax.unit=token"], "syntax.unit='token' is not allowed; choose one of: sentence"),
    ("ablate.py", ["mode=cluster", "cluster.stability_repeats=-1"], "cluster.stability_repeats=-1 must be 0 (none)"),
    ("ablate.py", ["mode=eval", "task.cluster_field=question"], "lacks column(s) ['question']"),
    ("ablate.py", ["mode=shapley", "shapley.resamples=1000000"], "shapley.resamples=1000000 is out of range"),
    # the reference set of mean / resample heads, counted in its data file before anything is tokenised or loaded
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=mean", "mask.heads=L0", "mask.reference_examples=600"],
     "mask.reference=validation (split validation) has 500 examples; mask.reference_examples=600 needs that many"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=resample", "mask.heads=L0", "mask.reference=train",
                   "mask.reference_examples=5000"], "mask.reference=train (split train) has 3000 examples"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=resample", "mask.heads=L0",
                   "mask.reference_examples=1"], "mask.reference_examples=1: resample needs at least 2 reference"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=mean", "mask.heads=L0",
                   "mask.reference=FILES/three_rows.jsonl", "mask.reference_examples=4"],
     "three_rows.jsonl has 3 examples; mask.reference_examples=4 needs that many"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=mean", "mask.heads=L0",
                   "mask.reference=FILES/none.jsonl"], "none.jsonl' is neither train, validation nor an existing"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=mean", "mask.heads=L0",
                   "mask.reference=FILES/no_sentence2.jsonl", "mask.reference_examples=2"],
     "no_sentence2.jsonl' row 2 has no text in 'sentence2'"),
    ("ablate.py", ["mode=eval", "task=demo_qa", "allow_random_head=true", "mask=mean", "mask.heads=L0"],
     "mask.reference=validation (split validation) has 360 examples; mask.reference_examples=512"),
    ("ablate.py", ["mode=sweep_heads", "allow_random_head=true", "mask.policy=mean", "mask.reference_examples=600"],
     "has 500 examples; mask.reference_examples=600"),
    ("ablate.py", ["mode=shapley", "allow_random_head=true", "shapley.over=layers", "shapley.policy=resample",
                   "mask.reference_examples=600"], "has 500 examples; mask.reference_examples=600"),
    ("ablate.py", ["mode=importance", "allow_random_head=true", "importance.policies=[mean]",
                   "mask.reference_examples=600"], "has 500 examples; mask.reference_examples=600"),
    ("ablate.py", ["mode=prune_curve", "allow_random_head=true", "prune_curve.policy=mean",
                   "mask.reference_examples=600"], "has 500 examples; mask.reference_examples=600"),
    ("ablate.py", ["mode=study", "study.refits.cluster.bootstrap_fits=5"],
     "study.refits.cluster: the refits stage runs mode=eval, which reads no cluster settings, so they would change "
     "nothing; set it on the stage that does: study.cluster.cluster"),
    ("ablate.py", ["mode=study", "study.robustness.mask.reference_examples=5000"],
     "mask.reference=train (split train) has 3000 examples; mask.reference_examples=5000"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "mask=prune", "mask.heads=5"],
     "head selector 5 is not a string"),
    ("ablate.py", ["mode=eval", "allow_random_head=true", "plan=prune_dense"],
     "plan='prune_dense', but no plans are defined"),
]


def run(script, overrides, files, tmp_path, run_dir=None):
    env = {**os.environ, "HF_HOME": str((files or tmp_path) / "empty_hf_home"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}  # one environment: one fork server (tests/forked.py)
    env.pop("HYDRA_FULL_ERROR", None)
    overrides = [o.replace("FILES", str(files)) for o in overrides]
    cache = [f"data.cache_dir={tmp_path / 'cache'}", f"data.max_eval_examples={8}"]
    if script == "ablate.py" and not any(o.startswith("baseline_dir=") for o in overrides):
        cache.append(f"baseline_dir={tmp_path / 'baselines'}")
    run_dir = f"hydra.run.dir={run_dir or tmp_path / 'run'}"
    if script == "ablate.py" and not any(o.startswith(("mode=", "experiment=")) for o in overrides):
        overrides = ["mode=demo", *overrides]  # the cases without a mode check the single plan of mode=demo
    command = [sys.executable, str(ROOT / script), *TINY[script], *overrides, *cache, run_dir]
    return run_script(command, cwd=ROOT, env=env, timeout=HANG_GUARD)  # as typed (benchmarks/ time fresh ones)


@pytest.fixture(scope="module")
def outcomes(files, tmp_path_factory):
    """Every case's (result, folder), run a few processes at a time: each is mostly Python's imports, one core."""
    folders = [tmp_path_factory.mktemp("case") for _ in CASES]
    results = in_parallel(lambda case, folder: run(case[0], case[1], files, folder), CASES, folders)
    return list(zip(results, folders))


@pytest.mark.parametrize("case", range(len(CASES)), ids=[" ".join(c[1]) for c in CASES])
def test_bad_command_prints_one_error_line(case, outcomes):
    (_, _, expected), (result, tmp_path) = CASES[case], outcomes[case]
    assert_one_error_line(result, expected)
    assert not (tmp_path / "run").exists()  # nothing of the failed job, not even Hydra's record in an empty folder
    assert not (tmp_path / "baselines").exists()
    assert not (tmp_path / "cache").exists()  # found before any data was tokenised (and so before weights load)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_gpu_trainer_without_a_gpu(files, tmp_path):
    result = run("train.py", ["trainer=gpu"], files, tmp_path)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and last.startswith("error: trainer:") and "Traceback" not in result.stderr


def test_bugs_keep_their_traceback_and_full_error_shows_all(files, tmp_path):
    """HYDRA_FULL_ERROR=1 asks for the traceback of bad input too."""
    env_result = run_script(
        [sys.executable, str(ROOT / "ablate.py"), "model=tiny_random", "mask.unit=word", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, env={**os.environ, "HYDRA_FULL_ERROR": "1"}, timeout=HANG_GUARD, fresh=True)
    assert env_result.returncode == 1 and "Traceback" in env_result.stderr and "UserError" in env_result.stderr


def test_error_reporting_leaves_bugs_alone():
    from hydra.errors import MissingConfigException

    from headlab.cli.errors import user_error_message
    from headlab.errors import UserError

    assert user_error_message(KeyError("x")) is None and user_error_message(RuntimeError("shape")) is None
    # a file that went away under a job (pyarrow names none) is a bug to see in full, not "file None does not exist"
    assert user_error_message(FileNotFoundError("[Errno 2] Failed to open local file 'x.arrow'")) is None
    assert user_error_message(FileNotFoundError(2, "No such file or directory", "data.json")) == \
        "file 'data.json' does not exist"
    try:
        try:
            raise UserError("mask.unit='word' is not allowed;\nchoose one of: sentence, segment")
        except UserError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert user_error_message(outer) == "mask.unit='word' is not allowed; choose one of: sentence, segment"
    missing = MissingConfigException("In 'train': Could not find 'mask/x'\n\nAvailable options in 'mask':\n\ta",
                                     missing_cfg_file="mask/x", options=["a", "b"])
    assert user_error_message(missing) == "In 'train': Could not find 'mask/x'; available: a, b"


def test_compile_needs_a_recent_torch():
    from headlab.errors import UserError
    from headlab.requirements import require_torch

    for fine in ("2.5.0", "2.13.0+cu130"):
        require_torch("compile=true", fine)
    with pytest.raises(UserError, match=r"compile=true needs torch >= 2.4; this is torch 2.3.1: upgrade torch, or "
                                        r"run with compile=false"):
        require_torch("compile=true", "2.3.1")


@pytest.mark.parametrize("read_only", ["baseline_dir", "hydra.run.dir"])
def test_a_read_only_folder_is_an_error_before_anything_is_evaluated(tmp_path, read_only):
    """A folder nobody may write to (root writes whatever the mode, so as root it is made immutable)."""
    folders = {name: tmp_path / name for name in ("baseline_dir", "hydra.run.dir")}
    for folder in folders.values():
        folder.mkdir()
    locked = folders[read_only]
    as_root = os.geteuid() == 0
    subprocess.run(["chattr", "+i", str(locked)], check=True) if as_root else locked.chmod(0o555)
    try:
        result = run("ablate.py", ["mode=eval", "mask=prune", "mask.heads=L0", "allow_random_head=true",
                                   f"baseline_dir={folders['baseline_dir']}"], None, tmp_path,
                     run_dir=folders["hydra.run.dir"])
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True) if as_root else locked.chmod(0o755)
    assert_one_error_line(result, f"baseline_dir={str(locked)!r} is not writable (" if read_only == "baseline_dir"
                          else f"cannot write '{locked}/")
    assert not list(folders["baseline_dir"].iterdir())
