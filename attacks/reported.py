"""The attack suite's ground truth and background knowledge, assembled from the parts the sites report.

On ``--executor flower`` the driver loads no data (docs/deployment.md).  For ``--attacks``, each
site that opted in to attack simulation (``--allow-attack-simulation``) reports its clients'
parts over the run's authenticated channel, as answers to ``attack`` requests ``own_data``: a
node client's subgraph (global node ids ``g_k``, features, labels, split masks, local edges
``E_k`` and its cross-client edges ``X_k``, both ends' global ids), a graph client's graphs.  The
runner assembles from them what it reads from the partitioned data on the other executors::

    x[v], y[v], masks[v] = those client k reports for v = g_k[i]      owner[v] = k
    E = U_k { (g_k[i], g_k[j]) : (i, j) in E_k }  U  U_k X_k            (sorted, each edge once)

With every client reported this is the partitioned graph over the nodes some client owns.
What differs: a node no client owns (a partition may drop nodes: ``num_owned < num_nodes`` in
the public facts) is in no part, so it has zero features, label -1, no split and no edges
(owner -1, as on every executor).  A client whose site reported nothing (it did not opt in, or
it was lost) is named in ``unreported``; its nodes are then unowned too, and the runner refuses
every attack that is scored against the ground truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from secure_fgl.data.federated import ClientSubgraph
from secure_fgl.data.graph_classification import FederatedGraphDataset
from secure_fgl.runtime.facts import GraphFacts


@dataclass
class ReportedGraph:
    """The global node arrays assembled from the reported subgraphs (rows of unowned nodes empty)."""

    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the global graph (the public ``num_nodes``)."""
        return int(self.y.numel())


@dataclass
class ReportedFederation:
    """A node-classification federation as its sites reported it (what the attack runner reads of ``fed``)."""

    graph: ReportedGraph
    owner: torch.Tensor
    clients: list[ClientSubgraph]
    num_clients: int
    num_features: int
    num_classes: int
    binary_features: bool
    unreported: dict[int, str]

    @property
    def reported_nodes(self) -> torch.Tensor:
        """The global ids of the nodes some reported client owns (the pool of drawn background knowledge)."""
        return torch.nonzero(self.owner >= 0).flatten()


def assemble(facts, parts: dict[int, ClientSubgraph], unreported: dict[int, str]) -> ReportedFederation:
    """The federation of the reported ``parts`` (client -> its subgraph), over the public ``facts``' node count."""
    n, d = int(facts.num_nodes), int(facts.num_features)
    x = torch.zeros(n, d)
    y = torch.full((n,), -1, dtype=torch.long)
    owner = torch.full((n,), -1, dtype=torch.long)
    masks = {split: torch.zeros(n, dtype=torch.bool) for split in ("train", "val", "test")}
    edges = [torch.zeros(2, 0, dtype=torch.long)]
    for k, c in sorted(parts.items()):
        ids = c.global_ids.long()
        x[ids], y[ids], owner[ids] = c.x.float(), c.y.long(), k
        for split, mask in masks.items():
            mask[ids] = getattr(c, f"{split}_mask").bool()
        edges += [ids[c.edge_index.long()], c.cross_edges.long()]
    pairs = torch.cat(edges, 1)
    keys = torch.unique(pairs[0] * n + pairs[1])  # sorted by (row, col), each edge once
    graph = ReportedGraph(x, y, torch.stack([keys // n, keys % n]), masks["train"], masks["val"], masks["test"])
    return ReportedFederation(
        graph,
        owner,
        [parts[k] for k in sorted(parts)],
        int(facts.num_clients),
        d,
        int(facts.num_classes),
        bool(facts.binary_features),
        dict(unreported),
    )


@dataclass
class ReportedGraphs(FederatedGraphDataset):
    """A graph-classification federation as its sites reported it: each reported client's graphs."""

    unreported: dict[int, str] = field(default_factory=dict)


def assemble_graphs(facts: GraphFacts, name: str, parts: dict[int, dict], unreported: dict[int, str]) -> ReportedGraphs:
    """The graph-classification federation of the reported ``parts`` (client -> its graphs' arrays)."""
    from secure_fgl.runtime.graph_data import graph_client

    clients = [
        graph_client(
            {
                **fields,
                "dataset": facts.datasets[k],
                "num_features": facts.num_features[k],
                "num_classes": facts.num_classes[k],
            },
            k,
        )
        for k, fields in sorted(parts.items())
    ]
    return ReportedGraphs(name, "reported", clients, dict(unreported))


def reported_federation(site_fed, parties, dataset: str):
    """Ask every client for its part (``own_data``) and assemble the federation of what was reported.

    ``site_fed``: the public facts the sites described (:class:`~secure_fgl.runtime.flower_executor.SiteFederation`);
    ``parties``: :class:`~attacks.parties.RuntimeParties`.  A client whose site refuses (it did not opt in to
    attack simulation) or cannot answer is recorded in ``unreported`` with the reason.
    """
    graph_level = isinstance(site_fed.facts, GraphFacts)
    parts, unreported = {}, {}
    for k in range(site_fed.num_clients):
        try:
            parts[k] = parties.own_graphs(k) if graph_level else parties.own_data(k)
        except RuntimeError as e:  # SiteError: not opted in; RuntimeError: the client was lost
            unreported[k] = str(e)
    if graph_level:
        return assemble_graphs(site_fed.facts, dataset, parts, unreported)
    return assemble(site_fed.facts, parts, unreported)
