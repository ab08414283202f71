"""The algorithm's client side: a small :class:`ClientLogic` per client.

A logic holds what its :class:`~.client.ClientRuntime` holds (one client's data, model,
optimizer) and answers the server strategy (:mod:`.strategy`):

* ``local_update(FitIns) -> FitRes``            -- local training; the loss and whether the client
  has training nodes;
* ``contribute(ContributeIns) -> ContributeRes`` -- what the client contributes to exchange ``tag``
  (kept for its protocol half; the reply holds public facts only);
* ``privatize(PrivatizeIns)``                   -- DP: clip and noise the kept contribution (:mod:`.dp`);
* ``receive(ReceiveIns)``                       -- how the client uses the result of ``tag``;
* ``evaluate(EvaluateIns) -> EvaluateRes``      -- correct/total counts per split (the only evaluation
  data that leaves the client, recorded as a message by the strategy);
* ``attack_state(AttackIns) -> StateRes``       -- after the run, what this client holds for an attack
  it takes part in (:mod:`attacks.parties`): its own data, what it decoded, its deployed model's
  parameters and answers (never another client's state; not a protocol message).

The requests and replies are the typed messages of :mod:`.messages`.

An algorithm's logic subclasses :class:`ClientLogic` in its package (FedAvg's:
:class:`secure_fgl.algorithms.fedavg.client.ModelAveragingLogic`).
"""

from __future__ import annotations

import numpy as np
import torch

from protocols import BlockTable

from ..algorithms import get_spec
from ..algorithms.base import SPLITS, accuracy
from .dp import ClientNoise
from .exchange import dense_table, rows_table
from .messages import (
    AttackIns,
    ContributeIns,
    ContributeRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    MessageError,
    PrivatizeIns,
    ReceiveIns,
    StateRes,
)
from .partition import DATA_FIELDS


