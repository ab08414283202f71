"""FedOMD (orthogonal layers and central-moment constraints) as a client logic and a server strategy.

The round of :mod:`secure_fgl.algorithms.fedomd` with every party apart:

1. **Statistics** (eq. 10, Algorithm 1 lines 8-17), among the sampled clients.  Each computes the
   clipped hidden features ``Z_k^l`` of its current model once (:func:`~secure_fgl.algorithms.fedomd.hidden_for_stats`)
   and contributes, per stage, one vector ``[n_k, n_k s_k^(1), ...]`` (:func:`protocols.batch.batch_vector`);
   the server sums it (:mod:`.sums`) and each recipient divides by the pooled ``sum_k n_k`` itself:

   * ``--batch-stats`` (default): stage ``fedomd/stats/mean`` carries every layer's mean, stage
     ``fedomd/stats/moments`` every layer's central moments about the pooled means
     (:func:`~secure_fgl.algorithms.stats_batch.batched_central_moments`);
   * ``--raw-moments``: one stage ``fedomd/stats/raw`` with every layer's raw moments, central ones
     by the binomial expansion (:func:`~secure_fgl.algorithms.stats_batch.one_stage_raw_moments`);
   * ``--batch-stats false``: per layer ``fedomd/hidden<l>/mean`` then ``.../moments``
     (:meth:`protocols.base.Protocol.central_moments`; ``--cmd-order 1``: the means only, projected
     onto ``[a, b]``).

   The server sees only the vectors its protocol gives it (in mask/ckks neither ``s_k`` nor ``n_k``)
   and plans from public facts: the number of hidden layers and their width, the orders, the
   public total of the weights (``N`` held nodes, or the training split's size).
   A per-layer exchange is sent as ``[n_k, n_k s_k]`` (weight first) where the in-process
   :meth:`~protocols.base.Protocol.weighted_mean` sends ``[n_k s_k, n_k]``: the same values and
   bytes, permuted.
2. **Local training** (eq. 12): :func:`~secure_fgl.algorithms.fedomd.train_client` against the
   received statistics; the loss terms (``ce``, ``ortho``, ``cmd``) come back with the loss.
3. **FedAvg** of the weights (tag ``fedomd/model``): :class:`~secure_fgl.algorithms.fedavg.server.ModelAveragingStrategy`.

DP (``--dp-epsilon``, as the in-process algorithm, "Differential privacy" of
:mod:`secure_fgl.algorithms.fedomd`): the statistics run per layer (``--batch-stats`` is off under
DP), each stage a DP weighted mean (:func:`~secure_fgl.algorithms.fedomd.stats_dp_requests`): a
client sends ``[w~ clip(v_k), w~ C]`` with ``w~ = n_k / N`` (:func:`.sums.dp_mean_vector`) plus its
share of the noise, added in its runtime before its half encodes; the driver's accountant counts
each release (:mod:`.dp`).  The recipients project the noisy mean onto ``[a, b]`` before the
moments and the noisy moments onto their range (post-processing).  The budget is split evenly over
``fedomd/model`` and the statistics tags, as in-process.

Per-client randomness (dropout) is :func:`secure_fgl.engine.rng.client_generator`'s, as in-process.
"""
from __future__ import annotations

import numpy as np
import torch

from protocols.batch import batch_means, batch_vector

from ..algorithms.cmd import clip_activations
from ..algorithms.fedomd import (GlobalStats, build_ortho_gcn, hidden_for_stats, project_moments, stats_dp_requests,
                                 stats_grid_spec, stats_tags, train_client)
from ..algorithms.options import FedOMDOptions
from ..algorithms.stats_batch import central_from_raw, layer_names, local_central_moments, local_mean, \
    local_raw_moments
from ..algorithms.fedavg.client import ModelAveragingLogic
from ..algorithms.fedavg.server import ModelAveragingStrategy
from .sums import dp_mean_vector, mean_of, offer, scoped, sum_exchange, summed

TERMS = ("ce", "ortho", "cmd")


