"""FedSpray: personalized GNNs distilled from a global feature-structure encoder.

FedSpray (Fu, Chen, Ding & Li, KDD 2024): personalized GNNs distilled from a global
feature-structure encoder with class-wise structure proxies.

* :mod:`.ops`: the encoder, the proxies, their alignment and DP bounds, a client's two local phases;
* :mod:`.client`: :class:`~.client.FedSprayLogic`; :mod:`.server`: :class:`~.server.FedSprayStrategy`.
"""

from __future__ import annotations

from protocols.registry import modes

from ..options import FedSprayOptions
from ..spec import AlgorithmSpec, every_round


def schedule(cfg) -> dict[str, tuple[int, int]]:
    """Every round: the encoder and proxy means, or (batching possible) their one-upload batch instead."""
    o, name = FedSprayOptions(**cfg.options), cfg.algorithm
    tags = [f"{name}/encoder"] + ([] if o.ablate_proxy else [f"{name}/proxies"])
    if cfg.dp_epsilon is None and not o.ablate_proxy and o.batch_exchanges:
        tags.append(f"{name}/batch")  # batched when the two specs share an encoding (fedspray.ops.round_spec)
    return every_round(cfg, *tags)


def broadcasts(cfg) -> tuple[str, ...]:
    """The global encoder and proxies every client receives whole (batched or not)."""
    return tuple(f"{cfg.algorithm}/{part}" for part in ("encoder", "proxies", "batch"))


def groups(cfg) -> list[list[str]]:
    """The batch carries the encoder's and the proxies' vectors of one local update: one contributor set per round."""
    return [[f"{cfg.algorithm}/batch", f"{cfg.algorithm}/{part}"] for part in ("encoder", "proxies")]


SPECS = [
    AlgorithmSpec(
        "fedspray",
        "personalized GNNs distilled from a global feature-structure encoder with class-wise structure proxies",
        "Fu, Chen, Ding & Li, Federated Graph Learning with Structure Proxy Alignment, KDD 2024",
        "fedspray/encoder: weighted mean of encoder updates; fedspray/proxies: class-wise "
        "weighted mean of structure proxies (weights stay secret), every round (one upload per client: "
        "fedspray/batch, without DP)",
        options=FedSprayOptions,
        modes=modes(),
        logic=f"{__name__}.client:FedSprayLogic",
        strategy=f"{__name__}.server:FedSprayStrategy",
        schedule=schedule,
        broadcasts=broadcasts,
        groups=groups,
    ),
]
