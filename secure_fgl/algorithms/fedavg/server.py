"""FedAvg's server (McMahan et al., AISTATS 2017, Algorithm 1), shared by FedProx and Local."""

from __future__ import annotations

import numpy as np

from protocols import DropoutError

from ...runtime.dp import privatize_dense
from ...runtime.exchange import plan_dense, run_split
from ...runtime.strategy import Strategy
from ..base import model_dp_request, model_spec


class ModelAveragingStrategy(Strategy):
    """FedAvg's server (McMahan et al. 2017, Algorithm 1): sample clients, let them train, and
    deliver the weighted mean of their updates (tag ``<name>/model``) to every client.  Local
    (``aggregate_models`` false) only trains.  Client sampling: every client, or a seeded
    ``--client-fraction`` of them each round."""

    #: the model mean on the plan's public grid (:func:`~secure_fgl.algorithms.base.model_spec`; FedOMD)
    grid_model_mean = False

    def __init__(self, executor, protocol, cfg, facts, options):
        super().__init__(executor, protocol, cfg, facts, options)
        self.aggregate_models = cfg.algorithm != "local"
        self.personalized = cfg.algorithm == "local"

    def sample_clients(self, rnd: int) -> list[int]:
        K = self.num_clients
        if self.cfg.client_fraction >= 1:
            return list(range(K))
        m = max(1, int(round(self.cfg.client_fraction * K)))
        return sorted(np.random.default_rng([self.cfg.seed, rnd, 7]).choice(K, size=m, replace=False).tolist())

    def train_round(self, rnd: int, tag: str | None = None) -> dict:
        """One FedAvg round of the model exchanged as ``tag`` (default ``<name>/model``; an
        algorithm with several models, e.g. fedgcn-gap's encoder, names the one it trains)."""
        self.round = rnd
        sampled = self.sample_clients(rnd)
        ask = self.local_update_request(rnd, tag)
        done = self.ask("local_update", {k: ask for k in sampled})
        losses = [r["loss"] for r in done.values() if r["trained"]]
        if self.aggregate_models:
            contributors = [k for k in sampled if k in self.lost or done[k]["trained"]] or sampled
            self.aggregate(rnd, contributors, tag)
        return {"train_loss": float(np.mean(losses)) if losses else 0.0, "clients_lost": len(self.lost)}

    def local_update_request(self, rnd: int, tag: str | None) -> dict:
        """What each sampled client is told to train in round ``rnd`` (the model ``tag`` names)."""
        return {"round": rnd, **({"model": tag} if tag else {})}

    def model_dp_request(self, tag: str):
        """Client-level DP-FedAvg on the model exchange when the run's DP scope covers it."""
        return model_dp_request(self.cfg, self.protocol.dp, tag)

    def aggregate(self, rnd: int, contributors: list[int], tag: str | None = None) -> None:
        tag = tag or f"{self.name}/model"
        spec = model_spec(
            len(contributors),
            self.num_clients,
            self.cfg.update_bound,
            grid=self.grid_model_mean or self.cfg.model_mean_on_grid,
        )
        dp = self.model_dp_request(tag)
        ask = {"tag": tag, "round": rnd}
        if dp is not None:  # DP-FedAvg: clipped, unweighted (protocols.dp)
            dp_sum, spec, _ = self.protocol.dp.mean_request(tag, rnd, dp, spec)
            ask["dp_clip"] = float(dp.clip)
        sent = self.ask("contribute", {k: ask for k in contributors})
        if not sent:
            raise DropoutError(f"every contributor of {tag} was lost: {sorted(self.lost)}", tag=tag, round=rnd)
        length = int(next(iter(sent.values()))["length"])
        self.model_size = length - (dp is None)
        noisy, noise_std = sorted(sent), 0.0
        if dp is not None:
            noisy, noise_std, spec = privatize_dense(self, tag, rnd, noisy, length, dp_sum, spec)
        included = run_split(
            self.protocol,
            plan_dense(self.protocol, tag, rnd, noisy, self.alive(), length, spec, dp_noise_std=noise_std),
        )
        done = {"tag": tag, "round": rnd, "length": length}
        self.tell("receive", {k: {**done, **({"count": len(included)} if dp else {})} for k in self.alive()})
