"""FedGCN-GAP (``--algorithm fedgcn-gap``): edge-level DP FedGCN by aggregation perturbation
(Sajadmanesh, Shamsabadi, Bellet & Gatica-Perez, GAP, USENIX Security 2023): an edge-free encoder,
noisy row-normalised neighbour sums of its embeddings, an MLP head; no exact edge enters a model.

* :mod:`.ops`: the models, the hop exchanges' bounds and DP requests;
* :mod:`.client`: :class:`~.client.GAPLogic` (and its encoder stage); :mod:`.server`: :class:`~.server.GAPStrategy`.
"""

from __future__ import annotations

from protocols.registry import modes

from ..options import GAPOptions
from ..spec import AlgorithmSpec

SPECS = [
    AlgorithmSpec(
        "fedgcn-gap",
        "edge-level DP FedGCN by aggregation perturbation: an edge-free encoder, noisy "
        "row-normalised neighbour sums of its embeddings, an MLP head (no exact edge enters "
        "a model)",
        "Sajadmanesh, Shamsabadi, Bellet & Gatica-Perez, GAP: Differentially Private Graph "
        "Neural Networks with Aggregation Perturbation, USENIX Security 2023",
        "fedgcn-gap/encoder: weighted mean of encoder updates; fedgcn-gap/hop/<h>: noisy "
        "row sums of embeddings, once per hop; fedgcn-gap/model: weighted mean of head updates",
        options=GAPOptions,
        modes=modes(),
        logic=f"{__name__}.client:GAPLogic",
        strategy=f"{__name__}.server:GAPStrategy",
    ),
]
