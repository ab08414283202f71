"""FedOMD (orthogonal layers and central-moment constraints) as a client logic and a server strategy.

The round of :mod:`secure_fgl.algorithms.fedomd` with every party apart:

1. **Statistics** (eq. 10, Algorithm 1 lines 8-17), among the sampled clients.  Each computes the
   clipped hidden features ``Z_k^l`` of its current model once (:func:`~secure_fgl.algorithms.fedomd.hidden_for_stats`)
   and contributes, per stage, one vector ``[n_k, n_k s_k^(1), ...]`` (:func:`protocols.batch.batch_vector`);
   the server sums it (:mod:`.sums`) and each recipient divides by the pooled ``sum_k n_k`` itself:

   * ``--batch-stats`` (default): stage ``fedomd/stats/mean`` carries every layer's mean, stage
     ``fedomd/stats/moments`` every layer's central moments about the pooled means
     (:mod:`~secure_fgl.algorithms.fedomd.stats_batch`);
   * ``--raw-moments``: one stage ``fedomd/stats/raw`` with every layer's raw moments, central ones
     by the binomial expansion (:func:`~secure_fgl.algorithms.fedomd.stats_batch.central_from_raw`);
   * ``--batch-stats false``: per layer ``fedomd/hidden<l>/mean`` then ``.../moments``
     (:meth:`protocols.base.Protocol.central_moments`; ``--cmd-order 1``: the means only, projected
     onto ``[a, b]``).

   The server sees only the vectors its protocol gives it (in mask/ckks neither ``s_k`` nor ``n_k``)
   and plans from public facts: the number of hidden layers and their width, the orders, the
   public total of the weights (``N`` held nodes, or the training split's size).
   A per-layer exchange is sent as ``[n_k, n_k s_k]`` (weight first; the values and bytes of
   :meth:`~protocols.base.Protocol.weighted_mean`'s ``[n_k s_k, n_k]``, permuted).
2. **Local training** (eq. 12): :func:`~secure_fgl.algorithms.fedomd.train_client` against the
   received statistics; the loss terms (``ce``, ``ortho``, ``cmd``) come back with the loss.
3. **FedAvg** of the weights (tag ``fedomd/model``):
   :class:`~secure_fgl.algorithms.fedavg.server.ModelAveragingStrategy`.

DP (``--dp-epsilon``, docs/fedomd.md): the statistics run per layer (``--batch-stats`` is off under
DP), each stage a DP weighted mean (:func:`~secure_fgl.algorithms.fedomd.stats_dp_requests`): a
client sends ``[w~ clip(v_k), w~ C]`` with ``w~ = n_k / N`` (:func:`.sums.dp_mean_vector`) plus its
share of the noise, added in its runtime before its half encodes; the driver's accountant counts
each release (:mod:`.dp`).  The recipients project the noisy mean onto ``[a, b]`` before the
moments and the noisy moments onto their range (post-processing).  The budget is shared equally by
``fedomd/model`` and the statistics tags.

Per-client randomness (dropout) is :func:`secure_fgl.engine.rng.client_generator`'s.
"""

from __future__ import annotations

import numpy as np

from ...runtime.sums import scoped, sum_exchange
from ..fedavg.server import ModelAveragingStrategy
from ..options import FedOMDOptions
from .ops import stats_dp_requests, stats_grid_spec, stats_tags
from .stats_batch import layer_names

TERMS = ("ce", "ortho", "cmd")


class FedOMDStrategy(ModelAveragingStrategy):
    """FedOMD's server: the statistics stages (module docstring), then FedAvg."""

    grid_model_mean = True  # every real exchange on its public grid

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.fopts = FedOMDOptions(**options)
        self.orders = tuple(range(2, self.fopts.cmd_order + 1))
        self.updates: dict[int, dict] = {}
        if protocol.dp is not None and protocol.dp.config.budget_shares is None:
            # an equal share of the run's budget for every DP exchange of FedOMD
            protocol.dp.declare(
                f"{self.name}/model",
                *(stats_tags(self.name, self.fopts.ortho_layers) if self.fopts.cmd_weight > 0 else []),
            )

    def stages(self) -> list[tuple[str, str, list[int], tuple | None]]:
        """``(tag, stage, layers, batch layout)`` of one round's statistics exchanges (public)."""
        o, d, J = self.fopts, self.cfg.hidden, len(self.orders)
        layers = list(range(1 + o.ortho_layers))
        names = layer_names(self.name, len(layers))
        if not (o.batch_stats and self.orders) or self.protocol.dp is not None:  # per layer (DP: always)
            return [
                (f"{n}/{stage}", stage, [l], None)
                for l, n in zip(layers, names)
                for stage in (("mean", "moments") if self.orders else ("mean",))
            ]
        if o.raw_moments:
            return [
                (
                    f"{self.name}/stats/raw",
                    "raw",
                    layers,
                    tuple(p for n in names for p in ((f"{n}/mean", d), (f"{n}/moments", J * d))),
                )
            ]
        return [
            (f"{self.name}/stats/mean", "mean", layers, tuple((f"{n}/mean", d) for n in names)),
            (f"{self.name}/stats/moments", "moments", layers, tuple((f"{n}/moments", J * d) for n in names)),
        ]

    def exchange_statistics(self, rnd: int, sampled: list[int]) -> None:
        """Exchange the sampled clients' hidden-feature statistics, stage by stage (the global moments of FedOMD)."""
        o = self.fopts
        node_total = self.facts.num_train if o.stats_nodes == "train" else self.facts.num_owned
        spec = stats_grid_spec(o, self.orders, node_total, len(sampled), self.num_clients)  # exact in every mode
        dp = (
            stats_dp_requests(
                o.act_low, o.act_high, self.cfg.hidden, self.orders, self.facts.num_nodes, self.cfg.rounds, o.dp_rows
            )
            if self.protocol.dp is not None
            else (None, None)
        )
        for tag, stage, layers, layout in self.stages():
            if layout is not None:
                self.protocol.transcript.attribute(tag, layout)
            sum_exchange(
                self,
                tag,
                rnd,
                sampled,
                sampled,
                spec,
                {"stage": stage, "layers": layers},
                dp=scoped(self, tag, dp[stage == "moments"]),
                dp_mean=True,
            )

    def ask(self, method: str, requests, **kw) -> dict:
        """:meth:`Strategy.ask`, keeping the loss terms of the round's local updates."""
        responses = super().ask(method, requests, **kw)
        if method == "local_update":  # keep the loss terms of this round's clients
            self.updates = responses
        return responses

    def train_round(self, rnd: int) -> dict:
        """Exchange the statistics (when the moment term is on), then a FedAvg round; report each loss term."""
        self.round = rnd
        if self.fopts.cmd_weight > 0:
            self.exchange_statistics(rnd, self.alive(self.sample_clients(rnd)))
        out = super().train_round(rnd)
        trained = [r for r in self.updates.values() if r.trained]
        for name in TERMS:
            out[f"{name}_loss"] = float(np.mean([r.terms[name] for r in trained])) if trained else 0.0
        return out
