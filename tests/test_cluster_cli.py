"""``ablate.py mode=cluster`` and ``mode=compare`` end to end: a random and a fine-tuned tiny BERT on demo_pairs,
and the clusters file feeding the Guan et al. Table 2 preset."""

from __future__ import annotations

import json
from math import comb

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, assert_one_error_line, run, wandb_log
from sklearn.cluster import KMeans

from headlab.analysis.types.checks import read_runs
from headlab.analysis.types.compare_roles import features_alike

TYPES = "[dense,diagonal,dense_vertical,vertical]"


def adjusted_rand(a, b):
    """ARI from its definition (Hubert and Arabie 1985) on the contingency table."""
    a_ids, b_ids = {v: i for i, v in enumerate(dict.fromkeys(a))}, {v: i for i, v in enumerate(dict.fromkeys(b))}
    table = np.zeros((len(a_ids), len(b_ids)), dtype=int)
    for x, y in zip(a, b):
        table[a_ids[x], b_ids[y]] += 1
    pairs = sum(comb(int(n), 2) for n in table.flat)
    rows, columns = sum(comb(int(n), 2) for n in table.sum(1)), sum(comb(int(n), 2) for n in table.sum(0))
    expected = rows * columns / comb(len(a), 2)
    return (pairs - expected) / ((rows + columns) / 2 - expected)


@pytest.fixture(scope="module")
def clustered(trained):
    """Features and clusters of the random model and of the fine-tuned checkpoint."""
    root, _ = trained
    jobs = {}
    for name, ckpt in (("random", "null"), ("tuned", str(root / "train"))):
        run("ablate.py", "mode=features", f"ckpt_path={ckpt}", "features.max_sequences=60",
            f"hydra.run.dir={root / f'features_{name}'}", cwd_tmp=root)
        result = run("ablate.py", "mode=cluster", f"cluster.features={root / f'features_{name}'}",
                     "cluster.stability_fits=4", f"cluster.names={TYPES}", f"hydra.run.dir={root / f'cluster_{name}'}",
                     "logger=wandb", cwd_tmp=root)
        jobs[name] = root / f"cluster_{name}", result
    return root, jobs


def test_clusters_file_holds_a_k_means_partition_of_the_distance_features(clustered):
    _, jobs = clustered
    folder, result = jobs["random"]
    clusters = json.loads((folder / "clusters.json").read_text())
    assert "named by hand" in result.stdout and "stability" in result.stdout
    features = pd.read_parquet(folder.parent / "features_random/heads.parquet")
    points = features[[c for c in features.columns if c.startswith("dist_")]].to_numpy()
    reference = KMeans(n_clusters=4, n_init=10, random_state=0).fit_predict(points)
    labels = [clusters["labels"][name] for name in features["name"]]
    assert adjusted_rand(labels, reference) == pytest.approx(1.0)  # the same partition as a direct K-means
    assert set(labels) <= {"dense", "diagonal", "dense_vertical", "vertical"} and clusters["named_by_hand"]
    assert 0.0 <= clusters["stability"] <= 1.0 and clusters["shape"] == [3, 4]
    assert ("note: stability" in result.stdout) == (clusters["stability"] < 0.9)  # cluster.min_stability's default
    assert b"heads.table.json" in wandb_log(folder)
    assert sum(clusters["counts"].values()) == 12
    summary = json.loads((folder / "results.json").read_text())
    for name in summary["files"]:
        assert (folder / name).is_file(), name


def test_compare_gives_the_adjusted_rand_index_and_transitions(clustered):
    root, jobs = clustered
    job = root / "compare"
    run("ablate.py", "mode=compare", f"compare.runs=[{jobs['random'][0]},{jobs['tuned'][0]},{jobs['random'][0]}]",
        "compare.names=[pre,tuned,again]", f"hydra.run.dir={job}", "logger=wandb", cwd_tmp=root)
    log = wandb_log(job)
    assert all(f"{table}.table.json".encode() in log for table in ("ari", "transitions", "stability", "heads"))
    labels = {name: json.loads((jobs[name][0] / "clusters.json").read_text())["labels"] for name in jobs}
    heads = list(labels["random"])
    ari = pd.read_csv(job / "ari.csv").set_index("run")
    expected = adjusted_rand([labels["random"][h] for h in heads], [labels["tuned"][h] for h in heads])
    assert ari.loc["pre", "tuned"] == pytest.approx(expected, abs=1e-12)
    assert ari.loc["pre", "again"] == pytest.approx(1.0)  # identical labels
    transitions = pd.read_csv(job / "transitions.csv")
    assert transitions.query("run == 'tuned'")["heads"].sum() == 12
    table = pd.read_parquet(job / "heads.parquet")
    assert (table["changed/tuned"] == (table["type/pre"] != table["type/tuned"])).all()
    assert (table["shift/again"] == 0).all() and (table["shift/tuned"] > 0).any()
    # Named types: per head, the type most runs give (here always the twice-given "pre" one) and the runs agreeing.
    same = table["type/pre"] == table["type/tuned"]
    assert (table["modal_type"] == table["type/pre"]).all()
    np.testing.assert_allclose(table["agreement"], np.where(same, 1.0, 2 / 3))
    assert json.loads((job / "results.json").read_text())["same_type_in_every_run"] == same.sum()
    qualities = pd.read_csv(job / "stability.csv", index_col=0)
    silhouettes = [json.loads((jobs[name][0] / "clusters.json").read_text())["silhouette"]
                   for name in ("random", "tuned", "random")]
    assert qualities.loc["silhouette"].tolist() == pytest.approx(silhouettes)