class ClientLogic:
    """Base: the hooks a strategy calls (see the module docstring)."""

    def __init__(self, runtime, options: dict):
        self.rt, self.opts = runtime, options
        self.cfg, self.facts, self.data = runtime.cfg, runtime.facts, runtime.data
        #: tag -> the contribution kept for the protocol half (backends in halves)
        self.pending: dict[str, tuple] = {}
        #: the kept tags this client sends in the clear (reports); the protocol half refuses a report
        #: plan for any other tag
        self.clear_tags: set[str] = set()
        #: this client's DP noise source (its own OS-keyed keystream, :mod:`.dp`)
        self.noise = ClientNoise()
        #: tag -> (round, what it uploaded) and (round, the result it decoded): its own memory of
        #: the exchanges, which a colluding client hands to a coalition (attack state ``contributions``)
        self.uploaded: dict[str, tuple[int, np.ndarray]] = {}
        self.aggregates: dict[str, tuple[int, np.ndarray]] = {}

    def local_update(self, req: FitIns) -> FitRes:
        """Train locally for one round (default: nothing to train).

        Args:
            req: The strategy's request; ``req.round`` is the round.

        Returns:
            Whether the client trained, its last loss and any algorithm-specific loss ``terms``.
        """
        return FitRes(trained=False, loss=0.0)

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """Prepare this client's contribution to exchange ``req.tag`` (held with :meth:`keep` for the protocol half).

        Args:
            req: The strategy's request: ``tag``, ``round`` and the exchange's public parameters.

        Returns:
            Public facts about the contribution (e.g. its ``length``); never the contribution itself.

        Raises:
            MessageError: this logic contributes nothing to ``tag`` (the base answer to every tag).
        """
        raise MessageError(f"client {self.rt.client_id} contributes nothing to {req.tag!r}")

    def keep(self, tag: str, *contribution, clear: bool = False) -> None:
        """Hold a contribution for the protocol half to ask for.

        :meth:`table`. ``clear``: the algorithm reports it in the clear (a protected contribution is never answered
        as a report).
        """
        self.pending[tag] = contribution
        (self.clear_tags.add if clear else self.clear_tags.discard)(tag)

    def privatize(self, req: PrivatizeIns) -> None:
        """Add this client's share of the DP noise of ``req.tag`` to its kept contribution (:mod:`.dp`)."""
        if req.tag not in self.pending:
            raise MessageError(f"client {self.rt.client_id} has no contribution to {req.tag!r} to noise")
        self.pending[req.tag] = self.noise.privatize(self.pending[req.tag], req)

    def table(self, plan) -> BlockTable:
        """The provider of this client's protocol half: the kept contribution as the plan's blocks."""
        if plan.tag not in self.pending:
            raise ValueError(f"client {self.rt.client_id} has no contribution for {plan.tag!r}")
        kept = self.pending.pop(plan.tag)
        if len(kept) == 1:  # a dense upload (row uploads are not kept: too large)
            self.uploaded[plan.tag] = (int(plan.round), kept[0])
        return dense_table(plan, kept[0]) if len(kept) == 1 else rows_table(plan, *kept)

    def receive(self, req: ReceiveIns) -> None:
        """Use the result of exchange ``req.tag`` that this client's protocol half decoded.

        Args:
            req: The strategy's request: ``tag``, ``round`` and what the client needs to read the result.

        Raises:
            MessageError: this logic expects no result of ``tag`` (the base answer to every tag).
        """
        raise MessageError(f"client {self.rt.client_id} expects no result of {req.tag!r}")

    def logits(self) -> torch.Tensor:
        """Class logits of the deployed model on this client's nodes."""
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, req: EvaluateIns) -> EvaluateRes:
        """``[correct, total]`` per split (train, val, test) of the deployed model on this client's nodes."""
        return EvaluateRes(self.split_counts(self.logits()))

    def split_counts(self, logits: torch.Tensor) -> dict[str, list[int]]:
        """``split -> [correct, total]`` of ``logits`` on this client's nodes."""
        c = self.data
        return {split: list(accuracy(logits, c.y, getattr(c, f"{split}_mask"))) for split in SPLITS}

    def state_dict(self) -> dict:
        """This client's checkpoint state (model, optimizer, algorithm state); empty by default."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore the state written by :meth:`state_dict`."""
        pass

    # -- what this client holds, for the attack suite (attacks/parties.py; docs/runtime.md)
    def attack_state(self, req: AttackIns) -> StateRes:
        """This client's state for the attack suite.

        ``what``: ``own_data`` (its subgraph), ``received`` (what it decoded of the exchanges,
        :meth:`decoded_rows`), ``model`` (its deployed model's parameters), ``posteriors`` (that
        model's class posteriors on its own nodes), ``inputs`` (the features that model takes),
        ``contributions`` (its last upload and decoded result of each dense exchange), ``query``
        (the posteriors and log-posteriors for features ``x`` on its own graph: an
        inference API).
        """
        what, c = req.what, self.data
        if what == "own_data":
            return StateRes({f: getattr(c, f) for f in DATA_FIELDS})
        if what == "received":
            return StateRes(self.decoded_rows())
        if what == "contributions":  # dense uploads and decoded results, by tag
            out = {f"upload:{t}": v for t, (_, v) in self.uploaded.items()}
            out.update({f"upload_round:{t}": r for t, (r, _) in self.uploaded.items()})
            out.update({f"aggregate:{t}": v for t, (_, v) in self.aggregates.items()})
            out.update({f"aggregate_round:{t}": r for t, (r, _) in self.aggregates.items()})
            return StateRes(out)
        model = getattr(self, "model", None)
        if model is None:
            return StateRes()
        if what == "model":
            return StateRes({f"param:{n}": t for n, t in model.state_dict().items()})
        x, graph = self.inputs()
        if what == "inputs":
            return StateRes({"features": x, "global_ids": c.global_ids})
        if what == "query":
            if req.x is None:
                raise MessageError(f"client {self.rt.client_id}: a query without its features x")
            x = torch.as_tensor(req.x, dtype=torch.float32, device=self.rt.device)
        elif what != "posteriors":
            raise MessageError(f"client {self.rt.client_id}: no attack state {what!r}")
        with torch.no_grad():
            model.eval()
            out = model(x, graph)
            out = out[0] if isinstance(out, tuple) else out
        reply = {"posteriors": torch.softmax(out.float(), -1), "global_ids": c.global_ids}
        if what == "query":
            reply["log_posteriors"] = torch.log_softmax(out.float(), -1)
        return StateRes(reply)

    def decoded_rows(self) -> dict:
        """Node ids and totals of the rows this client decoded (FedGCN: whole blocks), or nothing."""
        return {}


def make_logic(runtime, options: dict) -> ClientLogic:
    """The client logic of the run's algorithm (its :class:`~secure_fgl.algorithms.spec.AlgorithmSpec`)."""
    return get_spec(runtime.cfg.algorithm).logic_class()(runtime, options)
