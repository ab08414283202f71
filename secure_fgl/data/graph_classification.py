"""Federated graph classification data, the two settings of GCFL (Xie et al., 2021, sec. 6.1).

* :func:`chunk_partition` -- *single dataset*: the graphs of one dataset are distributed
  at random to ``K`` clients (GCFL ``_randChunk``: every client first gets
  ``min(50, G // K)`` graphs, the remaining graphs go to uniformly random clients; here the
  graphs are shuffled by ``seed`` first, unless ``order='file'``: then, as the reference code,
  client ``k`` gets graphs ``[50k, 50k + 50)`` of the file, whose TU graphs are sorted by
  label, so each client's first 50 graphs are one contiguous run of one class).
* :func:`multi_dataset_partition` -- *multi dataset*: one dataset per client (GCFL groups
  ``molecules``, ``biochem``, ``mix``, ``small`` are accepted as names).

Each client holds out 10 % for validation and 10 % for testing (80/10/10, stratified by
label, as GCFL's ``split_data`` with ``stratify=y``).

Features, as GCFL's ``setupGC.py``: every dataset keeps its own node features (TU node
labels one-hot, ``use_node_attr=False``); IMDB-BINARY, IMDB-MULTI and COLLAB, which have
none, get one-hot degrees.  So clients of different datasets have *different* feature
dimensions and label sets: GCFL shares only the GIN message-passing layers (``serverGIN``)
and keeps each client's input and output layers local.  ``features='degree'`` replaces every
dataset's features by one-hot degrees (GCFL's ``convert_x`` option).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch_geometric.data import Data

from .datasets import GCFL_GROUPS, _max_degree, get_dataset_info, load_graph_dataset
from .errors import DataError

__all__ = [
    "GraphClient",
    "FederatedGraphDataset",
    "chunk_partition",
    "multi_dataset_partition",
    "GCFL_GROUPS",
    "stratified_split",
]


@dataclass
class GraphClient:
    """One client's graphs: ``train``/``val``/``test`` lists of PyG ``Data`` (``y`` = ``[1]``)."""

    client_id: int
    dataset: str
    train: list[Data]
    val: list[Data]
    test: list[Data]
    num_features: int
    num_classes: int

    @property
    def num_graphs(self) -> int:
        """Number of the client's graphs over all splits."""
        return len(self.train) + len(self.val) + len(self.test)


@dataclass
class FederatedGraphDataset:
    """Graph-classification data of ``K`` clients (``setting``: ``'chunk'`` or ``'multi'``)."""

    name: str
    setting: str
    clients: list[GraphClient] = field(default_factory=list)

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.clients)


