"""``ablate.py mode=cluster``: head types from a ``mode=features`` job's distance features (Guan et al. 2020).

Reads ``cluster.features`` (no model is loaded), clusters the heads (``headlab.analysis.types.clusters``), measures the
stability, embeds the heads and writes into the job directory:

=========================  ==============================================================================
``clusters.json``          the clusters file of DESIGN.md section 5 (``labels``: head -> type, read by
                           ``cluster:NAME`` selectors and the Guan Table 2/3 presets), with the centroids,
                           counts per layer, stability, the separation of the centroids (named only above 1,
                           ``clusters.distinct``), the names the profiles gave and the settings; written
                           again only when it changes (the jobs that read it compare its time)
``refits.json``            the labels of each bootstrap fit of the same types (``refits``, of
                           ``bootstrap_fits`` made: ``clusters.bootstrap_labels``, ``same_types``)
``heads.parquet`` / .csv   the features job's per-head table with ``cluster`` and the embeddings' coordinates
``types_per_layer.csv``    heads of each type per layer (Guan Fig. 3)
``embeddings.png``         t-SNE and MDS of the distance features, by cluster and by layer (Guan Fig. 2, Clark
                           Fig. 6), with the MDS of the JS distances sqrt(JS) when the features have them
                           (Clark's Fig. 6 embeds the divergence itself)
``feature_boxes.png``      the 21 distance features of each cluster's heads (Guan Fig. 1)
``types_per_layer.png``    stacked bars of the types per layer (Guan Fig. 3)
``results.json``           the summary; a complete one for the same config makes a rerun skip the job
=========================  ==============================================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from sklearn.manifold import MDS, TSNE

from headlab.analysis.jobs.identity import JobIdentity, resumable
from headlab.analysis.types.checks import UNREADABLE, check_features_file, features_job, unreadable_features
from headlab.analysis.types.clusters import (
    Clustering,
    agreement,
    bootstrap_labels,
    distinct,
    fit_clusters,
    profiles,
    refits,
    same_types,
)
from headlab.analysis.types.features import DISTANCE_BINS, AttentionFeatures
from headlab.analysis.types.features_run import features_table
from headlab.files import (
    path_stamp,
    read_json,
    write_frame_atomic,
    write_json_atomic,
    write_json_if_changed,
    write_text_atomic,
)
from headlab.reporting import head_plots
from headlab.training.tracking import log_artifacts


def read_features(path: Path, summary: dict[str, Any]) -> AttentionFeatures:
    """The features in ``path``, checked to be of the model its folder's ``results.json`` describes."""
    check_features_file(path, summary)
    try:
        with np.load(path) as arrays:
            return AttentionFeatures.from_arrays(dict(arrays))
    except UNREADABLE as error:
        raise unreadable_features(path, error) from None


def embed(points: np.ndarray, seed: int, perplexity: float, precomputed: bool = False) -> dict[str, np.ndarray]:
    """2-D embeddings of ``points`` ``[heads, dims]`` (or of a distance matrix): t-SNE and metric MDS, seeded."""
    mds = MDS(n_components=2, metric="precomputed" if precomputed else "euclidean", init="classical_mds",
              random_state=seed)
    if precomputed:
        return {"JS MDS": mds.fit_transform(points)}
    tsne = TSNE(n_components=2, perplexity=min(perplexity, len(points) - 1), random_state=seed, init="pca")
    return {"t-SNE": tsne.fit_transform(points), "MDS": mds.fit_transform(points)}


def profile_table(clustering: Clustering) -> str:
    """Each cluster's short-range, long-range and special-token attention (what its name rests on), as text."""
    rows = [f"  {name:<16} short {short:.3f}  long {long:.3f}  special {special:.3f}"
            for name, (short, long, special) in zip(clustering.names, profiles(clustering.centroids))]
    return "centroid profiles (short = self + windows 0-1, long = windows 2-15, special = [CLS] [SEP] , .):\n" + \
        "\n".join(rows)


def naming(clustering: Clustering) -> str:
    """How the clusters got their names, or why they have none."""
    if clustering.by_hand:
        return "named by hand"
    if clustering.named:
        return "named by their profiles, distinct beyond the noise of the fits"
    if clustering.profile_names:
        return ("not named: the centroids match Guan et al.'s profiles but lie closer together than their spread "
                "across the stability fits; the heads did not separate into types")
    return ("not named: k != 4 or the centroid profiles do not match Guan et al.'s dense / diagonal / dense_vertical "
            "/ vertical (cluster.names=[...] names them)")


def stability_note(share: float, threshold: float | None) -> str | None:
    """One ``note:`` line when fewer heads than ``threshold`` keep their type in every fit on half the data."""
    if threshold is None or share >= threshold:
        return None
    return (f"note: stability {share:.1%} is below cluster.min_stability={threshold:g} (Guan et al. report 94-96%): "
            f"these types may change with another sample or fine-tuning seed; compare seeds (mode=compare) before "
            f"reading ablations by cluster:NAME")


