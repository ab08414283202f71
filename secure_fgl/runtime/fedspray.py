"""FedSpray (Fu et al., KDD 2024) as a client logic and a server strategy.

The round of :mod:`secure_fgl.algorithms.fedspray` with every party apart:

1. each sampled client with training nodes runs Algorithm 1's ``LocalUpdate``
   (:meth:`~secure_fgl.algorithms.fedspray.SprayClient.local_update`: its GNN, then its encoder copy
   and node proxies, against the global ``w_{r-1}, S_{r-1}`` it holds);
2. **encoder mean** (eq. 14, tag ``fedspray/encoder``): each sends ``[w_k (w_r^(k) - w_{r-1}), w_k]``,
   ``w_k = N_k / |V|`` (:func:`.sums.mean_vector`); every client receives the sum and updates its
   copy of ``w``;
3. **class-wise proxy mean** (eq. 15, tag ``fedspray/proxies``): each sends ``[a^(k) * S^(k), a^(k)]``
   with its secret class weights (:func:`protocols.base.classwise_vector`); every client receives
   the sum and sets ``S`` (:func:`protocols.base.classwise_result`; a class nobody holds keeps its
   proxy).  ``--ablate-proxy`` skips it.

The server moves the two sums (:mod:`.sums`) and sees only what its protocol gives it: in mask and
ckks neither the weights nor which classes a client lacks.  It never holds ``w`` or ``S``.

DP (``--dp-epsilon``, as the in-process algorithm; :mod:`.dp`): both exchanges are client-level
releases (``--dp-clip``, one per round, the budget split between the two).  The encoder mean is a
DP weighted mean (each client sends ``[w~ clip(u_k), w~ C]``, :func:`.sums.dp_mean_vector`); the
class-wise proxy vector is clipped whole to ``C`` on the client; each client adds its share of the
noise before its half encodes, and the recipients clamp the noisy ``S`` to ``+-DP_PROXY_BOUND``.
Evaluation: each client reports its counts, its minority counts
(:func:`~secure_fgl.algorithms.minority.minority_report`) and its teacher's test counts (the
global encoder with ``S`` on its test nodes), recorded as ``eval/counts`` messages.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols.base import classwise_result, classwise_vector

from ..algorithms.base import SPLITS, accuracy, accuracy_summary, model_spec
from ..algorithms.fedspray import (DP_PROXY_BOUND, PROXY_SPEC, SprayClient, check_options, declare_dp_exchanges,
                                   dp_request, first_proxies, keep_absent, new_encoder, round_spec)
from ..algorithms.minority import MinorityAccuracy, minority_report
from ..algorithms.options import FedSprayOptions
from .logic import ClientLogic
from ..algorithms.fedavg.server import ModelAveragingStrategy
from .strategy import EVAL_TAG
from .sums import dp_mean_vector, mean_of, mean_vector, offer, scoped, sum_exchange, summed


class FedSprayLogic(ClientLogic):
    """FedSpray's client: its :class:`~secure_fgl.algorithms.fedspray.SprayClient`, its copies of the
    global ``w`` and ``S``, and its contributions to the two sums."""

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

    def local_update(self, req: dict) -> dict:
        if not bool(self.data.train_mask.any()):
            return {"trained": False, "loss": 0.0}
        loss, self.update, self.local_proxies = self.part.local_update(self.global_encoder, self.proxies,
                                                                       int(req["round"]))
        return {"trained": True, "loss": loss}

    def contribute(self, req: dict) -> dict:
        tag, N = req["tag"], self.facts.num_nodes
        if tag == "fedspray/encoder":
            update, weight = self.update.cpu().numpy(), self.part.encoder_weight(N)
            return offer(self, req, dp_mean_vector(update, weight, req) if req.get("dp_clip") is not None
                         else mean_vector(update, weight))
        if tag == "fedspray/proxies":
            return offer(self, req, self.proxy_upload())
        if tag == "fedspray/batch":             # both in one upload (round_spec): [a * S, a, w dw, w]
            return offer(self, req, np.concatenate([self.proxy_upload(),
                                                    mean_vector(self.update.cpu().numpy(), self.part.encoder_weight(N))]))
        return super().contribute(req)

    def proxy_upload(self) -> np.ndarray:
        return classwise_vector(self.local_proxies.cpu().numpy().astype(np.float64),
                                self.part.proxy_weights(self.facts.num_nodes))

    def receive(self, req: dict) -> dict:
        tag = req["tag"]
        if tag == "fedspray/encoder":
            self.apply_encoder(mean_of(summed(self, req), tag, req))
        elif tag == "fedspray/proxies":
            self.apply_proxies(summed(self, req), max(PROXY_SPEC.tolerance, 3.0 * float(req.get("dp_std", 0.0))))
        elif tag == "fedspray/batch":
            total, C, d = summed(self, req), *self.proxies.shape
            self.apply_proxies(total[:C * (d + 1)], float(req["tolerance"]))
            self.apply_encoder(mean_of(total[C * (d + 1):], tag))
        else:
            return super().receive(req)
        return {}

    def apply_encoder(self, mean: np.ndarray) -> None:
        self.global_encoder = self.global_encoder + torch.as_tensor(mean, dtype=torch.float32, device=self.rt.device)

    def apply_proxies(self, total: np.ndarray, tolerance: float) -> None:
        C, d = self.proxies.shape
        self.proxies = keep_absent(*classwise_result(total, C, d, tolerance), self.proxies)
        if self.cfg.dp_epsilon:         # a noisy class-weight total near zero can blow a row up: keep S bounded
            self.proxies = self.proxies.clamp(-DP_PROXY_BOUND, DP_PROXY_BOUND)

    def inputs(self):
        return self.data.x, self.data.edge_index

    def logits(self) -> torch.Tensor:
        return self.part.logits()

    @torch.no_grad()
    def evaluate(self, req: dict) -> dict:
        logits, c = self.logits(), self.data
        if self.teacher is None:
            self.teacher = copy.deepcopy(self.part.encoder)
        vector_to_parameters(self.global_encoder.clone(), self.teacher.parameters())
        teacher = accuracy(self.part.soft_targets(self.teacher, self.proxies)[0], c.y, c.test_mask)
        return {**{split: list(accuracy(logits, c.y, getattr(c, f"{split}_mask"))) for split in SPLITS},
                "minority": minority_report(logits, c, self.facts.num_classes), "teacher": list(teacher)}

    def state_dict(self) -> dict:
        return {**self.part.state_dict(), "global_encoder": self.global_encoder.cpu(), "proxies": self.proxies.cpu()}

    def load_state_dict(self, state: dict) -> None:
        self.part.load_state_dict(state)
        self.global_encoder = state["global_encoder"].to(self.rt.device)
        self.proxies = state["proxies"].to(self.rt.device)
        vector_to_parameters(self.global_encoder.clone(), self.part.encoder.parameters())


class FedSprayStrategy(MinorityAccuracy, ModelAveragingStrategy):
    """FedSpray's server: the encoder mean and the class-wise proxy mean (module docstring);
    ``minority_acc`` at the best-validation round (:class:`~secure_fgl.algorithms.minority.MinorityAccuracy`)."""

    personalized = True

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.fopts = FedSprayOptions(**options)
        self.personalized = True

    def setup(self) -> None:
        declare_dp_exchanges(self.protocol, self.cfg, self.name, self.fopts)

    def train_round(self, rnd: int) -> dict:
        self.round = rnd
        K = self.num_clients
        done = self.ask("local_update", {k: {"round": rnd} for k in self.sample_clients(rnd)})
        trained = sorted(k for k, r in done.items() if r["trained"])
        if not trained:
            return {"train_loss": 0.0, "clients_lost": len(self.lost)}
        dp, encoder, proxies = dp_request(self.cfg), f"{self.name}/encoder", f"{self.name}/proxies"
        spec = model_spec(len(trained), K, self.cfg.update_bound, grid=self.cfg.model_mean_on_grid)
        batch = round_spec(spec, self.fopts, dp, len(trained), K)
        if batch is not None:                # one upload per client (algorithms.fedspray.round_spec)
            length = sum_exchange(self, f"{self.name}/batch", rnd, trained, range(K), batch,
                                  {"tolerance": batch.tolerance})
            proxy_len = self.facts.num_classes * (self.fopts.proxy_dim + 1)
            self.protocol.transcript.attribute(f"{self.name}/batch", ((proxies, proxy_len),
                                                                      (encoder, length - proxy_len)))
            return {"train_loss": float(np.mean([done[k]["loss"] for k in trained])), "clients_lost": len(self.lost)}
        sum_exchange(self, encoder, rnd, trained, range(K), spec, dp=scoped(self, encoder, dp), dp_mean=True)
        if not self.fopts.ablate_proxy:
            sum_exchange(self, proxies, rnd, trained, range(K), PROXY_SPEC, dp=scoped(self, proxies, dp))
        return {"train_loss": float(np.mean([done[k]["loss"] for k in trained])), "clients_lost": len(self.lost)}

    def evaluate(self) -> dict:
        reports = self.ask("evaluate", {k: {} for k in self.alive()}, record=(EVAL_TAG, "plain"))
        out = accuracy_summary(reports)
        correct, total = (sum(int(r["teacher"][i]) for r in reports.values()) for i in (0, 1))
        out["teacher_test_acc"] = correct / total if total else 0.0
        return self.add_minority(out, {k: r["minority"] for k, r in reports.items()})
