"""Head types by clustering the 21 distance features (Guan et al. 2020), their names and their stability.

- ``fit_clusters``: K-means (scikit-learn, ``KMEANS_STARTS`` starts, the best kept) or a Gaussian mixture on
  ``[heads, 21]``, fixed seed;
  labels are renumbered by first appearance in head order, so equal partitions get equal labels.
- ``name_clusters``: with k = 4, names by the centroids' profiles (short range = self + windows 0-1, long
  range = windows 2-15, special = [CLS] + [SEP] + ``,`` + ``.``), after Guan et al.'s descriptions:
  ``vertical`` has the most special-token attention, ``dense`` the most long-range attention, ``diagonal``
  the most short-range attention, ``dense_vertical`` is the fourth. The profiles match when those three are
  different clusters and ``dense_vertical`` has more special-token attention than ``dense`` and less
  short-range attention than ``diagonal``; otherwise (and when k != 4) the clusters are ``cluster0..k-1``
  (name them by hand with ``names=``).
- ``distinct``: the profile names stay only when the clusters are distinct beyond the noise of the fits: every two
  centroids lie further apart than ``t * sqrt(s_i^2 + s_j^2)``, ``s_i`` the root mean square distance of the
  centroid i of fits on random halves of the sequences (a fit's features, recomputed from its half, averaged over
  the heads of its aligned label i) from the full fit's: the standard error of centroid i by half-sampling
  (McCarthy 1969); ``t`` Student's 97.5% quantile with ``fits`` degrees of freedom. Each centroid's own spread
  counts, not that of the difference: conservative on purpose, so that four centroids of one profile (a model
  whose heads are alike) are not named.
- ``silhouette``: the heads' mean silhouette coefficient (Rousseeuw 1987; scikit-learn, Euclidean), for choosing k
  next to the stability (Guan et al.: "stable clustering results with 3 or 5 clusters", four read best).
- ``stability``: Guan et al.'s Table 1 (after Von Luxburg 2010): ``fits`` fits on random halves of the
  sequences (the heads' features recomputed from those sequences) or of the heads (predicting the rest),
  each fit's labels aligned to the full fit's by the Hungarian method; the share of heads whose label is
  the same in every fit; repeated with other seeds (``cluster.stability_repeats``), the spread of the procedure.
- ``bootstrap_labels``: the labels of fits on bootstrap resamples of the sequences (drawn with replacement, as many
  as there are), aligned to the full fit's: the clustering another sample of text would give; a fit whose own
  profiles name its clusters otherwise (``same_types``) is not the same types. The study reruns the type plans under
  each fit that is (its ``refits`` stage), so that a claim about a type states how much it rests on one fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import t as student_t
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score
from sklearn.mixture import GaussianMixture

from headlab.analysis.types.checks import check_k
from headlab.errors import UserError

TYPE_NAMES = ("dense", "diagonal", "dense_vertical", "vertical")  # Guan et al. 2020, Fig. 1
METHODS = ("kmeans", "gmm")
SHORT, LONG, SPECIAL = slice(0, 3), slice(3, 17), slice(17, 21)  # of the 21 bins: self+w0+w1, w2..w15, specials
# k-means starts, the best partition kept: scikit-learn's 10 left fine-tuned MiniLM's 72 heads, with seed 0, in a
# partition of inertia 1.199 where seeds 1-7 found 1.181 (6 heads typed otherwise); 50 find 1.181 from every seed
KMEANS_STARTS = 50


@dataclass
class Clustering:
    """Labels ``[heads]`` (0..k-1), centroids ``[k, 21]`` and the names of the clusters."""

    labels: np.ndarray
    centroids: np.ndarray
    names: list[str]
    named: bool  # the profiles matched Guan et al.'s four types (and, after ``distinct``, the clusters are distinct)
    silhouette: float | None  # mean silhouette coefficient; None when the heads fall into one cluster
    separation: float | None = None  # ``separation`` of the centroids (above 1: distinct); None until measured
    profile_names: list[str] | None = None  # the names the profiles gave (``name_clusters``), kept or not
    by_hand: bool = False  # named by ``names=``

    def label_names(self) -> list[str]:
        return [self.names[label] for label in self.labels]


def _model(k: int, method: str, seed: int):
    if method == "kmeans":
        return KMeans(n_clusters=k, n_init=KMEANS_STARTS, random_state=seed)
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
    profile_names, by_hand = name_clusters(centroids), names is not None
    names = list(names) if by_hand else profile_names
    used = len(set(labels.tolist()))
    silhouette = float(silhouette_score(features, labels)) if 2 <= used < len(features) else None
    return Clustering(labels, centroids, names or numbered(k), names is not None, silhouette,
                      profile_names=profile_names, by_hand=by_hand)


def numbered(k: int) -> list[str]:
    return [f"cluster{i}" for i in range(k)]


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
    """(share of heads labelled the same in every fit, ``[fits, heads]`` aligned labels) of ``refits`` aligned to
    the full fit."""
    fitted, _ = refits(per_sequence, fit_clusters(per_sequence.mean(0), k, method, seed).labels, k, method, seed,
                       fits, split)
    return agreement(fitted), fitted


def agreement(fitted: np.ndarray) -> float:
    """The share of heads labelled the same in every fit of ``fitted`` ``[fits, heads]``."""
    return float((fitted == fitted[0]).all(0).mean())


def refits(per_sequence: np.ndarray, reference: np.ndarray, k: int = 4, method: str = "kmeans", seed: int = 0,
           fits: int = 10, split: str = "sequences") -> tuple[np.ndarray, np.ndarray]:
    """``fits`` fits on random halves: (``[fits, heads]`` labels aligned to ``reference``, ``[fits, k, 21]`` each
    fit's centroids, its features' mean over the heads of each aligned label, NaN for a label without heads).

    ``per_sequence``: ``[sequences, heads, 21]`` features of each sequence; ``split``: ``sequences`` (fit on the
    features of a random half of the sequences) or ``heads`` (fit on a random half of the heads, predict all).
    """
    sequences, heads, bins = per_sequence.shape
    full = per_sequence.mean(0)
    rng = np.random.default_rng(seed)
    fitted, centroids = [], []
    for fit in range(fits):
        if split == "sequences":
            if sequences < 2:
                raise UserError("cluster stability on random halves of the sequences needs at least 2 sequences")
            features = per_sequence[rng.choice(sequences, size=sequences // 2, replace=False)].mean(0)
            labels = _model(k, method, seed + fit + 1).fit(features).predict(features)
        else:
            features, half = full, rng.choice(heads, size=max(k, heads // 2), replace=False)
            labels = _model(k, method, seed + fit + 1).fit(full[half]).predict(full)
        fitted.append(align(labels, reference, k))
        centroids.append([features[fitted[-1] == c].mean(0) if (fitted[-1] == c).any() else np.full(bins, np.nan)
                          for c in range(k)])
    return np.array(fitted), np.array(centroids)


def bootstrap_labels(per_sequence: np.ndarray, reference: np.ndarray, k: int = 4, method: str = "kmeans",
                     seed: int = 0, fits: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Fits on bootstrap resamples of the sequences of ``per_sequence`` ``[sequences, heads, 21]``: (``[fits, heads]``
    labels, each aligned to ``reference`` ``[heads]`` by the Hungarian method; ``[fits, k, 21]`` each fit's
    centroids, its resample's features averaged over the heads of each aligned label, NaN for a label without
    heads)."""
    sequences, heads, bins = per_sequence.shape
    rng = np.random.default_rng([seed, BOOTSTRAP_STREAM])
    fitted, centroids = np.zeros((fits, heads), dtype=int), np.full((fits, k, bins), np.nan)
    for fit in range(fits):
        features = per_sequence[rng.integers(0, sequences, size=sequences)].mean(0)  # [heads, 21]
        fitted[fit] = align(_model(k, method, seed + fit + 1).fit(features).predict(features), reference, k)
        for label in np.unique(fitted[fit]):
            centroids[fit, label] = features[fitted[fit] == label].mean(0)
    return fitted, centroids