@resumable
def run(cfg: Any, identity: JobIdentity) -> dict[str, Any]:
    """Cluster the heads of ``cfg.cluster.features``; ``cfg`` passed ``check_mode``."""
    path, source = features_job(cfg.cluster.features)
    features = read_features(path, source)
    logger = identity.logger(cfg.logger, f"cluster-{source['task']}-{source['model']}")
    options = cfg.cluster
    points = features.distance.reshape(-1, len(DISTANCE_BINS))  # [heads, 21]
    names = None if options.names is None else list(options.names)
    clustering = fit_clusters(points, options.k, options.method, cfg.seed, names)
    per_sequence = features.distance_sequences.reshape(features.num_sequences, -1, len(DISTANCE_BINS))
    # the centroids' noise for naming: fits on halves of the sequences (features recomputed), whatever the split of
    # the stability
    fitted, centroids = refits(per_sequence, clustering.labels, options.k, options.method, cfg.seed,
                               options.stability_fits, "sequences")
    clustering = distinct(clustering, centroids)

    def stable_share(seed: int) -> float:
        return agreement(refits(per_sequence, clustering.labels, options.k, options.method, seed,
                                options.stability_fits, options.stability_split)[0])

    share = agreement(fitted) if options.stability_split == "sequences" else stable_share(cfg.seed)
    repeats = [stable_share(cfg.seed + REPEAT * r)  # the whole procedure again, other halves and seeds
               for r in range(1, options.stability_repeats + 1)]
    resampled, resampled_centroids = bootstrap_labels(per_sequence, clustering.labels, options.k, options.method,
                                                      cfg.seed, options.bootstrap_fits)  # [fits, heads], [fits, k, 21]
    resampled = [fit for fit, fit_centroids in zip(resampled, resampled_centroids)
                 if same_types(clustering, fit_centroids)]
    summary = identity.complete(write_clusters(cfg, features, clustering, share, path, source, identity.output_dir,
                                               logger, repeats, resampled))
    write_json_atomic(identity.output_dir / "results.json", summary)
    counts = ", ".join(f"{name} {count}" for name, count in summary["counts"].items())
    silhouette = "" if clustering.silhouette is None else f", silhouette {clustering.silhouette:.3f}"
    bootstrap = (f", {len(resampled)} of {options.bootstrap_fits} bootstrap fits of the same types"
                 if options.bootstrap_fits else "")
    Console().print(f"{len(points)} heads in {options.k} clusters ({naming(clustering)}): {counts}; stability "
                    f"{share:.2%}{silhouette}, separation {clustering.separation:.2f}{bootstrap} -> "
                    f"{identity.output_dir / 'clusters.json'}\n{profile_table(clustering)}", markup=False,
                    soft_wrap=True)
    note = stability_note(share, options.min_stability)
    if note:
        Console().print(note, markup=False, soft_wrap=True)
    if logger:
        logger.finalize("success")
    return summary


REPEAT = 1000  # repeat r of the stability procedure draws its halves and fits with seed + REPEAT * r


