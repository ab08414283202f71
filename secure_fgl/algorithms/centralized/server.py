"""Centralized training on the runtimes: the **non-federated reference**, one runtime holding the whole graph.

Centralized (:mod:`secure_fgl.algorithms.centralized`) is the upper reference every federated
method is compared with: one model trained on the whole graph, no exchange.  It has no party
split to preserve, so it maps honestly onto a single :class:`~.client.ClientRuntime` (host 0)
whose set-up frame is the **whole graph** -- every client's nodes, features, labels and edges,
pooled, as a central data holder would have them -- plus the client owning each node, kept only
to break the evaluation down per client (``per_client`` and the client-mean accuracies are
comparable with the federated runs).  The runtime trains as FedAvg's client with the seed's
initialisation and the per-step generator of "client 0"; the strategy only tells it to
train and asks for its counts (one ``eval/counts`` message per evaluation).  Nothing here is
private: it is what a federation avoids.
"""

from __future__ import annotations

import torch

from ...data.federated import ClientSubgraph
from ...runtime.client import client_frame
from ...runtime.messages import EvaluateIns, FitIns
from ...runtime.strategy import EVAL_TAG, Strategy
from ..base import accuracy_summary


class CentralizedStrategy(Strategy):
    """Drives the one runtime: train a round, ask for the counts."""

    personalized = False

    @classmethod
    def client_frames(cls, fed, cfg, facts, options: dict, party_setup: bytes | None) -> dict[int, bytes]:
        """One runtime holding the whole graph (the centralised reference: no cross-client edges)."""
        g, n = fed.graph, int(fed.graph.num_nodes)
        whole = ClientSubgraph(
            0,
            torch.arange(n),
            g.x,
            g.y,
            g.edge_index,
            g.train_mask,
            g.val_mask,
            g.test_mask,
            g.edge_index.new_empty(2, 0),
        )
        return {0: client_frame(whole, whole.cross_edges[1], cfg, facts, options, party_setup, owner=fed.owner)}

    @property
    def hosts(self) -> list[int]:
        """The single runtime, 0."""
        return [0]

    def host_of(self, client: int) -> int:
        """Runtime 0 holds every node."""
        return 0

    def train_round(self, rnd: int) -> dict:
        """One local update of the single runtime on the whole graph."""
        self.round = rnd
        done = self.ask("local_update", {0: FitIns(rnd)})
        self.check_lost([0], f"round {rnd}")
        return {"train_loss": float(done[0].loss), "clients_lost": len(self.lost)}

    def evaluate(self) -> dict:
        """Accuracies of the single model, per original client."""
        counts = self.ask("evaluate", {0: EvaluateIns()}, record=(EVAL_TAG, "plain"))
        self.check_lost([0], "the evaluation")
        return accuracy_summary({int(k): v for k, v in counts[0].counts["per_client"].items()})
