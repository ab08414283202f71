"""Centralized training: the whole graph on one machine (the upper reference).

The federation is kept only for evaluation: accuracy is reported per client on the
nodes each client owns, so numbers are comparable with the federated methods.
``center``: subtract the mean of every node's features (FedGCN's ``--center`` on the whole graph)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ...engine import rng
from ...models.centring import centre_first_layer
from ..base import ModelAveraging
from ..options import CentralizedOptions


class Centralized(ModelAveraging):
    name = "centralized"
    Options = CentralizedOptions
    aggregate_models = False

    def __init__(self, fed, protocol, cfg, device, options=None):
        super().__init__(fed, protocol, cfg, device, options)
        g = fed.graph
        self.x, self.edge_index = g.x.to(device), g.edge_index.to(device)
        self.y, self.train_mask = g.y.to(device), g.train_mask.to(device)
        self.model, self.optimizer = self.models[0], self.optimizers[0]
        self.models, self.optimizers = [self.model], [self.optimizer]
        if self.opts.center:  # the model sees x - mean(x), no centred copy
            centre_first_layer(self.model, self.x.mean(0, keepdim=True))
        self._logits = None

    def train_round(self, rnd: int) -> dict:
        self.model.train()
        for step in range(self.cfg.local_epochs):
            self.optimizer.zero_grad()
            with rng.using(rng.client_generator(self.cfg.seed, rnd, 0, step)):  # the one "client"
                logits = self.model(self.x, self.edge_index)
            loss = F.cross_entropy(logits[self.train_mask], self.y[self.train_mask])
            loss.backward()
            self.optimizer.step()
        self._logits = None
        return {"train_loss": float(loss.detach())}

    @torch.no_grad()
    def client_logits(self, k: int) -> torch.Tensor:
        if self._logits is None:
            self.model.eval()
            self._logits = self.model(self.x, self.edge_index)
        return self._logits[self.clients[k].global_ids]

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._logits = None
