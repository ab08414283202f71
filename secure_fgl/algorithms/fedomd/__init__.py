"""FedOMD: federated graph learning with center moment constraints.

FedOMD (federated graph learning with center moment constraints): orthogonal GCN layers and a
central-moment (CMD) loss against the pooled statistics of every client's hidden features.

* :mod:`.ops`: the orthogonal GCN, the statistics and their precision, DP requests and local training;
* :mod:`.client`: :class:`~.client.FedOMDLogic`; :mod:`.server`: :class:`~.server.FedOMDStrategy`.
"""

from __future__ import annotations

from protocols.registry import modes

from ..options import FedOMDOptions
from ..spec import AlgorithmSpec

SPECS = [
    AlgorithmSpec(
        "fedomd",
        "orthogonal GCN layers and a central-moment (CMD) loss against pooled hidden statistics",
        "Federated Graph Learning with Center Moment Constraints for Node Classification (FedOMD)",
        "fedomd/hidden<l>/mean and /moments: pooled mean and central moments of hidden "
        "features, every round; fedomd/model: weighted mean of model updates",
        options=FedOMDOptions,
        modes=modes(),
        logic=f"{__name__}.client:FedOMDLogic",
        strategy=f"{__name__}.server:FedOMDStrategy",
    ),
]
