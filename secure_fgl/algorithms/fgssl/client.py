"""FGSSL (Huang et al., IJCAI 2023) as a client logic; the server is FedAvg's strategy.

Algorithm 1 of :mod:`secure_fgl.algorithms.fgssl` with every party apart: the server side is
FedAvg's weighted mean (:class:`~secure_fgl.algorithms.fedavg.server.ModelAveragingStrategy`, tag ``fgssl/model``); each
client's ``LocalUpdating`` freezes the global model it received (``G^g, F^g``), then runs ``E``
epochs of eq. 12 (or the released code's objective, ``--variant``) on its own subgraph
(:func:`~secure_fgl.algorithms.fgssl.fgssl_objective`), with value-independent augmentation
draws (keyed by the client's per-step generator).
"""

from __future__ import annotations

import copy

import torch
from torch.nn.utils import vector_to_parameters

from ...runtime.messages import FitIns, FitRes
from ..fedavg.client import ModelAveragingLogic
from ..options import FGSSLOptions
from .ops import fgssl_objective, fgssl_rates, fgssl_views


class FGSSLLogic(ModelAveragingLogic):
    """FGSSL's client: FedAvg's, with the frozen global model and the FGSSL objective."""

    def __init__(self, runtime, options: dict):
        self.fopts = FGSSLOptions(**options)
        super().__init__(runtime, options)
        self.weak, self.strong = fgssl_rates(self.fopts, self.model, self.cfg.model)
        #: the received global model G^g, F^g (frozen, evaluated without dropout)
        self.global_model = copy.deepcopy(self.model).eval().requires_grad_(False)

    def local_update(self, req: FitIns) -> FitRes:
        """Load the global model (the contrastive target), then a FedAvg local update."""
        vector_to_parameters(self.global_params.clone(), self.global_model.parameters())
        return super().local_update(req)

    def step_loss(self, rnd: int, step: int) -> torch.Tensor:
        """FGSSL's objective of one step (eq. 12, or the released code's CE + lambda_c InfoNCE)."""
        c, (x, edge_index) = self.data, self.inputs()
        key = (self.cfg.seed, rnd, self.rt.client_id, step)
        return fgssl_objective(
            self.model,
            self.global_model,
            x,
            edge_index,
            c.train_mask,
            c.y[c.train_mask],
            self.fopts,
            lambda: fgssl_views(x, edge_index, self.weak, self.strong, key),
        )
