"""Head types by clustering the 21 distance features (Guan et al. 2020), their names and their stability.

- ``fit_clusters``: K-means (scikit-learn, ``n_init=10``) or a Gaussian mixture on ``[heads, 21]``, fixed seed;
  labels are renumbered by first appearance in head order, so equal partitions get equal labels.
- ``name_clusters``: with k = 4, names by the centroids' profiles (short range = self + windows 0-1, long
  range = windows 2-15, special = [CLS] + [SEP] + ``,`` + ``.``), after Guan et al.'s descriptions:
  ``vertical`` has the most special-token attention, ``dense`` the most long-range attention, ``diagonal``
  the most short-range attention, ``dense_vertical`` is the fourth. The profiles match when those three are
  different clusters and ``dense_vertical`` has more special-token attention than ``dense`` and less
  short-range attention than ``diagonal``; otherwise (and when k != 4) the clusters are ``cluster0..k-1``
  (name them by hand with ``names=``).
- ``silhouette``: the heads' mean silhouette coefficient (Rousseeuw 1987; scikit-learn, Euclidean), for choosing k
  next to the stability (Guan et al.: "stable clustering results with 3 or 5 clusters", four read best).
- ``stability``: Guan et al.'s Table 1 (after Von Luxburg 2010): ``fits`` fits on random halves of the
  sequences (the heads' features recomputed from those sequences) or of the heads (predicting the rest),
  each fit's labels aligned to the full fit's by the Hungarian method; the share of heads whose label is
  the same in every fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score
from sklearn.mixture import GaussianMixture

from headlab.analysis.types.checks import check_k
from headlab.errors import UserError

TYPE_NAMES = ("dense", "diagonal", "dense_vertical", "vertical")  # Guan et al. 2020, Fig. 1
METHODS = ("kmeans", "gmm")
SHORT, LONG, SPECIAL = slice(0, 3), slice(3, 17), slice(17, 21)  # of the 21 bins: self+w0+w1, w2..w15, specials


@dataclass
class Clustering:
    """Labels ``[heads]`` (0..k-1), centroids ``[k, 21]`` and the names of the clusters."""

    labels: np.ndarray
    centroids: np.ndarray
    names: list[str]
    named: bool  # the profiles matched Guan et al.'s four types
    silhouette: float | None  # mean silhouette coefficient; None when the heads fall into one cluster

    def label_names(self) -> list[str]:
        return [self.names[label] for label in self.labels]


def _model(k: int, method: str, seed: int):
    if method == "kmeans":
        return KMeans(n_clusters=k, n_init=10, random_state=seed)
    return GaussianMixture(n_components=k, covariance_type="diag", n_init=5, reg_covar=1e-6, random_state=seed)


def _centroids(model) -> np.ndarray:
    return model.cluster_centers_ if hasattr(model, "cluster_centers_") else model.means_


def fit_clusters(features: np.ndarray, k: int = 4, method: str = "kmeans", seed: int = 0,
                 names: list[str] | None = None) -> Clustering:
    """Cluster the heads' ``features`` ``[heads, 21]``; the clusters are named by ``names`` (in label order) when
    given, else when their profiles match."""
    check_k(k, len(features))
    if names is not None and (len(names) != k or len(set(names)) != k):
        raise UserError(f"cluster.names={list(names)} must be {k} different names, one per cluster in the order "
                        f"cluster0..cluster{k - 1}")
    model = _model(k, method, seed).fit(features)
    labels, centroids = _first_appearance(model.predict(features), _centroids(model))
    names = list(names) if names is not None else name_clusters(centroids)
    used = len(set(labels.tolist()))
    silhouette = float(silhouette_score(features, labels)) if 2 <= used < len(features) else None
    return Clustering(labels, centroids, names or [f"cluster{i}" for i in range(k)], names is not None, silhouette)


def _first_appearance(labels: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Relabel so that cluster 0 holds the first head, cluster 1 the first head of another cluster, ..."""
    order = list(dict.fromkeys(labels.tolist()))
    order += [c for c in range(len(centroids)) if c not in order]  # empty clusters last
    mapping = np.empty(len(centroids), dtype=int)
    mapping[order] = np.arange(len(centroids))
    return mapping[labels], centroids[order]