class FedOMDLogic(ModelAveragingLogic):
    """FedOMD's client: its statistics contributions, eq. 12 locally, then FedAvg's client."""

    def __init__(self, runtime, options: dict):
        self.fopts = FedOMDOptions(**options)
        super().__init__(runtime, options)
        self.orders = tuple(range(2, self.fopts.cmd_order + 1))
        self.global_stats: list[GlobalStats] | None = None
        self.samples: tuple[int, list[np.ndarray]] | None = None    # (round, clipped Z^l as float64)
        self.pooled: dict = {}                                      # this round's received statistics

    @staticmethod
    def architecture(cfg, facts, options: dict) -> torch.nn.Module:
        return build_ortho_gcn(FedOMDOptions(**options), cfg, facts.num_features, facts.num_classes)

    def local_update(self, req: dict) -> dict:
        if not bool(self.data.train_mask.any()):
            return {"trained": False, "loss": 0.0}
        loss, terms = train_client(self.model, self.optimizer, *self.inputs(), self.data, self.fopts, self.cfg,
                                   self.global_stats, self.orders, int(req["round"]), self.rt.client_id)
        return {"trained": True, "loss": loss, **terms}

    def _samples(self, rnd: int) -> list[np.ndarray]:
        """This round's hidden features on the statistics' node set, clipped to ``[a, b]`` (computed once)."""
        if self.samples is None or self.samples[0] != rnd:
            o = self.fopts
            hidden = hidden_for_stats(self.model, *self.inputs(), self.data, o, self.cfg.seed, rnd, self.rt.client_id)
            self.samples = (rnd, [clip_activations(z, o.act_low, o.act_high).double().cpu().numpy() for z in hidden])
            self.pooled = {}
        return self.samples[1]

    def contribute(self, req: dict) -> dict:
        if "stage" not in req:
            return super().contribute(req)
        layers = self._samples(int(req["round"]))
        if req.get("dp_clip") is not None:          # one layer's DP weighted mean (.sums)
            a = layers[req["layers"][0]]
            value = local_mean(a) if req["stage"] == "mean" else \
                local_central_moments(a, self.pooled[("mean", req["layers"][0])], self.orders)
            return offer(self, req, dp_mean_vector(value, float(a.shape[0]), req))
        parts = []
        for l in req["layers"]:
            a = layers[l]
            if req["stage"] == "mean":
                parts.append(local_mean(a))
            elif req["stage"] == "moments":
                parts.append(local_central_moments(a, self.pooled[("mean", l)], self.orders))
            else:                                   # raw: E[z] and E[z^2..J] as two parts
                raw = local_raw_moments(a, max(self.orders))
                parts += [raw[0], raw[1:]]
        return offer(self, req, batch_vector(parts, float(layers[0].shape[0])))

    def receive(self, req: dict) -> dict:
        if "stage" not in req:
            return super().receive(req)
        o, stage, layers = self.fopts, req["stage"], list(req["layers"])
        d, J = self.cfg.hidden, len(self.orders)
        per_layer = {"mean": [(d,)], "moments": [(J, d)], "raw": [(d,), (J, d)]}[stage]
        if req.get("dp_clip") is not None:          # one layer's DP weighted mean
            means = [mean_of(summed(self, req), req["tag"], req).reshape(per_layer[0])]
        else:
            means = batch_means(summed(self, req), per_layer * len(layers), req["tag"], int(req["round"]))
        dp_run = bool(self.cfg.dp_epsilon)          # post-processing of the DP path (as in-process)
        for i, l in enumerate(layers):
            if stage == "mean":                     # the means-only exchange and DP project them
                project = dp_run or not self.orders
                self.pooled[("mean", l)] = np.clip(means[i], o.act_low, o.act_high) if project else means[i]
            elif stage == "moments":
                self.pooled[("moments", l)] = project_moments(means[i], self.orders, o.act_low, o.act_high) \
                    if dp_run else {j: means[i][n] for n, j in enumerate(self.orders)}
            else:
                mu = means[2 * i]
                self.pooled[("mean", l)] = mu
                self.pooled[("moments", l)] = central_from_raw(mu, means[2 * i + 1], self.orders)
        num_hidden = 1 + o.ortho_layers
        if all(("mean", l) in self.pooled and (not self.orders or ("moments", l) in self.pooled)
               for l in range(num_hidden)):
            dev = self.rt.device
            self.global_stats = [GlobalStats(torch.as_tensor(self.pooled[("mean", l)], dtype=torch.float32).to(dev),
                                             {j: torch.as_tensor(m, dtype=torch.float32).to(dev)
                                              for j, m in self.pooled.get(("moments", l), {}).items()})
                                 for l in range(num_hidden)]
        return {}