def test_compare_puts_each_runs_sieve_roles_side_by_side_with_the_syntax_jobs(clustered):
    """Roles of the features jobs (local, block, ...) and of compare.syntax's mode=syntax jobs, per head and run;
    the counts and kept / gained / lost recomputed here from the jobs' own sieve_roles.csv files."""
    root, jobs = clustered
    syntax = {}
    for name, ckpt in (("random", "null"), ("tuned", str(root / "train"))):
        syntax[name] = root / f"syntax_{name}"
        run("ablate.py", "mode=syntax", "allow_random_head=true", f"ckpt_path={ckpt}", "syntax.max_sentences=60",
            "syntax.resamples=100", "syntax.sieve_tau=1.0", f"hydra.run.dir={syntax[name]}", cwd_tmp=root)
    job = root / "compare_roles"
    runs = f"compare.runs=[{jobs['random'][0]},{jobs['tuned'][0]}]"
    out = run("ablate.py", "mode=compare", runs, "compare.names=[pre,tuned]",
              f"compare.syntax=[{syntax['random']},{syntax['tuned']}]", f"hydra.run.dir={job}", cwd_tmp=root).stdout
    assert "Heads per sieve role" in out
    has = {}
    for name in ("random", "tuned"):
        sources = [root / f"features_{name}/sieve_roles.csv", syntax[name] / "sieve_roles.csv"]
        frame = pd.concat([pd.read_csv(path) for path in sources])
        has[name] = {role: dict(zip(rows["name"], rows["role"].astype(bool))) for role, rows in frame.groupby("sieve")}
    assert {"local", "block", "syntactic", "nsubj", "obj", "amod", "advmod"} <= set(has["random"])
    roles = pd.read_csv(job / "roles.csv").set_index("role")
    heads = pd.read_parquet(job / "heads.parquet").set_index("name")
    assert sorted(roles.index) == sorted(has["random"])
    for role, pre in has["random"].items():
        tuned = has["tuned"][role]
        names = list(pre)
        assert roles.loc[role, "pre"] == sum(pre.values()) and roles.loc[role, "tuned"] == sum(tuned.values())
        assert roles.loc[role, "kept/tuned"] == sum(pre[h] and tuned[h] for h in names)
        assert roles.loc[role, "gained/tuned"] == sum(tuned[h] and not pre[h] for h in names)
        assert roles.loc[role, "lost/tuned"] == sum(pre[h] and not tuned[h] for h in names)
        assert heads[f"role_{role}/pre"].to_dict() == pre and heads[f"role_{role}/tuned"].to_dict() == tuned
    assert roles.to_numpy().sum() > 0  # some head has some role: the comparison is not of empty columns
    summary = json.loads((job / "results.json").read_text())
    assert summary["roles"]["local"] == {"pre": roles.loc["local", "pre"], "tuned": roles.loc["local", "tuned"]}
    # The syntax jobs given in the wrong order, one too few, or one run under a plan: refused before anything runs.
    planned = root / "syntax_planned"
    run("ablate.py", "mode=syntax", "allow_random_head=true", "mask=prune", "mask.heads=[L0H0]",
        "syntax.max_sentences=20", "syntax.resamples=50", f"hydra.run.dir={planned}", cwd_tmp=root)
    # One treebank path, other contents (40 sentences, then the file cut to 20): not the same sentences.
    treebank, on_file = root / "treebank.conllu", {}
    blocks = (ROOT / "src/headlab/tasks/data/demo_syntax/dev.conllu").read_text().split("\n\n")
    for name, ckpt, count in (("random", "null", 40), ("tuned", str(root / "train"), 20)):
        treebank.write_text("\n\n".join(blocks[:count]) + "\n\n")
        on_file[name] = root / f"syntax_file_{name}"
        run("ablate.py", "mode=syntax", "allow_random_head=true", f"ckpt_path={ckpt}", f"syntax.conllu={treebank}",
            "syntax.resamples=50", "syntax.sieve_tau=1.0", f"hydra.run.dir={on_file[name]}", cwd_tmp=root)
    for given, expected in (([syntax["tuned"], syntax["random"]], "give the syntax jobs in the order of compare.runs"),
                            ([syntax["random"]], "compare.syntax has 1 mode=syntax jobs for 2 compare.runs"),
                            ([planned, syntax["tuned"]], "ran under a plan"),
                            ([jobs["random"][0], syntax["tuned"]], "is not a finished mode=syntax job"),
                            ([on_file["random"], on_file["tuned"]], "compare.syntax jobs differ in sentences (pre: ")):
        result = run("ablate.py", "mode=compare", runs, "compare.names=[pre,tuned]",
                     f"compare.syntax=[{','.join(map(str, given))}]",
                     f"hydra.run.dir={root / 'refused'}", cwd_tmp=root, check=False)
        assert_one_error_line(result, expected)


