"""Node partitioners: who owns which node of one graph.

Every partitioner returns ``owner``, a ``LongTensor [N]`` with the client id of each node
(``-1`` = dropped), deterministically by ``seed``.

* :func:`dirichlet_partition` -- label-Dirichlet skew (Hsu et al., 2019) as used by FedGCN
  (Yao et al., 2023, sec. 5-6): for every class, proportions over clients ~ ``Dir(beta)``.
  ``beta = 10000`` is practically i.i.d., ``beta = 1`` highly skewed.
* :func:`louvain_partition` -- Louvain communities (Blondel et al., 2008) grouped into K
  clients, as FedSage+/FGSSL/FedOMD do, or only the K largest kept (FedSpray sec. 3.1).
* :func:`iid_partition` -- uniform random, equal sizes.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from .errors import DataError

__all__ = ["dirichlet_partition", "louvain_partition", "iid_partition", "partition_label_distribution"]


def _as_numpy(t: torch.Tensor | np.ndarray) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _check_k(num_nodes: int, num_clients: int) -> None:
    if num_clients < 1:
        raise DataError(f"num_clients={num_clients}: need at least 1 client")
    if num_clients > num_nodes:
        raise DataError(f"num_clients={num_clients} > number of nodes {num_nodes}: use fewer clients or a larger graph")


def iid_partition(num_nodes: int, num_clients: int, seed: int = 0) -> torch.Tensor:
    """Uniformly random assignment with client sizes differing by at most one.

    Args:
        num_nodes: Number of nodes ``N``.
        num_clients: Number of clients ``K`` (``1 <= K <= N``).
        seed: Seed of the permutation.

    Returns:
        ``owner [N]``: the client of each node.

    Raises:
        DataError: ``K`` is below 1 or above ``N``.
    """
    _check_k(num_nodes, num_clients)
    rng = np.random.default_rng([seed, 11])
    owner = np.empty(num_nodes, dtype=np.int64)
    owner[rng.permutation(num_nodes)] = np.arange(num_nodes) % num_clients
    return torch.from_numpy(owner)


def dirichlet_partition(
    y: torch.Tensor, num_clients: int, beta: float, seed: int = 0, min_size: int = 10, max_tries: int = 100
) -> torch.Tensor:
    r"""Label-Dirichlet partition (FedGCN's ``label_dirichlet_partition``, Hsu et al. 2019).

    For every class ``c`` the class's nodes are shuffled and cut at proportions
    ``q_c \sim Dir(\beta \mathbf 1_K)``; clients that already hold ``N/K`` nodes get no more
    (the balancing rule of FedGCN's code).  The draw is repeated until every client holds at
    least ``min(min_size, N // K)`` nodes.

    Args:
        y: Node labels ``[N]``.
        num_clients: Number of clients ``K``.
        beta: Dirichlet concentration (10000 ~ i.i.d., 1 = highly skewed).
        seed: Seed of the draws.
        min_size: Minimum client size wanted (capped at ``N // K``).
        max_tries: Draws before giving up.

    Returns:
        ``owner [N]``: the client of each node.

    Raises:
        DataError: ``beta <= 0``, ``K`` out of range, or no draw within ``max_tries`` gives every client
            ``min(min_size, N // K)`` nodes.
    """
    yn = _as_numpy(y).reshape(-1).astype(np.int64)
    n = yn.shape[0]
    _check_k(n, num_clients)
    if not beta > 0:
        raise DataError(f"beta={beta}: the Dirichlet concentration must be > 0 (10000 ~ i.i.d., 1 = highly skewed)")
    k = int(num_clients)
    need = min(int(min_size), n // k)
    rng = np.random.default_rng([seed, 12])
    classes = np.unique(yn)
    by_class = [np.flatnonzero(yn == c) for c in classes]
    cap = n / k
    for _ in range(max_tries):
        owner = np.empty(n, dtype=np.int64)
        sizes = np.zeros(k, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            prop = rng.dirichlet(np.full(k, float(beta)))
            prop = prop * (sizes < cap)
            prop = prop / prop.sum() if prop.sum() > 0 else np.full(k, 1.0 / k)
            cuts = (np.cumsum(prop) * idx.size).astype(np.int64)[:-1]
            counts = np.diff(np.concatenate([[0], cuts, [idx.size]]))
            owner[idx] = np.repeat(np.arange(k), counts)
            sizes += counts
        if sizes.min() >= need:
            return torch.from_numpy(owner)
    raise DataError(
        f"dirichlet_partition: after {max_tries} draws some client still has fewer "
        f"than {need} nodes (beta={beta}, K={k}, N={n}): raise beta or use fewer clients"
    )


def louvain_partition(
    edge_index: torch.Tensor,
    num_nodes: int,
    num_clients: int,
    resolution: float = 1.0,
    seed: int = 0,
    keep_largest: bool = False,
) -> torch.Tensor:
    """Louvain communities (``networkx.community.louvain_communities``) as clients.

    ``keep_largest=False`` (FedSage+/FGSSL/FedOMD): communities, largest first, go to the
    client currently holding the fewest nodes, so every node is owned and sizes are balanced.
    ``keep_largest=True`` (FedSpray sec. 3.1): the K largest communities become the clients
    (largest = client 0) and every other node is dropped (``owner = -1``).

    Args:
        edge_index: ``[2, E]`` edges (each undirected edge used once).
        num_nodes: Number of nodes ``N``.
        num_clients: Number of clients ``K``.
        resolution: Louvain resolution (larger = more, smaller communities).
        seed: Seed of Louvain.
        keep_largest: Keep only the ``K`` largest communities (FedSpray) instead of packing all of them.

    Returns:
        ``owner [N]``: the client of each node, ``-1`` for a dropped node.

    Raises:
        DataError: Louvain finds fewer than ``K`` communities, ``resolution <= 0`` or ``K`` out of range.
    """
    import networkx as nx

    _check_k(num_nodes, num_clients)
    if resolution <= 0:
        raise DataError(f"resolution={resolution}: must be > 0 (larger = more, smaller communities)")
    ei = _as_numpy(edge_index).astype(np.int64)
    g = nx.Graph()
    g.add_nodes_from(range(num_nodes))
    keep = ei[0] < ei[1]  # each undirected edge once, no self loops
    g.add_edges_from(zip(ei[0, keep].tolist(), ei[1, keep].tolist()))
    comms = nx.community.louvain_communities(g, resolution=resolution, seed=seed)
    # deterministic order: size desc, then smallest member
    comms = sorted((sorted(c) for c in comms), key=lambda c: (-len(c), c[0]))
    k = int(num_clients)
    if len(comms) < k:
        raise DataError(
            f"Louvain found only {len(comms)} communities for {k} clients: "
            f"raise resolution (now {resolution}) or use fewer clients"
        )
    owner = np.full(num_nodes, -1, dtype=np.int64)
    if keep_largest:
        for cid, members in enumerate(comms[:k]):
            owner[members] = cid
    else:
        heap = [(0, cid) for cid in range(k)]
        for members in comms:
            size, cid = heapq.heappop(heap)
            owner[members] = cid
            heapq.heappush(heap, (size + len(members), cid))
    return torch.from_numpy(owner)


def partition_label_distribution(y: torch.Tensor, owner: torch.Tensor, num_classes: int | None = None) -> torch.Tensor:
    """``[K, C]`` row-stochastic label distribution of every client (FedGCN Def. 5.1).

    Args:
        y: Node labels ``[N]``.
        owner: The client of each node (``-1``: dropped, not counted).
        num_classes: ``C`` (default: the largest label + 1).

    Returns:
        Row ``k``: the label shares of client ``k``'s nodes.
    """
    yn, on = _as_numpy(y).astype(np.int64), _as_numpy(owner).astype(np.int64)
    c = int(num_classes if num_classes is not None else yn.max() + 1)
    k = int(on.max()) + 1
    keep = on >= 0
    counts = np.bincount(on[keep] * c + yn[keep], minlength=k * c).reshape(k, c).astype(np.float64)
    return torch.from_numpy(counts / np.maximum(counts.sum(1, keepdims=True), 1))
