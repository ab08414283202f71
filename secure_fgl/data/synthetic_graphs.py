"""A synthetic graph-classification federation with two opposite labelings.

Tests and the quick start need no files.

Every graph is an Erdos-Renyi graph ``G(n, p)`` with ``n`` uniform in ``[min_nodes,
max_nodes]`` and ``p`` either ``p_sparse`` or ``p_dense`` (fair coin).  Node features are
one-hot degrees (capped at ``max_degree``).  Clients of group 0 (even ids) label a graph 1
when it is dense; clients of group 1 (odd ids) label it 1 when it is sparse: the two groups
are the ground truth of the clustering tests and of the similarity-matrix attack.
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data

from .datasets import SYNTHETIC_GRAPHS
from .errors import DataError
from .graph_classification import FederatedGraphDataset, GraphClient, stratified_split

__all__ = ["SYNTHETIC_GRAPHS", "two_task_graphs", "client_groups"]


def client_groups(num_clients: int) -> np.ndarray:
    """The task group of every client (ground truth for clustering tests and attacks)."""
    return np.arange(num_clients) % 2


def _er_graph(rng: np.random.Generator, n: int, p: float, max_degree: int) -> tuple[torch.Tensor, torch.Tensor]:
    upper = np.triu(rng.random((n, n)) < p, k=1)
    src, dst = np.nonzero(upper)
    edge_index = torch.as_tensor(np.stack([np.concatenate([src, dst]), np.concatenate([dst, src])]), dtype=torch.long)
    degree = np.minimum(np.bincount(src, minlength=n) + np.bincount(dst, minlength=n), max_degree)
    x = torch.zeros(n, max_degree + 1)
    x[torch.arange(n), torch.as_tensor(degree)] = 1.0
    return x, edge_index


def two_task_graphs(
    num_clients: int = 6,
    graphs_per_client: int = 60,
    seed: int = 0,
    *,
    min_nodes: int = 8,
    max_nodes: int = 16,
    p_sparse: float = 0.15,
    p_dense: float = 0.45,
    max_degree: int = 10,
    dense_share: float | list[float] = 0.5,
) -> FederatedGraphDataset:
    """``num_clients`` clients of ``graphs_per_client`` graphs each, split 80/10/10."""
    if num_clients < 1 or graphs_per_client < 3:
        raise DataError("synthetic-graphs needs >= 1 client and >= 3 graphs per client")
    shares = (
        np.broadcast_to(np.asarray(dense_share, dtype=np.float64), (num_clients,))
        if np.ndim(dense_share) == 0 or len(dense_share) == num_clients
        else None
    )
    if shares is None or not ((shares >= 0) & (shares <= 1)).all():
        raise DataError(f"dense_share must be one probability or one per client ({num_clients}), got {dense_share!r}")
    rng = np.random.default_rng([seed, 41])
    groups = client_groups(num_clients)
    clients = []
    for cid in range(num_clients):
        graphs, labels = [], []
        for _ in range(graphs_per_client):
            dense = int(rng.random() < shares[cid])
            n = int(rng.integers(min_nodes, max_nodes + 1))
            x, edge_index = _er_graph(rng, n, p_dense if dense else p_sparse, max_degree)
            label = dense if groups[cid] == 0 else 1 - dense
            graphs.append(Data(x=x, edge_index=edge_index, y=torch.tensor([label])))
            labels.append(label)
        tr, va, te = stratified_split(np.asarray(labels), (0.8, 0.1, 0.1), seed + cid)
        clients.append(
            GraphClient(
                cid,
                f"{SYNTHETIC_GRAPHS}-task{groups[cid]}",
                [graphs[i] for i in tr],
                [graphs[i] for i in va],
                [graphs[i] for i in te],
                max_degree + 1,
                2,
            )
        )
    return FederatedGraphDataset(name=SYNTHETIC_GRAPHS, setting="synthetic", clients=clients)