def write_clusters(cfg: Any, features: AttentionFeatures, clustering: Clustering, share: float, path: Path,
                   source: dict[str, Any], output_dir: Path, logger, repeats: list[float],
                   resampled: list[np.ndarray]) -> dict[str, Any]:
    """Every file of the module docstring; returns the summary for ``results.json`` (without the config).
    ``resampled``: the ``[heads]`` labels of each bootstrap fit of the same types (``refits.json``)."""
    options, formats = cfg.cluster, tuple(cfg.report.formats)
    names = clustering.label_names()
    table = features_table(features)
    table["cluster"] = names
    points = features.distance.reshape(-1, len(DISTANCE_BINS))
    embedded = embed(points, cfg.seed, options.perplexity)
    if features.js is not None:
        embedded |= embed(np.sqrt(features.js), cfg.seed, options.perplexity, precomputed=True)
    for name, xy in embedded.items():
        key = name.lower().replace(" ", "_").replace("-", "")
        table[f"{key}_x"], table[f"{key}_y"] = xy[:, 0], xy[:, 1]
    order = [n for n in clustering.names if n in set(names)]
    per_layer = (pd.crosstab(table["layer"], table["cluster"]).reindex(columns=order, fill_value=0)
                 .rename_axis(columns=None).reset_index())
    write_frame_atomic(table, output_dir / "heads.parquet")
    write_frame_atomic(table, output_dir / "heads.csv")
    write_frame_atomic(per_layer, output_dir / "types_per_layer.csv")
    counts = {name: int((table["cluster"] == name).sum()) for name in order}
    separation = None if np.isnan(clustering.separation) else clustering.separation  # NaN: a fit left a cluster empty
    write_json_if_changed(output_dir / "clusters.json", {
        "model": source["model"], "architecture": source.get("architecture"), "task": source["task"],
        "checkpoint": source.get("checkpoint"),
        "labels": dict(zip(table["name"], names)), "names": clustering.names, "named": clustering.named,
        "named_by_hand": options.names is not None, "profile_names": clustering.profile_names,
        "separation": separation,
        "profiles": {n: dict(zip(("short", "long", "special"), p.tolist()))
                     for n, p in zip(clustering.names, profiles(clustering.centroids))},
        "method": options.method, "k": options.k, "seed": cfg.seed, "counts": counts,
        "counts_per_layer": per_layer.to_dict("records"), "stability": share, "silhouette": clustering.silhouette,
        "stability_split": options.stability_split, "stability_fits": options.stability_fits,
        "stability_repeats": repeats,
        "centroids": {name: clustering.centroids[i].tolist() for i, name in enumerate(clustering.names)},
        "bins": list(DISTANCE_BINS), "shape": [features.num_layers, features.num_heads],
        "features": str(path.parent.absolute()), "num_sequences": features.num_sequences,
        "features_stamp": path_stamp(str(path.parent))})  # mode=compare reads the job's other files too
    write_json_atomic(output_dir / "refits.json", {  # apart: a change of the fits leaves clusters.json's readers done
        "names": clustering.names, "bootstrap_fits": options.bootstrap_fits,  # the fits made; refits: of the same types
        "refits": [dict(zip(table["name"], (clustering.names[label] for label in fit))) for fit in resampled]})
    title = f"{source['model']} ({source['task']}), {features.num_sequences} sequences"
    images = {
        "embeddings": head_plots.embeddings(embedded, names, table["layer"].tolist(), title,
                                            output_dir / "embeddings", formats)[0],
        "feature_boxes": head_plots.feature_boxes(points, names, DISTANCE_BINS, f"distance features per type, {title}",
                                                  output_dir / "feature_boxes", formats)[0],
        "types_per_layer": head_plots.types_per_layer(per_layer, f"head types per layer, {title}",
                                                      output_dir / "types_per_layer", formats)[0]}
    log_artifacts(logger, {"heads": table}, images)
    if logger is not None:
        metrics = {"stability": share, **{f"count/{k}": v for k, v in counts.items()}}
        if clustering.silhouette is not None:
            metrics["silhouette"] = clustering.silhouette
        logger.log_metrics(metrics, step=0)
    return {"kind": "cluster", "group": cfg.group, "model": source["model"],
            "architecture": source.get("architecture"), "task": source["task"],
            "features": str(path.parent.absolute()), "k": options.k, "method": options.method,
            "named": clustering.named, "counts": counts, "stability": share, "silhouette": clustering.silhouette,
            "stability_repeats": repeats, "separation": separation,
            "files": ["clusters.json", "refits.json", "heads.parquet", "heads.csv", "types_per_layer.csv",
                      *(p.name for p in images.values())]}


def summarize_sweep(sweep_dir: str | Path) -> pd.DataFrame | None:
    """One row per ``mode=cluster`` job under ``sweep_dir`` (e.g. a multirun over ``cluster.k``), for choosing k and
    the method by stability and silhouette: ``cluster_selection.csv`` / ``.md`` in ``sweep_dir``, also printed.
    None when there is no finished cluster job."""
    sweep_dir = Path(sweep_dir)
    rows = []
    for path in sorted(sweep_dir.rglob("results.json")):
        summary = read_json(path, "results")
        if summary.get("kind") != "cluster" or not summary.get("complete"):
            continue
        rows.append({"job": str(path.parent.relative_to(sweep_dir)), "features": summary["features"],
                     "method": summary["method"], "k": summary["k"], "seed": summary["config"]["seed"],
                     "stability": summary["stability"], "silhouette": summary.get("silhouette"),
                     "separation": summary.get("separation"), "named": summary["named"],
                     "counts": " / ".join(f"{name} {count}" for name, count in summary["counts"].items())})
    if not rows:
        return None
    table = pd.DataFrame(rows).sort_values(["features", "method", "k", "seed"], kind="stable")
    write_frame_atomic(table, sweep_dir / "cluster_selection.csv")
    hidden = [] if table.duplicated(["features", "method", "k", "seed"]).any() else ["job"]  # the CSV keeps them
    if table["features"].nunique() == 1:
        hidden.append("features")
    shown = table.drop(columns=hidden)
    text = shown.to_markdown(index=False, floatfmt=".4f")
    write_text_atomic(sweep_dir / "cluster_selection.md", text + "\n")
    Console().print(f"cluster jobs of {sweep_dir} (stability: share of heads labelled the same in every fit on "
                    f"half the data; silhouette: -1..1, higher is better separated; separation: the closest two "
                    f"centroids over their noise, named above 1):\n{text}\n"
                    f"-> {sweep_dir / 'cluster_selection.csv'}", markup=False, soft_wrap=True)
    return table
