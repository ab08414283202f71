r"""Attacks on FedGCN's pre-training exchange of neighbour-feature sums.

FedGCN (Yao et al., NeurIPS 2023) has client ``k`` upload, for every global row ``i`` it
touches, ``S_k[i] = sum_{j in N(i) ∩ V_k} x_j`` (closed neighbourhood ``N[i]`` when the
implementation counts the node itself; ``M = (A+I)^2`` etc. for 2 hops) through
:meth:`protocols.Protocol.row_sum`; each client receives the totals ``T = sum_k S_k`` of the rows
it asks for.  The attacks never assume which operator the implementation uses: the
known-topology attack picks the candidate operator with the smallest residual, the client
attack the convention that reproduces its own interior rows, scoring the one closest to the
ground truth.

* :class:`NeighbourSumReadout` -- server, K0.  Any uploaded row with a single contributor *is*
  that node's feature vector.  Pure rows are detected blindly (binary features: a non-zero row
  with every entry < 1.5; row-normalised features: equal non-zero entries; otherwise every row
  is a candidate) and rounded.  Metrics: **exposure rate** (share of nodes whose exact vector
  is among the claims, attributed to a true contributor of that row), claim precision, bit F1,
  bit-AUC on truly pure rows (detection-free; Phi(1/(sqrt2 sigma)) under Gaussian noise), node
  identifiability precision (NIP).
* :class:`NeighbourSumInversion` -- server, K2 (edge index + owner map known): per client,
  least squares ``min ||B_k X - S_k||`` with ``B_k = M[:, V_k]``; nodes whose unit vector lies
  in the row space of ``B_k`` are identifiable (exact up to noise).
* :class:`ClientSubtraction` -- a client subtracts its own contribution from the totals it
  receives: ``T_i - S_c[i] = sum_{j in N(i) \ V_c} x_j``, the exact feature vector of ``j``
  when its own node ``i`` has exactly one foreign neighbour ``j`` (the client knows its cross
  edges, so the vector is attributed too); other residual rows are read with the blind pure-row
  detector.  Works in every mode (the client legitimately decrypts its totals); only DP noise
  stops it.  Observer ``client:each``: every client on its own view, the union reported.

Row width.  This project's FedGCN sends ``[sum x_j, count]`` (a ones column appended,
``secure_fgl.algorithms.fedgcn.ops``): the count column is a perfect single-contributor detector
(``round(count) == 1``), used whenever the rows are ``d + 1`` wide (public ``row_width``,
else inferred from the block length).  With ``norm='sym'`` owners pre-scale their terms by
``deg^-1/2``; binary vectors are then read relative to the row maximum.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from protocols.transcript import SERVER, party_client

from .base import (
    Attack,
    AttackResult,
    GroundTruth,
    View,
    attack_device,
    bit_f1,
    nearest_is_true,
    roc_auc,
    row_blocks_to_rows,
)
from .significance import proportion_estimate

EXCHANGE = "fedgcn/*"
#: cross-client degree buckets of the per-node exposure histogram
DEGREE_BUCKETS = 8


# ----------------------------------------------------------------------------- helpers
def neighbour_sum_tags(view: View, pattern: str = EXCHANGE) -> list[str]:
    """FedGCN row-sum tags in the view (everything under ``fedgcn/`` but the model exchange)."""
    return [t for t in view.tags(pattern) if not t.endswith("/model")]


def row_width(pub: Mapping[str, Any], view: View, tags: list[str]) -> int:
    """Width of a row of the exchange.

    The public ``row_width``, else ``d + 1`` (count column) when it divides the block length, else ``d``.
    """
    d = int(pub["num_features"])
    if pub.get("row_width"):
        return int(pub["row_width"])
    for m in view.messages:
        if m.tag in tags and m.shape and len(m.shape) == 2:
            L = int(m.shape[1])
            if L % (d + 1) == 0:
                return d + 1
            if L % d == 0:
                return d
    return d + 1


def rows_to_vectors(feats: np.ndarray, binary: bool, relative: bool) -> np.ndarray:
    """Read feature vectors off rows.

    Binary -> bits (threshold 0.5, or half the row maximum when owners pre-scaled their terms); otherwise the rows
    themselves.
    """
    if not binary:
        return feats.astype(np.float32)
    if relative:
        thr = 0.5 * np.maximum(feats.max(axis=1, keepdims=True), 1e-12)
        return (feats > thr).astype(np.float32)
    return (feats > 0.5).astype(np.float32)


def _collect_rows(
    view: View, tags: list[str], d: int, n: int, *, receiver=None, sender=None
) -> tuple[dict[tuple[str, int], tuple[np.ndarray, np.ndarray]], int, int]:
    """Readable row-sum payloads -> {(tag, client): (gids, rows)}, plus counts of messages seen and of unreadable ones.

    Per tag only the latest readable round is used.
    """
    out, seen, opaque = {}, 0, 0
    for tag in tags:
        msgs = view.select(tag, receiver=receiver, sender=sender)
        seen += len(msgs)
        readable = [m for m in msgs if view.readable(m)]
        opaque += len(msgs) - len(readable)
        if not readable:
            continue
        last = max(m.round for m in readable)
        for m in readable:
            if m.round != last:
                continue
            party = m.sender if receiver is not None else m.receiver
            k = party_client(party)
            got = row_blocks_to_rows(view.payload(m), d, n)
            if got is None or k is None:
                continue
            gids, rows = got
            if (tag, k) in out:  # several messages of one client: merge
                g0, r0 = out[(tag, k)]
                gids, rows = np.concatenate([g0, gids]), np.concatenate([r0, rows])
            out[(tag, k)] = (gids, rows.astype(np.float32))
    return out, seen, opaque


def detect_single_contributor(
    rows: np.ndarray, binary: bool, d: int | None = None, relative: bool = False
) -> tuple[np.ndarray, np.ndarray, str]:
    """Blind pure-row detector: ``(mask, vectors, detector name)``.

    Rows of width ``d + 1`` carry a contributor count: pure iff ``round(count) == 1``.

    Binary features: a non-zero row whose entries are all < 1.5 (two contributors overlap in
    some word with high probability), read as ``row > 0.5``.  Row-normalised bag of words:
    equal non-zero entries.  Otherwise every non-zero row is a candidate ("none").
    """
    if rows.shape[0] == 0:
        return np.zeros(0, bool), rows[:, :d] if d else rows, "none"
    if d is not None and rows.shape[1] == d + 1:
        feats = rows[:, :d]
        mask = (np.rint(rows[:, d]) == 1) & (np.abs(feats).max(axis=1) > 1e-8)
        return mask, rows_to_vectors(feats, binary, relative), "count"
    if d is not None:
        rows = rows[:, :d]
    mx = rows.max(axis=1)
    if binary:
        mask = (mx > 0.5) & (mx < 1.5)
        return mask, (rows > 0.5).astype(np.float32), "binary"
    nz = np.abs(rows) > 1e-8
    any_nz = nz.any(axis=1)
    big = np.where(nz, np.abs(rows), np.inf).min(axis=1)
    top = np.abs(rows).max(axis=1)
    equal = any_nz & (top - big <= 1e-4 * np.maximum(top, 1e-12))
    if equal.sum() >= 0.05 * max(1, any_nz.sum()):
        return equal, rows, "normalised"
    return any_nz, rows, "none"


def _exact_match(vec: np.ndarray, x: np.ndarray, binary: bool) -> bool:
    if binary:
        return bool(np.array_equal(vec > 0.5, x > 0.5))
    return bool(np.allclose(vec, x, rtol=1e-3, atol=1e-5 * max(1.0, float(np.abs(x).max(initial=0)))))


def _prescaled(pub: Mapping[str, Any]) -> bool:
    """Owners pre-scale their terms (FedGCN ``norm='sym'``): binary rows are read relatively."""
    return str((pub.get("options") or {}).get("norm", "")) == "sym"


def candidate_operators(adj: sp.csr_matrix, hops: int | None = None) -> dict[str, sp.csr_matrix]:
    """The neighbour-sum operators an implementation may use: ``A``, ``A+I`` and their squares."""
    n = adj.shape[0]
    eye = sp.identity(n, format="csr")
    ops = {"A": adj, "A+I": (adj + eye).tocsr()}
    if hops is None or hops >= 2:
        ops["(A+I)^2"] = (ops["A+I"] @ ops["A+I"]).tocsr()
        ops["A^2"] = (adj @ adj).tocsr()
    if hops is not None and hops < 2:
        return ops
    return ops


def adjacency_from(edge_index: np.ndarray, n: int) -> sp.csr_matrix:
    """The ``n x n`` 0/1 adjacency of ``edge_index`` (duplicates merged, self loops removed)."""
    a = sp.csr_matrix((np.ones(edge_index.shape[1]), (edge_index[0], edge_index[1])), shape=(n, n))
    a.data[:] = 1.0
    a.setdiag(0)
    a.eliminate_zeros()
    return a.tocsr()


def _best_operator(
    ops: Mapping[str, sp.csr_matrix], cols: np.ndarray, x_cols: np.ndarray, gids: np.ndarray, rows: np.ndarray
) -> tuple[str, sp.csr_matrix]:
    """Scoring: the operator whose ``M[:, cols] X[cols]`` is closest to the observed rows."""
    best, best_err = None, np.inf
    for name, op in ops.items():
        b = op[:, cols].tocsr()
        pred = b[gids] @ x_cols
        err = float(np.square(pred - rows).sum())
        if err < best_err:
            best, best_err = name, err
    return best, ops[best][:, cols].tocsr()


def cross_degree(truth: GroundTruth) -> np.ndarray:
    """Number of neighbours each node has at other clients."""
    ei = truth.edge_index
    o = truth.owner
    cross = (o[ei[0]] != o[ei[1]]) & (o[ei[0]] >= 0) & (o[ei[1]] >= 0) & (ei[0] != ei[1])
    return np.bincount(ei[0][cross], minlength=truth.num_nodes)


def exposure_by_degree(exposed: np.ndarray, truth: GroundTruth) -> dict[str, list[int]]:
    """{cross-client degree bucket: [exposed nodes, nodes]} (the last bucket is 'B+')."""
    deg = np.minimum(cross_degree(truth), DEGREE_BUCKETS)
    kept = truth.owner >= 0
    out = {}
    for b in range(DEGREE_BUCKETS + 1):
        sel = kept & (deg == b)
        key = f"{b}+" if b == DEGREE_BUCKETS else str(b)
        out[key] = [int(exposed[sel].sum()), int(sel.sum())]
    return out


def exposure_estimate(exposed: int, eligible: int):
    """Share of eligible nodes whose features are read exactly.

    Chance 0 (no guess without the transcript reproduces a feature row), Wilson interval over the nodes.
    """
    return proportion_estimate("exposure_rate", float(exposed), int(eligible), 0.0)


def _claims_metrics(
    claim_vecs: np.ndarray, claim_cands: list[np.ndarray], truth: GroundTruth, eligible: np.ndarray
) -> tuple[dict, np.ndarray]:
    """Exposure, precision, bit-F1 and NIP of claimed vectors with their true contributor sets.

    ``eligible``: nodes that count for exposure (e.g. not the observer's own).
    """
    X, binary = truth.x, truth.binary
    exposed = np.zeros(truth.num_nodes, bool)
    correct = np.zeros(len(claim_cands), bool)
    f1s = np.zeros(len(claim_cands))
    closest = np.zeros(len(claim_cands), np.int64)
    for i, (vec, cands) in enumerate(zip(claim_vecs, claim_cands)):
        if cands.size == 0:
            continue
        xc = X[cands]
        if binary:
            pb, tb = vec > 0.5, xc > 0.5
            tp = (pb[None, :] & tb).sum(1)
            f = 2 * tp / np.maximum(pb.sum() + tb.sum(1), 1)
            j = int(np.argmax(f))
            f1s[i] = f[j]
            closest[i] = cands[j]
            hits = (tb == pb[None, :]).all(1)
        else:
            dif = np.abs(xc - vec[None, :]).max(1)
            j = int(np.argmin(dif))
            closest[i] = cands[j]
            hits = np.array([_exact_match(vec, xr, False) for xr in xc])
        if hits.any():
            correct[i] = True
            exposed[cands[hits]] = True
    exposed &= eligible
    n_elig = max(1, int(eligible.sum()))
    m = {
        "exposure_rate": float(exposed.sum() / n_elig),
        "exposed_nodes": int(exposed.sum()),
        "eligible_nodes": n_elig,
        "claims": int(len(claim_cands)),
        "precision": float(correct.mean()) if len(claim_cands) else None,
    }
    if binary:
        m["bit_f1"] = float(f1s.mean()) if len(claim_cands) else None
    if len(claim_cands):
        m["nip"] = float(nearest_is_true(claim_vecs, X, closest).mean())
    return m, exposed


def _bit_auc(scores: list[np.ndarray], bits: list[np.ndarray], limit_rows: int = 3000, seed: int = 0) -> float | None:
    if not scores:
        return None
    s, b = np.concatenate(scores), np.concatenate(bits)
    if s.shape[0] > limit_rows:
        idx = np.random.default_rng(seed).choice(s.shape[0], limit_rows, replace=False)
        s, b = s[idx], b[idx]
    v = roc_auc(s.ravel(), b.ravel() > 0.5)
    return None if np.isnan(v) else v


# ----------------------------------------------------------------------------- server readout
def _readable_uploads(attack, view: View, pub: Mapping[str, Any]):
    """The neighbour-sum uploads the observer can read, or a not-applicable result.

    Returns ``(obs, seen, opaque, tags, observer, relative)``.
    """
    tags = neighbour_sum_tags(view, attack.exchange)
    if not tags:
        return attack.not_applicable("no FedGCN neighbour-sum exchange in the transcript")
    me = view.parties[0]
    obs, seen, opaque = _collect_rows(view, tags, row_width(pub, view, tags), int(pub["num_nodes"]), receiver=me)
    if not obs:
        return attack.not_applicable(
            f"all {seen} uploads of {', '.join(tags)} are ciphertext/masked to the {me}"
            if seen
            else "no uploads reach this observer"
        )
    return obs, seen, opaque, tags, me, _prescaled(pub)


class NeighbourSumReadout(Attack):
    """Server reads single-contributor rows of each client's upload (K0: protocol only)."""

    name = "fedgcn_readout"
    exchange = EXCHANGE
    default_observer = SERVER
    knowledge = ("public",)
    algorithms = ("fedgcn",)

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Claim the rows of each client's readable row-sum uploads that the blind detector finds single-contributor."""
        pub = knowledge["public"]
        got = _readable_uploads(self, view, pub)
        if isinstance(got, AttackResult):
            return got
        obs, seen, opaque, tags, me, relative = got
        d, binary = int(pub["num_features"]), bool(pub["binary_features"])
        claims = []
        detector = "none"
        for (tag, k), (gids, rows) in obs.items():
            mask, vecs, detector = detect_single_contributor(rows, binary, d, relative)
            for g, v in zip(gids[mask], vecs[mask]):
                claims.append((tag, k, int(g), v))
        feats = {key: (g, r[:, :d]) for key, (g, r) in obs.items()}
        return self.result(
            output={"claims": claims, "observed": feats, "detector": detector, "opaque_messages": opaque}
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Exposure, precision and bit AUC of the claimed rows, with the operator that fits each client."""
        out = res.output
        adj = truth.adjacency()
        ops = candidate_operators(adj)
        per_client_op, cands, vecs = {}, [], []
        auc_s, auc_b = [], []
        for (tag, k), (gids, rows) in out["observed"].items():
            cols = np.flatnonzero(truth.owner == k)
            name, b = _best_operator(ops, cols, truth.x[cols], gids, rows)
            per_client_op[k] = name
            b_obs = b[gids]
            nnz = np.diff(b_obs.indptr)
            pure = (nnz == 1) & (np.abs(b_obs.sum(axis=1).A.ravel() - 1) < 1e-9)
            if truth.binary and pure.any():
                src = cols[b_obs.indices[b_obs.indptr[:-1][pure]]]
                auc_s.append(rows[pure])
                auc_b.append(truth.x[src])
            # candidate contributors of each claimed row of this (tag, k)
            for t2, k2, g, v in out["claims"]:
                if t2 == tag and k2 == k:
                    cands.append(cols[b.indices[b.indptr[g] : b.indptr[g + 1]]])
                    vecs.append(v)
        eligible = truth.owner >= 0
        vec_arr = np.stack(vecs) if vecs else np.zeros((0, truth.x.shape[1]))
        m, exposed = _claims_metrics(vec_arr, cands, truth, eligible)
        m["bit_auc"] = _bit_auc(auc_s, auc_b)
        m["operator"] = sorted(set(per_client_op.values()))
        m["detector"] = out["detector"]
        m["by_cross_degree"] = exposure_by_degree(exposed, truth)
        m["chance_bit_auc"] = 0.5
        res.metrics.update(m)
        res.add(exposure_estimate(m["exposed_nodes"], m["eligible_nodes"]), primary=True)
        return res


# ----------------------------------------------------------------------------- LS inversion
class NeighbourSumInversion(Attack):
    """Server with the topology (K2) solves ``S_k = B_k X_k`` by least squares per client."""

    name = "fedgcn_ls"
    exchange = EXCHANGE
    default_observer = SERVER
    knowledge = ("public", "topology")
    algorithms = ("fedgcn",)
    options = {"max_rows": 20000}

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Solve S_k = B_k X_k per client by pseudo-inverse, under the candidate operator with the smallest residual.

        Nodes whose row of pinv(B_k) B_k is a unit vector are marked identifiable.
        """
        pub, topo = knowledge["public"], knowledge["topology"]
        got = _readable_uploads(self, view, pub)
        if isinstance(got, AttackResult):
            return got
        obs, seen, opaque, tags, me, relative = got
        d, n, binary = int(pub["num_features"]), int(pub["num_nodes"]), bool(pub["binary_features"])
        obs = {key: (g, r[:, :d]) for key, (g, r) in obs.items()}
        owner = np.asarray(topo["owner"])
        adj = adjacency_from(np.asarray(topo["edge_index"]), n)
        ops = candidate_operators(adj)
        dev = attack_device()
        xhat = np.zeros((n, d))
        ident = np.zeros(n, bool)
        chosen = {}
        tag = tags[0]
        for (t, k), (gids, rows) in obs.items():
            if t != tag:
                continue
            cols = np.flatnonzero(owner == k)
            if cols.size == 0:
                continue
            s_obs = torch.zeros(n, d, dtype=torch.float64, device=dev)
            s_obs[torch.as_tensor(gids, device=dev)] = torch.as_tensor(rows, dtype=torch.float64, device=dev)
            best = None
            for name, op in ops.items():
                b = op[:, cols].tocsr()
                used = np.union1d(np.flatnonzero(np.diff(b.indptr)), gids)
                bd = torch.as_tensor(b[used].toarray(), dtype=torch.float64, device=dev)
                pinv = torch.linalg.pinv(bd)
                xk = pinv @ s_obs[torch.as_tensor(used, device=dev)]
                resid = float(((bd @ xk - s_obs[torch.as_tensor(used, device=dev)]) ** 2).sum())
                if best is None or resid < best[0]:
                    proj = torch.diagonal(pinv @ bd)
                    best = (resid, name, xk, proj)
            _, name, xk, proj = best
            chosen[k] = name
            xhat[cols] = xk.cpu().numpy()
            ident[cols] = (torch.abs(proj - 1) < 1e-6).cpu().numpy()
        return self.result(
            output={
                "xhat": xhat,
                "bits": rows_to_vectors(xhat, True, relative) if binary else None,
                "identifiable": ident,
                "operators": chosen,
                "clients": sorted(chosen),
                "binary": binary,
            }
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Share of the attacked clients' nodes whose features are recovered exactly, with bit AUC/F1 or MSE and NIP."""
        out = res.output
        attacked = np.isin(truth.owner, out["clients"])
        X, xh = truth.x, out["xhat"]
        if truth.binary:
            bits = out["bits"] if out.get("bits") is not None else (xh > 0.5)
            exact = ((bits > 0.5) == (X > 0.5)).all(1)
        else:
            exact = np.array([_exact_match(xh[i], X[i], False) for i in range(X.shape[0])])
        exposed = exact & attacked
        n_att = max(1, int(attacked.sum()))
        idx = np.flatnonzero(attacked)
        m = {
            "exposure_rate": float(exposed.sum() / n_att),
            "exposed_nodes": int(exposed.sum()),
            "eligible_nodes": n_att,
            "identifiable_fraction": float(out["identifiable"][attacked].mean()) if attacked.any() else None,
            "operator": sorted(set(out["operators"].values())),
            "nip": float(nearest_is_true(xh[idx], X, idx).mean()) if idx.size else None,
            "by_cross_degree": exposure_by_degree(exposed, truth),
        }
        if truth.binary and idx.size:
            sub = idx if idx.size <= 3000 else np.random.default_rng(0).choice(idx, 3000, replace=False)
            m["bit_auc"] = roc_auc(xh[sub].ravel(), X[sub].ravel() > 0.5)
            m["bit_f1"] = float(np.mean([bit_f1(bits[i] > 0.5, X[i] > 0.5) for i in sub]))
        else:
            m["mse"] = float(np.mean((xh[idx] - X[idx]) ** 2)) if idx.size else None
        res.metrics.update(m)
        res.add(exposure_estimate(m["exposed_nodes"], m["eligible_nodes"]), primary=True)
        return res


# ----------------------------------------------------------------------------- client side
def own_degrees(own) -> np.ndarray:
    """``deg + 1`` of the client's own nodes, from its local and cross edges."""
    g = own.global_ids.cpu().numpy().astype(np.int64)
    ei = own.edge_index.cpu().numpy()
    ce = own.cross_edges.cpu().numpy()
    deg = np.ones(g.size)
    keep = ei[0] != ei[1]
    np.add.at(deg, ei[0][keep], 1.0)
    if ce.size:
        np.add.at(deg, np.searchsorted(g, ce[0]), 1.0)
    return deg


def own_contribution(
    own, num_nodes: int, gids: np.ndarray, closed: bool, *, with_count: bool = False, prescale: bool = False
) -> np.ndarray:
    """Rows ``gids`` of what client ``own`` (a ClientSubgraph) contributes to 1-hop sums.

    ``sum_{j in N(i) ∩ V_c} t_j`` (+ ``t_i`` for own ``i`` when ``closed``), ``t_j = x_j`` (times ``deg_j^-1/2`` when
    ``prescale``), with a ones column when ``with_count``.
    """
    g = own.global_ids.cpu().numpy().astype(np.int64)
    x = own.x.detach().cpu().numpy().astype(np.float64)
    if prescale:
        x = x / np.sqrt(own_degrees(own))[:, None]
    if with_count:
        x = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
    ei = own.edge_index.cpu().numpy()
    keep = ei[0] != ei[1]
    ei = ei[:, keep]
    ce = own.cross_edges.cpu().numpy()
    # rows = target row (global), cols = own local index contributing
    r = np.concatenate([g[ei[0]], ce[1]]) if ce.size else g[ei[0]]
    c = np.concatenate([ei[1], np.searchsorted(g, ce[0])]) if ce.size else ei[1]
    if closed:
        r = np.concatenate([r, g])
        c = np.concatenate([c, np.arange(g.size)])
    b = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(num_nodes, g.size))
    b.data[:] = 1.0
    return np.asarray(b[gids] @ x)


class ClientSubtraction(Attack):
    """A client subtracts its own contribution from the totals it receives (any mode)."""

    name = "fedgcn_client_subtraction"
    exchange = EXCHANGE
    default_observer = "client:each"
    knowledge = ("public", "own_data", "received")
    algorithms = ("fedgcn",)

    def run(self, view: View, knowledge: Mapping[str, Any]) -> AttackResult:
        """Subtract the client's own contribution from the totals it receives and claim the residual rows.

        The neighbourhood convention (open or closed) is the one whose own contribution fits the client's interior rows;
        a
        residual from exactly one foreign neighbour is attributed to it.
        """
        pub, own = knowledge["public"], knowledge["own_data"]
        d, n, binary = int(pub["num_features"]), int(pub["num_nodes"]), bool(pub["binary_features"])
        me = view.parties[0]
        c = party_client(me)
        tags = neighbour_sum_tags(view, self.exchange)
        if not tags:
            return self.not_applicable("no FedGCN neighbour-sum exchange in the transcript")
        w = row_width(pub, view, tags)
        relative = _prescaled(pub)
        # everything the client decrypted (whole blocks, keyed by node id); else its readable downloads
        totals = {t: v for t, v in (knowledge.get("received") or {}).items() if fnmatch.fnmatchcase(t, self.exchange)}
        source = "client's decrypted blocks"
        if not totals:
            got, _, _ = _collect_rows(view, tags, w, n, sender=SERVER)
            totals = {t: v for (t, k), v in got.items() if k == c}
            source = "transcript"
        if not totals:
            return self.not_applicable(
                f"the totals {me} receives are ciphertext/masked in the transcript and no "
                "decrypted copy of its own results is available"
            )
        tag = sorted(totals)[0]
        gids, T = totals[tag]
        gids = np.asarray(gids, dtype=np.int64)
        T = np.asarray(T, dtype=np.float64)
        with_count = T.shape[1] == d + 1
        g_own = own.global_ids.cpu().numpy().astype(np.int64)
        is_own = np.isin(gids, g_own)
        ce = own.cross_edges.cpu().numpy()
        foreign_deg = (
            np.bincount(np.searchsorted(g_own, ce[0]), minlength=g_own.size)
            if ce.size
            else np.zeros(g_own.size, np.int64)
        )
        # convention: own rows without foreign neighbours must equal the own contribution
        interior = np.zeros(gids.size, bool)
        interior[is_own] = foreign_deg[np.searchsorted(g_own, gids[is_own])] == 0
        fits = {}
        for closed in (False, True):
            S = own_contribution(own, n, gids, closed, with_count=with_count, prescale=relative)
            fits[closed] = (
                float(np.square(T[interior] - S[interior]).mean())
                if interior.any()
                else float(np.square(T - S).mean()),
                S,
            )
        closed = min(fits, key=lambda k: fits[k][0])
        R = T - fits[closed][1]
        feats = R[:, :d]
        claims = []
        # (a) own node with exactly one foreign neighbour: the residual is that neighbour, attributed
        attributed = np.zeros(gids.size, bool)
        if ce.size:
            src_local = np.searchsorted(g_own, ce[0])
            partner = {int(g_own[s_]): int(f) for s_, f in zip(src_local, ce[1]) if foreign_deg[s_] == 1}
            pos = {int(g): i for i, g in enumerate(gids)}
            for node, mate in partner.items():
                i = pos.get(node)
                if i is None:
                    continue
                v = rows_to_vectors(feats[i : i + 1], binary, relative)[0]
                claims.append((node, mate, v, feats[i].astype(np.float32)))
                attributed[i] = True
        # (b) rows of foreign nodes received in the same blocks: the count column (or the blind
        #     detector) tells single contributors; own rows with >= 2 foreign neighbours are mixtures
        rest = ~is_own & (np.abs(feats).max(axis=1) > 1e-6 if R.size else np.zeros(0, bool))
        mask, vecs, detector = detect_single_contributor(R[rest], binary, d, relative)
        for g, v, raw in zip(gids[rest][mask], vecs[mask], feats[rest][mask]):
            claims.append((int(g), None, v.astype(np.float32), raw.astype(np.float32)))
        return self.result(
            output={
                "client": c,
                "claims": claims,
                "closed": closed,
                "source": source,
                "detector": detector,
                "fit_error": fits[closed][0],
                "rows_read": int(gids.size),
            }
        )

    def score(self, res: AttackResult, truth: GroundTruth) -> AttackResult:
        """Exposure, precision and bit AUC of the claims against the foreign neighbours of each claimed row."""
        out = res.output
        c = out["client"]
        a_closed = truth.adjacency(self_loops=True)
        foreign = truth.owner != c
        cands, vecs, auc_s, auc_b = [], [], [], []
        for row, partner, v, raw in out["claims"]:
            nb = a_closed.indices[a_closed.indptr[row] : a_closed.indptr[row + 1]]
            cand = nb[foreign[nb]]
            if partner is not None:
                cand = np.intersect1d(cand, [partner])
                if truth.binary and cand.size:
                    auc_s.append(raw[None, :])
                    auc_b.append(truth.x[cand[:1]])
            cands.append(cand)
            vecs.append(v)
        eligible = (truth.owner >= 0) & foreign
        vec_arr = np.stack(vecs) if vecs else np.zeros((0, truth.x.shape[1]))
        m, exposed = _claims_metrics(vec_arr, cands, truth, eligible)
        m["bit_auc"] = _bit_auc(auc_s, auc_b)
        m["convention"] = "closed" if out["closed"] else "open"
        m["source"] = out["source"]
        m["exposed_mask"] = exposed  # pooled by the runner, dropped before serialising
        res.metrics.update(m)
        res.add(exposure_estimate(m["exposed_nodes"], m["eligible_nodes"]), primary=True)
        return res

    @staticmethod
    def pool(results: list[AttackResult], truth: GroundTruth) -> dict:
        """Union over observer clients: share of all nodes exposed to at least one other client."""
        ok = [r for r in results if r.applicable and "exposed_mask" in r.metrics]
        if not ok:
            return {}
        union = np.zeros(truth.num_nodes, bool)
        for r in ok:
            union |= r.metrics["exposed_mask"]
        kept = truth.owner >= 0
        precs = [r.metrics["precision"] for r in ok if r.metrics.get("precision") is not None]
        aucs = [r.metrics["bit_auc"] for r in ok if r.metrics.get("bit_auc") is not None]
        return {
            "estimate": exposure_estimate(int(union[kept].sum()), int(kept.sum())),
            "exposure_rate": float(union[kept].mean()),
            "exposed_nodes": int(union.sum()),
            "per_client_exposure": [float(r.metrics["exposure_rate"]) for r in ok],
            "precision": float(np.mean(precs)) if precs else None,
            "bit_auc": float(np.mean(aucs)) if aucs else None,
            "claims": int(sum(r.metrics.get("claims", 0) for r in ok)),
            "source": ok[0].metrics.get("source"),
            "convention": ok[0].metrics.get("convention"),
            "by_cross_degree": exposure_by_degree(union, truth),
        }
