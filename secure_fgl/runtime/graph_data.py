"""A graph-classification client's set-up frame: its own graphs as flat arrays.

Each split (``train``, ``val``, ``test``) travels as the concatenated node features
``<split>/x`` ``[sum n_g, d]`` (float32), the concatenated edge lists ``<split>/edge_index``
``[2, sum e_g]`` (node indices local to each graph), the labels ``<split>/y`` ``[G]`` and
the sizes ``<split>/num_nodes``, ``<split>/num_edges`` ``[G]``; :func:`graph_client` rebuilds
the :class:`~secure_fgl.data.graph_classification.GraphClient` (PyG ``Data`` with ``x``,
``edge_index``, ``y``: what the GIN reads).  Nothing else of the driver's partition travels.
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data

from ..data.graph_classification import GraphClient
from . import wire

SPLITS = ("train", "val", "test")


def _split_arrays(graphs: list[Data], split: str) -> dict[str, np.ndarray]:
    d = graphs[0].num_node_features if graphs else 0
    return {
        f"{split}/x": np.concatenate([g.x.numpy().astype(np.float32) for g in graphs])
        if graphs
        else np.zeros((0, d), np.float32),
        f"{split}/edge_index": np.concatenate([g.edge_index.numpy() for g in graphs], axis=1).astype(np.int64)
        if graphs
        else np.zeros((2, 0), np.int64),
        f"{split}/y": np.array([int(g.y.view(-1)[0]) for g in graphs], dtype=np.int64),
        f"{split}/num_nodes": np.array([g.num_nodes for g in graphs], dtype=np.int64),
        f"{split}/num_edges": np.array([g.edge_index.shape[1] for g in graphs], dtype=np.int64),
    }


def graph_fields(c: GraphClient) -> dict[str, np.ndarray]:
    """Graph client ``c``'s data as set-up frame fields: every split's flat arrays."""
    return {k: v for s in SPLITS for k, v in _split_arrays(getattr(c, s), s).items()}


def graph_client_frame(c: GraphClient, cfg, facts, options: dict, party_setup: bytes | None = None) -> bytes:
    """The set-up frame of graph client ``c`` (same envelope as :func:`~.client.client_frame`)."""
    arrays = graph_fields(c)
    setup = {} if party_setup is None else {"party_setup": np.frombuffer(party_setup, dtype=np.uint8)}
    return wire.pack(
        {
            **arrays,
            "task": "graph",
            "dataset": c.dataset,
            "num_features": int(c.num_features),
            "num_classes": int(c.num_classes),
            "client_id": int(c.client_id),
            "config": cfg.to_dict(),
            "facts": facts.to_dict(),
            "options": options,
            **setup,
        }
    )


def _graphs(f: dict, split: str) -> list[Data]:
    nodes, edges = f[f"{split}/num_nodes"], f[f"{split}/num_edges"]
    xs = np.split(f[f"{split}/x"], np.cumsum(nodes)[:-1]) if nodes.size else []
    eis = np.split(f[f"{split}/edge_index"], np.cumsum(edges)[:-1], axis=1) if edges.size else []
    return [
        Data(x=torch.from_numpy(x.copy()), edge_index=torch.from_numpy(ei.copy()), y=torch.tensor([int(y)]))
        for x, ei, y in zip(xs, eis, f[f"{split}/y"])
    ]


def graph_client(f: dict, client_id: int) -> GraphClient:
    """The client's graphs from its unpacked set-up frame."""
    return GraphClient(
        client_id, str(f["dataset"]), *(_graphs(f, s) for s in SPLITS), int(f["num_features"]), int(f["num_classes"])
    )
