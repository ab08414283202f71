"""Cut a graph into per-client subgraphs: ``(Data, owner, split) -> FederatedGraph``.

Client ``k`` receives its nodes (with their global ids, in increasing global order), the
edges among them in local indices, its masks, and its cross-client edges in global ids
``[own node, foreign node]``.  A cross edge ``{u, v}`` between clients ``a`` and ``b`` is
therefore recorded twice: as ``(u, v)`` at ``a`` and ``(v, u)`` at ``b`` -- FedGCN's setting,
where "cross-client edges typically are stored in both clients" (Yao et al., 2023, sec. 1, 3).
Edges touching a dropped node (``owner = -1``) exist for no client.

Everything is vectorised over nodes and edges (one pass of sorting); the only Python loop is
over clients, so a 10^6-node graph is cut in seconds.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from .datasets import load_node_dataset
from .errors import DataError
from .federated import ClientSubgraph, FederatedGraph
from .partition import dirichlet_partition, iid_partition, louvain_partition
from .splits import apply_split
from .synthetic import coalesce_undirected

__all__ = ["build_federated", "make_federated", "PARTITIONS"]

PARTITIONS = ("dirichlet", "louvain", "iid", "native")


def _groups(keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Stable sort order of ``keys`` (values in ``0..k-1``) and the boundaries of each group."""
    order = np.argsort(keys, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(keys, minlength=k))])
    return order, bounds


def build_federated(data: Data, owner: torch.Tensor, split: str = "public", seed: int = 0) -> FederatedGraph:
    """Split ``data`` among the clients named by ``owner`` (``-1`` = dropped).

    The edge set is made undirected and coalesced first (a no-op for PyG datasets and the
    synthetic graphs); ``FederatedGraph.graph`` is a shallow copy of ``data`` carrying that
    edge set and the global masks of ``split`` (see :func:`~secure_fgl.data.splits.apply_split`).

    Args:
        data: The whole graph.
        owner: ``[N]`` client id of each node, ``-1`` = dropped.
        split: The train/validation/test split (``public``, ``random:a/b/c``, ...).
        seed: Seed of a random split.

    Returns:
        The federation: the global graph and one subgraph per client.

    Raises:
        DataError: ``owner`` does not match the graph or drops every node.
    """
    n = int(data.num_nodes)
    own = owner.detach().cpu().numpy().astype(np.int64).reshape(-1)
    if own.shape[0] != n:
        raise DataError(f"owner has {own.shape[0]} entries for {n} nodes: partition this graph")
    if own.size and own.min() < -1:
        raise DataError("owner ids must be client ids >= 0 or -1 (dropped)")
    kept = own >= 0
    if not kept.any():
        raise DataError("every node is dropped (owner = -1): nothing to federate")
    k = int(own.max()) + 1
    sizes = np.bincount(own[kept], minlength=k)
    if (sizes == 0).any():
        empty = np.flatnonzero(sizes == 0).tolist()
        raise DataError(f"clients {empty} own no node: number clients 0..K-1 without gaps, or use fewer clients")

    train, val, test = apply_split(data, owner, split, seed)

    ei = data.edge_index.detach().cpu().numpy()
    edge_index = coalesce_undirected(ei[0], ei[1], n, remove_self_loops=False)
    row, col = edge_index.numpy()

    # local index of every kept node: rank among its client's nodes, in global-id order
    node_order, node_bounds = _groups(np.where(kept, own, k), k + 1)
    local = np.full(n, -1, dtype=np.int64)
    kept_order = node_order[: node_bounds[k]]
    local[kept_order] = np.arange(kept_order.size) - np.repeat(node_bounds[:k], sizes)

    o_r, o_c = own[row], own[col]
    both = (o_r >= 0) & (o_c >= 0)
    inner = np.flatnonzero(both & (o_r == o_c))
    cross = np.flatnonzero(both & (o_r != o_c))
    in_order, in_bounds = _groups(o_r[inner], k)
    cr_order, cr_bounds = _groups(o_r[cross], k)
    inner, cross = inner[in_order], cross[cr_order]
    loc_r, loc_c = local[row[inner]], local[col[inner]]
    g_row, g_col = torch.from_numpy(row), torch.from_numpy(col)
    train_t, val_t, test_t = train, val, test

    clients = []
    for cid in range(k):
        gids = torch.from_numpy(np.ascontiguousarray(kept_order[node_bounds[cid] : node_bounds[cid + 1]]))
        lo, hi = in_bounds[cid], in_bounds[cid + 1]
        e_local = torch.from_numpy(np.stack([loc_r[lo:hi], loc_c[lo:hi]]))
        sel = torch.from_numpy(cross[cr_bounds[cid] : cr_bounds[cid + 1]])
        clients.append(
            ClientSubgraph(
                client_id=cid,
                global_ids=gids,
                x=data.x[gids],
                y=data.y[gids],
                edge_index=e_local,
                train_mask=train_t[gids],
                val_mask=val_t[gids],
                test_mask=test_t[gids],
                cross_edges=torch.stack([g_row[sel], g_col[sel]]),
            )
        )

    graph = copy.copy(data)  # shallow: tensors shared, attributes separate
    graph.edge_index = edge_index
    graph.train_mask, graph.val_mask, graph.test_mask = train, val, test
    num_classes = int(getattr(data, "num_classes", None) or int(data.y.max()) + 1)
    binary = getattr(data, "binary_features", None)
    if binary is None:
        binary = bool(((data.x == 0) | (data.x == 1)).all())
    counts = (
        bool(binary)
        or bool((data.x >= 0).all())
        and (not data.x.is_floating_point() or bool(torch.equal(data.x, data.x.round())))
    )
    return FederatedGraph(
        graph=graph,
        clients=clients,
        owner=torch.from_numpy(own),
        num_classes=num_classes,
        name=str(getattr(data, "name", "graph")),
        binary_features=bool(binary),
        count_features=counts,
    )


