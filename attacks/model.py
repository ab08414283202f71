"""Attacks on the released model.

They are unchanged by secure aggregation, since every client decrypts the model it then deploys.

* :class:`MembershipInference` -- node-level membership inference with a loss threshold
  (Yeom et al., CSF 2018; node-level: Olatunji et al. 2021, He et al. 2021): score
  ``log p_y(v)`` from the deployed model's posteriors; members are training nodes.  Metrics:
  AUC, membership advantage ``max(TPR - FPR)`` and TPR at 1 % FPR (Carlini et al., S&P 2022);
  also max-probability and negative-entropy scores.
* :class:`PosteriorLinkInference` -- link stealing Attack-0 (He et al., USENIX Sec 2021):
  ``score(u, v) = cos(P_u, P_v)``.  AUC against random non-edges **and** against 2-hop pairs
  (distance exactly 2, the hard negatives), next to the feature-cosine baseline (homophily).
* :class:`InfluenceLinkInference` -- LinkTeller (Wu et al., S&P 2022): query a client's
  inference API with node ``v``'s features scaled by ``1 + delta``; the influence
  ``||(f(X') - f(X))_u|| / delta`` is non-zero only within the model's receptive field, large
  for neighbours.  AUC with random and 2-hop negatives.

Scores are the attack's output; which pairs/nodes are positives is decided in ``score``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from .base import Attack, AttackResult, GroundTruth, View, advantage, roc_auc, tpr_at_fpr
from .significance import auc_estimate, pair_auc_estimate, score_estimate


# ----------------------------------------------------------------------------- membership
class MembershipInference(Attack):
    """Loss-threshold membership inference on the deployed models' posteriors."""

    name = "membership"
    exchange = "released model"
    default_observer = "client:0"
    knowledge = ("posteriors", "candidates")
    needs_exchange = False

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Loss, max-probability and negative-entropy scores of the candidate nodes under the deployed posteriors."""
        P = np.asarray(knowledge["posteriors"], dtype=np.float64)
        cand = knowledge["candidates"]
        ids, labels = np.asarray(cand["ids"]), np.asarray(cand["labels"])
        p = np.clip(P[ids], 1e-12, 1.0)
        ok = np.isfinite(p).all(1)
        logp = np.log(p[np.arange(ids.size), labels])
        maxp = p.max(1)
        negent = (p * np.log(p)).sum(1)
        return self.result(
            output={"ids": ids[ok], "scores": {"loss": logp[ok], "max_prob": maxp[ok], "neg_entropy": negent[ok]}}
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """AUC, membership advantage and TPR at 1 % FPR of the loss score (training nodes are members)."""
        ids = res.output["ids"]
        member = truth.train_mask[ids]
        s = res.output["scores"]
        res.add(auc_estimate("auc", s["loss"], member), primary=True)
        res.add(score_estimate("advantage", advantage, s["loss"], member))
        res.add(score_estimate("tpr_at_1fpr", lambda a, b: tpr_at_fpr(a, b, 0.01), s["loss"], member))
        res.metrics.update(
            {
                "auc_max_prob": roc_auc(s["max_prob"], member),
                "auc_neg_entropy": roc_auc(s["neg_entropy"], member),
                "members": int(member.sum()),
                "non_members": int((~member).sum()),
            }
        )
        return res


# ----------------------------------------------------------------------------- pair sampling
def sample_pairs(
    edge_index: np.ndarray,
    nodes: np.ndarray,
    num: int,
    seed: int = 0,
    anchors: np.ndarray | None = None,
    keep_pair=None,
) -> dict[str, np.ndarray]:
    """Positive pairs (edges), random non-edges and 2-hop pairs (distance exactly 2) among ``nodes``.

    With ``anchors`` every pair has an anchor as its first element; ``keep_pair(u, v)`` (boolean arrays) restricts all
    three sets to one population (e.g. both ends in one client).
    """
    rng = np.random.default_rng(seed)
    n = int(max(edge_index.max(initial=0), nodes.max(initial=0))) + 1
    keep = np.zeros(n, bool)
    keep[nodes] = True
    e = edge_index[:, keep[edge_index[0]] & keep[edge_index[1]] & (edge_index[0] != edge_index[1])]
    a = sp.csr_matrix((np.ones(e.shape[1]), (e[0], e[1])), shape=(n, n))
    a.data[:] = 1
    a = ((a + a.T) > 0).astype(np.float64).tocsr()
    anc = np.zeros(n, bool)
    anc[anchors if anchors is not None else nodes] = True

    def subset(pr: np.ndarray) -> np.ndarray:
        if keep_pair is not None and pr.shape[1]:
            pr = pr[:, keep_pair(pr[0], pr[1])]
        return pr[:, rng.choice(pr.shape[1], num, replace=False)] if pr.shape[1] > num else pr

    pos = np.stack(a.nonzero())
    pos = subset(pos[:, anc[pos[0]] & ((pos[0] < pos[1]) | ~anc[pos[1]])])
    two = (a @ a).tocsr()
    two.setdiag(0)
    two = two - two.multiply(a)
    two.eliminate_zeros()
    hard = np.stack(two.nonzero())
    hard = subset(hard[:, (hard[0] != hard[1]) & anc[hard[0]]])
    src_pool = np.flatnonzero(anc & keep)
    want, rnd = max(pos.shape[1], 1), np.zeros((2, 0), np.int64)
    for _ in range(20):  # bounded: a population may hold few pairs
        u, v = rng.choice(src_pool, 4 * want), rng.choice(nodes, 4 * want)
        ok = (u != v) & (np.asarray(a[u, v]).ravel() == 0)
        if keep_pair is not None:
            ok &= keep_pair(u, v)
        rnd = np.concatenate([rnd, np.stack([u[ok], v[ok]])], 1)
        if rnd.shape[1] >= want:
            break
    return {"pos": pos, "random": rnd[:, :want], "hard": hard}


def pair_estimates(score_fn, pairs: dict[str, np.ndarray], suffix: str = "") -> dict:
    """AUC of the positive pairs against random (``auc_random``) and 2-hop (``auc_2hop``) negatives.

    Returns:
        Each an :class:`~attacks.significance.Estimate` (None if a set is empty).
    """
    out = {}
    sp_ = score_fn(pairs["pos"]) if pairs["pos"].shape[1] else None
    for key, name in (("random", "auc_random"), ("hard", "auc_2hop")):
        neg = pairs[key]
        out[name + suffix] = (
            None if sp_ is None or neg.shape[1] == 0 else pair_auc_estimate(name + suffix, sp_, score_fn(neg))
        )
    return out


def _cos_rows(M: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    a, b = M[pairs[0]], M[pairs[1]]
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def _record_pairs(res: AttackResult, ests: dict, primary: str) -> None:
    for name, est in ests.items():
        if est is not None:
            res.add(est, primary=name == primary)
        else:
            res.metrics[name] = None
    if res.estimate is None:
        res.metric, res.chance = primary, 0.5


class PosteriorLinkInference(Attack):
    """Link stealing from posterior similarity (He et al. Attack-0, cosine).

    In a federated run the deployed models saw only the edges inside each client: those pairs
    (both ends and the negatives in one client) are the headline ``auc_2hop``/``auc_random``;
    cross-client edges, which no model saw, are scored apart (``auc_2hop_cross``,
    ``auc_random_cross``).
    """

    name = "link_posterior"
    exchange = "released model"
    default_observer = "client:0"
    knowledge = ("posteriors",)
    needs_exchange = False
    options = {"pairs": 2000, "seed": 0}

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Collect the posteriors; pairs are scored by cosine similarity in :meth:`score`."""
        P = np.asarray(knowledge["posteriors"], dtype=np.float64)
        return self.result(output={"posteriors": P})

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """AUC of posterior cosine for edges against 2-hop and random negatives, intra- and cross-client."""
        P = res.output["posteriors"]
        owner = truth.owner
        nodes = np.flatnonzero(np.isfinite(P).all(1) & (owner >= 0))
        federated = np.unique(owner[nodes]).size > 1
        num, seed = int(self.opts["pairs"]), int(self.opts["seed"])
        pops = {"": (lambda u, v: owner[u] == owner[v]) if federated else None}
        if federated:
            pops["_cross"] = lambda u, v: owner[u] != owner[v]
        ests, counts = {}, {}
        for suffix, keep_pair in pops.items():
            pairs = sample_pairs(truth.edge_index, nodes, num, seed, keep_pair=keep_pair)
            ests.update(pair_estimates(lambda pr: _cos_rows(P, pr), pairs, suffix))
            base = pair_estimates(lambda pr: _cos_rows(truth.x, pr), pairs, suffix)
            for name, est in base.items():
                res.metrics["feature_baseline_" + name] = None if est is None else est.value
            counts["positives" + suffix] = int(pairs["pos"].shape[1])
            counts["hard_negatives" + suffix] = int(pairs["hard"].shape[1])
        _record_pairs(res, ests, "auc_2hop")
        res.metrics.update(counts)
        res.metrics["population"] = "intra-client edges" if federated else "all edges"
        return res


