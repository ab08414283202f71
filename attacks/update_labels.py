"""A client's label distribution from its model update (after iDLG/LLG, Zhao et al. 2020,
Wainakh et al. 2022, and EC-LDA's FGL setting).

With softmax cross-entropy the gradient of the last layer's bias is ``mean_train(p - y)``: the
mean posterior minus the client's label shares.  A client that takes ``E`` full-batch SGD steps
(momentum ``mu``, weight decay ``lambda``) moves that bias by
``db = -lr s (mean p - pi_k) - lr E lambda b`` with ``s = sum_{t=1..E} (1 - mu^t) / (1 - mu)``
(``s = E`` without momentum), so the server, reading client ``k``'s update in plain mode, estimates

    pi_k ~ clip(p_bar + (db + lr E lambda b) / (lr s), 0),  normalised,

with ``p_bar`` the round-start model's mean posterior on a labelled auxiliary sample (K1), standing
in for the client's own nodes.  Adam keeps only the sign of each coordinate's gradient, which gives
presence, not shares (``gradient_inversion`` reports it): the attack says so rather than guess.
Metric: mean total-variation distance to the clients' true training-label distributions; chance:
the global prior's (``attacks.statistics``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
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


class UpdateLabelDistribution(Attack):
    """Server reads each client's label shares off the last-layer bias of its SGD update."""

    name = "update_label_dist"
    exchange = EXCHANGE
    default_observer = SERVER
    knowledge = ("public", "architecture", "released_model", "aux_labelled")
    algorithms = RAW_FEATURE_ALGORITHMS

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        pub = knowledge["public"]
        if str(pub.get("optimizer", "adam")).lower() != "sgd":
            return self.not_applicable(
                "Adam keeps only the sign of the bias gradient (label presence, not shares: "
                "see gradient_inversion's label_presence_acc); shares need --optimizer sgd"
            )
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
        vector_to_parameters(start.float(), model.parameters())
        model.eval()
        aux = knowledge["aux_labelled"]
        with torch.no_grad():
            out = model(torch.as_tensor(aux["x"], dtype=torch.float32), torch.as_tensor(aux["edge_index"]))
            out = out[0] if isinstance(out, tuple) else out
            p_bar = torch.softmax(out[torch.as_tensor(np.asarray(aux["ids"]))].double(), -1).mean(0).numpy()
        lr, steps = float(pub["lr"]), max(1, int(pub.get("local_epochs") or 1))
        wd = float(pub.get("weight_decay") or 0.0)
        s = sgd_step_sum(steps, float(pub.get("momentum") or 0.0))
        b = start.numpy()[loc[0] : loc[0] + C]
        dists = {}
        for k, vec in ups.items():
            db = split_weighted(vec, pub)[0][loc[0] : loc[0] + C]
            est = np.clip(p_bar + (db + lr * steps * wd * b) / (lr * s), 0.0, None)
            dists[k] = est / est.sum() if est.sum() > 0 else np.full(C, 1.0 / C)
        return self.result(output={"dists": dists, "round": rnd, "tag": tag})

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        return score_label_dists(res, truth, res.output["dists"], "train")