def same_types(clustering: Clustering, centroids: np.ndarray) -> bool:
    """Whether a fit's aligned ``centroids`` ``[k, 21]`` are the types ``clustering``'s names say: always for numbered
    clusters or names given by hand; for names the profiles gave, the fit's own profiles must give each aligned
    cluster the same name (and no cluster may be empty), else the alignment would call another profile by the
    type's name."""
    if not clustering.named or clustering.by_hand:
        return True
    return not np.isnan(centroids).any() and name_clusters(centroids) == list(clustering.names)


BOOTSTRAP_STREAM = 7  # the resamples' own random stream, apart from the stability's halves of the same seed


def separation(centroids: np.ndarray, fitted: np.ndarray) -> float:
    """The closest two of ``centroids`` ``[k, 21]`` relative to their noise (module docstring, ``distinct``): the
    smallest ``|c_i - c_j| / (t * sqrt(s_i^2 + s_j^2))`` over pairs, ``fitted`` ``[fits, k, 21]`` the fits'
    centroids; above 1, every two centroids are told apart. NaN when a fit left a cluster empty."""
    spread = np.mean(((fitted - centroids) ** 2).sum(-1), axis=0)  # [k]: s_i^2
    distance = np.linalg.norm(centroids[:, None] - centroids[None], axis=-1)
    ratio = distance / np.sqrt(spread[:, None] + spread[None]) / student_t.ppf(0.975, len(fitted))
    pairs = np.triu_indices(len(centroids), 1)
    return float(np.nan) if np.isnan(ratio[pairs]).any() else float(ratio[pairs].min())


def distinct(clustering: Clustering, fitted: np.ndarray) -> Clustering:
    """``clustering`` with its ``separation`` from the fits' centroids ``fitted`` (``refits``); names from the profiles
    stay only when it is above 1 (else ``cluster0..k-1``). Names given by hand stay."""
    measured = replace(clustering, separation=separation(clustering.centroids, fitted))
    if measured.named and not measured.by_hand and not measured.separation > 1:
        return replace(measured, names=numbered(len(measured.centroids)), named=False)
    return measured