class InfluenceLinkInference(Attack):
    """LinkTeller: influence of a node's features on the other nodes' log-posteriors via the API.

    The API answers log-probabilities ``log P`` (LinkTeller's reference scoring): on a confident
    model softmax outputs saturate, so neighbours and 2-hop nodes both show near-zero softmax
    influence, while ``log P`` keeps the GCN's exact receptive field structure.
    """

    name = "link_influence"
    exchange = "released model"
    default_observer = "client:1"
    knowledge = ("query_api",)
    needs_exchange = False
    options = {"targets": 500, "delta": 1e-2, "pairs": 4000, "seed": 0}

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """LinkTeller: perturb each target's features by ``delta``; record the change of every node's log-posteriors."""
        api = knowledge["query_api"]
        X = torch.as_tensor(api["features"], dtype=torch.float32)
        n = X.shape[0]
        rng = np.random.default_rng(int(self.opts["seed"]))
        targets = np.sort(rng.choice(n, min(n, int(self.opts["targets"])), replace=False))
        delta = float(self.opts["delta"])
        with torch.no_grad():
            base = api["query"](X).double()
            infl = np.zeros((targets.size, n))
            for i, v in enumerate(targets):
                Xp = X.clone()
                Xp[v] = Xp[v] * (1 + delta) if Xp[v].abs().sum() > 0 else Xp[v] + delta
                out = api["query"](Xp).double()
                infl[i] = ((out - base) / delta).norm(dim=1).cpu().numpy()[:n]
        return self.result(
            output={
                "client": int(api["client"]),
                "targets": targets,
                "influence": infl,
                "global_ids": np.asarray(api["global_ids"]),
            }
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """AUC of the influence for the client's edges against 2-hop and random negatives, with a feature baseline."""
        out = res.output
        c = truth.clients[out["client"]]
        ei = c.edge_index.detach().cpu().numpy()
        n = out["influence"].shape[1]
        targets = out["targets"]
        row_of = np.full(n, -1)
        row_of[targets] = np.arange(targets.size)
        pairs = sample_pairs(ei, np.arange(n), int(self.opts["pairs"]), int(self.opts["seed"]), anchors=targets)
        infl = out["influence"]
        _record_pairs(res, pair_estimates(lambda pr: infl[row_of[pr[0]], pr[1]], pairs), "auc_2hop")
        xl = c.x.detach().cpu().numpy().astype(np.float64)
        for name, est in pair_estimates(lambda pr: _cos_rows(xl, pr), pairs).items():
            res.metrics["feature_baseline_" + name] = None if est is None else est.value
        res.metrics.update(
            {
                "client": out["client"],
                "positives": int(pairs["pos"].shape[1]),
                "hard_negatives": int(pairs["hard"].shape[1]),
                "targets": int(targets.size),
            }
        )
        return res