def test_features_roles_tested_otherwise_are_left_out_with_a_note(tmp_path, capsys):
    """Roles above another tau (or at another alpha, or corrected otherwise) do not compare: a note, no columns."""
    runs = []
    for name, tau in (("pre", 3.0), ("tuned", 1.0)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"config": {"features": {
            "sieve_tau": tau, "sieve_alpha": 0.05, "sieve_correction": "holm"}}}))
        runs.append({"name": name, "features": str(tmp_path / name)})
    assert not features_alike(runs)
    assert "differ in sieve_tau (pre: 3.0, tuned: 1.0): their sieve roles are left out" in capsys.readouterr().out
    assert features_alike(runs[:1] * 2)


def test_the_clusters_file_feeds_the_guan_table_2_preset(clustered):
    root, jobs = clustered
    clusters = jobs["random"][0] / "clusters.json"
    labels = json.loads(clusters.read_text())["labels"]
    job = root / "table2"
    run("ablate.py", "experiment=guan2020_table2", "hydra.mode=RUN", "plan=prune_diagonal", "allow_random_head=true",
        f"mask.clusters={clusters}", f"hydra.run.dir={job}", cwd_tmp=root)
    result = json.loads((job / "results.json").read_text())
    assert set(result["plan"]["policies"]) == {h for h, t in labels.items() if t == "diagonal"}
    assert set(result["plan"]["policies"].values()) <= {"prune"}


def test_compare_refuses_a_cluster_job_whose_features_job_ran_again(clustered, tmp_path):
    """mode=compare reads the shifts and roles from each cluster job's features job: run again on other text since,
    it paired the old labels with the new data (and a compare run before said "already done"). Refused until the
    cluster job runs again (the same command)."""
    import shutil

    root, jobs = clustered
    features = tmp_path / "features"
    shutil.copytree(root / "features_random", features)
    cluster = ["ablate.py", "mode=cluster", f"cluster.features={features}", "cluster.stability_fits=2",
               f"hydra.run.dir={tmp_path / 'cluster'}"]
    run(*cluster, cwd_tmp=root)
    compare = ["ablate.py", "mode=compare", f"compare.runs=[{tmp_path / 'cluster'},{jobs['tuned'][0]}]",
               f"hydra.run.dir={tmp_path / 'compare'}"]
    run(*compare, cwd_tmp=root)
    table = pd.read_csv(features / "sieve_roles.csv")
    numeric = table.select_dtypes("number").columns[-1]
    table.loc[0, numeric] += 1  # written again with another value (a rerun on other text, say)
    table.to_csv(features / "sieve_roles.csv", index=False)
    refused = run(*compare, cwd_tmp=root, check=False)
    assert_one_error_line(refused, f"its features job {str(features)!r} changed after it was clustered "
                                   "(sieve_roles.csv); run that mode=cluster job again")
    run(*cluster, cwd_tmp=root)  # its input changed: it runs again
    again = run(*compare, cwd_tmp=root)
    assert "already done" not in again.stdout + again.stderr
    shutil.move(features, tmp_path / "moved")  # the shifts had read NaN without a word
    gone = run(*compare[:-1], f"hydra.run.dir={tmp_path / 'compare_gone'}", cwd_tmp=root)
    assert "is gone (moved or deleted): the shifts from or to it are left empty" in gone.stdout
    assert pd.read_csv(tmp_path / "compare_gone/heads.csv").filter(like="shift/").isna().all().all()


