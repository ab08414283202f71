"""Graph classification as a client logic and a server strategy.

Graph classification (gc-selftrain, gc-fedavg, gc-fedprox; the baselines of GCFL, Xie et al.,
NeurIPS 2021, sec. 6.1) as a client logic and a server strategy.

Client (:class:`GraphLogic`): one client's graphs and its
:class:`~secure_fgl.algorithms.graph_level.GraphLearner` (GIN with shared GIN layers and local
input/``post``/classifier layers, Adam, its own generators).  For the model exchange of a
cluster (tag ``<algorithm>/model``) it contributes ``[Q(w dW / 4), F(w / 4)]`` on the grid of
:mod:`~secure_fgl.algorithms.grid_mean` (``dW`` its update of the shared layers, ``w = n_k / N``
with ``N`` the public number of training graphs), receives the sum decoded by its own protocol
half, keeps the mean ``S[:-1] / S[-1]``, and applies it when the server says so (tag
``<algorithm>/apply``).  At evaluation only counts leave it.

Server (:class:`GraphStrategy`): FedAvg within each cluster (one cluster here; GCFL splits it,
:mod:`.gcfl`): the members' grid sum through the protocol to the members only, then "apply".
gc-selftrain only trains.  The per-client rows of the evaluation are built from the counts and
the public facts (:class:`~.facts.GraphFacts`: dataset and split sizes of every client).
"""

from __future__ import annotations

import dataclasses

from protocols import DropoutError

from ...dpsgd import stage_request
from ...runtime.exchange import plan_dense, run_server_half
from ...runtime.messages import ContributeIns, EvaluateIns, FitIns, ReceiveIns
from ...runtime.strategy import EVAL_TAG, Strategy
from ..base import train_loss_of
from ..fedavg.server import ModelAveragingStrategy
from ..grid_mean import GRID_SPEC
from .ops import check_graph_dp, dpsgd_release_dependencies, dpsgd_tag, graph_summary, last_round_metrics


class GraphStrategy(ModelAveragingStrategy):
    """FedAvg of the shared GIN layers within clusters.

    See the module docstring. Client sampling is :meth:`ModelAveragingStrategy.sample_clients`.
    """

    personalized = True

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.aggregate_models = cfg.algorithm != "gc-selftrain"
        self.clusters: list[list[int]] = [list(range(facts.num_clients))]
        self.last_eval: list[dict | None] | None = None
        check_graph_dp(self.name, cfg, bool(options.get("dpsgd")))
        #: ``--dpsgd``: the DP tag of the steps and its request
        self.dpsgd = (
            (dpsgd_tag(self.name), stage_request(cfg.dp_clip, cfg.rounds, cfg.local_epochs))
            if options.get("dpsgd")
            else None
        )
        if self.dpsgd is not None and protocol.dp.config.budget_shares is None:
            protocol.dp.declare(self.dpsgd[0])

    def release_dependencies(self) -> dict[str, set[str]]:
        """Which DP releases depend on which (DP-SGD runs only)."""
        return dpsgd_release_dependencies(self.name) if self.dpsgd is not None else {}

    def release_units(self) -> dict[str, str]:
        """DP-SGD steps protect one training graph (a sample)."""
        return {self.dpsgd[0]: "sample"} if self.dpsgd is not None else {}

    def local_update_request(self, rnd: int, tag: str | None = None) -> FitIns:
        """With ``--dpsgd``: count this round's epochs and tell the clients the noise std.

        With ``--dpsgd``: count this round's epochs (one release each: an epoch's batches are
        disjoint) and tell the clients each epoch's noise std.
        """
        ask = super().local_update_request(rnd, tag)
        if self.dpsgd is None:
            return ask
        dp_tag, request = self.dpsgd
        epochs = self.cfg.local_epochs
        return dataclasses.replace(
            ask,
            dpsgd_tag=dp_tag,
            dpsgd_std=[self.protocol.dp.local_release(dp_tag, rnd * epochs + e, request) for e in range(epochs)],
        )

    def train_round(self, rnd: int) -> dict:
        """Local updates of the sampled clients, then the cluster round when models are aggregated."""
        self.round = rnd
        self.round_info: dict = {}  # what the cluster round records (GCFL: eq. 4-5 per cluster)
        ask = self.local_update_request(rnd)
        done = self.ask("local_update", {k: ask for k in self.sample_clients(rnd)})
        if self.aggregate_models and done:
            self.cluster_round(rnd, sorted(done))
        losses = [r.loss for r in done.values() if r.loss is not None]
        return {
            **train_loss_of(done, losses),
            "num_clusters": len(self.clusters),
            "clients_lost": len(self.lost),
            **self.round_info,
        }

    def cluster_round(self, rnd: int, updated: list[int]) -> None:
        """Exchange and apply each cluster's mean over its updated members."""
        for members in self.clusters:
            members = [k for k in members if k in updated]
            if members:
                self.apply_mean(members, self.exchange_mean(rnd, members))

    # ------------------------------------------------------------------ the exchange of one cluster
    def exchange_mean(self, rnd: int, members: list[int], tag: str | None = None) -> None:
        """The members' grid sum through the protocol, delivered to the members only.

        Each member keeps the mean (:meth:`GraphLogic.receive`). A member lost before it contributed is left out.
        ``tag``: ``<algorithm>/model`` (FedAvg's weights) unless another mean of updates is meant.
        """
        tag = tag or f"{self.name}/model"
        sent = self.ask("contribute", {k: ContributeIns(tag, rnd) for k in members})
        if not sent:
            raise DropoutError(f"every member of {members} was lost: {sorted(self.lost)}", tag=tag, round=rnd)
        members = sorted(sent)  # a member lost in training is not a contributor
        length = int(next(iter(sent.values())).length)
        run_server_half(self.protocol, plan_dense(self.protocol, tag, rnd, members, members, length, GRID_SPEC))
        self.note_broadcast(tag, rnd)
        self.tell("receive", {k: ReceiveIns(tag, rnd, length) for k in members})

    def apply_mean(self, members: list[int], mean=None) -> None:
        """Tell the members to restart from the cluster mean they received."""
        self.tell("receive", {k: ReceiveIns(f"{self.name}/apply", self.round) for k in members})

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict:
        """:func:`~secure_fgl.algorithms.graph_level.graph_summary` of the clients' counts."""
        counts = self.ask("evaluate", {k: EvaluateIns() for k in self.alive()}, record=(EVAL_TAG, "plain"))
        f = self.facts
        out = graph_summary(
            [
                {"client": k, "dataset": f.datasets[k], "num_train": f.num_train[k], **counts[k].counts}
                for k in sorted(counts)
            ]
        )
        rows = {r["client"]: r for r in out["per_client"]}
        self.last_eval = [rows.get(k) for k in range(self.num_clients)]
        return out

    def final_metrics(self) -> dict:
        """Base metrics plus the last round's per-cluster accuracies."""
        return {**Strategy.final_metrics(self), **last_round_metrics(self.evaluate()["per_client"], self.clusters)}

    def server_state(self) -> dict:
        """The clusters."""
        return {"clusters": self.clusters}

    def load_server_state(self, state: dict) -> None:
        """Restore the clusters."""
        self.clusters = [list(c) for c in state["clusters"]]
