"""The public facts of a run: all an algorithm's server side and client logic learn about the
federation as a whole (issue 14: never the global ``FederatedGraph``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PublicFacts:
    """``N`` nodes, ``d`` features, ``C`` classes, ``K`` clients, the feature type, the public
    size of the training split (the denominator of FedAvg's weights ``n_k / n_train``) and the
    number of nodes held by some client (a partition may drop nodes; FedOMD's weight total)."""

    num_nodes: int
    num_features: int
    num_classes: int
    num_clients: int
    binary_features: bool
    num_train: int
    num_owned: int = 0

    @classmethod
    def of(cls, fed) -> "PublicFacts":
        """The facts of a partitioned graph (read once, by whoever partitions the data)."""
        return cls(int(fed.graph.num_nodes), int(fed.num_features), int(fed.num_classes), int(fed.num_clients),
                   bool(fed.binary_features), int(fed.graph.train_mask.sum()), int((fed.owner >= 0).sum()))

    def to_dict(self) -> dict:
        return asdict(self)