class FedOMDStrategy(ModelAveragingStrategy):
    """FedOMD's server: the statistics stages (module docstring), then FedAvg."""

    grid_model_mean = True        # as the in-process FedOMD: every real exchange on its public grid

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.fopts = FedOMDOptions(**options)
        self.orders = tuple(range(2, self.fopts.cmd_order + 1))
        self.updates: dict[int, dict] = {}
        if protocol.dp is not None and protocol.dp.config.split is None:
            # split the run's budget evenly over every DP exchange of FedOMD (as in-process)
            protocol.dp.declare(f"{self.name}/model",
                                *(stats_tags(self.name, self.fopts.ortho_layers) if self.fopts.cmd_weight > 0 else []))

    def stages(self) -> list[tuple[str, str, list[int], tuple | None]]:
        """``(tag, stage, layers, batch layout)`` of one round's statistics exchanges (public)."""
        o, d, J = self.fopts, self.cfg.hidden, len(self.orders)
        layers = list(range(1 + o.ortho_layers))
        names = layer_names(self.name, len(layers))
        if not (o.batch_stats and self.orders) or self.protocol.dp is not None:     # per layer (DP: always)
            return [(f"{n}/{stage}", stage, [l], None) for l, n in zip(layers, names)
                    for stage in (("mean", "moments") if self.orders else ("mean",))]
        if o.raw_moments:
            return [(f"{self.name}/stats/raw", "raw", layers,
                     tuple(p for n in names for p in ((f"{n}/mean", d), (f"{n}/moments", J * d))))]
        return [(f"{self.name}/stats/mean", "mean", layers, tuple((f"{n}/mean", d) for n in names)),
                (f"{self.name}/stats/moments", "moments", layers, tuple((f"{n}/moments", J * d) for n in names))]

    def exchange_statistics(self, rnd: int, sampled: list[int]) -> None:
        o = self.fopts
        node_total = self.facts.num_train if o.stats_nodes == "train" else self.facts.num_owned
        spec = stats_grid_spec(o, self.orders, node_total, len(sampled), self.num_clients)   # exact in every mode
        dp = stats_dp_requests(o.act_low, o.act_high, self.cfg.hidden, self.orders, self.facts.num_nodes,
                               self.cfg.rounds, o.dp_rows) if self.protocol.dp is not None else (None, None)
        for tag, stage, layers, layout in self.stages():
            if layout is not None:
                self.protocol.transcript.attribute(tag, layout)
            sum_exchange(self, tag, rnd, sampled, sampled, spec, {"stage": stage, "layers": layers},
                         dp=scoped(self, tag, dp[stage == "moments"]), dp_mean=True)

    def ask(self, method: str, requests: dict[int, dict], **kw) -> dict[int, dict]:
        responses = super().ask(method, requests, **kw)
        if method == "local_update":                 # keep the loss terms of this round's clients
            self.updates = responses
        return responses

    def train_round(self, rnd: int) -> dict:
        self.round = rnd
        if self.fopts.cmd_weight > 0:
            self.exchange_statistics(rnd, self.alive(self.sample_clients(rnd)))
        out = super().train_round(rnd)
        trained = [r for r in self.updates.values() if r["trained"]]
        for name in TERMS:
            out[f"{name}_loss"] = float(np.mean([r[name] for r in trained])) if trained else 0.0
        return out
