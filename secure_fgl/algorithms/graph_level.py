"""Federated graph classification: self-train, FedAvg and FedProx over per-client GINs whose
GIN layers are shared, the baselines of GCFL (Xie et al., NeurIPS 2021, sec. 6.1).

Every client holds :class:`~secure_fgl.models.gcfl_gin.GCFLGIN` (local input, ``post`` and
classifier layers; shared GIN layers, as the reference's ``serverGIN``) and trains it on
mini-batches of its graphs (``torch_geometric.loader.DataLoader``, ``batch_size`` graphs,
shuffled by the run seed), ``--local-epochs`` epochs a round.

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

from typing import ClassVar

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch_geometric.loader import DataLoader

from ..config import ConfigError
from ..models.gcfl_gin import GCFLGIN
from .base import FederatedAlgorithm
from .grid_mean import grid_weighted_mean
from .options import GraphOptions, GraphProxOptions

__all__ = ["GraphOptions", "GraphProxOptions", "GraphFederated", "GraphSelfTrain",
           "GraphFedAvg", "GraphFedProx"]


class GraphFederated(FederatedAlgorithm):
    """Shared GIN layers averaged within clusters of clients (FedAvg: one cluster)."""

    name = "gc-fedavg"
    Options = GraphOptions
    personalized = True
    #: modes whose exchanges this algorithm can run
    supported_modes: ClassVar[tuple[str, ...]] = ("plain", "ckks", "mask")
    aggregate_models: ClassVar[bool] = True

    def __init__(self, fed, protocol, cfg, device, options=None):
        if protocol.mode not in self.supported_modes:
            raise ConfigError(self.mode_refusal(protocol.mode))
        if cfg.dp_epsilon is not None:
            raise ConfigError(f"{self.name} has no DP path: drop --dp-epsilon")
        self.fed, self.protocol, self.cfg, self.device = fed, protocol, cfg, device
        self.opts = options if options is not None else self.Options()
        self.prox_mu = float(getattr(self.opts, "mu", 0.0))     # FedProx options carry mu
        self.clients = fed.clients
        self.rng = np.random.default_rng(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.models = [GCFLGIN(c.num_features, cfg.hidden, c.num_classes, cfg.num_layers, cfg.dropout).to(device)
                       for c in self.clients]
        shared = parameters_to_vector(self.models[0].shared_parameters()).detach()
        for m in self.models:               # every client starts from the same GIN layers
            vector_to_parameters(shared.clone(), m.shared_parameters())
        self.optimizers = [torch.optim.Adam(m.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
                           for m in self.models]
        #: the shared-layer vector each client's round starts from (its cluster's model)
        self.anchors = [shared.clone() for _ in self.clients]
        self.clusters: list[list[int]] = [list(range(len(self.clients)))]
        self.num_train = np.array([len(c.train) for c in self.clients], dtype=np.float64)
        self.train_acc = np.zeros(len(self.clients))
        self.grad_norms = np.zeros(len(self.clients))
        gen = torch.Generator().manual_seed(cfg.seed)
        self.train_loaders = [DataLoader(c.train, batch_size=self.opts.batch_size, shuffle=True, generator=gen)
                              for c in self.clients]
        self.eval_loaders = [{s: DataLoader(getattr(c, s), batch_size=self.opts.batch_size) for s in ("val", "test")}
                             for c in self.clients]

    @classmethod
    def mode_refusal(cls, mode: str) -> str:
        return f"{cls.name} cannot run in --mode {mode}: use one of {', '.join(cls.supported_modes)}"

    # ------------------------------------------------------------------ client side
    def shared_vector(self, k: int) -> torch.Tensor:
        return parameters_to_vector(self.models[k].shared_parameters()).detach()

    def local_update(self, k: int) -> float:
        """``local_epochs`` epochs of mini-batch training; records the running training accuracy
        and the norm of the shared layers' gradient at the last step (reference ``convGradsNorm``)."""
        model, opt = self.models[k], self.optimizers[k]
        model.train()
        shared = model.shared_parameters()
        loss_sum = correct = seen = 0
        for _ in range(self.cfg.local_epochs):
            loss_sum = correct = seen = 0
            for batch in self.train_loaders[k]:
                batch = batch.to(self.device)
                opt.zero_grad()
                out = model(batch.x, batch.edge_index, batch.batch)
                loss = F.cross_entropy(out, batch.y)
                if self.prox_mu > 0:
                    loss = loss + 0.5 * self.prox_mu * (parameters_to_vector(shared) - self.anchors[k]).pow(2).sum()
                loss.backward()
                opt.step()
                loss_sum += float(loss.detach()) * batch.num_graphs
                correct += int((out.argmax(-1) == batch.y).sum())
                seen += batch.num_graphs
        self.train_acc[k] = correct / max(seen, 1)
        self.grad_norms[k] = float(torch.cat([p.grad.reshape(-1) for p in shared]).norm())
        return loss_sum / max(seen, 1)

    # ------------------------------------------------------------------ one round
    def train_round(self, rnd: int) -> dict:
        sampled = self.sample_clients(rnd)
        losses = [self.local_update(k) for k in sampled]
        if self.aggregate_models:
            updates = {k: self.shared_vector(k) - self.anchors[k] for k in sampled}
            self.cluster_round(rnd, updates)
        return {"train_loss": float(np.mean(losses)), "num_clusters": len(self.clusters)}

    def cluster_round(self, rnd: int, updates: dict[int, torch.Tensor]) -> None:
        """FedAvg within every cluster (GCFL overrides this to split clusters first)."""
        for members in self.clusters:
            members = [k for k in members if k in updates]
            if members:
                self.apply_mean(members, self.cluster_mean(rnd, members, updates))

    def cluster_mean(self, rnd: int, members: list[int], updates: dict[int, torch.Tensor]) -> np.ndarray:
        """``sum_i n_i dW_i / sum_i n_i`` over ``members``, through the protocol on the grid of
        :mod:`~secure_fgl.algorithms.grid_mean` (the same value in every mode, so GCFL's
        decisions do not depend on the mode); only the members receive it."""
        total = float(self.num_train.sum())
        return grid_weighted_mean(self.protocol, f"{self.name}/model", rnd,
                                  {k: updates[k].cpu().numpy() for k in members},
                                  {k: self.num_train[k] / total for k in members}, recipients=members)

    def apply_mean(self, members: list[int], mean: np.ndarray) -> None:
        """Every member restarts from its anchor plus the cluster's mean update."""
        step = torch.as_tensor(mean, dtype=torch.float32, device=self.device)
        for k in members:
            self.anchors[k] = self.anchors[k] + step
            vector_to_parameters(self.anchors[k].clone(), self.models[k].shared_parameters())

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def client_accuracy(self, k: int, split: str) -> tuple[int, int]:
        model = self.models[k]
        model.eval()
        correct = total = 0
        for batch in self.eval_loaders[k][split]:
            batch = batch.to(self.device)
            correct += int((model(batch.x, batch.edge_index, batch.batch).argmax(-1) == batch.y).sum())
            total += batch.num_graphs
        return correct, total

    def evaluate(self) -> dict:
        """Per client: its own model on its own graphs; overall = graph-weighted, and the
        unweighted mean over clients (the paper's "average accuracy")."""
        per_client, sums = [], {s: [0, 0] for s in ("val", "test")}
        for k, c in enumerate(self.clients):
            row = {"client": k, "dataset": c.dataset, "train_acc": float(self.train_acc[k]),
                   "num_train": len(c.train)}
            for split in sums:
                correct, total = self.client_accuracy(k, split)
                sums[split][0] += correct
                sums[split][1] += total
                row[f"{split}_acc"] = correct / total if total else None
                row[f"num_{split}"] = total
            per_client.append(row)
        out = {f"{s}_acc": v[0] / v[1] if v[1] else 0.0 for s, v in sums.items()}
        out["train_acc"] = float(np.average(self.train_acc, weights=self.num_train))
        for split in sums:
            out[f"{split}_acc_client_mean"] = float(np.mean([r[f"{split}_acc"] for r in per_client]))
        out["per_client"] = per_client
        self.last_eval = per_client
        return out

    def final_metrics(self) -> dict:
        """The last round's per-client test accuracy (the paper evaluates after the last round)."""
        last = self.evaluate()["per_client"]
        accs = [r["test_acc"] for r in last]
        return {"test_acc_last_client_mean": float(np.mean(accs)), "per_client_test_acc_last": accs,
                "clusters": [list(map(int, c)) for c in self.clusters]}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        return {"models": [m.state_dict() for m in self.models], "optimizers": [o.state_dict() for o in self.optimizers],
                "anchors": [a.cpu() for a in self.anchors], "clusters": self.clusters,
                "train_acc": self.train_acc.copy(), "grad_norms": self.grad_norms.copy()}

    def load_state_dict(self, state: dict) -> None:
        for m, s in zip(self.models, state["models"]):
            m.load_state_dict(s)
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)
        self.anchors = [a.to(self.device) for a in state["anchors"]]
        self.clusters = [list(c) for c in state["clusters"]]
        self.train_acc, self.grad_norms = state["train_acc"], state["grad_norms"]


class GraphFedAvg(GraphFederated):
    name = "gc-fedavg"


class GraphFedProx(GraphFederated):
    name = "gc-fedprox"
    Options = GraphProxOptions


class GraphSelfTrain(GraphFederated):
    """Self-train: every client trains its GIN alone; nothing is exchanged."""

    name = "gc-selftrain"
    aggregate_models = False
