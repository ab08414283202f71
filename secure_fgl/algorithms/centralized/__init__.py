"""Centralized training: one model on the whole graph.

It is the upper reference every federated method is compared with (accuracy reported per client, on the nodes each
client owns).

* :mod:`.client`: :class:`~.client.CentralizedLogic`, the one runtime holding the whole graph;
* :mod:`.server`: :class:`~.server.CentralizedStrategy`, train a round, ask for the counts.
"""

from __future__ import annotations

from protocols.registry import modes

from ..options import CentralizedOptions
from ..spec import AlgorithmSpec, no_exchanges

SPECS = [
    AlgorithmSpec(
        "centralized",
        "one model on the whole graph (upper reference); accuracy reported per client",
        "Kipf & Welling, Semi-Supervised Classification with GCNs, ICLR 2017",
        "none",
        options=CentralizedOptions,
        modes=modes(),
        logic=f"{__name__}.client:CentralizedLogic",
        strategy=f"{__name__}.server:CentralizedStrategy",
        schedule=no_exchanges,
    ),
]
