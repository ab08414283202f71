"""The smallest complete algorithm: FedAvg as a client logic, a server strategy and a spec.

FedAvg (McMahan et al., AISTATS 2017, Algorithm 1): each client takes ``local_epochs`` full-batch
steps on its subgraph, then the server delivers the weighted mean of the updates,
``w <- w + sum_k n_k (w_k - w) / sum_k n_k``, computed by the run's protocol (plain, mask, ckks,
ckks-mp): each client uploads ``[n_k (w_k - w), n_k]`` through its protocol half and decodes the sum.
It leaves out what the built-in ``fedavg`` adds (client sampling, DP, dropout handling,
checkpoints), and trains exactly as it does: same seed, initialisation and per-step randomness.

    python examples/minimal_fedavg.py          # 3 rounds on a synthetic graph, in --mode mask
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from secure_fgl.algorithms import SPECS, AlgorithmSpec
from secure_fgl.algorithms.base import model_spec
from secure_fgl.algorithms.options import NoOptions
from secure_fgl.engine import rng
from secure_fgl.models import build_model
from secure_fgl.runtime.exchange import dense_result, plan_dense, run_server_half
from secure_fgl.runtime.logic import ClientLogic
from secure_fgl.runtime.messages import ContributeIns, ContributeRes, FitIns, FitRes, ReceiveIns
from secure_fgl.runtime.strategy import Strategy

NAME = "minimal-fedavg"
TAG = f"{NAME}/model"


class FedAvgClient(ClientLogic):
    """One client: its model, its optimizer, the last global parameters."""

    def __init__(self, runtime, options: dict):
        super().__init__(runtime, options)
        cfg, facts = self.cfg, self.facts
        torch.manual_seed(cfg.seed)  # every client starts from the same model
        self.model = build_model(
            cfg.model,
            facts.num_features,
            cfg.hidden,
            facts.num_classes,
            num_layers=cfg.num_layers,
            dropout=cfg.dropout,
            heads=cfg.heads,
        ).to(runtime.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.global_params = parameters_to_vector(self.model.parameters()).detach().clone()

    def local_update(self, req: FitIns) -> FitRes:
        c, rnd = self.data, req.round
        self.model.train()
        for step in range(self.cfg.local_epochs):
            self.optimizer.zero_grad()
            with rng.using(rng.client_generator(self.cfg.seed, rnd, self.rt.client_id, step)):  # dropout masks
                logits = self.model(c.x, c.edge_index)
            loss = F.cross_entropy(logits[c.train_mask], c.y[c.train_mask])
            loss.backward()
            self.optimizer.step()
        return FitRes(trained=True, loss=float(loss.detach()))

    def contribute(self, req: ContributeIns) -> ContributeRes:
        """Keep ``[n_k v_k, n_k]`` for the protocol half.

        ``n_k``: the client's share of the training nodes. The strategy learns only the public length.
        """
        update = (parameters_to_vector(self.model.parameters()).detach() - self.global_params).cpu().numpy()
        n_k = float(self.data.train_mask.sum()) / float(self.facts.num_train)
        self.keep(req.tag, np.concatenate([update.astype(np.float64) * n_k, [n_k]]))
        return ContributeRes(length=update.size + 1)

    def receive(self, req: ReceiveIns) -> None:
        """Decode this client's result of the exchange, ``[sum n_k v_k, sum n_k]``, and apply the mean."""
        total = dense_result(self.rt.half.result(), req.length)
        mean = torch.as_tensor(total[:-1] / total[-1], dtype=torch.float32, device=self.rt.device)
        self.global_params = self.global_params + mean
        vector_to_parameters(self.global_params.clone(), self.model.parameters())

    @torch.no_grad()
    def logits(self) -> torch.Tensor:  # what evaluate() counts correct answers of
        self.model.eval()
        return self.model(self.data.x, self.data.edge_index)


class FedAvgServer(Strategy):
    """The server: tell every client to train, run the secure weighted mean, tell them it is done."""

    def train_round(self, rnd: int) -> dict:
        self.round = rnd
        clients = self.alive()
        done = self.ask("local_update", {k: FitIns(rnd) for k in clients})  # {k: FitRes}
        sent = self.ask("contribute", {k: ContributeIns(TAG, rnd) for k in clients})  # {k: ContributeRes}
        length = next(iter(sent.values())).length
        spec = model_spec(len(sent), self.num_clients, self.cfg.update_bound, grid=self.cfg.model_mean_on_grid)
        run_server_half(self.protocol, plan_dense(self.protocol, TAG, rnd, sorted(sent), clients, length, spec))
        self.tell("receive", {k: ReceiveIns(TAG, rnd, length=length) for k in clients})
        return {"train_loss": float(np.mean([r.loss for r in done.values()]))}


SPEC = AlgorithmSpec(
    name=NAME,
    summary="FedAvg in one short file (docs/design.md, 'Adding an algorithm')",
    paper="McMahan et al., Communication-Efficient Learning of Deep Networks from Decentralized Data, AISTATS 2017",
    exchanges=f"{TAG}: weighted mean of model updates, every round",
    options=NoOptions,
    logic=f"{__name__}:FedAvgClient",
    strategy=f"{__name__}:FedAvgServer",
    modes=("plain", "mask", "ckks", "ckks-mp"),
)
SPECS.setdefault(NAME, SPEC)


if __name__ == "__main__":
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment

    cfg = dict(dataset="sbm", clients=3, mode="mask", rounds=3, synthetic={"num_nodes": 300, "num_features": 40})
    for algorithm in (NAME, "fedavg"):
        result = run_experiment(RunConfig(algorithm=algorithm, **cfg), progress=False)
        print(
            f"{algorithm:<16} losses {[round(r['train_loss'], 6) for r in result['rounds']]}  "
            f"test acc {result['final']['test_acc']:.3f}"
        )
