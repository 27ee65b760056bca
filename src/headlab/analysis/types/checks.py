"""The checks of ``mode=features``, ``mode=cluster`` and ``mode=compare``, and the input files they read: no weights
read, no torch imported."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from headlab.analysis.types.compare_roles import read_syntax_jobs
from headlab.core.head_files import load_clusters
from headlab.core.masks import mask_rules
from headlab.errors import UserError, one_of
from headlab.files import path_stamp, read_json
from headlab.training.checkpoints import locate_checkpoint


def check_features(cfg: Any) -> None:
    """The text file has lines, or the split is one of the task's; the checkpoint exists (no weights read); no plan:
    features are the model's own attention."""
    if mask_rules(cfg.mask):
        raise UserError(f"mode=features takes no mask (given {mask_rules(cfg.mask)}): features describe the "
                        "model's own attention (headlab.observe_attention inside headlab.ablate gives the weights "
                        "downstream of a plan, docs/features.md)")
    if cfg.features.text_file is not None:
        read_text_lines(cfg.features.text_file)
    else:
        one_of("features.split", cfg.features.split, ["train", cfg.task.train_split, *cfg.task.eval_splits])
    locate_checkpoint(cfg.ckpt_path, cfg.model, cfg.task)


def check_cluster(cfg: Any) -> None:
    """The features job exists with distance features, and k fits its heads (no weights are read)."""
    if cfg.cluster.features is None:
        raise UserError("mode=cluster needs cluster.features=DIR: a mode=features job directory")
    path, summary = features_job(cfg.cluster.features)
    layers, heads = summary["shape"]
    check_k(cfg.cluster.k, layers * heads)
    check_features_file(path, summary)


# what np.load and a malformed member (a shape that is no list of two sizes) raise
UNREADABLE = (OSError, ValueError, EOFError, KeyError, IndexError, TypeError, zipfile.BadZipFile)


def unreadable_features(path: Path, error: Exception) -> UserError:
    return UserError(f"features file {str(path)!r} is not readable ({type(error).__name__}: {error}); run its "
                     "mode=features job again")


def check_features_file(path: Path, summary: dict[str, Any]) -> None:
    """``path`` (a ``features.npz``) opens, and holds distance features of the shape its ``results.json`` says."""
    try:
        with np.load(path) as arrays:  # reads the members asked for only
            layers, heads = (int(n) for n in arrays["shape"][:2])
            distance = "distance" in arrays.files
    except UNREADABLE as error:
        raise unreadable_features(path, error) from None
    if [layers, heads] != summary["shape"] or not distance:
        raise UserError(f"features file {str(path)!r} holds {layers} x {heads} heads"
                        f"{'' if distance else ' without distance features'}, but its "
                        f"results.json says {summary.get('model', 'a model')} with {summary['shape'][0]} x "
                        f"{summary['shape'][1]}: the folder mixes two jobs; run its mode=features job again")


def check_compare(cfg: Any) -> None:
    """The runs are mode=cluster jobs of one shape, their names and syntax jobs fit them."""
    read_inputs(cfg)


def read_text_lines(path: str | Path) -> list[tuple[int, list[str]]]:
    """The file's non-blank lines with their 1-based numbers, each as its one or two texts; ``UserError`` when the
    file is missing or has none, or a line has more than two texts or a blank one."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"features.text_file={str(path)!r}: no such file; give a text file with one sequence per "
                        "line (or two tab-separated texts per line)")
    try:  # lines end at \n only (as `wc -l` and editors count them), not at a form feed or U+2028 inside a line
        text = path.read_bytes().decode("utf-8")
        lines = [line.removesuffix("\r") for line in text.removesuffix("\n").split("\n")]
    except UnicodeDecodeError as error:
        raise UserError(f"features.text_file={str(path)!r} is not UTF-8 text: {error}") from None
    kept = [(number, _texts(line, number, path)) for number, line in enumerate(lines, 1) if line.strip()]
    if not kept:
        raise UserError(f"features.text_file={str(path)!r} is empty: it has no non-blank line")
    return kept


def _texts(line: str, number: int, path: Path) -> list[str]:
    """A line's text, or its two tab-separated texts (a pair); neither may be blank."""
    texts = line.split("\t")
    if len(texts) > 2:
        raise UserError(f"features.text_file={str(path)!r} line {number} has {len(texts)} tab-separated texts; a "
                        "line holds one sequence, or a pair as two texts separated by one tab")
    if len(texts) == 2 and not all(text.strip() for text in texts):
        side = "before" if not texts[0].strip() else "after"
        raise UserError(f"features.text_file={str(path)!r} line {number} has a tab with nothing {side} it; a line "
                        "holds one sequence, or a pair as two texts separated by one tab")
    return texts


def features_job(source: str | Path) -> tuple[Path, dict[str, Any]]:
    """(features.npz, the job's results) of a ``mode=features`` job directory or its ``features.npz``."""
    path = Path(source)
    folder = path.parent if path.suffix == ".npz" else path
    if not (folder / "features.npz").is_file():
        raise UserError(f"cluster.features={str(source)!r}: no features.npz there; give a mode=features job directory")
    summary = read_json(folder / "results.json", "features results")
    shape = summary.get("shape") if isinstance(summary, dict) else None
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(n, int) and n > 0 for n in shape)
            and isinstance(summary.get("families"), list)):
        raise UserError(f"cluster.features={str(source)!r}: {str(folder / 'results.json')!r} is not the results of a "
                        "mode=features job (no [layers, heads] shape or families)")
    if "distance" not in summary.get("families", []):
        raise UserError(f"cluster.features={str(source)!r} has no distance features (families "
                        f"{summary.get('families')}); run mode=features with the distance family")
    return folder / "features.npz", summary


