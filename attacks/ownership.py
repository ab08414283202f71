"""Node-to-client ownership inference from the model updates (after CC-MIA, arXiv 2507.19964).

Which client holds node ``v``?  The server reads each client's update ``u_k`` of the latest round
(plain mode) and the round's start parameters ``w`` (the released model minus the mean update).
A training node's loss gradient ``g_v = grad_w CE(f_w(X, A)_v, y_v)`` is a summand of its
client's update (SGD: ``u_k = -lr sum_t mean_{v in k} g_v``; Adam rescales it per coordinate), so
the owner is guessed as ``argmax_k cos(g_v, -u_k) - mean_t cos(g_t, -u_k)`` over the first layer's
weights (where a node's own words, aggregated over its neighbourhood, concentrate its gradient;
the mean over the targets ``t`` removes what every node's gradient shares).  The attacker holds K1 knowledge: the
features, graph and labels of a labelled node sample (``aux_labelled``); the targets are those
nodes.  Metrics (scored on the targets that are some client's training nodes, the ones whose
gradients entered an update): ownership accuracy (chance: a random pairing of guesses and owners,
``sum_k P(guess = k) P(owner = k)``) and the AUC of the true owner's score against the other
clients' scores (chance 1/2).  Both intervals are cluster bootstraps over the owning clients: a
client's nodes are neighbours whose gradients and errors are correlated, so whole clients are
resampled (``attacks.significance.cluster_proportion_estimate``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols.transcript import SERVER

from .base import Attack, AttackResult, GroundTruth, View
from .gradient import (
    EXCHANGE,
    first_weight,
    model_tag,
    read_aggregate,
    read_uploads,
    round_start_params,
    split_weighted,
)
from .significance import auc_estimate, cluster_proportion_estimate, matching_chance


class OwnershipInference(Attack):
    """Server guesses each target node's client from the alignment of its gradient with the updates."""

    name = "ownership"
    exchange = EXCHANGE
    default_observer = SERVER
    knowledge = ("public", "architecture", "released_model", "aux_labelled")
    algorithms = ("fedavg", "fedprox")
    options = {"targets": 1000, "seed": 0}

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Score each target node against each client by the cosine of its loss gradient with the client's update.

        Scores are centred per client, so an offset common to every node does not count.
        """
        pub = knowledge["public"]
        tag = model_tag(view, self.exchange)
        if tag is None:
            return self.not_applicable("no model exchange in the transcript")
        released = parameters_to_vector(knowledge["released_model"].parameters()).detach().cpu().double()
        P = released.numel()
        rnd = view.latest_round(tag)
        ups = read_uploads(view, tag, rnd, P) if rnd is not None else {}
        if len(ups) < 2:
            return self.not_applicable(f"fewer than two client updates of {tag} are readable by the server")
        total = read_aggregate(view, tag, rnd, P)
        if total is None:
            total = np.sum(list(ups.values()), axis=0)
        start = round_start_params(released, total, pub, len(ups))
        clients = sorted(ups)
        U = torch.as_tensor(np.stack([split_weighted(ups[k], pub)[0] for k in clients]), dtype=torch.float32)
        model = knowledge["architecture"]()
        loc = first_weight(model, int(pub["num_features"]))
        part = slice(loc[0], loc[0] + loc[1]) if loc is not None else slice(None)
        aux = knowledge["aux_labelled"]
        ids, y = np.asarray(aux["ids"]), np.asarray(aux["y"])
        rng = np.random.default_rng(int(self.opts["seed"]))
        pick = np.sort(rng.choice(ids.size, min(ids.size, int(self.opts["targets"])), replace=False))
        vector_to_parameters(start.float(), model.parameters())
        model.eval()
        params = list(model.parameters())
        logits = model(torch.as_tensor(aux["x"], dtype=torch.float32), torch.as_tensor(aux["edge_index"]))
        logits = logits[0] if isinstance(logits, tuple) else logits
        scores = np.zeros((pick.size, len(clients)))
        for i, j in enumerate(pick):
            loss = F.cross_entropy(logits[int(ids[j])][None], torch.as_tensor([int(y[j])]))
            g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, params, retain_graph=True)])
            scores[i] = F.cosine_similarity(-U[:, part], g[None, part], dim=1).detach().numpy()
        scores -= scores.mean(0, keepdims=True)  # a client's offset common to every node says nothing of v
        return self.result(output={"ids": ids[pick], "clients": np.asarray(clients), "scores": scores, "round": rnd})

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Accuracy of the best-aligned client as the owner of the member targets (chance: matching), and owner AUC."""
        out = res.output
        ids, clients, S = out["ids"], out["clients"], out["scores"]
        member = truth.train_mask[ids] & np.isin(truth.owner[ids], clients)
        owner = truth.owner[ids][member]
        guess = clients[S[member].argmax(1)]
        chance = matching_chance(guess, owner) if owner.size else None
        res.add(cluster_proportion_estimate("ownership_acc", guess == owner, owner, chance), primary=True)
        is_owner = clients[None, :] == owner[:, None]
        groups = np.repeat(owner, clients.size)
        res.add(auc_estimate("owner_auc", S[member].ravel(), is_owner.ravel(), groups=groups))
        res.metrics.update(
            {
                "round": out["round"],
                "targets": int(ids.size),
                "member_targets": int(member.sum()),
                "clients": int(clients.size),
            }
        )
        return res


