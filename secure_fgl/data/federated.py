"""Containers for a graph split across K clients.

A :class:`FederatedGraph` holds the whole graph (ground truth, used only by the
Centralized baseline, by evaluation and by attack scoring) and one
:class:`ClientSubgraph` per client.  Everything a client may legitimately know
lives in its ``ClientSubgraph``: its own nodes (with their *global* ids), the
edges among them, its masks, and the cross-client edges it is an endpoint of.
An edge between two clients is known to both of them (FedGCN, sec. 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch_geometric.data import Data


@dataclass
class ClientSubgraph:
    """What client ``client_id`` holds.

    Attributes:
    ----------
    global_ids:   ``[n_k]`` long; local node ``i`` is global node ``global_ids[i]``.
    x, y:         local features ``[n_k, d]`` (float32) and labels ``[n_k]``.
    edge_index:   ``[2, e_k]`` local indices, both directions, edges inside the client.
    train_mask, val_mask, test_mask: ``[n_k]`` bool.
    cross_edges:  ``[2, c_k]`` *global* ids, row 0 a local node, row 1 a node owned by
                  another client; both directions of a cross edge are known to both ends.
    """

    client_id: int
    global_ids: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    cross_edges: torch.Tensor = field(default_factory=lambda: torch.empty(2, 0, dtype=torch.long))

    @property
    def num_nodes(self) -> int:
        """Number of nodes the client owns."""
        return int(self.global_ids.numel())


@dataclass
class FederatedGraph:
    """A node-classification graph and its partition into clients.

    ``owner[v]`` is the client holding global node ``v`` (``-1`` for nodes dropped by
    a partition that keeps only the K largest communities).  ``graph`` carries the
    global masks consistent with the clients' local masks.
    """

    graph: Data
    clients: list[ClientSubgraph]
    owner: torch.Tensor
    num_classes: int
    name: str = "graph"
    binary_features: bool = False
    #: every feature is a non-negative integer (binary, or counts as Coauthor CS / Physics hold)
    count_features: bool = False

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.clients)

    @property
    def num_features(self) -> int:
        """Feature dimension of the global graph."""
        return int(self.graph.x.size(1))
