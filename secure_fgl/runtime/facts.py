"""The public facts of a run.

All an algorithm's server side and client logic learn about the federation as a whole (never the global
``FederatedGraph``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PublicFacts:
    """The public facts of a node-classification federation.

    ``N`` nodes, ``d`` features, ``C`` classes, ``K`` clients, the feature type (binary;
    counts: every feature a non-negative integer), the public
    size of the training split (the denominator of FedAvg's weights ``n_k / n_train``), the
    number of nodes held by some client (a partition may drop nodes; FedOMD's weight total) and
    the number of clients holding a training node (a DP-SGD step's noise shares).
    """

    num_nodes: int
    num_features: int
    num_classes: int
    num_clients: int
    binary_features: bool
    num_train: int
    num_owned: int = 0
    num_trainers: int = 0
    count_features: bool = False

    @classmethod
    def of(cls, fed) -> PublicFacts:
        """The facts of a partitioned graph (read once, by whoever partitions the data)."""
        train_owners = fed.owner[fed.graph.train_mask & (fed.owner >= 0)]
        return cls(
            int(fed.graph.num_nodes),
            int(fed.num_features),
            int(fed.num_classes),
            int(fed.num_clients),
            bool(fed.binary_features),
            int(fed.graph.train_mask.sum()),
            int((fed.owner >= 0).sum()),
            int(train_owners.unique().numel()),
            bool(getattr(fed, "count_features", False)),
        )

    def to_dict(self) -> dict:
        """The facts as a plain dict."""
        return asdict(self)


@dataclass(frozen=True)
class GraphFacts:
    """A graph-classification federation's public facts.

    GCFL's settings, where each client's dataset and graph counts are part of the experiment's description. ``K``
    clients, the dataset each holds, its numbers of train/val/test graphs, feature dimension and classes.
    ``sum(num_train)`` is the denominator of FedAvg's weights ``n_k / N``.
    """

    num_clients: int
    datasets: list
    num_train: list
    num_val: list
    num_test: list
    num_features: list
    num_classes: list

    @classmethod
    def of(cls, fed) -> GraphFacts:
        """The public facts of a graph-classification federation."""
        cs = fed.clients
        return cls(
            len(cs),
            [c.dataset for c in cs],
            [len(c.train) for c in cs],
            [len(c.val) for c in cs],
            [len(c.test) for c in cs],
            [int(c.num_features) for c in cs],
            [int(c.num_classes) for c in cs],
        )

    @property
    def total_train(self) -> int:
        """Training graphs over all clients."""
        return int(sum(self.num_train))

    def to_dict(self) -> dict:
        """The facts as a plain dict."""
        return asdict(self)
