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

DP (``--dp-epsilon``; :mod:`.dp`): both exchanges are client-level
releases (``--dp-clip``, one per round, the budget split between the two).  The encoder mean is a
DP weighted mean (each client sends ``[w~ clip(u_k), w~ C]``, :func:`.sums.dp_mean_vector`); the
class-wise proxy vector is clipped whole to ``C`` on the client; each client adds its share of the
noise before its half encodes, and the recipients clamp the noisy ``S`` to ``+-DP_PROXY_BOUND``.
Evaluation: each client reports its counts, its minority counts
(:func:`~secure_fgl.algorithms.minority.minority_report`) and its teacher's test counts (the
global encoder with ``S`` on its test nodes), recorded as ``eval/counts`` messages.
"""

from __future__ import annotations

import numpy as np

from ...runtime.messages import EvaluateIns, FitIns
from ...runtime.strategy import EVAL_TAG
from ...runtime.sums import scoped, sum_exchange
from ..base import accuracy_summary, model_spec
from ..fedavg.server import ModelAveragingStrategy
from ..minority import MinorityAccuracy
from ..options import FedSprayOptions
from .ops import PROXY_SPEC, declare_dp_exchanges, dp_request, round_spec


class FedSprayStrategy(MinorityAccuracy, ModelAveragingStrategy):
    """FedSpray's server: the encoder mean and the class-wise proxy mean.

    See the module docstring. ``minority_acc`` at the best-validation round
    (:class:`~secure_fgl.algorithms.minority.MinorityAccuracy`).
    """

    personalized = True

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.fopts = FedSprayOptions(**options)
        self.personalized = True

    def setup(self) -> None:
        """Declare the DP exchanges of the run."""
        declare_dp_exchanges(self.protocol, self.cfg, self.name, self.fopts)

    def train_round(self, rnd: int) -> dict:
        """Local updates, then the encoder and proxy exchanges (one batched upload when they fit together)."""
        self.round = rnd
        K = self.num_clients
        done = self.ask("local_update", {k: FitIns(rnd) for k in self.sample_clients(rnd)})
        trained = sorted(k for k, r in done.items() if r.trained)
        if not trained:
            return {"train_loss": 0.0, "clients_lost": len(self.lost)}
        dp, encoder, proxies = dp_request(self.cfg), f"{self.name}/encoder", f"{self.name}/proxies"
        spec = model_spec(len(trained), K, self.cfg.update_bound, grid=self.cfg.model_mean_on_grid)
        batch = round_spec(spec, self.fopts, dp, len(trained), K)
        if batch is not None:  # one upload per client (algorithms.fedspray.round_spec)
            length = sum_exchange(
                self, f"{self.name}/batch", rnd, trained, range(K), batch, {"tolerance": batch.tolerance}
            )
            proxy_len = self.facts.num_classes * (self.fopts.proxy_dim + 1)
            self.protocol.transcript.attribute(
                f"{self.name}/batch", ((proxies, proxy_len), (encoder, length - proxy_len))
            )
            return {"train_loss": float(np.mean([done[k].loss for k in trained])), "clients_lost": len(self.lost)}
        sum_exchange(self, encoder, rnd, trained, range(K), spec, dp=scoped(self, encoder, dp), dp_mean=True)
        if not self.fopts.ablate_proxy:
            sum_exchange(self, proxies, rnd, trained, range(K), PROXY_SPEC, dp=scoped(self, proxies, dp))
        return {"train_loss": float(np.mean([done[k].loss for k in trained])), "clients_lost": len(self.lost)}

    def evaluate(self) -> dict:
        """Accuracy summary plus the teacher's test accuracy and the minority-class accuracies."""
        asked = self.ask("evaluate", {k: EvaluateIns() for k in self.alive()}, record=(EVAL_TAG, "plain"))
        reports = {k: r.counts for k, r in asked.items()}
        out = accuracy_summary(reports)
        correct, total = (sum(int(r["teacher"][i]) for r in reports.values()) for i in (0, 1))
        out["teacher_test_acc"] = correct / total if total else 0.0
        return self.add_minority(out, {k: r["minority"] for k, r in reports.items()})
