"""FedAvg (McMahan et al., AISTATS 2017) and FedProx (Li et al., MLSys 2020) on
clients' local subgraphs, cross-client edges ignored (FedGCN's "0-hop"); Local: each client
trains alone, nothing is exchanged."""

from __future__ import annotations

from ..base import ModelAveraging
from ..options import FedProxOptions


class FedAvg(ModelAveraging):
    name = "fedavg"


class FedProx(ModelAveraging):
    name = "fedprox"
    Options = FedProxOptions

    def __init__(self, fed, protocol, cfg, device, options=None):
        super().__init__(fed, protocol, cfg, device, options)
        self.prox_mu = self.opts.mu


class Local(ModelAveraging):
    name = "local"
    personalized = True
    aggregate_models = False
