"""FedOMD's client.

Its orthogonal GCN, its hidden statistics (kept for the protocol half) and local training against the pooled
statistics (eq. 12); :mod:`.server` describes the round.
"""

from __future__ import annotations

import numpy as np
import torch

from protocols.batch import batch_means, batch_vector

from ...runtime.messages import ContributeIns, ContributeRes, FitIns, FitRes, ReceiveIns
from ...runtime.sums import dp_mean_vector, mean_of, offer, summed
from ..fedavg.client import ModelAveragingLogic
from ..options import FedOMDOptions
from .cmd import clip_activations
from .ops import GlobalStats, build_ortho_gcn, hidden_for_stats, project_moments, train_client
from .stats_batch import central_from_raw, local_central_moments, local_mean, local_raw_moments


class FedOMDLogic(ModelAveragingLogic):
    """FedOMD's client: its statistics contributions, eq. 12 locally, then FedAvg's client."""

    def __init__(self, runtime, options: dict):
        self.fopts = FedOMDOptions(**options)
        super().__init__(runtime, options)
        self.orders = tuple(range(2, self.fopts.cmd_order + 1))
        self.global_stats: list[GlobalStats] | None = None
        self.samples: tuple[int, list[np.ndarray]] | None = None  # (round, clipped Z^l as float64)
        self.pooled: dict = {}  # this round's received statistics

    @staticmethod
    def architecture(cfg, facts, options: dict) -> torch.nn.Module:
        """The orthogonal GCN of FedOMD."""
        return build_ortho_gcn(FedOMDOptions(**options), cfg, facts.num_features, facts.num_classes)

    def local_update(self, req: FitIns) -> FitRes:
        """FedOMD's local steps (eq. 12): cross-entropy, orthogonality and central-moment-discrepancy terms."""
        if not bool(self.data.train_mask.any()):
            return FitRes(trained=False, loss=0.0)
        loss, terms = train_client(
            self.model,
            self.optimizer,
            *self.inputs(),
            self.data,
            self.fopts,
            self.cfg,
            self.global_stats,
            self.orders,
            int(req.round),
            self.rt.client_id,
        )
        return FitRes(trained=True, loss=loss, terms=terms)

    def _samples(self, rnd: int) -> list[np.ndarray]:
        """This round's hidden features on the statistics' node set, clipped to ``[a, b]`` (computed once)."""
        if self.samples is None or self.samples[0] != rnd:
            o = self.fopts
            hidden = hidden_for_stats(self.model, *self.inputs(), self.data, o, self.cfg.seed, rnd, self.rt.client_id)
            self.samples = (rnd, [clip_activations(z, o.act_low, o.act_high).double().cpu().numpy() for z in hidden])
            self.pooled = {}
        return self.samples[1]

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """Keep this client's hidden-feature statistics of the requested layers (means, central or raw moments)."""
        if "stage" not in req.config:
            return super().contribute(req)
        stage, layer_ids = req.entry("stage"), list(req.entry("layers"))
        layers = self._samples(int(req.round))
        if req.dp_clip is not None:  # one layer's DP weighted mean (.sums)
            a = layers[layer_ids[0]]
            value = (
                local_mean(a)
                if stage == "mean"
                else local_central_moments(a, self.pooled[("mean", layer_ids[0])], self.orders)
            )
            return offer(self, req, dp_mean_vector(value, float(a.shape[0]), req))
        parts = []
        for l in layer_ids:
            a = layers[l]
            if stage == "mean":
                parts.append(local_mean(a))
            elif stage == "moments":
                parts.append(local_central_moments(a, self.pooled[("mean", l)], self.orders))
            else:  # raw: E[z] and E[z^2..J] as two parts
                raw = local_raw_moments(a, max(self.orders))
                parts += [raw[0], raw[1:]]
        return offer(self, req, batch_vector(parts, float(layers[0].shape[0])))

    def receive(self, req: ReceiveIns) -> None:
        """Store the pooled statistics; under DP they are projected onto the activation bounds."""
        if "stage" not in req.config:
            return super().receive(req)
        o, stage, layers = self.fopts, req.entry("stage"), list(req.entry("layers"))
        d, J = self.cfg.hidden, len(self.orders)
        per_layer = {"mean": [(d,)], "moments": [(J, d)], "raw": [(d,), (J, d)]}[stage]
        if req.dp_clip is not None:  # one layer's DP weighted mean
            means = [mean_of(summed(self, req), req.tag, req).reshape(per_layer[0])]
        else:
            means = batch_means(summed(self, req), per_layer * len(layers), req.tag, int(req.round))
        dp_run = bool(self.cfg.dp_epsilon)  # post-processing of the DP path
        for i, l in enumerate(layers):
            if stage == "mean":  # the means-only exchange and DP project them
                project = dp_run or not self.orders
                self.pooled[("mean", l)] = np.clip(means[i], o.act_low, o.act_high) if project else means[i]
            elif stage == "moments":
                self.pooled[("moments", l)] = (
                    project_moments(means[i], self.orders, o.act_low, o.act_high)
                    if dp_run
                    else {j: means[i][n] for n, j in enumerate(self.orders)}
                )
            else:
                mu = means[2 * i]
                self.pooled[("mean", l)] = mu
                self.pooled[("moments", l)] = central_from_raw(mu, means[2 * i + 1], self.orders)
        num_hidden = 1 + o.ortho_layers
        if all(
            ("mean", l) in self.pooled and (not self.orders or ("moments", l) in self.pooled) for l in range(num_hidden)
        ):
            dev = self.rt.device
            self.global_stats = [
                GlobalStats(
                    torch.as_tensor(self.pooled[("mean", l)], dtype=torch.float32).to(dev),
                    {
                        j: torch.as_tensor(m, dtype=torch.float32).to(dev)
                        for j, m in self.pooled.get(("moments", l), {}).items()
                    },
                )
                for l in range(num_hidden)
            ]
        return None
