"""Centralized training on the runtimes: the **non-federated reference**, one runtime holding the
whole graph.

Centralized (:mod:`secure_fgl.algorithms.centralized`) is the upper reference every federated
method is compared with: one model trained on the whole graph, no exchange.  It has no party
split to preserve, so it maps honestly onto a single :class:`~.client.ClientRuntime` (host 0)
whose set-up frame is the **whole graph** -- every client's nodes, features, labels and edges,
pooled, as a central data holder would have them -- plus the client owning each node, kept only
to break the evaluation down per client (``per_client`` and the client-mean accuracies are
comparable with the federated runs).  The runtime trains exactly as the in-process algorithm
(same seed, initialisation, per-step generator of "client 0"); the strategy only tells it to
train and asks for its counts (one ``eval/counts`` message per evaluation).  Nothing here is
private: it is what a federation avoids.
"""
from __future__ import annotations

import copy

import torch
from torch_geometric.utils import subgraph

from ..algorithms.base import SPLITS, accuracy, accuracy_summary
from ..algorithms.options import CentralizedOptions
from ..data.federated import ClientSubgraph
from ..models.centring import centre_first_layer
from .client import client_frame
from ..algorithms.fedavg.client import ModelAveragingLogic
from .strategy import EVAL_TAG, Strategy


class CentralizedLogic(ModelAveragingLogic):
    """The one runtime: FedAvg's local training on the whole graph, never exchanging."""

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        if CentralizedOptions(**options).center:         # the model sees x - mean(x), no centred copy
            centre_first_layer(self.model, self.data.x.mean(0, keepdim=True))

    def attack_state(self, req: dict) -> dict:
        """Client ``req["client"]``'s share of the one model (the attack suite's view of a client):
        the posteriors of the nodes it owns, computed on the whole graph (what the model answers for
        them); its own data, inputs and queries on the subgraph of the nodes it owns and the edges
        among them (what a client deploying the model serves)."""
        k = req.get("client")
        if k is None:
            return super().attack_state(req)
        keep = self.rt.owner.to(self.data.y.device) == int(k)
        if req["what"] == "posteriors":
            return {name: v[keep] for name, v in super().attack_state(req).items()}
        view = copy.copy(self)
        view.data = owned_subgraph(self.data, keep, int(k))
        return super(CentralizedLogic, view).attack_state(req)

    @torch.no_grad()
    def evaluate(self, req: dict) -> dict:
        """Counts per owning client (nodes no client keeps are left out, as in the federation)."""
        logits, c, owner = self.logits(), self.data, self.rt.owner.to(self.data.y.device)
        return {"per_client": {str(k): {s: list(accuracy(logits, c.y, getattr(c, f"{s}_mask") & (owner == k)))
                                        for s in SPLITS} for k in range(self.facts.num_clients)}}


def owned_subgraph(g: ClientSubgraph, keep: torch.Tensor, client: int) -> ClientSubgraph:
    """The nodes of ``g`` where ``keep`` holds and the edges among them, relabelled in node order
    (the subgraph the partition hands that client)."""
    edge_index, _ = subgraph(keep, g.edge_index, relabel_nodes=True, num_nodes=g.num_nodes)
    return ClientSubgraph(client, g.global_ids[keep], g.x[keep], g.y[keep], edge_index, g.train_mask[keep],
                          g.val_mask[keep], g.test_mask[keep], g.edge_index.new_empty(2, 0))


class CentralizedStrategy(Strategy):
    """Drives the one runtime: train a round, ask for the counts."""

    personalized = False
    dp_on_runtimes = True          # nothing is released, as inline

    @classmethod
    def client_frames(cls, fed, cfg, facts, options: dict, party_setup: bytes | None) -> dict[int, bytes]:
        g, n = fed.graph, int(fed.graph.num_nodes)
        whole = ClientSubgraph(0, torch.arange(n), g.x, g.y, g.edge_index, g.train_mask, g.val_mask, g.test_mask,
                               g.edge_index.new_empty(2, 0))
        return {0: client_frame(whole, whole.cross_edges[1], cfg, facts, options, party_setup, owner=fed.owner)}

    @property
    def hosts(self) -> list[int]:
        return [0]

    def host_of(self, client: int) -> int:
        return 0

    def train_round(self, rnd: int) -> dict:
        self.round = rnd
        done = self.ask("local_update", {0: {"round": rnd}})
        self.check_lost([0], f"round {rnd}")
        return {"train_loss": float(done[0]["loss"]), "clients_lost": len(self.lost)}

    def evaluate(self) -> dict:
        counts = self.ask("evaluate", {0: {}}, record=(EVAL_TAG, "plain"))
        self.check_lost([0], "the evaluation")
        return accuracy_summary({int(k): v for k, v in counts[0]["per_client"].items()})
