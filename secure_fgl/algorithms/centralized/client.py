"""The centralized reference's one runtime.

FedAvg's local training on the whole graph, never exchanging; the attack suite's view of each client
(:meth:`CentralizedLogic.attack_state`).
"""

from __future__ import annotations

import copy

import torch
from torch_geometric.utils import subgraph

from ...data.federated import ClientSubgraph
from ...models.centring import centre_first_layer
from ...runtime.messages import AttackIns, EvaluateIns, EvaluateRes, StateRes
from ..base import SPLITS, accuracy
from ..fedavg.client import ModelAveragingLogic
from ..options import CentralizedOptions


class CentralizedLogic(ModelAveragingLogic):
    """The one runtime: FedAvg's local training on the whole graph, never exchanging."""

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        if CentralizedOptions(**options).center:  # the model sees x - mean(x), no centred copy
            centre_first_layer(self.model, self.data.x.mean(0, keepdim=True))

    def attack_state(self, req: AttackIns) -> StateRes:
        """Client ``req.client``'s share of the one model, for the attack suite.

        Client ``req.client``'s share of the one model (the attack suite's view of a client):
        the posteriors of the nodes it owns, computed on the whole graph (what the model answers for
        them); its own data, inputs and queries on the subgraph of the nodes it owns and the edges
        among them (what a client deploying the model serves).
        """
        k = req.client
        if k is None:
            return super().attack_state(req)
        keep = self.rt.owner.to(self.data.y.device) == int(k)
        if req.what == "posteriors":
            return StateRes({name: v[keep] for name, v in super().attack_state(req).state.items()})
        view = copy.copy(self)
        view.data = owned_subgraph(self.data, keep, int(k))
        return super(CentralizedLogic, view).attack_state(req)

    @torch.no_grad()
    def evaluate(self, req: EvaluateIns) -> EvaluateRes:
        """Counts per owning client (nodes no client keeps are left out, as in the federation)."""
        logits, c, owner = self.logits(), self.data, self.rt.owner.to(self.data.y.device)
        return EvaluateRes(
            {
                "per_client": {
                    str(k): {s: list(accuracy(logits, c.y, getattr(c, f"{s}_mask") & (owner == k))) for s in SPLITS}
                    for k in range(self.facts.num_clients)
                }
            }
        )


def owned_subgraph(g: ClientSubgraph, keep: torch.Tensor, client: int) -> ClientSubgraph:
    """The subgraph of ``g`` induced by the nodes where ``keep`` holds.

    The nodes of ``g`` where ``keep`` holds and the edges among them, relabelled in node order
    (the subgraph the partition hands that client).
    """
    edge_index, _ = subgraph(keep, g.edge_index, relabel_nodes=True, num_nodes=g.num_nodes)
    return ClientSubgraph(
        client,
        g.global_ids[keep],
        g.x[keep],
        g.y[keep],
        edge_index,
        g.train_mask[keep],
        g.val_mask[keep],
        g.test_mask[keep],
        g.edge_index.new_empty(2, 0),
    )
