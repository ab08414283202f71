"""Gradient inversion of one client's GIN update in federated graph classification.

Target: GCFL and its baselines (Xie et al., NeurIPS 2021), whose clients upload the update
``dW_v`` of the *shared GIN layers only*; the input layer, the ``post`` layer and the
classifier stay on the client.  In plain mode the server reads ``dW_v`` (the grid-mean upload
``[Q(w dW_v / 4), F(w / 4)]`` of :mod:`secure_fgl.algorithms.grid_mean`, so ``dW_v`` is the
first part over the last entry) and the cluster mean it sent back.

Attack (DLG, Zhu et al. 2019, with soft labels; cosine matching as Inverting Gradients,
Geiping et al. 2020): the server optimises dummy node features (a softmax over the feature
dimension per node: TU node labels are one-hot) and soft graph labels of the victim's
training graphs so that the negative gradient of the mean cross-entropy w.r.t. the shared
layers, at the round's start parameters, has the direction of ``dW_v``.

Declared knowledge (the attacker's setting; everything beyond the transcript is a stated
assumption, chosen to make the attack strong, so its result is an upper bound for a server
that lacks it):

* ``victim_graphs`` (K2): the structure of the victim's training graphs (edges, node counts),
  not their features or labels;
* ``victim_model`` (K3): the victim's model after the run.  Its private layers stand in for
  the ones of the attacked (last) round -- within one local round of them; its shared layers
  minus the cluster mean the server sent back are that round's start parameters.

What the real update is and the simulation is not: ``local_epochs`` of mini-batch Adam with
persistent moments and dropout 0.5 (a client with more than ``batch_size`` training graphs
takes several steps); the simulation is one full-batch gradient without dropout.  Scored: the
share of graphs whose label is recovered (chance: the victim's majority label share), the
share of nodes whose feature category is recovered (chance: its majority category share; only
for one-hot features) and the total variation between the recovered and the true label
distribution (baseline: the uniform guess).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols.transcript import SERVER, client_party

from .base import Attack, AttackResult, GroundTruth, View, dense_vector, tv_distance
from .significance import proportion_estimate

__all__ = ["GRAPH_ALGORITHMS", "read_round", "invert_gin_update", "GINUpdateInversion"]

EXCHANGE = "*/model"
#: graph-classification algorithms whose clients upload GIN-layer updates
GRAPH_ALGORITHMS = ("gc-fedavg", "gc-fedprox", "gcfl", "gcflplus")


def read_round(view: View, tag: str, victim: int, num_shared: int) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(round, dW_v, mean sent to v)`` of the latest round whose payloads the view can read."""
    party = client_party(victim)
    rnd = view.latest_round(tag, sender=party, receiver=SERVER)
    if rnd is None:
        return None
    up = [view.payload(m) for m in view.select(tag, sender=party, receiver=SERVER, round=rnd)]
    down = [view.payload(m) for m in view.select(tag, sender=SERVER, receiver=party, round=rnd)]
    up = [dense_vector(p, num_shared + 1) for p in up if p is not None]
    down = [dense_vector(p, num_shared + 1) for p in down if p is not None]
    if not up or not down or up[0] is None or down[-1] is None or up[0][-1] <= 0 or down[-1][-1] <= 0:
        return None
    return rnd, up[0][:-1] / up[0][-1], down[-1][:-1] / down[-1][-1]  # the last download is the one applied


