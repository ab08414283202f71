"""FGSSL: federated graph semantic and structural learning.

FGSSL (Huang, Ye, Wang, Du & Ye, IJCAI 2023): node-level semantic contrast with the received
global model (FNSC) and neighbour-similarity distillation (FGSD) in each client's loss; the server
is FedAvg's.

* :mod:`.ops`: the objective (eq. 7-12) and the augmented views;
* :mod:`.client`: :class:`~.client.FGSSLLogic`, local training against the frozen global model.
"""

from __future__ import annotations

from protocols.registry import modes

from ..fedavg import HALVES
from ..options import FGSSLOptions
from ..spec import AlgorithmSpec, model_broadcast

SPECS = [
    AlgorithmSpec(
        "fgssl",
        "node-level semantic contrast with the received global model (FNSC) and neighbour-"
        "similarity distillation (FGSD) in each client's loss; FedAvg server",
        "Huang, Ye, Wang, Du & Ye, Federated Graph Semantic and Structural Learning, IJCAI 2023",
        "fgssl/model: weighted mean of model updates, every round",
        options=FGSSLOptions,
        modes=modes(),
        logic=f"{__name__}.client:FGSSLLogic",
        strategy=HALVES["strategy"],
        broadcasts=model_broadcast,
    ),
]