def name_clusters(centroids: np.ndarray) -> list[str] | None:
    """Guan et al.'s type of each centroid (module docstring), or None when k != 4 or the profiles do not match."""
    if len(centroids) != len(TYPE_NAMES):
        return None
    short, long, special = profiles(centroids).T
    vertical, dense, diagonal = int(np.argmax(special)), int(np.argmax(long)), int(np.argmax(short))
    if len({vertical, dense, diagonal}) < 3:
        return None
    dense_vertical = ({0, 1, 2, 3} - {vertical, dense, diagonal}).pop()
    if not (special[dense_vertical] > special[dense] and short[dense_vertical] < short[diagonal]):
        return None
    names = [""] * 4
    for cluster, name in zip((dense, diagonal, dense_vertical, vertical), TYPE_NAMES):
        names[cluster] = name
    return names


def name_margins(named: dict[str, dict[str, float]]) -> dict[str, float]:
    """How clearly each of Guan et al.'s four named centroids fits its type, from ``{name: {short, long, special}}``:
    its distance (in shares of attention) from the edge of the naming rule (``name_clusters``) and of Guan et al.'s
    description. ``vertical``: its special-token share minus the next highest; ``dense``: its long-range share minus
    the next; ``diagonal``: its short-range share minus the next; ``dense_vertical`` ("large values at long range
    windows and special tokens"): the smallest of its special share over ``dense``'s, ``diagonal``'s short share over
    its own, and its long share over ``diagonal``'s. Near 0 or below, the name says more than the centroid does."""
    def lead(name: str, part: str) -> float:
        return named[name][part] - max(values[part] for other, values in named.items() if other != name)

    return {"dense": lead("dense", "long"), "diagonal": lead("diagonal", "short"),
            "dense_vertical": min(named["dense_vertical"]["special"] - named["dense"]["special"],
                                  named["diagonal"]["short"] - named["dense_vertical"]["short"],
                                  named["dense_vertical"]["long"] - named["diagonal"]["long"]),
            "vertical": lead("vertical", "special")}


def profiles(centroids: np.ndarray) -> np.ndarray:
    """``[k, 3]``: each centroid's short-range, long-range and special-token attention."""
    return np.stack([centroids[:, part].sum(1) for part in (SHORT, LONG, SPECIAL)], axis=1)


def align(labels: np.ndarray, reference: np.ndarray, k: int) -> np.ndarray:
    """``labels`` renamed to agree best with ``reference`` (Hungarian method on the contingency table)."""
    table = np.zeros((k, k), dtype=int)
    np.add.at(table, (labels, reference), 1)
    rows, columns = linear_sum_assignment(-table)
    mapping = np.empty(k, dtype=int)
    mapping[rows] = columns
    return mapping[labels]


def stability(per_sequence: np.ndarray, k: int = 4, method: str = "kmeans", seed: int = 0, fits: int = 10,
              split: str = "sequences") -> tuple[float, np.ndarray]:
    """(share of heads labelled the same in every fit, ``[fits, heads]`` aligned labels).

    ``per_sequence``: ``[sequences, heads, 21]`` features of each sequence; ``split``: ``sequences`` (fit on the
    features of a random half of the sequences) or ``heads`` (fit on a random half of the heads, predict all).
    """
    sequences, heads, _ = per_sequence.shape
    full = per_sequence.mean(0)
    reference = fit_clusters(full, k, method, seed).labels
    rng = np.random.default_rng(seed)
    fitted = []
    for fit in range(fits):
        if split == "sequences":
            if sequences < 2:
                raise UserError("cluster stability on random halves of the sequences needs at least 2 sequences")
            features = per_sequence[rng.choice(sequences, size=sequences // 2, replace=False)].mean(0)
            labels = _model(k, method, seed + fit + 1).fit(features).predict(features)
        else:
            half = rng.choice(heads, size=max(k, heads // 2), replace=False)
            labels = _model(k, method, seed + fit + 1).fit(full[half]).predict(full)
        fitted.append(align(labels, reference, k))
    fitted = np.array(fitted)
    return float((fitted == fitted[0]).all(0).mean()), fitted