def stratified_split(
    labels: np.ndarray, ratios: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of a label-stratified train/val/test split (val and test >= 1 when n >= 3).

    Items are ordered by (label, random key); test and validation items are then picked at
    evenly spaced positions of that order, so every class is represented in proportion.
    """
    n = labels.shape[0]
    rng = np.random.default_rng([seed, 31])
    order = np.lexsort((rng.random(n), labels))
    n_te = int(round(ratios[2] * n))
    n_va = int(round(ratios[1] * n))
    if n >= 3:
        n_te, n_va = max(n_te, 1), max(n_va, 1)
    pick_te = np.unique(np.round(np.linspace(0, n - 1, n_te)).astype(np.int64)) if n_te else np.empty(0, np.int64)
    rest = np.setdiff1d(np.arange(n), pick_te)
    pick_va = (
        rest[np.unique(np.round(np.linspace(0, rest.size - 1, n_va)).astype(np.int64))]
        if n_va
        else np.empty(0, np.int64)
    )
    train = np.setdiff1d(rest, pick_va)
    return (rng.permutation(order[train]), rng.permutation(order[pick_va]), rng.permutation(order[pick_te]))


def _graphs(ds: Any, features: str) -> tuple[list[Data], str, int, int]:
    """Materialise a graph dataset as a list with the requested features (``ds`` unchanged)."""
    if features not in ("native", "degree"):
        raise DataError(f"features={features!r}: use 'native' (GCFL default) or 'degree'")
    name = str(getattr(ds, "name", "graphs"))
    try:
        name = get_dataset_info(name).name
    except DataError:  # a user's own dataset: keep its name
        pass
    graphs = [g for g in ds]
    if not graphs:
        raise DataError(f"{name} holds no graphs: check its raw files")
    if features == "degree":
        from torch_geometric.transforms import OneHotDegree

        to_degree = OneHotDegree(_max_degree(graphs), cat=False)
        graphs = [to_degree(g) for g in graphs]  # replaces x (GCFL convert_x)
    if graphs[0].x is None:
        raise DataError(f"{name} has no node features: load it with load_graph_dataset, which adds one-hot degrees")
    num_classes = int(getattr(ds, "num_classes", 0) or max(int(g.y.view(-1)[0]) for g in graphs) + 1)
    return graphs, name, int(graphs[0].num_node_features), num_classes


def _client(cid: int, dataset: str, graphs: list[Data], num_features: int, num_classes: int, seed: int) -> GraphClient:
    if len(graphs) < 3:
        raise DataError(
            f"client {cid} ({dataset}) holds {len(graphs)} graphs, too few for a "
            "train/val/test split: use fewer clients"
        )
    labels = np.array([int(g.y.view(-1)[0]) for g in graphs], dtype=np.int64)
    tr, va, te = stratified_split(labels, (0.8, 0.1, 0.1), seed + cid)
    return GraphClient(
        cid,
        dataset,
        [graphs[i] for i in tr],
        [graphs[i] for i in va],
        [graphs[i] for i in te],
        num_features,
        num_classes,
    )


def chunk_partition(
    dataset: Any,
    num_clients: int,
    seed: int = 0,
    *,
    data_root: str | os.PathLike | None = None,
    features: str = "native",
    allow_download: bool = False,
    order: str = "shuffled",
) -> FederatedGraphDataset:
    """GCFL single-dataset setting.

    ``dataset`` (a name or a loaded TU dataset) chunked at random across ``num_clients`` clients, each split 80/10/10.

    ``order``: ``'shuffled'`` (graphs shuffled by ``seed`` before chunking) or ``'file'``
    (the reference ``_randChunk``: the first ``K * min(50, G // K)`` graphs in file order, the
    rest to random clients).
    """
    if order not in ("shuffled", "file"):
        raise DataError(f"order={order!r}: use 'shuffled' or 'file' (GCFL reference chunking)")
    ds = load_graph_dataset(dataset, data_root, allow_download) if isinstance(dataset, str) else dataset
    graphs, name, nf, nc = _graphs(ds, features)
    g, k = len(graphs), int(num_clients)
    if k < 1 or k > g // 3:
        raise DataError(
            f"{name} has {g} graphs, too few for {k} clients (each needs >= 3): use at most {g // 3} clients"
        )
    rng = np.random.default_rng([seed, 32])
    perm = rng.permutation(g) if order == "shuffled" else np.arange(g)
    base = min(50, g // k)  # GCFL _randChunk
    owner = np.empty(g, dtype=np.int64)
    owner[perm[: k * base]] = np.repeat(np.arange(k), base)
    owner[perm[k * base :]] = rng.integers(0, k, size=g - k * base)
    clients = []
    for cid in range(k):
        mine = perm[np.sort(np.flatnonzero(owner[perm] == cid))]
        clients.append(_client(cid, name, [graphs[i] for i in mine], nf, nc, seed))
    return FederatedGraphDataset(name=name, setting="chunk", clients=clients)


def multi_dataset_partition(
    names: str | Sequence[str],
    data_root: str | os.PathLike | None = None,
    seed: int = 0,
    *,
    features: str = "native",
    allow_download: bool = False,
) -> FederatedGraphDataset:
    """GCFL multi-dataset setting: one client per dataset, each split 80/10/10.

    ``names``: dataset names, or one GCFL group name (``molecules``, ``small``, ``biochem``,
    ``mix``).  Clients keep their own feature dimension and label set (see module doc).
    """
    group = None
    if isinstance(names, str):
        group = names.lower()
        if group not in GCFL_GROUPS:
            raise DataError(f"unknown group {names!r}: give a list of dataset names or one of {', '.join(GCFL_GROUPS)}")
        names = GCFL_GROUPS[group]
    names = list(names)
    if not names:
        raise DataError("no datasets given: name at least one TU dataset or a GCFL group")
    clients = []
    for cid, n in enumerate(names):
        ds = load_graph_dataset(n, data_root, allow_download)
        graphs, name, nf, nc = _graphs(ds, features)
        clients.append(_client(cid, name, graphs, nf, nc, seed))
    label = group or "+".join(c.dataset for c in clients)
    return FederatedGraphDataset(name=label, setting="multi", clients=clients)
