"""FedSpray's client.

Its personalized GNN, its copies of the global encoder and proxies, its upload of encoder update and class-wise
proxies; :mod:`.server` describes the round.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols.base import classwise_result, classwise_vector

from ...runtime.logic import ClientLogic
from ...runtime.messages import ContributeIns, ContributeRes, EvaluateIns, EvaluateRes, FitIns, FitRes, ReceiveIns
from ...runtime.sums import dp_mean_vector, mean_of, mean_vector, offer, summed
from ..base import accuracy
from ..minority import minority_report
from ..options import FedSprayOptions
from .ops import DP_PROXY_BOUND, PROXY_SPEC, SprayClient, check_options, first_proxies, keep_absent, new_encoder


class FedSprayLogic(ClientLogic):
    """FedSpray's client logic.

    FedSpray's client: its :class:`~secure_fgl.algorithms.fedspray.SprayClient`, its copies of the
    global ``w`` and ``S``, and its contributions to the two sums.
    """

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        o, f = FedSprayOptions(**options), self.facts
        check_options(o)
        self.fopts = o
        encoder = new_encoder(o, f.num_features, f.num_classes, self.cfg.seed).to(runtime.device)
        self.global_encoder = parameters_to_vector(encoder.parameters()).detach().clone()
        self.part = SprayClient(self.data, runtime.client_id, o, f.num_features, f.num_classes, encoder, self.cfg.seed)
        self.proxies = first_proxies(o, f.num_classes).to(runtime.device)
        #: the deployed model (the personalized GNN; the attack suite's posteriors and queries)
        self.model = self.part.gnn
        self.teacher = None
        self.update = self.local_proxies = None

    def local_update(self, req: FitIns) -> FitRes:
        """One round of FedSpray's local training; keeps the encoder update and the local class proxies."""
        if not bool(self.data.train_mask.any()):
            return FitRes(trained=False, loss=0.0)
        loss, self.update, self.local_proxies = self.part.local_update(
            self.global_encoder, self.proxies, int(req.round)
        )
        return FitRes(trained=True, loss=loss)

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """Keep the encoder update as a weighted mean, the class-wise proxies, or both in one batch."""
        tag, N = req.tag, self.facts.num_nodes
        if tag == "fedspray/encoder":
            update, weight = self.update.cpu().numpy(), self.part.encoder_weight(N)
            return offer(
                self,
                req,
                dp_mean_vector(update, weight, req) if req.dp_clip is not None else mean_vector(update, weight),
            )
        if tag == "fedspray/proxies":
            return offer(self, req, self.proxy_upload())
        if tag == "fedspray/batch":  # both in one upload (round_spec): [a * S, a, w dw, w]
            return offer(
                self,
                req,
                np.concatenate(
                    [self.proxy_upload(), mean_vector(self.update.cpu().numpy(), self.part.encoder_weight(N))]
                ),
            )
        return super().contribute(req)

    def proxy_upload(self) -> np.ndarray:
        """The local proxies as a class-wise upload ``[a * S ([C, d]), a ([C])]`` with this client's class weights a."""
        return classwise_vector(
            self.local_proxies.cpu().numpy().astype(np.float64), self.part.proxy_weights(self.facts.num_nodes)
        )

    def receive(self, req: ReceiveIns) -> None:
        """Apply the decoded encoder mean and/or class proxies."""
        tag = req.tag
        if tag == "fedspray/encoder":
            self.apply_encoder(mean_of(summed(self, req), tag, req))
        elif tag == "fedspray/proxies":
            self.apply_proxies(summed(self, req), max(PROXY_SPEC.tolerance, 3.0 * float(req.dp_std or 0.0)))
        elif tag == "fedspray/batch":
            total, C, d = summed(self, req), *self.proxies.shape
            self.apply_proxies(total[: C * (d + 1)], float(req.entry("tolerance")))
            self.apply_encoder(mean_of(total[C * (d + 1) :], tag))
        else:
            return super().receive(req)
        return None

    def apply_encoder(self, mean: np.ndarray) -> None:
        """Add the mean encoder update to the global encoder."""
        self.global_encoder = self.global_encoder + torch.as_tensor(mean, dtype=torch.float32, device=self.rt.device)

    def apply_proxies(self, total: np.ndarray, tolerance: float) -> None:
        """Set the global proxies to the class-wise means (absent classes keep theirs; bounded under DP)."""
        C, d = self.proxies.shape
        self.proxies = keep_absent(*classwise_result(total, C, d, tolerance), self.proxies)
        if self.cfg.dp_epsilon:  # a noisy class-weight total near zero can blow a row up: keep S bounded
            self.proxies = self.proxies.clamp(-DP_PROXY_BOUND, DP_PROXY_BOUND)

    def inputs(self):
        """The client's features and edges."""
        return self.data.x, self.data.edge_index

    def logits(self) -> torch.Tensor:
        """Logits of the client's GNN."""
        return self.part.logits()

    @torch.no_grad()
    def evaluate(self, req: EvaluateIns) -> EvaluateRes:
        """Per-split counts, minority-class report and the test accuracy of the global encoder as teacher."""
        logits, c = self.logits(), self.data
        if self.teacher is None:
            self.teacher = copy.deepcopy(self.part.encoder)
        vector_to_parameters(self.global_encoder.clone(), self.teacher.parameters())
        teacher = accuracy(self.part.soft_targets(self.teacher, self.proxies)[0], c.y, c.test_mask)
        return EvaluateRes(
            {
                **self.split_counts(logits),
                "minority": minority_report(logits, c, self.facts.num_classes),
                "teacher": list(teacher),
            }
        )

    def state_dict(self) -> dict:
        """The local part's state plus the global encoder and proxies."""
        return {**self.part.state_dict(), "global_encoder": self.global_encoder.cpu(), "proxies": self.proxies.cpu()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the state written by :meth:`state_dict`."""
        self.part.load_state_dict(state)
        self.global_encoder = state["global_encoder"].to(self.rt.device)
        self.proxies = state["proxies"].to(self.rt.device)
        vector_to_parameters(self.global_encoder.clone(), self.part.encoder.parameters())