class RequestOwnership(Attack):
    """Server reads which client owns each node off FedGCN's sparse download requests.

    In the sparse layout each client asks for the row blocks holding its own nodes' rows (and, at
    2 hops, their neighbours'); a block holds ``R = block_len / (d + 1)`` consecutive row ids, which
    are node ids under ``row_order='given'``.  The server guesses node ``v``'s owner among the
    clients that requested ``v``'s block (ties broken at random).  ``--layout dense`` (every client
    requests every block) leaves it at chance; with a private row numbering (``row_order`` other
    than ``given``) the server cannot map blocks to nodes and the attack says so.  Intervals:
    cluster bootstrap over the owning clients, as for :class:`OwnershipInference`.
    """

    name = "ownership_requests"
    exchange = "fedgcn/*"
    default_observer = SERVER
    knowledge = ("public",)
    algorithms = ("fedgcn",)
    options = {"seed": 0}

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Score each node by the clients that request its row block (not applicable under a private row order)."""
        pub = knowledge["public"]
        order = str((pub.get("options") or {}).get("row_order", "given"))
        if order != "given":
            return self.not_applicable(f"row_order {order!r}: the row numbering is private to the clients")
        plans = [
            m.payload
            for m in view.select("fedgcn/*", kinds=("control",))
            if isinstance(m.payload, Mapping) and "requests" in m.payload and not m.tag.endswith("/model")
        ]
        if not plans:
            return self.not_applicable("no row-exchange plan with download requests reached the server")
        requests: dict[int, set] = {}
        for p in plans:
            for k, blocks in p["requests"].items():
                requests.setdefault(int(k), set()).update(int(b) for b in np.asarray(blocks).ravel())
        rpb = max(1, int(plans[0]["block_len"]) // int(pub["row_width"]))
        N, clients = int(pub["num_nodes"]), sorted(requests)
        block = np.arange(N) // rpb
        asked = np.array([[b in requests[k] for k in clients] for b in block], dtype=float)
        scores = asked / np.maximum(asked.sum(1, keepdims=True), 1.0)
        return self.result(
            output={
                "clients": np.asarray(clients),
                "scores": scores,
                "rows_per_block": rpb,
                "layout": str(plans[0].get("layout")),
            }
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Owner accuracy (ties broken at random; chance: matching) and owner AUC of the request scores."""
        out = res.output
        clients, S = out["clients"], out["scores"]
        kept = np.flatnonzero(np.isin(truth.owner, clients))
        owner = truth.owner[kept]
        rng = np.random.default_rng(int(self.opts["seed"]))
        noisy = S[kept] + rng.random(S[kept].shape) * 1e-9  # ties broken at random
        guess = clients[noisy.argmax(1)]
        res.add(
            cluster_proportion_estimate("ownership_acc", guess == owner, owner, matching_chance(guess, owner)),
            primary=True,
        )
        is_owner = clients[None, :] == owner[:, None]
        res.add(auc_estimate("owner_auc", S[kept].ravel(), is_owner.ravel(), groups=np.repeat(owner, clients.size)))
        res.metrics.update({"rows_per_block": out["rows_per_block"], "layout": out["layout"]})
        return res
