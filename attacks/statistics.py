"""Label-distribution inference from exchanged statistics.

* :class:`ProxyLabelDistribution` -- FedSpray's class-proxy exchange
  (``Protocol.classwise_mean``, tag ``fedspray/proxies``): each client sends
  ``[a_1 p_1, ..., a_C p_C, a_1, ..., a_C]`` with ``a_c`` its class ratio (or count).  In plain
  mode the server reads the weights: the label distribution exactly; a zero weight (and zero
  proxy) says the class is absent.  Secure modes hide both; DP noises them.
* :class:`MomentLabelDistribution` -- FedOMD's hidden-feature statistics (tags
  ``fedomd/hidden<l>/mean``): each client sends ``[n_k mu_k, n_k]``.  The server reads the
  client size ``n_k`` and the mean hidden feature ``mu_k``; with a labelled auxiliary sample
  (K1) and the released model it builds class prototypes ``M_c`` (mean hidden feature of class
  ``c``) and unmixes ``mu_k ~ sum_c pi_c M_c`` by non-negative least squares on the simplex,
  shrunk toward the auxiliary prior by how well the prototypes classify the auxiliary nodes
  (no class signal in the hidden features -> the prior, never worse than guessing by design).

Metric: total-variation distance between the inferred and the true label distribution,
averaged over clients; the baseline ("chance") is the TV of the global prior (the
distribution of the whole graph's labels), i.e. what a guesser without the transcript gets.
Lower is leakier (``higher_is_leakier=False``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from protocols.transcript import SERVER, party_client

from .base import Attack, AttackResult, GroundTruth, View, dense_vector, tv_distance
from .significance import mean_estimate


def _latest_uploads(view: View, tag: str, length: int | None) -> tuple[dict[int, np.ndarray], int | None, int]:
    msgs = (
        view.select(tag, receiver=view.parties[0])
        if view.parties[0] == SERVER
        else view.select(tag, sender=view.parties[0])
    )
    readable = [m for m in msgs if view.readable(m)]
    if not readable:
        return {}, None, len(msgs)
    rnd = max(m.round for m in readable)
    out = {}
    for m in readable:
        if m.round != rnd:
            continue
        k = party_client(m.sender)
        vec = dense_vector(view.payload(m), length)
        if k is not None and vec is not None:
            out[k] = vec
    return out, rnd, len(msgs)


def _prior(truth: GroundTruth, mask: np.ndarray | None = None) -> np.ndarray:
    y = truth.y[truth.owner >= 0] if mask is None else truth.y[mask & (truth.owner >= 0)]
    return np.bincount(y, minlength=truth.num_classes).astype(float)


def score_label_dists(res: AttackResult, truth: GroundTruth, est: dict[int, np.ndarray], node_set: str) -> AttackResult:
    """Score estimated label distributions by their mean total-variation distance to the clients' true ones.

    Args:
        res: The result to score.
        truth: The ground truth (each client's labels and masks).
        est: Client -> estimated label distribution.
        node_set: ``"train"`` (the training labels) or ``"all"`` (every node the client holds).

    Returns:
        ``res`` with ``label_tv`` (lower is leakier) against the global prior's TV as the chance level, and
        ``uniform_tv``, ``exact_clients``, ``absent_class_acc``, ``clients_scored``.
    """
    tvs, base, uniform, exact, absent_ok = [], [], [], [], []
    prior = _prior(truth, truth.train_mask if node_set == "train" else None)
    for k, pi in est.items():
        c = truth.clients[k]
        y = c.y.detach().cpu().numpy()
        if node_set == "train":
            y = y[c.train_mask.detach().cpu().numpy().astype(bool)]
        true = np.bincount(y, minlength=truth.num_classes).astype(float)
        if true.sum() == 0:
            continue
        tv = tv_distance(pi, true)
        tvs.append(tv)
        base.append(tv_distance(prior, true))
        uniform.append(tv_distance(np.ones(truth.num_classes), true))
        exact.append(tv < 1e-6)
        absent_ok.append(float(((np.asarray(pi) <= 1e-9) == (true == 0)).mean()))
    res.add(
        mean_estimate(
            "label_tv",
            tvs,
            float(np.mean(base)) if base else None,
            higher_is_leakier=False,
            chance_method="baseline (the global label prior)",
        ),
        primary=True,
    )
    res.metrics.update(
        {
            "prior_tv": res.chance,
            "uniform_tv": float(np.mean(uniform)) if uniform else None,
            "exact_clients": float(np.mean(exact)) if exact else None,
            "absent_class_acc": float(np.mean(absent_ok)) if absent_ok else None,
            "clients_scored": len(tvs),
            "node_set": node_set,
        }
    )
    return res


#: FedSpray's round batch ``[a * S, a, w dw, w]`` (algorithms.fedspray.round_spec): its first ``C (d_s + 1)``
#: entries are the proxy upload
BATCHED_PROXIES = "*/batch"


class ProxyLabelDistribution(Attack):
    """Server reads each client's class weights off FedSpray's proxy exchange."""

    name = "fedspray_label_dist"
    exchange = "*/proxies"
    default_observer = SERVER
    knowledge = ("public",)
    algorithms = ("fedspray",)

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Read each client's class weights off the latest readable proxy upload and normalise them to label shares."""
        pub = knowledge["public"]
        C = int(pub["num_classes"])
        tags = view.tags(self.exchange)
        tags = tags or view.tags(BATCHED_PROXIES)  # proxies first in the round's batch: the same entries
        if not tags:
            return self.not_applicable("no class-proxy exchange in the transcript")
        dim = (pub.get("options") or {}).get("proxy_dim")
        length = C * (int(dim) + 1) if dim else None
        ups, rnd, seen = _latest_uploads(view, tags[0], length)
        if not ups:
            return self.not_applicable(
                f"all {seen} uploads of {tags[0]} are ciphertext/masked to the {view.parties[0]}"
                if seen
                else "no uploads reach this observer"
            )
        est = {}
        for k, vec in ups.items():
            w = np.asarray(vec[-C:], dtype=np.float64)
            est[k] = np.clip(w, 0, None) / max(np.clip(w, 0, None).sum(), 1e-12)
        return self.result(output={"dists": est, "round": rnd, "tag": tags[0]})

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Mean TV distance of the estimates to the clients' training label shares."""
        return score_label_dists(res, truth, res.output["dists"], "train")


def simplex_nnls(M: np.ndarray, b: np.ndarray, weight: float = 10.0) -> np.ndarray:
    """``argmin ||M^T pi - b||`` over ``pi >= 0``, ``sum pi = 1`` (penalised), ``M`` [C, h]."""
    from scipy.optimize import nnls

    A = np.vstack([M.T, weight * np.ones((1, M.shape[0]))])
    rhs = np.concatenate([b, [weight]])
    pi, _ = nnls(A, rhs)
    return pi / pi.sum() if pi.sum() > 0 else np.full(M.shape[0], 1.0 / M.shape[0])


#: batched statistics whose first entries are ``[n_k, n_k mu^1]`` (secure_fgl.algorithms.fedomd.stats_batch)
BATCHED_MEANS = ("*/stats/mean", "*/stats/raw")


class MomentLabelDistribution(Attack):
    """Server unmixes FedOMD's mean hidden features into class shares (K1 prototypes)."""

    name = "fedomd_label_dist"
    exchange = "*/hidden1/mean"
    default_observer = SERVER
    knowledge = ("public", "hidden_fn", "aux_labelled")
    algorithms = ("fedomd",)

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Unmix each client's mean hidden feature into class shares with prototypes from auxiliary labelled nodes.

        The estimate shrinks toward the auxiliary prior by the prototypes' nearest-prototype accuracy above chance.
        """
        pub = knowledge["public"]
        C = int(pub["num_classes"])
        tags = view.tags(self.exchange)
        batched = not tags  # protocols.batch layout [n_k, n_k mu^1, n_k mu^2, ...] (stats_batch)
        tags = tags or [t for pattern in BATCHED_MEANS for t in view.tags(pattern)]
        if not tags:
            return self.not_applicable("no hidden-statistics exchange in the transcript")
        aux = knowledge["aux_labelled"]
        H = np.asarray(knowledge["hidden_fn"](aux["x"], aux["edge_index"]), dtype=np.float64)
        if "ids" in aux and H.shape[0] != len(aux["y"]):
            H = H[np.asarray(aux["ids"])]
        h = H.shape[1]
        ups, rnd, seen = _latest_uploads(view, tags[0], h + 1)
        if batched:  # the same numbers, weight first: [n_k mu^1, n_k]
            ups = {k: np.concatenate([v[1:], v[:1]]) for k, v in ups.items()}
        if not ups:
            return self.not_applicable(
                f"all {seen} uploads of {tags[0]} are ciphertext/masked to the {view.parties[0]}"
                if seen
                else "no uploads reach this observer"
            )
        y = np.asarray(aux["y"])
        M = np.stack([H[y == c].mean(0) if (y == c).any() else np.zeros(h) for c in range(C)])
        prior = np.bincount(y, minlength=C).astype(float)
        prior /= max(prior.sum(), 1.0)
        # trust in the prototypes: nearest-prototype accuracy on the auxiliary sample, rescaled so
        # that chance (1/C) -> 0 and perfect -> 1; estimates shrink toward the prior accordingly
        dist = ((H[:, None, :] - M[None, :, :]) ** 2).sum(-1)
        acc = float((dist.argmin(1) == y).mean()) if y.size else 0.0
        alpha = float(np.clip((acc - 1.0 / C) / (1.0 - 1.0 / C), 0.0, 1.0))
        est, sizes = {}, {}
        for k, vec in ups.items():
            n_k = float(vec[h])
            if pub.get("dp_epsilon"):
                n_k = max(n_k, 1e-6)
            mu = vec[:h] / n_k if abs(n_k) > 1e-12 else vec[:h]
            est[k] = alpha * simplex_nnls(M, mu) + (1 - alpha) * prior
            sizes[k] = n_k
        node_set = str((pub.get("options") or {}).get("stats_nodes", "all"))
        return self.result(
            output={
                "dists": est,
                "sizes": sizes,
                "round": rnd,
                "tag": tags[0],
                "node_set": node_set,
                "prototype_trust": alpha,
            }
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Mean TV distance of the estimates to the clients' label shares; whether the read client sizes are exact."""
        node_set = res.output.get("node_set", "all")
        res = score_label_dists(res, truth, res.output["dists"], node_set)

        def size(k):
            c = truth.clients[k]
            return int(c.train_mask.sum()) if node_set == "train" else c.num_nodes

        ok = [abs(res.output["sizes"][k] - size(k)) < 0.5 for k in res.output["sizes"]]
        res.metrics["client_size_exact"] = float(np.mean(ok)) if ok else None
        res.metrics["prototype_trust"] = res.output.get("prototype_trust")
        return res