def make_federated(
    dataset: str = "sbm",
    num_clients: int = 10,
    partition: str | None = None,
    beta: float = 10000.0,
    resolution: float = 1.0,
    keep_largest: bool = False,
    split: str = "public",
    seed: int = 0,
    data_root: str | os.PathLike | None = None,
    allow_download: bool = False,
    **synthetic_kwargs: Any,
) -> FederatedGraph:
    """Load (or generate), partition and split in one call.

    Args:
        dataset: A ``--dataset`` name (real or synthetic).
        num_clients: Number of clients.
        partition: ``'dirichlet'`` (label skew ``beta``), ``'louvain'`` (``resolution``, ``keep_largest``),
            ``'iid'``, or ``'native'`` (the clients a generator defines, e.g. ``csbm-fed``).  ``None`` means
            ``'native'`` when the dataset defines clients, else ``'dirichlet'``.
        beta: Dirichlet concentration.
        resolution: Louvain resolution.
        keep_largest: Louvain: keep only the ``num_clients`` largest communities.
        split: The train/validation/test split.
        seed: Seeds the generator (unless given in ``synthetic_kwargs``), the partition and the split.
        data_root: Folder of the real datasets (default: ``$SECURE_FGL_DATA``).
        allow_download: Let PyG download a missing dataset into the cache.
        **synthetic_kwargs: Arguments of a synthetic generator.

    Returns:
        The federation.

    Raises:
        DataError: Unknown dataset or partition, missing files, or a partition that cannot be made.
    """
    from .datasets import get_dataset_info

    info = get_dataset_info(dataset)
    if info.synthetic:
        synthetic_kwargs.setdefault("seed", seed)
        if info.name == "csbm-fed":
            synthetic_kwargs.setdefault("num_clients", num_clients)
    data = load_node_dataset(info.name, data_root=data_root, allow_download=allow_download, **synthetic_kwargs)
    if partition is None:
        partition = "native" if getattr(data, "owner", None) is not None else "dirichlet"
    p = str(partition).lower()
    if p == "dirichlet":
        owner = dirichlet_partition(data.y, num_clients, beta, seed)
    elif p == "louvain":
        owner = louvain_partition(
            data.edge_index, data.num_nodes, num_clients, resolution=resolution, seed=seed, keep_largest=keep_largest
        )
    elif p == "iid":
        owner = iid_partition(data.num_nodes, num_clients, seed)
    elif p == "native":
        owner = getattr(data, "owner", None)
        if owner is None:
            raise DataError(f"{info.name} defines no clients: use partition='dirichlet', 'louvain' or 'iid'")
        if int(owner.max()) + 1 != num_clients:
            raise DataError(
                f"{info.name} was generated for {int(owner.max()) + 1} clients, not "
                f"{num_clients}: pass num_clients={int(owner.max()) + 1}"
            )
    else:
        raise DataError(f"unknown partition {partition!r}: choose one of {', '.join(PARTITIONS)}")
    return build_federated(data, owner, split=split, seed=seed)
