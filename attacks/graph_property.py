"""Graph-property inference against graph-level federated clients.

After PIAFGNN and the shadow-model property inference of Ganju et al., CCS 2018, and Melis et al., S&P 2019.

Target: GCFL, GCFL+ and their FedAvg/FedProx baselines, whose clients train a GIN with private
input/``post``/classifier layers and upload the update ``dW_k`` of the shared GIN layers
(:mod:`attacks.gin_inversion`).  Property: a client's training graphs are *mostly dense* -- more
than half of them have edge density ``2|E| / (n (n - 1)) >= threshold``.

What the server reads of client ``k`` in the latest round (its :class:`~attacks.base.View` only):
``||dW_k||`` -- from the plaintext upload, or from GCFL's clear-text norm report
(``<algorithm>/norms``, readable in every mode) -- and, GCFL+, the clear-text gradient norm of
the shared layers.  The update's *direction* is not used: the clients' private input layers are
drawn at random, which scatters it.  Features: ``f_k = log`` of those norms.

Shadow training: the server simulates the public local training
(:class:`~secure_fgl.algorithms.graph_level.ops.GraphLearner`, fresh private layers) from the
round-start shared layers (the public initial layers plus the means it sent to ``k`` before, where
it can still read them) on shadow clients drawn from its auxiliary graphs, per source pool
``shadows`` with a dense share from ``(1/2, 1]`` (with) and ``shadows`` from ``[0, 1/2)`` (without).
The classifier is the linear rule of the two shadow class means (Fisher's discriminant with
diagonal covariance ``s^2``):

    score_k = sum_j (f_kj - (m_1j + m_0j) / 2) (m_1j - m_0j) / s_j^2

Metric: rank AUC of ``score_k`` against each client's true property, over the clients (chance
1/2, 95 % bootstrap interval: :mod:`attacks.significance`).  When the server reads neither an
update nor a norm (FedAvg under ``mask``/``ckks``) the attack is not applicable.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from protocols.transcript import SERVER, client_party

from .base import Attack, AttackResult, GroundTruth, View, dense_vector
from .gin_inversion import EXCHANGE, GRAPH_ALGORITHMS
from .significance import auc_estimate

__all__ = ["edge_density", "dense_majority", "read_norms", "shadow_norms", "GraphPropertyInference"]


def edge_density(graph) -> float:
    """``2|E| / (n (n - 1))`` of an undirected graph stored in both directions."""
    n = int(graph.num_nodes)
    return float(graph.edge_index.shape[1]) / (n * (n - 1)) if n > 1 else 0.0


def dense_majority(graphs, threshold: float) -> bool:
    """The property: more than half of ``graphs`` have edge density ``>= threshold``."""
    return float(np.mean([edge_density(g) >= threshold for g in graphs])) > 0.5


def read_norms(view: View, algorithm: str, num_shared: int) -> tuple[int, dict[int, np.ndarray], dict, bool] | None:
    """The update norms of the latest round in which the server reads updates or GCFL's norm report.

    Returns:
        ``(round, {k: [||dW_k||(, grad norm)]}, {k: sum of the means sent to k before}, exact)``, or ``None``;
        ``exact``: every earlier mean was still readable (else the round start is only approximated).
    """
    model_tag, report_tag = f"{algorithm}/model", f"{algorithm}/norms"
    norms: dict[int, np.ndarray] = {}
    rnd = view.latest_round(report_tag, receiver=SERVER)
    if rnd is not None:  # GCFL's clear-text report: update, mean(, grad)
        for m in view.select(report_tag, receiver=SERVER, round=rnd):
            values = np.atleast_1d(np.asarray(view.payload(m), dtype=np.float64))
            if m.sender.startswith("client") and values.size >= 2:
                norms[int(m.sender[len("client") :])] = np.r_[values[0], values[2:]]
    else:
        rnd = view.latest_round(model_tag, receiver=SERVER)
        if rnd is None:
            return None
        for m in view.select(model_tag, receiver=SERVER, round=rnd):
            vec = dense_vector(view.payload(m), num_shared + 1)
            k = int(m.sender[len("client") :]) if m.sender.startswith("client") else None
            if vec is not None and k is not None and k not in norms and vec[-1] > 0:
                norms[k] = np.array([np.linalg.norm(vec[:-1] / vec[-1])])
    if not norms:
        return None
    starts, exact = {}, True
    for k in norms:  # the round-start model: every earlier mean sent to k
        sent = np.zeros(num_shared)
        for r in range(rnd):
            down = [
                dense_vector(view.payload(d), num_shared + 1)
                for d in view.select(model_tag, sender=SERVER, receiver=client_party(k), round=r)
            ]
            down = [d for d in down if d is not None and d[-1] > 0]
            if down:
                sent += down[-1][:-1] / down[-1][-1]
            else:
                exact = False
        starts[k] = sent
    return rnd, norms, starts, exact


def shadow_norms(
    start: torch.Tensor,
    pools: list[list],
    pub: Mapping[str, Any],
    *,
    threshold: float,
    shadows: int,
    graphs: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Update and gradient norms of shadow clients with and without the property.

    Returns ``(norms [n, 2], labels [n])``: ``[||dW||, grad norm]`` after one round of the public local training
    from ``start`` on shadow clients of ``graphs`` auxiliary graphs.  Every pool (the auxiliary graphs of one
    source, so of one labelling task) with graphs on both sides of ``threshold`` gives ``shadows`` clients with the
    property and ``shadows`` without.
    """
    from secure_fgl.algorithms.graph_level.ops import GraphLearner
    from secure_fgl.data.graph_classification import GraphClient

    rng = np.random.default_rng([seed, 53])
    opts = pub.get("options") or {}
    ups, labels = [], []
    for pool in pools:
        dense = [g for g in pool if edge_density(g) >= threshold]
        sparse = [g for g in pool if edge_density(g) < threshold]
        if not dense or not sparse:
            continue
        for has in [1, 0] * shadows:
            low, high = (graphs // 2 + 1, graphs) if has else (0, (graphs - 1) // 2)
            n_dense = int(
                np.clip(round(rng.uniform(0.5, 1.0) * graphs if has else rng.uniform(0.0, 0.5) * graphs), low, high)
            )
            picked = [dense[i] for i in rng.integers(0, len(dense), n_dense)] + [
                sparse[i] for i in rng.integers(0, len(sparse), graphs - n_dense)
            ]
            cfg = SimpleNamespace(
                seed=int(rng.integers(2**31)),
                hidden=pub["hidden"],
                num_layers=pub["num_layers"],
                dropout=pub["dropout"],
                lr=pub["lr"],
                weight_decay=pub["weight_decay"],
                local_epochs=pub["local_epochs"],
            )
            client = GraphClient(len(ups), "shadow", picked, [], [], int(pool[0].x.shape[1]), int(pub["num_classes"]))
            learner = GraphLearner(client, cfg, torch.device("cpu"), int(opts.get("batch_size", 128)), start)
            learner.local_update(0, float(opts.get("mu", 0.0) or 0.0))
            ups.append([float(learner.update().norm()), learner.grad_norm])
            labels.append(has)
    return np.asarray(ups, dtype=np.float64).reshape(-1, 2), np.asarray(labels)


class GraphPropertyInference(Attack):
    """The server infers whether a client's graphs are mostly dense from its update (module docstring)."""

    name = "graph_property"
    exchange = EXCHANGE
    knowledge = ("public", "aux_graphs")
    algorithms = GRAPH_ALGORITHMS
    options = {"threshold": 0.3, "shadows": 4}

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Score each client's update norms with shadow classifiers trained on auxiliary graphs at its round start."""
        from secure_fgl.algorithms.graph_level.ops import initial_shared

        pub, aux = knowledge["public"], knowledge["aux_graphs"]
        read = read_norms(view, pub["algorithm"], int(pub["num_shared"]))
        if read is None:
            return self.not_applicable("the server reads no client update and no norm report")
        rnd, norms, starts, exact = read
        initial = initial_shared(
            SimpleNamespace(
                seed=pub["seed"], hidden=pub["hidden"], num_layers=pub["num_layers"], dropout=pub["dropout"]
            )
        ).double()
        scores, rules = {}, {}
        for k, observed in norms.items():
            key = starts[k].tobytes()
            if key not in rules:  # one shadow classifier per round-start model
                start = (initial + torch.as_tensor(starts[k])).float()
                shadow, labels = shadow_norms(
                    start,
                    aux["pools"],
                    pub,
                    threshold=float(self.opts["threshold"]),
                    shadows=int(self.opts["shadows"]),
                    graphs=int(aux["graphs_per_client"]),
                    seed=len(rules),
                )
                if len(set(labels.tolist())) < 2:
                    return self.not_applicable("no auxiliary pool holds graphs on both sides of the density threshold")
                feats = np.log(shadow[:, : observed.size] + 1e-12)
                m1, m0 = feats[labels == 1].mean(0), feats[labels == 0].mean(0)
                rules[key] = ((m1 + m0) / 2, (m1 - m0) / (feats.var(0) + 1e-12))
            centre, weight = rules[key]
            scores[k] = float((np.log(observed + 1e-12) - centre) @ weight)
        return self.result(
            output={"scores": scores},
            metrics={
                "round": rnd,
                "clients": len(scores),
                "features": int(next(iter(norms.values())).size),
                "start_exact": exact,
                "shadow_classifiers": len(rules),
            },
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """AUC of the scores for telling clients whose graphs are mostly dense (above the density threshold)."""
        scores = res.output["scores"]
        thr = float(self.opts["threshold"])
        labels = [int(dense_majority(truth.clients[k].train, thr)) for k in scores]
        if len(set(labels)) < 2:
            return self.not_applicable("every client read has the property (or none has): nothing to tell")
        res.metrics["with_property"] = int(sum(labels))
        return res.add(auc_estimate("auc", list(scores.values()), labels), primary=True)