def test_clusters_of_other_weights_are_noted_not_refused(clustered):
    """The pre-trained model's types on the fine-tuned checkpoint (and the reverse): allowed, with a note naming
    both weights; clusters of the job's own weights: no note."""
    root, jobs = clustered
    tuned = str(root / "train")
    for clusters, ckpt, noted in ((jobs["random"][0], tuned, True), (jobs["tuned"][0], "null", True),
                                  (jobs["tuned"][0], tuned, False), (jobs["random"][0], "null", False)):
        result = run("ablate.py", "experiment=guan2020_table2", "hydra.mode=RUN", "plan=prune_diagonal",
                     "allow_random_head=true", f"ckpt_path={ckpt}", f"mask.clusters={clusters}/clusters.json",
                     f"hydra.run.dir={root / 'noted' / f'{clusters.name}_{noted}'}", cwd_tmp=root)
        notes = [line for line in result.stderr.splitlines() if line.startswith("note: mask.clusters=")]
        assert len(notes) == int(noted), (clusters, ckpt, result.stderr)
        if noted:
            own = "the model's own weights"
            assert (own in notes[0].split("; ")[0]) == (ckpt == tuned), notes[0]
            assert (own in notes[0].split("; ")[1]) == (ckpt == "null"), notes[0]


def test_one_per_head_table_joins_features_clusters_importance_and_measured_deltas(clustered, trained):
    root, jobs = clustered
    tuned = str(root / "train")
    sweep, importance, job = root / "sweep_prune", root / "importance", root / "heads"
    run("ablate.py", "mode=sweep_heads", "mask=prune", f"ckpt_path={tuned}", f"hydra.run.dir={sweep}", cwd_tmp=root)
    run("ablate.py", "mode=importance", "importance.max_examples=40", f"ckpt_path={tuned}",
        f"hydra.run.dir={importance}", cwd_tmp=root)
    entry = (f"{{features: {root / 'features_tuned'}, clusters: {jobs['tuned'][0]}, importance: {importance}, "
             f"sweeps: [{sweep}], label: tuned}}")
    run("ablate.py", "mode=report", f"report.heads=[{entry},{{features: {root / 'features_random'}, label: pre}}]",
        f"hydra.run.dir={job}", cwd_tmp=root)
    table = pd.read_parquet(job / "heads.parquet")
    assert len(table) == 24 and list(table.columns[:6]) == ["layer", "head", "name", "model", "task", "label"]
    tuned_rows = table[table["label"] == "tuned"].reset_index(drop=True)
    features = pd.read_parquet(root / "features_tuned/heads.parquet")
    np.testing.assert_array_equal(tuned_rows["dist_cls"], features["dist_cls"])
    labels = json.loads((jobs["tuned"][0] / "clusters.json").read_text())["labels"]
    assert tuned_rows["cluster"].tolist() == [labels[name] for name in tuned_rows["name"]]
    measured = json.loads((sweep / "results.json").read_text())["tables"]["validation"]["accuracy"]["delta"]
    np.testing.assert_array_equal(tuned_rows["delta_prune_accuracy"], np.ravel(measured))
    scores = json.loads((importance / "importance.json").read_text())["raw"]["fisher"]
    np.testing.assert_array_equal(tuned_rows["importance_fisher"], np.ravel(scores))
    by_type = tuned_rows.groupby("cluster")["delta_prune_loss"].mean()  # "do vertical heads matter more?"
    assert set(by_type.index) <= {"dense", "diagonal", "dense_vertical", "vertical"}
    assert table.loc[table["label"] == "pre", "cluster"].isna().all()
    # The pre-trained model's features beside the fine-tuned model's sweep: one row would join two models' heads.
    from headlab.errors import UserError
    from headlab.reporting.head_table import head_table

    with pytest.raises(UserError, match=r"is of model tiny_random with the weights .*/train/model, but "
                                        r"features=.* is of model tiny_random with its own weights"):
        head_table(features=root / "features_random", sweeps=[sweep])


