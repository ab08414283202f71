"""The algorithm interface and the model-averaging machinery the baselines share.

An algorithm is driven by :func:`secure_fgl.engine.runner.run_experiment`:

``setup()`` once (pre-training exchanges such as FedGCN's neighbour sums), then
``train_round(r)`` for ``r = 0..rounds-1`` with ``evaluate()`` after each, then
``final_metrics()``.  Every client->server exchange goes through ``self.protocol``;
an algorithm never hands a tensor to the server.

:class:`ModelAveraging` is FedAvg (McMahan et al., AISTATS 2017, Algorithm 1): each
sampled client runs ``local_epochs`` of full-batch training on its subgraph, then the
server-side weighted mean ``w = sum_k n_k w_k / sum_k n_k`` (n_k = training nodes of
client k) is computed by the protocol's weighted-mean exchange (tag ``<name>/model``).
Clients send their update ``w_k - w`` (equal to sending ``w_k`` for the mean, and the
quantity DP-FedAvg clips; McMahan et al., ICLR 2018).
The weights are divided by the public size of the training split, so each is in
``[0, 1]`` and they total 1 under full participation; the exchange is planned by
:class:`protocols.precision.MeanPrecision` from these public bounds (:func:`model_precision`),
so the averaged update is within ``FLOAT32_MEAN_TOLERANCE`` of the exact mean.
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols import DPRequest, Protocol, ValueSpec
from protocols.precision import FLOAT32_MEAN_TOLERANCE, MeanPrecision, grid_tolerance

from ..config import RunConfig
from ..data.federated import ClientSubgraph, FederatedGraph
from ..engine import rng
from ..engine.host import to_host
from ..models import build_model
from .options import NoOptions

#: public bound on |parameter| carried by model exchanges; larger weights are refused
PARAM_BOUND = 100.0


#: target of a model mean on the public grid (:func:`model_spec` with ``grid``) for parameters up to 4:
#: 2^-22, the float32 rounding error of a parameter of size 4 (:func:`grid_model_tolerance` scales it)
GRID_MODEL_TOLERANCE = 2.0**-22


def grid_model_tolerance(value_bound: float) -> float:
    """Target of a grid model mean with public bound ``B`` on update entries: the float32 rounding
    error of a parameter of size ``max(4, B)``, ``2^(floor(log2 max(4, B)) - 24)`` -- :data:`GRID_MODEL_TOLERANCE`
    up to ``B < 8``, ``2^-18`` at the default ``B = 100``.  A bound-independent target would make the grid
    finer as ``B`` grows (the weight total's error enters as ``|mean| <= B``): at ``B = 100`` and ten
    clients its sums need 43 bits, more than a CKKS slot half carries exactly (41); this one needs 38."""
    return 2.0 ** (math.floor(math.log2(max(4.0, float(value_bound)))) - 24)


def model_spec(
    num_contributors: int, num_clients: int, value_bound: float | None = None, *, grid: bool = False
) -> ValueSpec:
    """The model exchange's :class:`~protocols.base.ValueSpec`: :func:`model_precision`'s plan, or with
    ``grid`` its exact mean on the public grid (:meth:`protocols.precision.MeanPrecision.grid_spec`,
    target :func:`grid_model_tolerance`): every mode then averages to the same bits."""
    if not grid:
        return model_precision(num_contributors, num_clients, value_bound).spec()
    bound = value_bound or PARAM_BOUND
    return model_precision(
        num_contributors, num_clients, bound, tolerance=grid_tolerance(grid_model_tolerance(bound), num_clients)
    ).grid_spec(num_contributors)


def model_dp_request(cfg, dp, tag: str) -> DPRequest | None:
    """Client-level DP-FedAvg on the model exchange when the run's DP scope (``dp``, the protocol's
    engine or None) covers ``tag``: updates clipped to ``--dp-clip``, one release per round."""
    dp_on = dp is not None and dp.config.in_scope(tag)
    return DPRequest(clip=cfg.dp_clip, releases=cfg.rounds) if dp_on else None


def model_precision(
    num_contributors: int,
    num_clients: int,
    value_bound: float | None = None,
    *,
    tolerance: float = FLOAT32_MEAN_TOLERANCE,
) -> MeanPrecision:
    """Precision plan of a model-averaging exchange with weights in ``[0, 1]`` that total 1
    over all clients: ``T_min = 1`` under full participation (exact), else the expected share
    ``m / K`` of the sampled clients (a planning value; the recipients' bound
    :meth:`~protocols.precision.MeanPrecision.error_bound` with the decoded total holds
    regardless).  ``value_bound``: the public bound on update entries (``--update-bound``;
    default :data:`PARAM_BOUND`); packed fixed point takes its quantum from it."""
    share = 1.0 if num_contributors >= num_clients else num_contributors / num_clients
    return MeanPrecision(
        value_bound=value_bound or PARAM_BOUND, weight_bound=1.0, min_weight_total=share, tolerance=tolerance
    )


def accuracy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> tuple[int, int]:
    """(correct, total) over ``mask``."""
    total = int(mask.sum())
    if total == 0:
        return 0, 0
    return int((logits[mask].argmax(-1) == y[mask]).sum()), total


SPLITS = ("train", "val", "test")


def accuracy_summary(counts: dict[int, dict[str, tuple[int, int]]]) -> dict:
    """Accuracy per client, overall (node-weighted) and mean over clients (unweighted), from
    client -> split -> ``(correct, total)``."""
    per_client, sums = [], {s: [0, 0] for s in SPLITS}
    for k in sorted(counts):
        row = {"client": k}
        for split in SPLITS:
            correct, total = (int(v) for v in counts[k][split])
            sums[split][0] += correct
            sums[split][1] += total
            row[f"{split}_acc"] = correct / total if total else None
            row[f"num_{split}"] = total
        per_client.append(row)
    out = {f"{s}_acc": (v[0] / v[1] if v[1] else 0.0) for s, v in sums.items()}
    for split in ("val", "test"):
        accs = [r[f"{split}_acc"] for r in per_client if r[f"{split}_acc"] is not None]
        out[f"{split}_acc_client_mean"] = float(np.mean(accs)) if accs else 0.0
    out["per_client"] = per_client
    return out


class FederatedAlgorithm:
    """Base class.  Subclasses set ``name`` and implement the three hooks."""

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    #: evaluate each client's own model (True) or a single global model (False)
    personalized: ClassVar[bool] = False

    def __init__(
        self, fed: FederatedGraph, protocol: Protocol, cfg: RunConfig, device: torch.device, options: Any = None
    ):
        self.fed, self.protocol, self.cfg, self.device = fed, protocol, cfg, device
        self.opts = options if options is not None else self.Options()
        self.clients: list[ClientSubgraph] = [self._to_device(c) for c in fed.clients]
        self.rng = np.random.default_rng(cfg.seed)
        #: the round being trained (keys each client's per-step generator)
        self.round = 0

    # ------------------------------------------------------------------ hooks
    def setup(self) -> None:
        """One-off exchanges before training (default: none)."""

    def train_round(self, rnd: int) -> dict:
        raise NotImplementedError

    def client_logits(self, k: int) -> torch.Tensor:
        """Logits for client k's local nodes, from the model that client would deploy."""
        raise NotImplementedError

    def final_metrics(self) -> dict:
        """Algorithm-specific entries of ``result['final']`` (default: none)."""
        return {}

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared
    def _to_device(self, c: ClientSubgraph) -> ClientSubgraph:
        return ClientSubgraph(
            **{
                f: (getattr(c, f).to(self.device) if torch.is_tensor(getattr(c, f)) else getattr(c, f))
                for f in c.__dataclass_fields__
            }
        )

    def sample_clients(self, rnd: int) -> list[int]:
        """Clients taking part in round ``rnd`` (all, or the public PRF sample of a fraction,
        :func:`protocols.client_sampling.sample_clients`)."""
        from protocols.client_sampling import sample_clients

        return sample_clients(self.cfg.seed, rnd, len(self.clients), self.cfg.client_fraction)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Accuracy per client and overall (node-weighted) and mean over clients (unweighted)."""
        counts = {}
        for k, c in enumerate(self.clients):
            logits = self.client_logits(k)
            counts[k] = {split: accuracy(logits, c.y, getattr(c, f"{split}_mask")) for split in SPLITS}
        return accuracy_summary(counts)


class ModelAveraging(FederatedAlgorithm):
    """FedAvg over per-client copies of one model; FedProx adds ``mu/2 ||w - w_global||^2``
    to the local objective (Li et al., MLSys 2020, eq. 2) when ``prox_mu > 0``."""

    name = "fedavg"
    prox_mu: float = 0.0
    #: run the model-averaging exchange (False: Local training, each client alone)
    aggregate_models: bool = True
    #: average on the plan's public grid (:func:`model_spec`): the same mean bit for bit in every mode
    grid_model_mean: bool = False

    def __init__(self, fed, protocol, cfg, device, options=None):
        super().__init__(fed, protocol, cfg, device, options)
        torch.manual_seed(cfg.seed)
        template = self.build_model().to(device)
        self.models = [copy.deepcopy(template) for _ in self.clients]  # same initialisation
        self.optimizers = [self.make_optimizer(m) for m in self.models]
        self.global_params = parameters_to_vector(template.parameters()).detach().clone()

    # -- overridable pieces
    def build_model(self) -> nn.Module:
        cfg = self.cfg
        return build_model(
            cfg.model,
            self.fed.num_features,
            cfg.hidden,
            self.fed.num_classes,
            num_layers=cfg.num_layers,
            dropout=cfg.dropout,
            heads=cfg.heads,
        )

    def make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """``--optimizer``: Adam (Kipf's setting, default) or SGD with ``--momentum`` (FedGCN's
        released code: plain SGD; FGSSL: momentum 0.9)."""
        cfg = self.cfg
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def client_inputs(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, edge_index)`` client k trains on (FedGCN replaces x by received sums)."""
        c = self.clients[k]
        return c.x, c.edge_index

    def local_loss(self, k: int, logits: torch.Tensor) -> torch.Tensor:
        c = self.clients[k]
        loss = F.cross_entropy(logits[c.train_mask], c.y[c.train_mask])
        if self.prox_mu > 0:
            w = parameters_to_vector(self.models[k].parameters())
            loss = loss + 0.5 * self.prox_mu * (w - self.global_params).pow(2).sum()
        return loss

    def aggregation_weight(self, k: int) -> float:
        """FedAvg weight ``n_k / n_train`` (training nodes over the public size of the
        training split): in ``[0, 1]``, total 1 over the clients."""
        return float(self.clients[k].train_mask.sum()) / max(1.0, float(self.fed.graph.train_mask.sum()))

    # -- one round
    def local_update(self, k: int) -> float:
        model, opt = self.models[k], self.optimizers[k]
        model.train()
        x, edge_index = self.client_inputs(k)
        loss = torch.zeros(())
        for step in range(self.cfg.local_epochs):
            opt.zero_grad()
            with rng.using(rng.client_generator(self.cfg.seed, self.round, k, step)):
                loss = self.local_loss(k, model(x, edge_index))
            loss.backward()
            opt.step()
        return float(loss.detach())

    def train_round(self, rnd: int) -> dict:
        self.round = rnd
        sampled = self.sample_clients(rnd)
        losses = [self.local_update(k) for k in sampled if self.clients[k].train_mask.any()]
        if self.aggregate_models:
            self.aggregate(rnd, sampled)
        return {"train_loss": float(np.mean(losses)) if losses else 0.0}

    def aggregate(self, rnd: int, sampled: list[int]) -> None:
        """Weighted mean of the sampled clients' parameters through the protocol; every
        client (sampled or not) then starts the next round from it."""
        contributors = [k for k in sampled if self.aggregation_weight(k) > 0] or sampled
        updates = to_host(
            {k: parameters_to_vector(self.models[k].parameters()).detach() - self.global_params for k in contributors}
        )  # one pinned device -> host copy
        tag = f"{self.name}/model"
        dp = self.model_dp_request(tag)
        # DP-FedAvg (McMahan et al., ICLR 2018) averages clipped updates with equal weights:
        # tiny n_k/N weights would drown in the noise on the weight total
        weights = None if dp is not None else {k: self.aggregation_weight(k) for k in contributors}
        mean_update = self.protocol.weighted_mean(
            tag,
            rnd,
            updates,
            weights,
            spec=model_spec(
                len(contributors),
                len(self.clients),
                self.cfg.update_bound,
                grid=self.grid_model_mean or self.cfg.model_mean_on_grid,
            ),
            dp=dp,
            recipients=range(len(self.clients)),
        )
        self.global_params = self.global_params + torch.as_tensor(mean_update, dtype=torch.float32, device=self.device)
        for m in self.models:
            vector_to_parameters(self.global_params.clone(), m.parameters())

    def model_dp_request(self, tag: str) -> DPRequest | None:
        return model_dp_request(self.cfg, self.protocol.dp, tag)

    @torch.no_grad()
    def client_logits(self, k: int) -> torch.Tensor:
        model = self.models[k]
        model.eval()
        x, edge_index = self.client_inputs(k)
        return model(x, edge_index)

    # -- checkpoints
    def state_dict(self) -> dict:
        return {
            "models": [m.state_dict() for m in self.models],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "global_params": self.global_params.cpu(),
        }

    def load_state_dict(self, state: dict) -> None:
        for m, s in zip(self.models, state["models"]):
            m.load_state_dict(s)
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)
        self.global_params = state["global_params"].to(self.device)
