"""Federated graph classification: self-train, FedAvg and FedProx over per-client GINs.

The GIN layers are shared; these are the baselines of GCFL (Xie et al., NeurIPS 2021, sec. 6.1).

Every client holds :class:`~secure_fgl.models.gcfl_gin.GCFLGIN` (local input, ``post`` and
classifier layers; shared GIN layers, as the reference's ``serverGIN``) and trains it on
mini-batches of its graphs (``torch_geometric.loader.DataLoader``, ``batch_size`` graphs,
shuffled by the client's own generator), ``--local-epochs`` epochs a round.  One client's
side is a :class:`GraphLearner`; the algorithm object holds one per client, a client runtime
(:mod:`secure_fgl.algorithms.graph_level.client`) holds its own.

Aggregation is per *cluster* of clients (one cluster for FedAvg/FedProx; GCFL splits it):
each member ``i`` sends its update of the shared layers ``dW_i = W_i - W_c`` through the
protocol's weighted mean with weight ``n_i / N`` (training graphs over all training
graphs), and every member restarts from ``W_c + sum_i n_i dW_i / sum_i n_i`` (FedAvg,
McMahan et al., 2017).  FedProx adds ``mu/2 ||W - W_c||^2`` on the shared layers only, as
the reference ``_prox_term`` (Li et al., MLSys 2020, eq. 2).

Evaluation: each client's accuracy on its own validation and test graphs with its own
model (the one of its cluster, with its local layers); the training accuracy is the
running accuracy of the last local epoch (as the reference's ``train_gc``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch_geometric.loader import DataLoader

from ...data.graph_classification import GraphClient
from ...engine import rng
from ...models.gcfl_gin import GCFLGIN
from ...validation import ConfigError
from ..options import GraphOptions, GraphProxOptions

__all__ = [
    "GraphOptions",
    "GraphProxOptions",
    "GraphLearner",
    "graph_summary",
    "initial_shared",
]


def initial_shared(cfg) -> torch.Tensor:
    """The shared GIN layers every client starts from.

    Those of a GIN built under the run seed (their shapes depend only on ``hidden`` and ``num_layers``, not on any
    client's data).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return parameters_to_vector(GCFLGIN(1, cfg.hidden, 1, cfg.num_layers, cfg.dropout).shared_parameters()).detach()


class GraphLearner:
    """One client's side of graph-level training.

    Its graphs, its GIN and optimizer, and the shared-layer vector its round starts from (``anchor``: its cluster's
    model).

    Randomness is the client's own (:mod:`secure_fgl.engine.rng`): its local layers are drawn
    from ``(seed, client)``, and epoch ``e`` of round ``r`` shuffles its graphs and draws its
    dropout keys from ``client_generator(seed, r, client, e)`` -- the same whether the client
    runs in the algorithm object or in its own runtime.
    """

    def __init__(self, client: GraphClient, cfg, device, batch_size: int, shared: torch.Tensor):
        self.client, self.cfg, self.device, self.batch_size = client, cfg, device, batch_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.SeedSequence([cfg.seed, client.client_id, 19]).generate_state(1)[0]))
            self.model = GCFLGIN(client.num_features, cfg.hidden, client.num_classes, cfg.num_layers, cfg.dropout).to(
                device
            )
        vector_to_parameters(shared.clone().to(device), self.model.shared_parameters())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.anchor = shared.clone().to(device)
        #: running training accuracy of the last local epoch, as counts (reference ``train_gc``)
        self.train_counts = (0, 0)
        #: norm of the shared layers' gradient at the last local step (reference ``convGradsNorm``)
        self.grad_norm = 0.0
        #: validation and test graphs collated once (evaluated every round, always in the same order)
        self.eval_batches = {
            s: [b.to(device) for b in DataLoader(getattr(client, s), batch_size=batch_size)] for s in ("val", "test")
        }

    def shared_vector(self) -> torch.Tensor:
        """The shared parameters as one flat vector."""
        return parameters_to_vector(self.model.shared_parameters()).detach()

    def update(self) -> torch.Tensor:
        """``dW = W - W_anchor`` of the shared layers after local training."""
        return self.shared_vector() - self.anchor

    def local_update(self, rnd: int, prox_mu: float = 0.0, dpsgd=None, noises=None) -> float:
        """``local_epochs`` epochs of mini-batch training; returns the last epoch's mean loss.

        FedProx adds ``mu/2 ||W - W_anchor||^2`` on the shared layers.  With ``dpsgd`` (a
        :class:`~secure_fgl.dpsgd.DPSGD`) every batch is a DP-SGD step on per-graph clipped
        gradients, epoch ``e``'s noise drawn from ``noises[e]``; the proximal gradient is
        data-independent and added after the noise.  Its running training accuracy is not
        computed (it would read the training graphs outside the DP steps).
        """
        model, opt, k = self.model, self.optimizer, self.client.client_id
        model.train()
        shared = model.shared_parameters()
        loss_sum = correct = seen = 0
        for epoch in range(self.cfg.local_epochs):
            loss_sum = correct = seen = 0
            gen = rng.client_generator(self.cfg.seed, rnd, k, epoch)
            with rng.using(gen):
                for batch in DataLoader(self.client.train, batch_size=self.batch_size, shuffle=True, generator=gen):
                    batch = batch.to(self.device)
                    opt.zero_grad()
                    if dpsgd is not None:
                        grads, loss = dpsgd.clipped_sum_graphs(model, batch)
                        dpsgd.apply_noisy(model, grads, noises[epoch], batch.num_graphs)
                        if prox_mu > 0:
                            for p, w in zip(
                                shared, (parameters_to_vector(shared) - self.anchor).split([p.numel() for p in shared])
                            ):
                                p.grad = p.grad + prox_mu * w.view_as(p).detach()
                    else:
                        out = model(batch.x, batch.edge_index, batch.batch)
                        loss = F.cross_entropy(out, batch.y)
                        if prox_mu > 0:
                            loss = loss + 0.5 * prox_mu * (parameters_to_vector(shared) - self.anchor).pow(2).sum()
                        loss.backward()
                        correct += int((out.argmax(-1) == batch.y).sum())
                    opt.step()
                    loss_sum += float(loss.detach()) * batch.num_graphs
                    seen += batch.num_graphs
        self.train_counts = (correct, seen if dpsgd is None else 0)
        self.grad_norm = float(torch.cat([p.grad.reshape(-1) for p in shared]).norm())
        return loss_sum / max(seen, 1)

    def apply_mean(self, mean: np.ndarray) -> None:
        """Restart from the anchor plus the cluster's mean update."""
        self.anchor = self.anchor + torch.as_tensor(mean, dtype=torch.float32, device=self.device)
        vector_to_parameters(self.anchor.clone(), self.model.shared_parameters())

    @torch.no_grad()
    def accuracy(self, split: str) -> tuple[int, int]:
        """``(correct, total)`` of this client's model on its own ``split`` graphs."""
        self.model.eval()
        correct = total = 0
        for batch in self.eval_batches[split]:
            correct += int((self.model(batch.x, batch.edge_index, batch.batch).argmax(-1) == batch.y).sum())
            total += batch.num_graphs
        return correct, total

    def counts(self) -> dict:
        """What leaves the client at evaluation: correct/total per split (training: last epoch)."""
        return {"train": list(self.train_counts), **{s: list(self.accuracy(s)) for s in ("val", "test")}}

    def state_dict(self) -> dict:
        """Model, optimizer, round anchor, training counts and the last gradient norm."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "anchor": self.anchor.cpu(),
            "train_counts": list(self.train_counts),
            "grad_norm": self.grad_norm,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the state written by :meth:`state_dict`."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.anchor = state["anchor"].to(self.device)
        self.train_counts = tuple(int(v) for v in state["train_counts"])
        self.grad_norm = float(state["grad_norm"])


def dpsgd_tag(algorithm: str) -> str:
    return f"{algorithm}/dpsgd"


def check_graph_dp(name: str, cfg, dpsgd: bool) -> None:
    """A graph-classification run privatises its training by per-graph DP-SGD or not at all."""
    if cfg.dp_epsilon is not None and not dpsgd:
        raise ConfigError(
            f"{name}'s exchanges have no DP mechanism of their own: add --dpsgd (per-graph DP-SGD, "
            "a training graph as the record) or drop --dp-epsilon"
        )
    if dpsgd and cfg.dp_epsilon is None:
        raise ConfigError(f"{name} --dpsgd needs --dp-epsilon (the run's total budget)")


def dpsgd_release_dependencies(name: str) -> dict[str, set[str]]:
    """The data each release touches under ``--dpsgd``.

    Under ``--dpsgd``: the DP-SGD steps read the training graphs; every exchange of ``name``
    is computed from their outputs only (post-processing), so it touches no raw training graph.
    """
    return {dpsgd_tag(name): {"features", "labels", "edges"}, name: set()}


def graph_summary(rows: list[dict]) -> dict:
    """The evaluation of every client from its counts.

    ``rows``: ``client``, ``dataset``, ``num_train`` and ``{train,val,test}`` = ``(correct, total)``. Overall =
    graph-weighted, and the unweighted mean over clients (the paper's "average accuracy").
    """
    per_client, sums = [], {s: [0, 0] for s in ("val", "test")}
    for r in rows:
        correct, seen = r["train"]
        row = {
            "client": r["client"],
            "dataset": r["dataset"],
            "train_acc": correct / max(seen, 1),
            "num_train": r["num_train"],
        }
        for split in sums:
            correct, total = r[split]
            sums[split][0] += correct
            sums[split][1] += total
            row[f"{split}_acc"] = correct / total if total else None
            row[f"num_{split}"] = total
        per_client.append(row)
    out = {f"{s}_acc": v[0] / v[1] if v[1] else 0.0 for s, v in sums.items()}
    out["train_acc"] = float(
        np.average([r["train_acc"] for r in per_client], weights=[r["num_train"] for r in per_client])
    )
    for split in sums:
        out[f"{split}_acc_client_mean"] = float(np.mean([r[f"{split}_acc"] for r in per_client]))
    out["per_client"] = per_client
    return out


def last_round_metrics(per_client: list[dict], clusters: list[list[int]]) -> dict:
    accs = [r["test_acc"] for r in per_client]
    return {
        "test_acc_last_client_mean": float(np.mean(accs)),
        "per_client_test_acc_last": accs,
        "clusters": [list(map(int, c)) for c in clusters],
    }
