"""The server-side decisions of GCFL and GCFL+.

Xie et al., NeurIPS 2021, sec. 4-5, as small pure functions on the statistics the server is given.

* :func:`should_split` -- eq. 4-5: a cluster ``c`` is split when
  ``delta_mean = || sum_{i in c} (|G_i| / |G_c|) dW_i || < eps1`` (the cluster as a whole is
  near a stationary point) and ``delta_max = max_{i in c} || dW_i || > eps2`` (some client
  still moves a lot), plus the reference code's ``|c| > 2`` and ``round > 20``
  (``training.py``; rounds there count from 1, here from 0, hence ``rnd + 1 > 20``).
* :func:`bipartition` -- Stoer-Wagner global minimum cut (Stoer & Wagner, JACM 1997) of
  the complete graph whose edge weights are pairwise similarities (networkx).
* :func:`cut_margin` -- how much lighter the chosen cut is than the next one: a perturbation of
  every similarity by at most ``eps`` moves a cut by at most ``m^2 eps / 4``, so the cut cannot
  change while ``margin > m^2 eps / 2`` (the bound that keeps ckks's cut equal to plain's).
* :func:`dtw_distances` -- GCFL+: pairwise dynamic-time-warping distances of the clients'
  gradient-norm sequences (``dtaidistance``), turned into similarities ``max(D) - D``
  before the cut, as the reference code does.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np

__all__ = [
    "should_split",
    "bipartition",
    "cut_margin",
    "cut_flip_bound",
    "dtw_distances",
    "dtw_similarity",
    "MIN_SPLIT_SIZE",
    "WARMUP_ROUNDS",
]

#: a cluster must have more than this many members to be split (reference code)
MIN_SPLIT_SIZE = 2
#: no split in the first rounds (reference code: ``c_round > 20``, rounds from 1)
WARMUP_ROUNDS = 20


def should_split(delta_mean: float, delta_max: float, size: int, rnd: int, eps1: float, eps2: float) -> bool:
    """Eq. 4-5 and the reference code's size and warm-up conditions (``rnd`` counts from 0)."""
    return delta_mean < eps1 and delta_max > eps2 and size > MIN_SPLIT_SIZE and rnd + 1 > WARMUP_ROUNDS


def bipartition(
    similarity: np.ndarray, members: Sequence[int], min_side: int = 1
) -> tuple[list[int], list[int]] | None:
    """Split ``members`` in two by the Stoer-Wagner minimum cut of ``similarity``.

    ``similarity`` is ``[m, m]``, symmetric and non-negative; row ``i`` belongs to ``members[i]``. Each side is
    sorted.

    ``min_side``: the fewest members a side may have.  When the minimum cut leaves a smaller side,
    the lightest cut with both sides ``>= min_side`` (every bipartition enumerated, up to
    :data:`MARGIN_MAX_MEMBERS` members); ``None`` when there is none.
    """
    sim = np.asarray(similarity, dtype=np.float64)
    m = len(members)
    if sim.shape != (m, m) or m < 2:
        raise ValueError(f"similarity must be [{m}, {m}] with at least 2 members, got {sim.shape}")
    g = nx.Graph()
    g.add_nodes_from(range(m))
    g.add_weighted_edges_from((i, j, float(sim[i, j])) for i in range(m) for j in range(i + 1, m))
    _, (side_a, side_b) = nx.stoer_wagner(g)
    if min(len(side_a), len(side_b)) < min_side:
        if m < 2 * min_side or m > MARGIN_MAX_MEMBERS:
            return None
        codes = np.arange(1, 2 ** (m - 1))  # member m-1 always on side 0
        side = ((codes[:, None] >> np.arange(m)) & 1).astype(np.float64)
        sizes = side.sum(axis=1)
        weights = np.einsum("ci,ij,cj->c", side, sim, 1.0 - side)
        weights[(sizes < min_side) | (m - sizes < min_side)] = np.inf
        chosen = side[int(np.argmin(weights))]
        side_a, side_b = np.flatnonzero(chosen).tolist(), np.flatnonzero(chosen == 0).tolist()
    first, second = sorted(members[i] for i in side_a), sorted(members[i] for i in side_b)
    return (first, second) if first[0] < second[0] else (second, first)


#: largest cluster whose cuts :func:`cut_margin` enumerates (2^(m-1) - 1 cuts)
MARGIN_MAX_MEMBERS = 16


def cut_margin(similarity: np.ndarray) -> float | None:
    """Weight of the second-lightest cut minus the lightest.

    Every bipartition enumerated; ``None`` above :data:`MARGIN_MAX_MEMBERS` members.
    """
    sim = np.asarray(similarity, dtype=np.float64)
    m = sim.shape[0]
    if m < 3 or m > MARGIN_MAX_MEMBERS:
        return None
    codes = np.arange(1, 2 ** (m - 1))  # member m-1 always on side 0
    side = ((codes[:, None] >> np.arange(m)) & 1).astype(np.float64)
    weights = np.einsum("ci,ij,cj->c", side, sim, 1.0 - side)
    lightest, second = np.partition(weights, 1)[:2]
    return float(second - lightest)


def cut_flip_bound(num_members: int, similarity_error: float) -> float:
    """``m^2 eps / 2``: the margin above which no similarity error ``<= eps`` changes the cut."""
    return num_members**2 * similarity_error / 2.0


def dtw_distances(sequences: Sequence[Sequence[float]], standardize: bool = False) -> np.ndarray:
    """Pairwise DTW distances between sequences.

    Pairwise DTW distances (``dtaidistance.dtw.distance_matrix``: Euclidean DTW, no
    window); ``standardize`` divides each sequence by its standard deviation (reference option).
    """
    from dtaidistance import dtw

    seqs = [np.asarray(s, dtype=np.float64) for s in sequences]
    if standardize:
        seqs = [s / max(s.std(), 1e-12) for s in seqs]
    return np.asarray(dtw.distance_matrix(seqs, use_c=False), dtype=np.float64)


def dtw_similarity(distances: np.ndarray) -> np.ndarray:
    """``max(D) - D``: the similarity GCFL+ cuts."""
    return float(np.max(distances)) - distances
