"""A client's label distribution from its model update.

After iDLG/LLG (Zhao et al. 2020, Wainakh et al. 2022) and EC-LDA's FGL setting.

**SGD.** With softmax cross-entropy the gradient of the last layer's bias is ``mean_train(p - y)``:
the mean posterior minus the client's label shares.  ``E`` full-batch SGD steps (momentum ``mu``,
weight decay ``lambda``) move that bias by ``db = -lr s (mean p - pi_k) - lr E lambda b`` with
``s = sum_{t=1..E} (1 - mu^t) / (1 - mu)`` (``s = E`` without momentum), so the server estimates

    pi_k ~ clip(p_bar + (db + lr E lambda b) / (lr s), 0),  normalised,

with ``p_bar`` the round-start model's mean posterior on a labelled auxiliary sample (K1).

**Adam** divides each coordinate by the root of its running second moment, so the bias update
no longer scales with ``mean p - pi``.  The attack calibrates on shadow training instead: from the
round-start model it trains ``M`` shadow clients on the auxiliary nodes re-weighted to label
distributions ``pi_m ~ Dirichlet(1)`` with the run's public optimizer, learning rate, weight decay
and schedule (``min(r E, 20)`` warm-up steps for round ``r``'s optimizer state, then the ``E`` recorded
steps), reads the features ``f = [db / lr, mean_j dW_cj / lr]`` of each class row ``c`` of the last
layer, and fits the ridge regression ``pi ~ [f, 1] B``; a client's estimate is its features through
``B``, clipped at 0 and normalised (the shadow-model calibration of Shokri et al. 2017).

Metric: mean total-variation distance to the clients' true training-label distributions; chance:
the global prior's (``attacks.statistics``); ``uniform_tv`` reports the uniform guess's.
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
    RAW_FEATURE_ALGORITHMS,
    last_bias,
    model_tag,
    read_aggregate,
    read_uploads,
    round_start_params,
    split_weighted,
)
from .statistics import score_label_dists


def sgd_step_sum(local_steps: int, momentum: float) -> float:
    """``sum_{t=1..E} (1 - mu^t) / (1 - mu)``: how many gradients a run of ``E`` heavy-ball steps adds up."""
    if not momentum:
        return float(local_steps)
    return float(sum((1 - momentum**t) / (1 - momentum) for t in range(1, local_steps + 1)))


def last_weight(model: torch.nn.Module, C: int) -> tuple[int, tuple[int, ...]] | None:
    """Offset and shape in the flat parameter vector of the last 2-D weight with ``C`` rows."""
    off, found = 0, None
    for p in model.parameters():
        if p.dim() == 2 and p.shape[0] == C:
            found = (off, tuple(p.shape))
        off += p.numel()
    return found


def class_features(update: np.ndarray, bias: int, weight: tuple[int, tuple[int, ...]] | None, C: int, lr: float):
    """``[db_c / lr, mean_j dW_cj / lr]`` for each class ``c`` of the last layer (flattened)."""
    feats = [update[bias : bias + C] / lr]
    if weight is not None:
        off, shape = weight
        feats.append(update[off : off + int(np.prod(shape))].reshape(shape).mean(1) / lr)
    return np.concatenate(feats)


def make_optimizer(params, pub: Mapping[str, Any]) -> torch.optim.Optimizer:
    """The run's public local optimizer (``--optimizer``, ``--lr``, ``--momentum``, ``--weight-decay``)."""
    lr, wd = float(pub["lr"]), float(pub.get("weight_decay") or 0.0)
    if str(pub.get("optimizer", "adam")).lower() == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=float(pub.get("momentum") or 0.0), weight_decay=wd)
    return torch.optim.Adam(params, lr=lr, weight_decay=wd)


def shadow_updates(
    architecture,
    start: torch.Tensor,
    aux: Mapping[str, Any],
    pub: Mapping[str, Any],
    dists: np.ndarray,
    rnd: int,
    max_warmup: int = 20,
) -> list[np.ndarray]:
    """The update of a shadow client per row of ``dists``.

    A shadow client is the auxiliary nodes weighted by ``pi[y_v] / n_aux(y_v)`` (a weighted cross-entropy with label
    distribution ``pi``), trained from ``start`` for ``E`` local steps after ``min(rnd E, max_warmup)`` warm-up steps
    of the optimizer state (the client's optimizer keeps its state across rounds).

    Args:
        architecture: Builds the run's model (random weights; replaced by ``start``).
        start: The round-start parameters (flat).
        aux: The labelled auxiliary sample: ``x``, ``edge_index``, ``ids``, ``y``.
        pub: The run's public settings (optimizer, lr, momentum, weight decay, local epochs).
        dists: ``[M, C]`` label distributions, one per shadow client.
        rnd: The round whose update is attacked.
        max_warmup: Cap on the optimizer warm-up steps.

    Returns:
        The flat update (parameters after minus ``start``) of each shadow client.
    """
    x = torch.as_tensor(aux["x"], dtype=torch.float32)
    ei = torch.as_tensor(aux["edge_index"])
    ids = torch.as_tensor(np.asarray(aux["ids"]))
    y = np.asarray(aux["y"])
    counts = np.bincount(y, minlength=dists.shape[1]).astype(float)
    steps = max(1, int(pub.get("local_epochs") or 1))
    yt = torch.as_tensor(y)
    out = []
    for pi in dists:
        w = torch.as_tensor(pi[y] / np.maximum(counts[y], 1.0), dtype=torch.float32)
        w = w / w.sum()
        model = architecture()
        params = list(model.parameters())
        opt = make_optimizer(params, pub)
        model.train()
        for phase in (min(rnd * steps, max_warmup), steps):
            vector_to_parameters(start.float(), params)
            for _ in range(phase):
                opt.zero_grad()
                logits = model(x, ei)
                logits = logits[0] if isinstance(logits, tuple) else logits
                (w * F.cross_entropy(logits[ids], yt, reduction="none")).sum().backward()
                opt.step()
        out.append((parameters_to_vector(params).detach().double() - start).numpy())
    return out


