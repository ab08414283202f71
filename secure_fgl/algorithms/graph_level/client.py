"""The graph-classification baselines' client.

GCFL's self-train, FedAvg and FedProx. Its GIN on its own graphs; the shared GIN layers go to the exchange, the rest
stays local.
"""

from __future__ import annotations

import numpy as np

from ...dpsgd import DPSGD
from ...runtime.graph_data import graph_fields
from ...runtime.logic import ClientLogic
from ...runtime.messages import (
    AttackIns,
    ContributeIns,
    ContributeRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    MessageError,
    ReceiveIns,
    StateRes,
)
from ...runtime.sums import summed
from ..grid_mean import grid_contribution, grid_mean_of_sum
from .ops import GCFLGIN, GraphLearner, initial_shared


class GraphLogic(ClientLogic):
    """A graph-classification client (module docstring)."""

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        self.prox_mu = float(options.get("mu", 0.0)) if self.cfg.algorithm == "gc-fedprox" else 0.0
        self.learner = GraphLearner(
            self.data, self.cfg, runtime.device, int(options["batch_size"]), initial_shared(self.cfg)
        )
        #: the last cluster mean received, applied when the server says so
        self.mean: np.ndarray | None = None
        #: ``--dpsgd``: per-graph clipping to ``--dp-clip``, noise from this client's own keystream
        self.sgd = DPSGD(self.cfg.dp_clip) if options.get("dpsgd") else None

    @staticmethod
    def architecture(cfg, facts, options: dict, client: int = 0):
        """Client ``client``'s GIN shape (its public feature dimension and classes), randomly initialised."""
        return GCFLGIN(facts.num_features[client], cfg.hidden, facts.num_classes[client], cfg.num_layers, cfg.dropout)

    def local_update(self, req: FitIns) -> FitRes:
        """One local update of the shared layers (by DP-SGD with this client's noise when the request carries its std).

        Raises:
            ValueError: DP-SGD is asked of a run without ``--dpsgd``.
        """
        rnd = int(req.round)
        if req.dpsgd_std is None:
            return FitRes(trained=True, loss=self.learner.local_update(rnd, self.prox_mu))
        if self.sgd is None:
            raise ValueError(f"client {self.rt.client_id} trains by DP-SGD only in a run with --dpsgd")
        dp_tag = str(req.dpsgd_tag)
        noises = [lambda size, std=std: self.noise.gaussian(std, size, dp_tag, rnd) for std in req.dpsgd_std]
        self.learner.local_update(rnd, self.prox_mu, self.sgd, noises)
        return FitRes(trained=True)  # the loss is computed from un-noised gradients: it stays here

    def weight(self, tag: str) -> float | None:
        """The weight of this client's update in the mean exchanged under ``tag``.

        None if not a mean of updates; FedAvg's ``n_k / N`` (``N``: the public number of training graphs).
        """
        return len(self.data.train) / self.facts.total_train if tag == f"{self.cfg.algorithm}/model" else None

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """Keep the weighted update on the public grid for the cluster-mean exchange."""
        tag, rnd = req.tag, int(req.round)
        weight = self.weight(tag)
        if weight is None:
            return super().contribute(req)
        contribution = grid_contribution(
            self.learner.update().cpu().numpy(), weight, tag=tag, rnd=rnd, client=self.rt.client_id
        )
        self.keep(tag, contribution)
        return ContributeRes(length=contribution.size)

    def receive(self, req: ReceiveIns) -> None:
        """Store the cluster mean, or apply the stored one when told to.

        Raises:
            ValueError: told to apply a mean it never received.
        """
        tag = req.tag
        if tag == f"{self.cfg.algorithm}/model":
            self.mean = self.received_mean(req)
            return None
        if tag == f"{self.cfg.algorithm}/apply":
            if self.mean is None:
                raise ValueError(f"client {self.rt.client_id}: told to apply a cluster mean it never received")
            self.learner.apply_mean(self.mean)
            self.mean = None
            return None
        return super().receive(req)

    def received_mean(self, req: ReceiveIns) -> np.ndarray:
        """The mean of this client's decoded grid sum."""
        return grid_mean_of_sum(summed(self, req))

    def evaluate(self, req: EvaluateIns) -> EvaluateRes:
        """The learner's per-split counts."""
        return EvaluateRes(self.learner.counts())

    def attack_state(self, req: AttackIns) -> StateRes:
        """This client's GIN after the run, for the attack suite.

        For the attack suite (:mod:`attacks.parties`): ``model``, this client's GIN (private
        layers included) after the run; ``own_data``, its graphs (the set-up frame's arrays).
        """
        if req.what == "model":
            return StateRes({f"param:{n}": t for n, t in self.learner.model.state_dict().items()})
        if req.what == "own_data":
            return StateRes(graph_fields(self.data))
        raise MessageError(f"client {self.rt.client_id}: no attack state {req.what!r} for a graph client")

    def state_dict(self) -> dict:
        """The learner's state."""
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore the learner's state."""
        self.learner.load_state_dict(state)
