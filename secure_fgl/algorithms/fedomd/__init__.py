"""FedOMD: federated graph learning with center moment constraints.

FedOMD (federated graph learning with center moment constraints): orthogonal GCN layers and a
central-moment (CMD) loss against the pooled statistics of every client's hidden features.

* :mod:`.ops`: the orthogonal GCN, the statistics and their precision, DP requests and local training;
* :mod:`.client`: :class:`~.client.FedOMDLogic`; :mod:`.server`: :class:`~.server.FedOMDStrategy`.
"""

from __future__ import annotations

from protocols.registry import modes

from ..options import FedOMDOptions
from ..spec import AlgorithmSpec, every_round, model_broadcast


def schedule(cfg) -> dict[str, tuple[int, int]]:
    """Every round: the statistics exchanges of the strategy's ``stages`` (public options, DP on or off), the model."""
    o, name = FedOMDOptions(**cfg.options), cfg.algorithm
    tags = [f"{name}/model"]
    if o.cmd_weight > 0:
        has_moments = o.cmd_order >= 2
        if not (o.batch_stats and has_moments) or cfg.dp_epsilon is not None:  # per layer
            stages = ("mean", "moments") if has_moments else ("mean",)
            tags += [f"{name}/hidden{l + 1}/{s}" for l in range(1 + o.ortho_layers) for s in stages]
        elif o.raw_moments:
            tags.append(f"{name}/stats/raw")
        else:
            tags += [f"{name}/stats/mean", f"{name}/stats/moments"]
    return every_round(cfg, *tags)


def statistics(cfg) -> tuple[str, ...]:
    """The statistics exchanges: the round's sample receives them whole and trains on them in that round."""
    return tuple(tag for tag in schedule(cfg) if tag != f"{cfg.algorithm}/model")


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
        schedule=schedule,
        broadcasts=model_broadcast,
        statistics=statistics,
    ),
]