def invert_gin_update(
    model: torch.nn.Module,
    start: torch.Tensor,
    target: torch.Tensor,
    graphs: list[tuple[torch.Tensor, int]],
    num_features: int,
    num_classes: int,
    *,
    iterations: int = 200,
    lr: float = 0.1,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Dummy node features and graph labels whose gradient direction matches ``target``.

    ``graphs``: ``(edge_index, num_nodes)`` of every training graph.  Returns
    ``(node feature probabilities [N, d], label probabilities [G, C])``.
    """
    model = copy.deepcopy(model).cpu().eval()  # no dropout in the simulation
    shared = list(model.convs.parameters())
    vector_to_parameters(start.clone(), shared)
    shared_ids = {id(p) for p in shared}
    for p in model.parameters():
        p.requires_grad_(id(p) in shared_ids)
    sizes = torch.tensor([n for _, n in graphs])
    offsets = torch.cumsum(sizes, 0) - sizes
    edge_index = torch.cat([e + o for (e, _), o in zip(graphs, offsets)], 1)
    batch = torch.repeat_interleave(torch.arange(len(graphs)), sizes)
    gen = torch.Generator().manual_seed(seed)
    zx = (0.01 * torch.randn(int(sizes.sum()), num_features, generator=gen)).requires_grad_(True)
    zy = (0.01 * torch.randn(len(graphs), num_classes, generator=gen)).requires_grad_(True)
    opt = torch.optim.Adam([zx, zy], lr=lr)
    target = target.float()
    for _ in range(iterations):
        opt.zero_grad()
        out = model(torch.softmax(zx, -1), edge_index, batch)
        loss = -(torch.softmax(zy, -1) * F.log_softmax(out, -1)).sum(-1).mean()
        grad = parameters_to_vector(torch.autograd.grad(loss, shared, create_graph=True))
        (1.0 - F.cosine_similarity(-grad, target, dim=0)).backward()
        opt.step()
    return torch.softmax(zx, -1).detach().numpy(), torch.softmax(zy, -1).detach().numpy()


class GINUpdateInversion(Attack):
    """The server inverts one client's plaintext GIN-layer update (module docstring)."""

    name = "gin_gradient_inversion"
    exchange = EXCHANGE
    knowledge = ("public", "victim_graphs", "victim_model")
    algorithms = GRAPH_ALGORITHMS
    options = {"victim": 0, "iterations": 200, "lr": 0.1}

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Invert the victim's GIN-layer update from the round-start model (final model minus its cluster mean)."""
        pub, graphs, model = knowledge["public"], knowledge["victim_graphs"], knowledge["victim_model"]
        tags = view.tags(self.exchange)
        read = read_round(view, tags[0], int(self.opts["victim"]), int(pub["num_shared"])) if tags else None
        if read is None:
            return self.not_applicable("the victim's update and its cluster mean are not readable by the server")
        rnd, update, mean = read
        final = parameters_to_vector(model.convs.parameters()).detach().double()
        start = (final - torch.as_tensor(mean)).float()
        feats, labels = invert_gin_update(
            model,
            start,
            torch.as_tensor(update),
            graphs["structure"],
            graphs["num_features"],
            graphs["num_classes"],
            iterations=int(self.opts["iterations"]),
            lr=float(self.opts["lr"]),
            seed=int(self.opts["victim"]),
        )
        return self.result(
            output={"features": feats, "labels": labels, "client": graphs["client"]},
            metrics={"round": rnd, "num_graphs": len(graphs["structure"]), "num_nodes": int(feats.shape[0])},
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Graph-label accuracy (chance: majority class), label-share TV distance and one-hot feature accuracy."""
        client = truth.clients[res.output["client"]]
        y = np.array([int(g.y.view(-1)[0]) for g in client.train])
        x = torch.cat([g.x for g in client.train]).numpy()
        guess = res.output["labels"].argmax(1)
        counts = np.bincount(y, minlength=client.num_classes)
        res.add(
            proportion_estimate(
                "label_acc",
                float((guess == y).sum()),
                int(y.size),
                float(counts.max() / y.size),
                chance_method="baseline (majority class)",
            ),
            primary=True,
        )
        m = res.metrics
        m["label_tv"] = tv_distance(res.output["labels"].mean(0), counts / y.size)
        m["label_tv_uniform"] = tv_distance(np.full(client.num_classes, 1.0 / client.num_classes), counts / y.size)
        if np.allclose(x.sum(1), 1.0) and ((x == 0) | (x == 1)).all():  # one-hot node features
            cats = x.argmax(1)
            m["feature_acc"] = float((res.output["features"].argmax(1) == cats).mean())
            m["feature_chance"] = float(np.bincount(cats).max() / cats.size)
        return res
