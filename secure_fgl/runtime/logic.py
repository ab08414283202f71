"""The algorithm's client side: a small :class:`ClientLogic` per client.

A logic holds what its :class:`~.client.ClientRuntime` holds (one client's data, model,
optimizer) and answers the server strategy (:mod:`.strategy`):

* ``local_update({"round"})``      -- local training; returns the loss and whether the client has
  training nodes;
* ``contribute({"tag", "round"})`` -- what the client contributes to exchange ``tag``;
* ``privatize({"tag", "std", ...})`` -- DP: clip and noise the kept contribution (:mod:`.dp`);
* ``receive({"tag", "round", ...})`` -- how the client uses the result of ``tag``;
* ``evaluate({})``                 -- correct/total counts per split (the only evaluation data
  that leaves the client, recorded as a message by the strategy);
* ``attack_state({"what"})``       -- after the run, what this client holds for an attack it
  takes part in (:mod:`attacks.parties`): its own data, what it decoded, its deployed model's
  parameters and answers (never another client's state; not a protocol message).

:class:`ModelAveragingLogic` is FedAvg's client (McMahan et al., AISTATS 2017, Algorithm 1,
``ClientUpdate``): ``local_epochs`` full-batch steps on the local subgraph, then the update
``w_k - w`` with weight ``n_k / n_train``; FedProx adds ``mu/2 ||w - w_global||^2`` (Li et al.,
MLSys 2020, eq. 2); Local never exchanges.  Initialisation and per-step randomness are
those of :class:`secure_fgl.algorithms.base.ModelAveraging` (``torch.manual_seed(seed)``
before building the model; :func:`secure_fgl.engine.rng.client_generator` per step), so a
run gives the same models as the in-process algorithm.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols import BlockTable, DPRequest
from protocols.dp import clip_mean_value

from ..algorithms.base import SPLITS, accuracy
from ..engine import rng
from ..models import build_model
from .dp import ClientNoise
from .exchange import dense_result, dense_table, rows_table


class ClientLogic:
    """Base: the hooks a strategy calls (see the module docstring)."""

    def __init__(self, runtime, options: dict):
        self.rt, self.opts = runtime, options
        self.cfg, self.facts, self.data = runtime.cfg, runtime.facts, runtime.data
        #: tag -> the contribution kept for the protocol half (split backends)
        self.pending: dict[str, tuple] = {}
        #: this client's DP noise source (its own OS-keyed keystream, :mod:`.dp`)
        self.noise = ClientNoise()
        #: tag -> (round, what it uploaded) and (round, the result it decoded): its own memory of
        #: the exchanges, which a colluding client hands to a coalition (attack state ``contributions``)
        self.uploaded: dict[str, tuple[int, np.ndarray]] = {}
        self.aggregates: dict[str, tuple[int, np.ndarray]] = {}

    def local_update(self, req: dict) -> dict:
        return {}

    def contribute(self, req: dict) -> dict:
        raise ValueError(f"client {self.rt.client_id} contributes nothing to {req.get('tag')!r}")

    def keep(self, tag: str, *contribution) -> None:
        """Hold a contribution for the protocol half to ask for (:meth:`table`)."""
        self.pending[tag] = contribution

    def privatize(self, req: dict) -> dict:
        """Add this client's share of the DP noise of ``req["tag"]`` to its kept contribution (:mod:`.dp`)."""
        self.pending[req["tag"]] = self.noise.privatize(self.pending[req["tag"]], req)
        return {}

    def table(self, plan) -> BlockTable:
        """The provider of this client's protocol half: the kept contribution as the plan's blocks."""
        if plan.tag not in self.pending:
            raise ValueError(f"client {self.rt.client_id} has no contribution for {plan.tag!r}")
        kept = self.pending.pop(plan.tag)
        if len(kept) == 1:                       # a dense upload (row uploads are not kept: too large)
            self.uploaded[plan.tag] = (int(plan.round), kept[0])
        return dense_table(plan, kept[0]) if len(kept) == 1 else rows_table(plan, *kept)

    def receive(self, req: dict) -> dict:
        raise ValueError(f"client {self.rt.client_id} expects no result of {req.get('tag')!r}")

    def logits(self) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, req: dict) -> dict:
        logits, c = self.logits(), self.data
        return {split: list(accuracy(logits, c.y, getattr(c, f"{split}_mask"))) for split in SPLITS}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    # -- what this client holds, for the attack suite (attacks/parties.py; docs/runtime.md)
    def attack_state(self, req: dict) -> dict:
        """``what``: ``own_data`` (its subgraph), ``received`` (what it decoded of the exchanges,
        :meth:`decoded_rows`), ``model`` (its deployed model's parameters), ``posteriors`` (that
        model's class posteriors on its own nodes), ``inputs`` (the features that model takes),
        ``contributions`` (its last upload and decoded result of each dense exchange), ``query``
        (the posteriors and log-posteriors for features ``x`` on its own graph: an
        inference API)."""
        from .client import DATA_FIELDS
        what, c = req["what"], self.data
        if what == "own_data":
            return {f: getattr(c, f) for f in DATA_FIELDS}
        if what == "received":
            return self.decoded_rows()
        if what == "contributions":           # dense uploads and decoded results, by tag
            out = {f"upload:{t}": v for t, (_, v) in self.uploaded.items()}
            out.update({f"upload_round:{t}": r for t, (r, _) in self.uploaded.items()})
            out.update({f"aggregate:{t}": v for t, (_, v) in self.aggregates.items()})
            out.update({f"aggregate_round:{t}": r for t, (r, _) in self.aggregates.items()})
            return out
        model = getattr(self, "model", None)
        if model is None:
            return {}
        if what == "model":
            return {f"param:{n}": t for n, t in model.state_dict().items()}
        x, graph = self.inputs()
        if what == "inputs":
            return {"features": x, "global_ids": c.global_ids}
        if what == "query":
            x = torch.as_tensor(req["x"], dtype=torch.float32, device=self.rt.device)
        elif what != "posteriors":
            raise ValueError(f"client {self.rt.client_id}: no attack state {what!r}")
        with torch.no_grad():
            model.eval()
            out = model(x, graph)
            out = out[0] if isinstance(out, tuple) else out
        reply = {"posteriors": torch.softmax(out.float(), -1), "global_ids": c.global_ids}
        if what == "query":
            reply["log_posteriors"] = torch.log_softmax(out.float(), -1)
        return reply

    def decoded_rows(self) -> dict:
        """Node ids and totals of the rows this client decoded (FedGCN: whole blocks), or nothing."""
        return {}


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
        return self.architecture(self.cfg, self.facts, self.opts)

    @staticmethod
    def architecture(cfg, facts, options: dict) -> torch.nn.Module:
        """The model of the run's public architecture (randomly initialised)."""
        return build_model(cfg.model, facts.num_features, cfg.hidden, facts.num_classes, num_layers=cfg.num_layers,
                           dropout=cfg.dropout, heads=cfg.heads)

    def make_optimizer(self) -> torch.optim.Optimizer:
        cfg = self.cfg
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                   weight_decay=cfg.weight_decay)
        return torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def inputs(self):
        """``(x, graph)`` the model trains on (FedGCN: the received sums)."""
        return self.data.x, self.data.edge_index

    def weight(self) -> float:
        """FedAvg weight ``n_k / n_train`` (public size of the training split)."""
        return float(self.data.train_mask.sum()) / max(1.0, float(self.facts.num_train))

    def local_loss(self, logits: torch.Tensor) -> torch.Tensor:
        c = self.data
        loss = F.cross_entropy(logits[c.train_mask], c.y[c.train_mask])
        if self.prox_mu > 0:
            w = parameters_to_vector(self.model.parameters())
            loss = loss + 0.5 * self.prox_mu * (w - self.global_params).pow(2).sum()
        return loss

    def local_update(self, req: dict) -> dict:
        if not bool(self.data.train_mask.any()):
            return {"trained": False, "loss": 0.0}
        rnd, k = int(req["round"]), self.rt.client_id
        self.model.train()
        loss = torch.zeros(())
        for step in range(self.cfg.local_epochs):
            self.optimizer.zero_grad()
            with rng.using(rng.client_generator(self.cfg.seed, rnd, k, step)):
                loss = self.step_loss(rnd, step)
            loss.backward()
            self.optimizer.step()
        return {"trained": True, "loss": float(loss.detach())}

    def step_loss(self, rnd: int, step: int) -> torch.Tensor:
        """The objective of local step ``step`` of round ``rnd`` (FedAvg: :meth:`local_loss`)."""
        return self.local_loss(self.model(*self.inputs()))

    def contribute(self, req: dict) -> dict:
        if req["tag"] != self.model_tag:
            return super().contribute(req)
        update = (parameters_to_vector(self.model.parameters()).detach() - self.global_params).cpu().numpy()
        update = update.astype(np.float64)
        if req.get("dp_clip") is not None:       # DP-FedAvg: the clipped update, unweighted (protocols.dp)
            self.keep(req["tag"], clip_mean_value(update, DPRequest(clip=float(req["dp_clip"]))))
            return {"length": update.size}
        if req.get("split"):                     # the half uploads [w v, w] (protocols.base.weighted_mean)
            w = self.weight()
            self.keep(req["tag"], np.concatenate([update * w, [w]]))
            return {"length": update.size + 1}
        return {"update": update, "weight": self.weight()}

    def receive(self, req: dict) -> dict:
        if req["tag"] != self.model_tag:
            return super().receive(req)
        if "mean_update" in req:
            mean = req["mean_update"]
        elif "count" in req:                     # DP-FedAvg: the noisy sum of clipped updates / the public count
            total = dense_result(self.rt.half.result(), int(req["length"]))
            self.aggregates[req["tag"]] = (int(req["round"]), total)
            mean = total / float(req["count"])
        else:                                    # this client's own decoded result: [sum w v, sum w]
            total = dense_result(self.rt.half.result(), int(req["length"]))
            self.aggregates[req["tag"]] = (int(req["round"]), total)
            if not total[-1] > 0:
                raise ValueError(f"client {self.rt.client_id}: the weights of {req['tag']} sum to {total[-1]}")
            mean = total[:-1] / total[-1]
        mean = torch.as_tensor(mean, dtype=torch.float32, device=self.rt.device)
        self.global_params = self.global_params + mean
        vector_to_parameters(self.global_params.clone(), self.model.parameters())
        return {}

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        self.model.eval()
        return self.model(*self.inputs())

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "global_params": self.global_params.cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.global_params = state["global_params"].to(self.rt.device)


def make_logic(runtime, options: dict) -> ClientLogic:
    """The client logic of the run's algorithm (:mod:`.registry`)."""
    from .registry import logic_class
    return logic_class(runtime.cfg.algorithm)(runtime, options)