def check_k(k: int, heads: int) -> None:
    if not 2 <= k <= heads:
        raise UserError(f"cluster.k={k}: the model has {heads} heads; k must be between 2 and {heads}")


def read_clusters_run(source: str | Path) -> dict[str, Any]:
    """The clusters file of a ``mode=cluster`` job directory (or the file itself)."""
    path = Path(source)
    path = path / "clusters.json" if path.is_dir() else path
    if not path.is_file():
        raise UserError(f"compare.runs entry {str(source)!r}: no clusters.json there; give mode=cluster job "
                        "directories")
    clusters = read_json(path, "clusters")
    if not isinstance(clusters, dict) or "labels" not in clusters or "shape" not in clusters:
        raise UserError(f"{str(path)!r} is not a clusters file written by mode=cluster (no labels/shape)")
    labels = load_clusters(path)  # every head of its shape, once, named L{layer}H{head}
    check_features_unchanged(clusters, source)
    return clusters | {"labels": labels, "path": str(path.absolute())}


def check_features_unchanged(clusters: dict[str, Any], source: str | Path) -> None:
    """A ``UserError`` when the features job a cluster job read was run again (or its files changed) since: the
    shifts and roles mode=compare reads there would pair these labels with other data. (A clusters file written
    before the stamp was recorded, or with stamps of modification times, or whose features job is gone, is not
    checked.)"""
    recorded, folder = clusters.get("features_stamp"), clusters.get("features")
    if recorded is None or not folder or not Path(folder).is_dir() or any(
            isinstance(stamp, list) and isinstance(stamp[-1], int) for stamp in recorded.values()):
        return  # stamps of modification times (before content digests): not comparable
    now = path_stamp(folder)
    changed = sorted(name for name in recorded.keys() | now.keys() if recorded.get(name) != now.get(name))
    if changed:
        raise UserError(f"compare.runs entry {str(source)!r}: its features job {folder!r} changed after it was "
                        f"clustered ({', '.join(changed[:3])}); run that mode=cluster job again (its command) "
                        "before comparing")


def read_runs(runs: list[str], names: list[str] | None) -> list[dict[str, Any]]:
    """The runs' clusters, named, checked to come from models of one shape (``UserError`` otherwise)."""
    if len(runs) < 2:
        raise UserError(f"mode=compare needs compare.runs with two or more mode=cluster job directories; got "
                        f"{len(runs)}")
    if names is not None and len(names) != len(runs):
        raise UserError(f"compare.names has {len(names)} names for {len(runs)} runs")
    loaded = [read_clusters_run(run) for run in runs]
    shapes = {tuple(run["shape"]) for run in loaded}
    if len(shapes) > 1:
        described = ", ".join(f"{r['model']} {r['shape'][0]}x{r['shape'][1]}" for r in loaded)
        raise UserError(f"compare.runs come from models of different shapes ({described}): heads cannot be matched")
    models = {(run["model"], run.get("architecture")) for run in loaded}
    if len({name for name, _ in models}) > 1 or len({built for _, built in models} - {None}) > 1:
        described = ", ".join(f"{r['model']} ({r.get('architecture') or 'architecture not recorded'})" for r in loaded)
        raise UserError(f"compare.runs come from different models ({described}): a head of one is not the same head "
                        "of another; compare the pre-trained and fine-tuned weights of one model")
    labels = names or _default_names(loaded)
    labels = [label if labels.count(label) == 1 else f"{label} #{i + 1}" for i, label in enumerate(labels)]
    return [run | {"name": label} for run, label in zip(loaded, labels)]


def _default_names(runs: list[dict[str, Any]]) -> list[str]:
    """The model and checkpoint of each run, then what else tells the runs apart (task, clustering settings)."""
    def model(run: dict[str, Any]) -> str:
        checkpoint = (run.get("checkpoint") or {}).get("ckpt_path")
        return f"{run['model']} ({'pre-trained' if checkpoint is None else Path(checkpoint).name})"

    names = [[model(run)] for run in runs]
    if len({name[0] for name in names}) < len(runs):
        for describe in (lambda r: r.get("task"), lambda r: r.get("method"), lambda r: f"k={r.get('k')}",
                         lambda r: f"seed={r.get('seed')}"):
            parts = [describe(run) for run in runs]
            if len(set(parts)) > 1:
                for name, part in zip(names, parts):
                    name.append(str(part))
    return [name[0] + (f" {' '.join(name[1:])}" if len(name) > 1 else "") for name in names]


def read_inputs(cfg: Any) -> tuple[list[dict[str, Any]], list[Path] | None]:
    """The runs and their ``mode=syntax`` jobs, checked."""
    runs = read_runs(list(cfg.compare.runs), None if cfg.compare.names is None else list(cfg.compare.names))
    return runs, read_syntax_jobs(None if cfg.compare.syntax is None else list(cfg.compare.syntax), runs)
