"""Graph classification baselines of GCFL.

Xie, Ma, Liu & Yang, NeurIPS 2021, sec. 6.1. Each client a GIN on its own graphs; self-train exchanges nothing,
FedAvg and FedProx average the shared GIN layers (input and classifier layers stay local).

* :mod:`.ops`: the GIN learner, its shared layers, graph-level DP-SGD and the metrics;
* :mod:`.client`: :class:`~.client.GraphLogic`; :mod:`.server`: :class:`~.server.GraphStrategy`.
"""

from __future__ import annotations

from protocols.registry import graph_level_modes

from ..options import GraphOptions, GraphProxOptions
from ..spec import AlgorithmSpec, no_exchanges

GCFL_PAPER = "Xie, Ma, Liu & Yang, Federated Graph Classification over Non-IID Graphs, NeurIPS 2021"
#: the two halves the baselines share; the graph-level algorithms do not run in ckks-mp yet
HALVES = dict(
    logic=f"{__name__}.client:GraphLogic",
    strategy=f"{__name__}.server:GraphStrategy",
    modes=graph_level_modes(),
    task="graph",
)

SPECS = [
    AlgorithmSpec(
        "gc-selftrain",
        "graph classification: each client trains its GIN alone on its graphs; nothing is "
        "exchanged (GCFL's self-train baseline)",
        GCFL_PAPER,
        "none",
        options=GraphOptions,
        schedule=no_exchanges,
        **HALVES,
    ),
    AlgorithmSpec(
        "gc-fedavg",
        "graph classification: FedAvg of the shared GIN layers; input and classifier layers "
        "stay local (GCFL's FedAvg baseline)",
        GCFL_PAPER,
        "gc-fedavg/model: weighted mean of shared-layer updates, every round",
        options=GraphOptions,
        **HALVES,
    ),
    AlgorithmSpec(
        "gc-fedprox",
        "graph classification: gc-fedavg with a proximal term on the shared GIN layers (GCFL's FedProx baseline)",
        GCFL_PAPER,
        "gc-fedprox/model: weighted mean of shared-layer updates, every round",
        options=GraphProxOptions,
        **HALVES,
    ),
]
