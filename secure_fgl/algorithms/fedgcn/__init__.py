"""FedGCN: neighbour-feature sums exchanged once, then FedAvg of a GCN.

FedGCN (Yao, Jin, Ravi & Joe-Wong, NeurIPS 2023): one pre-training exchange of neighbour-feature
sums, then FedAvg of a GCN on them.

* :mod:`.ops`: the exchange's maths (touch sets, row numberings, partial sums, value bounds, DP terms)
  and the GCN;
* :mod:`.client`: :class:`~.client.FedGCNLogic`, one client's side of the exchange and its training;
* :mod:`.server`: :class:`~.server.FedGCNStrategy`, the row layout and the exchange's server side.
"""

from __future__ import annotations

from protocols.registry import modes

from ..options import FedGCNOptions, check_fedgcn
from ..spec import AlgorithmSpec, model_broadcast, model_every_round


def schedule(cfg) -> dict[str, tuple[int, int]]:
    """The neighbour sums once, in round 0, before training (none at 0 hops); the model every round."""
    hops = FedGCNOptions(**cfg.options).hops
    return {**({"fedgcn/neighbour_sums": (0, 0)} if hops > 0 else {}), **model_every_round(cfg)}


def releases(cfg) -> tuple[str, ...]:
    """The neighbour sums: every client receives the rows of its own nodes, under one commitment."""
    return ("fedgcn/neighbour_sums",)


SPECS = [
    AlgorithmSpec(
        "fedgcn",
        "one pre-training exchange of neighbour-feature sums (0/1/2 hops), then FedAvg of a GCN",
        "Yao, Jin, Ravi & Joe-Wong, FedGCN: Convergence-Communication Tradeoffs in Federated "
        "Training of Graph Convolutional Networks, NeurIPS 2023",
        "fedgcn/neighbour_sums: row sums [A~X, degree] once before training; fedgcn/model: "
        "weighted mean of model updates, every round",
        options=FedGCNOptions,
        check=check_fedgcn,
        modes=modes(),
        logic=f"{__name__}.client:FedGCNLogic",
        strategy=f"{__name__}.server:FedGCNStrategy",
        schedule=schedule,
        broadcasts=model_broadcast,
        releases=releases,
    ),
]