def ridge_fit(features: np.ndarray, targets: np.ndarray, alpha: float = 1.0):
    """``B = argmin ||[Z, 1] B - T||^2 + alpha ||B||^2`` on standardised features ``Z``.

    Returns:
        A function mapping a feature matrix to predicted targets.
    """
    mu, sd = features.mean(0), features.std(0) + 1e-12
    A = np.hstack([(features - mu) / sd, np.ones((features.shape[0], 1))])
    reg = alpha * np.eye(A.shape[1])
    reg[-1, -1] = 0.0
    B = np.linalg.solve(A.T @ A + reg, A.T @ targets)
    return lambda f: np.hstack([(np.atleast_2d(f) - mu) / sd, np.ones((np.atleast_2d(f).shape[0], 1))]) @ B


class UpdateLabelDistribution(Attack):
    """Server reads each client's label shares off the last layer of its update (SGD or Adam)."""

    name = "update_label_dist"
    exchange = EXCHANGE
    default_observer = SERVER
    knowledge = ("public", "architecture", "released_model", "aux_labelled")
    algorithms = RAW_FEATURE_ALGORITHMS
    options = {"shadows": 64, "max_warmup": 20, "seed": 0}

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Estimate each client's label shares from its last-layer bias update.

        Closed form under SGD; under Adam, calibrated with shadow clients trained from the round-start model.
        """
        pub = knowledge["public"]
        tag = model_tag(view, self.exchange)
        rnd = view.latest_round(tag) if tag else None
        if rnd is None:
            return self.not_applicable("no readable model update reaches the server")
        C = int(pub["num_classes"])
        model = knowledge["architecture"]()
        loc = last_bias(model, C)
        if loc is None:
            return self.not_applicable(f"the model has no last-layer bias of {C} classes")
        released = parameters_to_vector(knowledge["released_model"].parameters()).detach().cpu().double()
        ups = read_uploads(view, tag, rnd, released.numel())
        if not ups:
            return self.not_applicable(f"no client update of {tag} round {rnd} is readable by the server")
        total = read_aggregate(view, tag, rnd, released.numel())
        if total is None:
            total = np.sum(list(ups.values()), axis=0)
        start = round_start_params(released, total, pub, len(ups))
        updates = {k: split_weighted(vec, pub)[0] for k, vec in ups.items()}
        aux = knowledge["aux_labelled"]
        if str(pub.get("optimizer", "adam")).lower() == "sgd":
            dists = self._sgd(model, start, updates, loc[0], C, aux, pub)
            method = "sgd closed form"
        else:
            dists = self._shadow(knowledge["architecture"], model, start, updates, loc[0], C, aux, pub, rnd)
            method = f"shadow calibration ({int(self.opts['shadows'])} shadow clients)"
        return self.result(output={"dists": dists, "round": rnd, "tag": tag, "method": method})

    @staticmethod
    def _sgd(model, start, updates, bias, C, aux, pub) -> dict[int, np.ndarray]:
        """The closed form of the module docstring."""
        vector_to_parameters(start.float(), model.parameters())
        model.eval()
        with torch.no_grad():
            out = model(torch.as_tensor(aux["x"], dtype=torch.float32), torch.as_tensor(aux["edge_index"]))
            out = out[0] if isinstance(out, tuple) else out
            p_bar = torch.softmax(out[torch.as_tensor(np.asarray(aux["ids"]))].double(), -1).mean(0).numpy()
        lr, steps = float(pub["lr"]), max(1, int(pub.get("local_epochs") or 1))
        wd = float(pub.get("weight_decay") or 0.0)
        s = sgd_step_sum(steps, float(pub.get("momentum") or 0.0))
        b = start.numpy()[bias : bias + C]
        dists = {}
        for k, u in updates.items():
            est = np.clip(p_bar + (u[bias : bias + C] + lr * steps * wd * b) / (lr * s), 0.0, None)
            dists[k] = est / est.sum() if est.sum() > 0 else np.full(C, 1.0 / C)
        return dists

    def _shadow(self, architecture, model, start, updates, bias, C, aux, pub, rnd) -> dict[int, np.ndarray]:
        """Shadow-calibrated regression from the last layer's update to the label shares."""
        weight = last_weight(model, C)
        lr = float(pub["lr"])
        rng = np.random.default_rng(int(self.opts["seed"]))
        targets = rng.dirichlet(np.ones(C), int(self.opts["shadows"]))
        torch.manual_seed(int(self.opts["seed"]))
        shadows = shadow_updates(architecture, start, aux, pub, targets, rnd, int(self.opts["max_warmup"]))
        feats = np.stack([class_features(u, bias, weight, C, lr) for u in shadows])
        predict = ridge_fit(feats, targets)
        dists = {}
        for k, u in updates.items():
            est = np.clip(predict(class_features(u, bias, weight, C, lr))[0], 0.0, None)
            dists[k] = est / est.sum() if est.sum() > 0 else np.full(C, 1.0 / C)
        return dists

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Mean TV distance of the estimates to the clients' training label shares."""
        res = score_label_dists(res, truth, res.output["dists"], "train")
        res.metrics["method"] = res.output.get("method")
        return res
