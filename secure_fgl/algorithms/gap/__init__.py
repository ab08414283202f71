"""FedGCN-GAP: edge-level DP FedGCN by aggregation perturbation.

FedGCN-GAP (``--algorithm fedgcn-gap``): edge-level DP FedGCN by aggregation perturbation
(Sajadmanesh, Shamsabadi, Bellet & Gatica-Perez, GAP, USENIX Security 2023): an edge-free encoder,
noisy row-normalised neighbour sums of its embeddings, an MLP head; no exact edge enters a model.

* :mod:`.ops`: the models, the hop exchanges' bounds and DP requests;
* :mod:`.client`: :class:`~.client.GAPLogic` (and its encoder stage); :mod:`.server`: :class:`~.server.GAPStrategy`;
* :mod:`.central`: ``--algorithm gap``, the same modules on one party holding the whole graph.
"""

from __future__ import annotations

from protocols.registry import modes

from ..options import GAPOptions, check_gap
from ..spec import AlgorithmSpec, every_round
from .central import check_central


def schedule(cfg) -> dict[str, tuple[int, int]]:
    """The encoder's rounds, each hop's noisy sums once in round 0, then the head every round."""
    o = GAPOptions(**cfg.options)
    encoder = {"fedgcn-gap/encoder/model": (0, int(o.encoder_rounds or cfg.rounds) - 1)}
    if o.center_embeddings:
        encoder["fedgcn-gap/encoder/mean"] = (0, 0)
    hops = {f"fedgcn-gap/hop/{h}": (0, 0) for h in range(1, o.hops + 1)}
    return {**encoder, **hops, **every_round(cfg, f"{cfg.algorithm}/model")}


def releases(cfg) -> tuple[str, ...]:
    """Each hop's noisy sums: every client receives the rows of its own nodes, under one commitment."""
    return tuple(f"fedgcn-gap/hop/{h}" for h in range(1, GAPOptions(**cfg.options).hops + 1))


def broadcasts(cfg) -> tuple[str, ...]:
    """The encoder, its mean embedding and the head every client receives whole (the hops' rows differ per client)."""
    mean = ("fedgcn-gap/encoder/mean",) if GAPOptions(**cfg.options).center_embeddings else ()
    return ("fedgcn-gap/encoder/model", *mean, f"{cfg.algorithm}/model")


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
        check=check_gap,
        modes=modes(),
        logic=f"{__name__}.client:GAPLogic",
        strategy=f"{__name__}.server:GAPStrategy",
        schedule=schedule,
        broadcasts=broadcasts,
        releases=releases,
    ),
    AlgorithmSpec(
        "gap",
        "central GAP: fedgcn-gap's encoder, noisy hops and head on one party holding the whole "
        "graph (--clients 1, plain); the reference of the federated DP curves",
        "Sajadmanesh, Shamsabadi, Bellet & Gatica-Perez, GAP: Differentially Private Graph "
        "Neural Networks with Aggregation Perturbation, USENIX Security 2023",
        "as fedgcn-gap, with one party: fedgcn-gap/encoder, fedgcn-gap/hop/<h> (the noisy "
        "aggregation, the only DP release at edge level), gap/model",
        options=GAPOptions,
        check=check_central,
        modes=("plain",),
        mode_note="is the central reference (one party holding the whole graph): nothing to "
        "aggregate securely in --mode {mode}; use --mode plain",
        logic=f"{__name__}.client:GAPLogic",
        strategy=f"{__name__}.server:GAPStrategy",
        schedule=schedule,
        broadcasts=broadcasts,
        releases=releases,
    ),
]
