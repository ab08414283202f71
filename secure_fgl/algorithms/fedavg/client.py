"""FedAvg's client, shared by FedProx and Local.

FedAvg's client (McMahan et al., AISTATS 2017, Algorithm 1, ``ClientUpdate``), shared by FedProx
and Local: ``local_epochs`` full-batch steps on the local subgraph, then the update ``w_k - w``
with weight ``n_k / n_train``; FedProx adds ``mu/2 ||w - w_global||^2`` (Li et al., MLSys 2020,
eq. 2); Local never exchanges.  Initialisation and per-step randomness: ``torch.manual_seed(seed)``
before building the model, :func:`secure_fgl.engine.rng.client_generator` per step.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols import DPRequest
from protocols.dp import clip_mean_value

from ...engine import rng
from ...models import build_model
from ...runtime.logic import ClientLogic
from ...runtime.messages import ContributeIns, ContributeRes, FitIns, FitRes, ReceiveIns
from ...runtime.sums import summed


class ModelAveragingLogic(ClientLogic):
    """FedAvg / FedProx / Local on the client (module docstring)."""

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        self.prox_mu = float(options.get("mu", 0.0)) if self.cfg.algorithm == "fedprox" else 0.0
        #: the tag its model is exchanged under
        self.model_tag = f"{self.cfg.algorithm}/model"
        torch.manual_seed(self.cfg.seed)
        self.model = self.build_model().to(runtime.device)
        self.optimizer = self.make_optimizer()
        self.global_params = parameters_to_vector(self.model.parameters()).detach().clone()

    def build_model(self) -> torch.nn.Module:
        """This algorithm's model for the run's configuration."""
        return self.architecture(self.cfg, self.facts, self.opts)

    @staticmethod
    def architecture(cfg, facts, options: dict) -> torch.nn.Module:
        """The model of the run's public architecture (randomly initialised)."""
        return build_model(
            cfg.model,
            facts.num_features,
            cfg.hidden,
            facts.num_classes,
            num_layers=cfg.num_layers,
            dropout=cfg.dropout,
            heads=cfg.heads,
        )

    def make_optimizer(self) -> torch.optim.Optimizer:
        """SGD (with momentum) or Adam over the model's parameters, as ``--optimizer`` says."""
        cfg = self.cfg
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(
                self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
            )
        return torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def inputs(self):
        """``(x, graph)`` the model trains on (FedGCN: the received sums)."""
        return self.data.x, self.data.edge_index

    def weight(self) -> float:
        """FedAvg weight ``n_k / n_train`` (public size of the training split)."""
        return float(self.data.train_mask.sum()) / max(1.0, float(self.facts.num_train))

    def local_loss(self, logits: torch.Tensor) -> torch.Tensor:
        """Cross-entropy on the training nodes, plus FedProx's (mu/2) ||w - w_global||^2 (Li et al., MLSys 2020)."""
        c = self.data
        loss = F.cross_entropy(logits[c.train_mask], c.y[c.train_mask])
        if self.prox_mu > 0:
            w = parameters_to_vector(self.model.parameters())
            loss = loss + 0.5 * self.prox_mu * (w - self.global_params).pow(2).sum()
        return loss

    def local_update(self, req: FitIns) -> FitRes:
        """``local_epochs`` optimiser steps on :meth:`step_loss`, each under its keyed generator."""
        if not bool(self.data.train_mask.any()):
            return FitRes(trained=False, loss=0.0)
        rnd, k = int(req.round), self.rt.client_id
        self.model.train()
        loss = torch.zeros(())
        for step in range(self.local_epochs()):
            self.optimizer.zero_grad()
            with rng.using(rng.client_generator(self.cfg.seed, rnd, k, step)):
                loss = self.step_loss(rnd, step)
            loss.backward()
            self.optimizer.step()
        return FitRes(trained=True, loss=float(loss.detach()))

    def local_epochs(self) -> int:
        """Optimiser steps of one local update (``--local-epochs``)."""
        return self.cfg.local_epochs

    def step_loss(self, rnd: int, step: int) -> torch.Tensor:
        """The objective of local step ``step`` of round ``rnd`` (FedAvg: :meth:`local_loss`)."""
        return self.local_loss(self.model(*self.inputs()))

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """Keep the update v = w - w_global as [w_k v, w_k], or clipped and unweighted under DP-FedAvg."""
        if req.tag != self.model_tag:
            return super().contribute(req)
        update = (parameters_to_vector(self.model.parameters()).detach() - self.global_params).cpu().numpy()
        update = update.astype(np.float64)
        if req.dp_clip is not None:  # DP-FedAvg: the clipped update, unweighted (protocols.dp)
            self.keep(req.tag, clip_mean_value(update, DPRequest(clip=float(req.dp_clip))))
            return ContributeRes(length=update.size)
        w = self.weight()  # the half uploads [w v, w] (protocols.base.weighted_mean)
        self.keep(req.tag, np.concatenate([update * w, [w]]))
        return ContributeRes(length=update.size + 1)

    def receive(self, req: ReceiveIns) -> None:
        """Apply the decoded mean update: w_global += sum_k w_k v_k / sum_k w_k (DP: the noisy sum / the public count).

        Raises:
            ValueError: the decoded weights do not sum to a positive number.
        """
        if req.tag != self.model_tag:
            return super().receive(req)
        total = summed(self, req)  # this client's own decoded result
        self.aggregates[req.tag] = (int(req.round), total)
        if req.count is not None:  # DP-FedAvg: the noisy sum of clipped updates / the public count
            mean = total / float(req.count)
        else:  # [sum w v, sum w]
            if not total[-1] > 0:
                raise ValueError(f"client {self.rt.client_id}: the weights of {req.tag} sum to {total[-1]}")
            mean = total[:-1] / total[-1]
        self.global_params = self.global_params + torch.as_tensor(mean, dtype=torch.float32, device=self.rt.device)
        vector_to_parameters(self.global_params.clone(), self.model.parameters())
        return None

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        """Logits of the model in eval mode on this client's inputs."""
        self.model.eval()
        return self.model(*self.inputs())

    def state_dict(self) -> dict:
        """Model, optimizer and the last global parameters."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "global_params": self.global_params.cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the state written by :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.global_params = state["global_params"].to(self.rt.device)
