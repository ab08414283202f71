"""FedAvg and the baselines that share its two halves: FedProx and Local.

* :mod:`.client`: :class:`~.client.ModelAveragingLogic`, local training and the model update;
* :mod:`.server`: :class:`~.server.ModelAveragingStrategy`, client sampling and the weighted mean.
"""

from __future__ import annotations

from protocols.registry import modes

from ..options import FedProxOptions, NoOptions
from ..spec import AlgorithmSpec, no_exchanges

HALVES = dict(logic=f"{__name__}.client:ModelAveragingLogic", strategy=f"{__name__}.server:ModelAveragingStrategy")

SPECS = [
    AlgorithmSpec(
        "fedavg",
        "clients train a GNN on their own subgraph; the server averages the weights (cross-client edges ignored)",
        "McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, AISTATS 2017",
        "fedavg/model: weighted mean of model updates, every round",
        options=NoOptions,
        modes=modes(),
        **HALVES,
    ),
    AlgorithmSpec(
        "fedprox",
        "FedAvg with a proximal term mu/2 ||w - w_global||^2 in the local loss",
        "Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020",
        "fedprox/model: weighted mean of model updates, every round",
        options=FedProxOptions,
        modes=modes(),
        **HALVES,
    ),
    AlgorithmSpec(
        "local",
        "each client trains alone on its subgraph; nothing is exchanged (lower reference)",
        "-",
        "none",
        options=NoOptions,
        modes=modes(),
        schedule=no_exchanges,
        **HALVES,
    ),
]