def test_a_multirun_over_k_ends_with_a_table_of_stability_and_silhouette(clustered, tmp_path):
    root, _ = clustered
    result = run("ablate.py", "-m", "mode=cluster", f"cluster.features={root / 'features_random'}", "cluster.k=2,3,4",
                 "cluster.stability_fits=2", cwd_tmp=root, cwd=tmp_path)  # the default sweep directory
    sweep = tmp_path / "outputs/ablate/multirun/adhoc/from_jobs"  # named after the preset; no task or model here
    table = pd.read_csv(sweep / "cluster_selection.csv")
    assert table["k"].tolist() == [2, 3, 4] and (table["method"] == "kmeans").all()
    for row in table.itertuples():
        job = json.loads((sweep / row.job / "results.json").read_text())
        clusters = json.loads((sweep / row.job / "clusters.json").read_text())
        assert (job["k"], job["stability"], job["silhouette"]) == (row.k, row.stability, row.silhouette)
        assert clusters["silhouette"] == job["silhouette"] and -1 <= row.silhouette <= 1
    assert "cluster_selection.csv" in result.stdout and (sweep / "cluster_selection.md").is_file()


def test_default_run_names_say_what_tells_the_runs_apart(tmp_path):
    runs = []
    for number, (ckpt, method, k) in enumerate([(None, "kmeans", 4), (None, "gmm", 3), (None, "kmeans", 4),
                                                ("runs/tuned", "kmeans", 4)]):
        clusters = {"model": "minilm", "task": "demo_qa", "checkpoint": {"ckpt_path": ckpt}, "method": method,
                    "k": k, "seed": 0, "shape": [6, 12],
                    "labels": {f"L{layer}H{head}": "dense" for layer in range(6) for head in range(12)}}
        (tmp_path / f"{number}.json").write_text(json.dumps(clusters))
        runs.append(str(tmp_path / f"{number}.json"))
    names = [run["name"] for run in read_runs(runs, None)]
    assert names == ["minilm (pre-trained) kmeans k=4 #1", "minilm (pre-trained) gmm k=3",
                     "minilm (pre-trained) kmeans k=4 #3", "minilm (tuned) kmeans k=4"]
    assert [run["name"] for run in read_runs(runs[2:], None)] == ["minilm (pre-trained)", "minilm (tuned)"]


@pytest.mark.parametrize("shape", [np.array(3), np.array([3]), np.array(["a", "b"])], ids=["0-d", "one", "text"])
def test_a_features_file_with_a_malformed_shape_is_unreadable_not_a_traceback(tmp_path, shape):
    from headlab.analysis.types.checks import check_features_file
    from headlab.errors import UserError

    np.savez(tmp_path / "features.npz", shape=shape, distance=np.zeros(1))
    with pytest.raises(UserError, match="is not readable"):
        check_features_file(tmp_path / "features.npz", {"shape": [3, 4]})


def test_a_model_whose_heads_are_alike_gets_numbered_clusters_and_says_why(tmp_path):
    """Four centroids of one profile (a tiny DeBERTa's printed short 0.228, long 0.738, special 0.034 four times) were
    named dense_vertical / vertical / dense / diagonal: the job keeps cluster0..3, says the heads did not separate
    into types, and records what the profile rule would have said and the separation."""
    from test_clusters import alike

    from headlab.analysis.types.clusters import fit_clusters
    from headlab.analysis.types.features import AttentionFeatures

    per_sequence = alike(np.random.default_rng(0))  # [sequences, 12 heads, 21]
    features = AttentionFeatures(3, 4, len(per_sequence), ("distance",), per_sequence.mean(0).reshape(3, 4, 21),
                                 per_sequence.reshape(len(per_sequence), 3, 4, 21))
    np.savez(tmp_path / "features.npz", **features.to_arrays())
    (tmp_path / "results.json").write_text(json.dumps({"complete": True, "kind": "features", "model": "tiny_deberta",
                                                       "task": "demo_qa", "shape": [3, 4], "families": ["distance"]}))
    result = run("ablate.py", "mode=cluster", f"cluster.features={tmp_path}", f"hydra.run.dir={tmp_path / 'cluster'}",
                 cwd_tmp=tmp_path)
    clusters = json.loads((tmp_path / "cluster/clusters.json").read_text())
    rule = fit_clusters(per_sequence.mean(0), k=4).names  # the profile rule alone: Guan et al.'s four names
    assert sorted(rule) == sorted(TYPES.strip("[]").split(","))
    assert (clusters["named"], clusters["names"]) == (False, ["cluster0", "cluster1", "cluster2", "cluster3"])
    assert clusters["profile_names"] == rule  # what the rule said, on record
    assert set(clusters["labels"].values()) == set(clusters["names"]) and clusters["separation"] < 1
    assert "the heads did not separate into types" in result.stdout and "separation" in result.stdout
