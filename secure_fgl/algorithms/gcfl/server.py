"""GCFL and GCFL+ (Xie et al., NeurIPS 2021, sec. 4-5) as a client logic and a server strategy.

The server's decisions are :class:`~secure_fgl.algorithms.gcfl.GCFLServer`'s (clusters, eq. 4-5,
Stoer-Wagner cut, the cache behind ``test_acc_best_cached``); the strategy plays its hooks over
the executor, so the server sees only what the clients send:

* the cluster mean: :class:`~.graph_level.GraphStrategy`'s grid sum to the members only (with
  ``--mean-norm unweighted`` a second one, equal weights, tag ``<algorithm>/criterion_mean``,
  whose norm each member reports for eq. 4);
* the norms, once every cluster's mean is out: each client reports, in ONE message (batch tag
  ``<algorithm>/norms``, bytes attributed to the part tags), the norm of the mean it decoded
  (``<algorithm>/mean_norm``; ``delta_mean`` of eq. 4 is the first member's), its ``||dW_i||``
  (``<algorithm>/update_norms``; eq. 5's ``delta_max``) and, GCFL+, its last gradient norm of the
  shared layers (``<algorithm>/grad_norms``).  The values are in the clear (the documented leak
  of the decision rule, :mod:`protocols.similarity`), sent by the client's protocol half as one
  signed message of a report exchange (:mod:`protocols.report`);
* GCFL's update similarity, the cosine matrix of the members' updates (``<algorithm>/similarity``),
  only when eq. 4-5 fire: an exchange of the halves (:mod:`protocols.similarity_exchange`) --
  ``plain``: each member's half sends its update;
  ``ckks``: the decider's half (``--decider``) makes a fresh key pair and keeps the secret key,
  each member's half encrypts its normalised update under the key the decider signed, the
  server half evaluates the inner products, the decider's half decrypts only the pair values.
"""

from __future__ import annotations

import numpy as np

from protocols.batch import report_parts
from protocols.report import collect_reports
from protocols.similarity_exchange import similarity_over_halves

from ...runtime.messages import ContributeIns
from ...runtime.strategy import Strategy
from ..graph_level.ops import last_round_metrics
from ..graph_level.server import GraphStrategy
from ..options import GCFLOptions, GCFLPlusOptions
from .ops import GCFLPlusServer, GCFLServer


class GCFLStrategy(GraphStrategy, GCFLServer):
    """GCFL's server over the executor (module docstring)."""

    options_class = GCFLOptions

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.opts = self.options_class(**options)
        self.init_clusters(facts.num_clients)

    def cluster_round(self, rnd: int, updated: list[int]) -> None:
        """One round of clustered FedAvg with GCFL's split criterion."""
        self.split_clusters(rnd, updated)

    # ------------------------------------------------------------------ GCFLServer's hooks
    def exchange_unweighted_mean(self, rnd: int, members: list[int]) -> None:
        """The members' unweighted mean update (the criterion of eq. 4), as an exchange."""
        self.exchange_mean(rnd, members, tag=f"{self.name}/criterion_mean")

    def round_norms(self, rnd: int, clusters: list[list[int]], means=None) -> dict[str, dict[int, float]]:
        """Every client's norms in one clear-text report, split into the part tags (:mod:`protocols.batch`)."""
        tag, parts = f"{self.name}/norms", list(self.norm_parts)
        names = [f"{self.name}/{p}" for p in parts]
        ask = ContributeIns(tag, rnd, config={"parts": parts})
        clients = [k for c in clusters for k in c]
        self.ask("contribute", {k: ask for k in clients})
        reports = collect_reports(self.protocol, tag, rnd, self.alive(clients), len(parts))
        values = report_parts(self.protocol, tag, names, reports)
        return {p: values[n] for p, n in zip(parts, names)}

    def update_similarity(self, rnd: int, members: list[int]) -> np.ndarray:
        """The members' cosine similarities, computed over their protocol halves with the decider.

        Raises:
            DropoutError: a member or the decider was lost.
        """
        tag = f"{self.name}/similarity"
        # the members' and the decider's halves run the exchange (protocols/similarity_exchange.py)
        sent = self.ask("contribute", {k: ContributeIns(tag, rnd) for k in members})
        self.check_lost(members + [int(self.opts.decider)], tag)
        return similarity_over_halves(
            self.protocol, tag, rnd, members, int(self.opts.decider), int(sent[members[0]].length)
        )

    # ------------------------------------------------------------------ reporting, checkpoints
    def final_metrics(self) -> dict:
        """Base metrics, the last round's per-cluster accuracies and the best cached accuracies."""
        last = self.evaluate()["per_client"]
        return {
            **Strategy.final_metrics(self),
            **last_round_metrics(last, self.clusters),
            **self.best_cached(self.num_clients),
        }

    def server_state(self) -> dict:
        """The cluster state."""
        return self.cluster_state()

    def load_server_state(self, state: dict) -> None:
        """Restore the cluster state."""
        self.load_cluster_state(state)


class GCFLPlusStrategy(GCFLStrategy, GCFLPlusServer):
    """GCFL+'s server: the cut on DTW of the reported gradient-norm sequences."""

    options_class = GCFLPlusOptions
