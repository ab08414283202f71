r"""FedGCN: one secure pre-training exchange of neighbour-feature sums, then FedAvg.

Yao, Jin, Ravi & Joe-Wong, *FedGCN: Convergence-Communication Tradeoffs in Federated
Training of Graph Convolutional Networks*, NeurIPS 2023, sec. 4 (eq. 2-3, "Training
Algorithm") and sec. 6 (Table 2).  Design and what each option reveals: docs/fedgcn.md.

Operator summed (eq. 3, with the self loop of the GCN): with ``Ã = A + I``, ``d̃_v = deg(v) + 1``
and ``t_j = [x_j, 1]`` (a ones column appended), client ``k`` contributes for every node ``v`` it
knows (its own nodes and the remote endpoints of its cross edges)

.. math::  P^{(k)}_v = \sum_{j \in V_k} Ã_{vj}\, t_j

and the parties receive the sum (eq. 2), the degree travelling through the ones column:

.. math::  S_v = \sum_k P^{(k)}_v = \big[(ÃX)_v,\; d̃_v\big]

Scope: ``hops=1`` returns ``S_v`` for the client's own nodes, ``hops=2`` also for the remote
endpoints of its cross edges, ``hops=0`` has no exchange (FedAvg on the local subgraph).

Normalisation (``norm``): ``'row'`` ``Z_v = S_v[:d] / d̃_v = (D̃^{-1} Ã X)_v``; ``'sym'``
``(D̃^{-1/2} Ã D̃^{-1/2} X)_v``, owners pre-scaling their terms ``t_j = [d̃_j^{-1/2} x_j, 1]`` and the
receiver multiplying by ``d̃_v^{-1/2}``; ``'none'`` the raw sums ``(ÃX)_v``.

Model (the paper code's ``AggreGCN``): ``logits = Â_k · relu(Z W_1 + b_1) · W_2 + b_2``, the first
layer a linear map of the received sums, the later ones propagating over the graph the client
knows (1-hop: its local subgraph; 2-hop: with its cross edges and the received degrees).
``center`` feeds ``Z - 1 mu^T`` (mu: the mean of the client's own rows) through
``(Z - 1 mu^T) W = Z W - 1 (mu^T W)`` (:mod:`secure_fgl.models.centring`).

``degree_cap``: a public bound on every degree, checked by each owner on its own nodes before
anything is encrypted (:class:`protocols.BoundError`); it fixes the packed field width
(``sum_max = degree_cap + 1``) and the node-level DP sensitivity.

DP (``--dp-epsilon``): every term is clipped, ``||[x̂_j, 1]||_2 <= C``; L2 sensitivity ``sqrt(2) C``
per edge (:func:`protocols.dp.edge_level_sensitivity`), ``sqrt(D + 1) C`` per node with
``D = degree_cap`` (:func:`protocols.dp.node_level_sensitivity`); :func:`denoise_with_own_data`
post-processes the noisy sums with the client's own data.

Row numbering of the sparse layout (``row_order``): ``'given'`` (node ids), ``'signature'`` (rows
grouped by the set ``S(v)`` of clients touching them), ``'owner'`` (rows grouped by recipient); the server
numbers them from the clients' touch-set histograms
(:func:`~secure_fgl.algorithms.fedgcn.server.layout_from_histogram`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from protocols import SERVER, DPRequest, ValueSpec, client_party
from protocols.baseline import row_sum_bytes
from protocols.row_blocks import exact_integers

from ...data.federated import ClientSubgraph
from ...models.node import dropout
from ...privacy import resolve_unit
from ...validation import ConfigError
from ..options import FedGCNOptions

#: tag of the pre-training exchange
TAG = "fedgcn/neighbour_sums"
#: the row-order exchanges (``--row-order signature|owner``): histograms, then relayed row ids
ORDER_TAG = "fedgcn/row_order"
IDS_TAG = "fedgcn/row_ids"
#: the channel stage the relayed row ids are bound to (associated data)
RELAY_STAGE = "relay"
#: the block-cutting dynamic programme runs when (rows x rows-per-block) is at most this; above
#: it the Gray-ordered rows are cut into full blocks (a few more bytes, docs/performance.md)
SEGMENT_DP_MAX_WORK = 4_000_000


class PropGraph(NamedTuple):
    """The graph a client propagates over after the first layer.

    ``edge_index``/``edge_weight`` over the client's known nodes (own nodes first), self
    loops included; ``num_out`` = number of own nodes (the rows whose logits are used).
    """

    edge_index: torch.Tensor
    edge_weight: torch.Tensor
    num_out: int


# ---------------------------------------------------------------------------
# pure pieces of the pre-training exchange (client side)
# ---------------------------------------------------------------------------
def _local_positions(global_ids: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Local index of each global id in ``query`` (all must be own nodes)."""
    order = torch.argsort(global_ids)
    pos = torch.searchsorted(global_ids[order], query)
    return order[pos]


def _local_edges(c: ClientSubgraph) -> tuple[torch.Tensor, torch.Tensor]:
    """Local edges without self loops (``Ã`` carries exactly one self loop per node)."""
    a, b = c.edge_index
    keep = a != b
    return a[keep], b[keep]


def local_degrees(c: ClientSubgraph) -> torch.Tensor:
    """``d̃_v = deg(v) + 1`` of every own node, from the client's own local and cross edges."""
    a, _ = _local_edges(c)
    deg = torch.ones(c.num_nodes, dtype=torch.float64, device=c.global_ids.device)
    deg.index_add_(0, a, torch.ones_like(a, dtype=torch.float64))
    if c.cross_edges.numel():
        pos = _local_positions(c.global_ids, c.cross_edges[0])
        deg.index_add_(0, pos, torch.ones_like(pos, dtype=torch.float64))
    return deg


def subsample_ones(x: torch.Tensor, max_ones: int, generator: torch.Generator) -> torch.Tensor:
    """Binary rows with more than ``max_ones`` ones keep a uniformly random subset of that size."""
    out = x.clone()
    rows, cols = (x != 0).nonzero(as_tuple=True)
    if rows.numel() == 0:
        return out
    key = torch.rand(rows.numel(), generator=generator, dtype=torch.float64).to(x.device) + rows.to(torch.float64)
    order = torch.argsort(key)  # by row, random within a row
    rows, cols = rows[order], cols[order]
    starts = torch.zeros(x.size(0) + 1, dtype=torch.long, device=x.device)
    starts[1:] = torch.cumsum(torch.bincount(rows, minlength=x.size(0)), 0)
    rank = torch.arange(rows.numel(), device=x.device) - starts[rows]
    drop = rank >= max_ones
    out[rows[drop], cols[drop]] = 0
    return out


def neighbour_terms(
    c: ClientSubgraph, norm: str = "row", clip: float | None = None, binary: bool = False, seed: int = 0
) -> torch.Tensor:
    """``t_j = [x̂_j, 1]`` for own nodes (float64).

    Without ``clip``: ``x̂_j = x_j``.  With ``clip = C`` (DP): ``||t_j|| <= C`` -- binary
    features keep at most ``floor(C^2 - 1)`` random ones, others are scaled to norm
    ``sqrt(C^2 - 1)``; the ones entry is untouched.  ``norm='sym'`` pre-scales ``x̂_j`` by
    ``d̃_j^{-1/2}`` (the owner knows ``d̃_j``).
    """
    x = c.x.to(torch.float64)
    if clip is not None:
        room = max(clip * clip - 1.0, 0.0)
        if binary:
            gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(c.client_id))
            x = subsample_ones(x, int(math.floor(room + 1e-9)), gen)
        else:
            scale = (math.sqrt(room) / x.norm(dim=1).clamp_min(1e-300)).clamp(max=1.0)
            x = x * scale[:, None]
    if norm == "sym":
        x = x * local_degrees(c).rsqrt()[:, None]
    return torch.cat([x, torch.ones(x.size(0), 1, dtype=torch.float64, device=x.device)], dim=1)


def partial_neighbour_sums(c: ClientSubgraph, terms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``k``'s contribution (eq. 3): ``P_v = Σ_{j ∈ V_k} Ã_vj t_j``.

    Rows: own nodes (global ids, own term + own local neighbours' terms) followed by the
    remote endpoints of the cross edges (sorted, the terms of their own neighbours here).
    Returns ``(global_row_ids [m], rows [m, d+1])``.
    """
    a, b = _local_edges(c)
    own = terms.clone()  # the self loop, once, by the owner
    own.index_add_(0, a, terms[b])  # edge (a, b): b is a neighbour of a
    if c.cross_edges.numel():
        mine = _local_positions(c.global_ids, c.cross_edges[0])
        remote_ids, inv = torch.unique(c.cross_edges[1], return_inverse=True)
        remote = torch.zeros(remote_ids.numel(), terms.size(1), dtype=terms.dtype, device=terms.device)
        remote.index_add_(0, inv, terms[mine])
    else:
        remote_ids = c.global_ids.new_empty(0)
        remote = terms.new_zeros(0, terms.size(1))
    return torch.cat([c.global_ids, remote_ids]), torch.cat([own, remote])


def narrow_integer_rows(rows: torch.Tensor) -> torch.Tensor:
    """Integer-valued rows in the narrowest signed integer dtype that holds them.

    Integer-valued rows (counts of binary features) in the narrowest signed integer dtype that
    holds them exactly (:func:`protocols.row_blocks.exact_integers`) -- int16 under the default
    degree cap, a quarter of float64's memory (10 clients' rows at 1e6 nodes: 0.76 GB -> 0.19 GB);
    other rows unchanged.  The backends build their blocks from them in float64, so the sums are
    the same.
    """
    return torch.from_numpy(exact_integers(rows.cpu().numpy()))


def touch_signatures(clients: list[ClientSubgraph], owner: torch.Tensor, num_nodes: int) -> np.ndarray:
    """``S(v)`` as an int64 bitmask per global node (bit ``k``: client ``k`` touches row ``v``).

    Computed owner-side, as each owner would: its own nodes get its bit, and a cross edge
    ``(v, u)`` at own node ``v`` adds the bit of ``u``'s owner (the client that holds that far
    end and therefore contributes to row ``v``).  Dropped nodes (owner ``-1``) get 0.
    """
    if len(clients) > 62:
        raise ConfigError(f"row_order='signature' supports at most 62 clients, got {len(clients)}")
    own = owner.detach().cpu().numpy()
    masks = np.zeros(int(num_nodes), dtype=np.int64)
    for k, c in enumerate(clients):
        masks[c.global_ids.cpu().numpy()] |= np.int64(1) << k
        if c.cross_edges.numel():
            v = c.cross_edges[0].cpu().numpy()
            np.bitwise_or.at(masks, v, np.left_shift(np.int64(1), own[c.cross_edges[1].cpu().numpy()]))
    return masks


def _inverse_gray(masks: np.ndarray) -> np.ndarray:
    """Rank of each bitmask in the reflected Gray code sequence (consecutive ranks differ by one bit)."""
    out = masks.copy()
    shift = masks >> 1
    while shift.any():
        out ^= shift
        shift >>= 1
    return out


def segment_blocks(masks: np.ndarray, rpb: int, max_work: int = SEGMENT_DP_MAX_WORK) -> np.ndarray:
    """Row id of each entry of an ordered sequence of touch masks.

    The sequence is cut into blocks of ``<= rpb`` consecutive entries (the rest of a block left empty) so that the
    uploads, ``sum over blocks of popcount(OR of the block's masks)``, are minimal (exact DP, ``f[j] = min_{j-rpb <=
    i < j} f[i] + popcount(OR masks[i:j])``). Above ``max_work`` (entries x rpb) the sequence is cut into full
    blocks (ids ``0..n-1``).
    """
    n = int(masks.size)
    if n == 0 or rpb <= 1 or n * rpb > max_work:
        return np.arange(n, dtype=np.int64)
    m = [int(x) for x in masks]
    f = [0] + [math.inf] * n
    prev = [0] * (n + 1)
    for i in range(n):
        fi, u = f[i], 0
        for j in range(i + 1, min(n, i + rpb) + 1):
            u |= m[j - 1]
            c = fi + u.bit_count()
            if c < f[j]:
                f[j], prev[j] = c, i
    starts, j = [], n
    while j > 0:
        starts.append(prev[j])
        j = prev[j]
    starts.reverse()
    pos = np.empty(n, dtype=np.int64)
    for b, (a, e) in enumerate(itertools.pairwise([*starts, n])):
        pos[a:e] = b * rpb + np.arange(e - a)
    return pos


def denoise_with_own_data(
    c: ClientSubgraph, totals: torch.Tensor, sent_own: torch.Tensor, norm: str, noise_std: float = 0.0
) -> torch.Tensor:
    """DP post-processing with what client ``k`` legitimately holds (no privacy cost).

    For an own node ``v`` the total is ``P_v^{(k)} + R_v + noise`` where ``P^{(k)}`` is the
    client's own part (it sent the clipped ``sent_own``) and ``R_v`` the other clients' part.
    The client replaces its own part by the exact, unclipped one, keeps the remote part only
    if ``v`` has a cross edge (``r_v`` of them, known from its cross edges; otherwise ``R_v = 0``
    exactly).  The noise is left zero-mean: projecting it onto the feasible range ``[0, r_v]``
    biases every one of the ``d`` entries upwards and costs far more accuracy than it saves.
    Rows of remote endpoints (2-hop) are used as received.
    """
    n = c.num_nodes
    exact_own = partial_neighbour_sums(c, neighbour_terms(c, norm))[1][:n]
    r = torch.zeros(n, dtype=torch.float64, device=totals.device)
    if c.cross_edges.numel():
        r.index_add_(
            0,
            _local_positions(c.global_ids, c.cross_edges[0]),
            torch.ones(c.cross_edges.size(1), dtype=torch.float64, device=totals.device),
        )
    remote = (totals[:n] - sent_own) * (r > 0).to(totals.dtype)[:, None]
    if noise_std > 0:
        # James-Stein shrinkage of each row's remote part (known noise std, d >= 3 entries)
        d = remote.size(1) - 1
        sq = remote[:, :-1].pow(2).sum(1).clamp_min(1e-300)
        shrink = (1.0 - (d - 2) * noise_std**2 / sq).clamp(0.0, 1.0)
        remote = remote * shrink[:, None]
    out = totals.clone()
    out[:n] = exact_own + remote
    return out


def requested_rows(c: ClientSubgraph, hops: int) -> torch.Tensor:
    """Rows client ``k`` receives: own nodes (1-hop), then cross-edge endpoints (2-hop)."""
    if hops <= 1 or not c.cross_edges.numel():
        return c.global_ids
    return torch.cat([c.global_ids, torch.unique(c.cross_edges[1])])


def without_clients(c: ClientSubgraph, far_owner: torch.Tensor, left_out) -> tuple[ClientSubgraph, torch.Tensor]:
    """Client ``k``'s subgraph in the graph without the nodes of the clients ``left_out``.

    A pre-training exchange that left some contributors out (dropouts) sums ``S'_v = sum_{j in Ñ(v), owner(j) kept}
    t_j``: FedGCN's sums on the subgraph induced by the kept clients' nodes.  Returns ``c`` without its cross edges to
    the left-out clients' nodes (so :func:`local_degrees` gives ``d̃'_v``, and :func:`propagation_graph` the induced
    graph) and a mask over ``requested_rows(c, 2)`` of the rows still in it (own nodes and kept far ends).
    """
    gone = torch.as_tensor(sorted(int(j) for j in left_out), dtype=far_owner.dtype, device=far_owner.device)
    keep = ~torch.isin(far_owner, gone)
    kept = replace(c, cross_edges=c.cross_edges[:, keep])
    remote_ids = torch.unique(c.cross_edges[1]) if c.cross_edges.numel() else c.global_ids.new_empty(0)
    rows = torch.cat([torch.ones(c.num_nodes, dtype=torch.bool), torch.isin(remote_ids, kept.cross_edges[1])])
    return kept, rows


#: the public grid of float pre-training sums (without DP): each contribution is rounded to a multiple
#: of 2^-20 on its client, every decoded sum back to it (``ValueSpec.grid_bits``)
PRETRAIN_GRID_BITS = 20
#: a coarser grid where the sums' bound needs it: at most 2^39 grid steps, exact in ckks's signed fields
PRETRAIN_GRID_STEP_BITS = 39


def exchange_spec(o: FedGCNOptions, binary: bool, dp_clip: float | None = None, counts: bool = False) -> ValueSpec:
    """Public bounds of the pre-training exchange.

    Public bounds of the exchange (:meth:`FedGCN.value_spec`), from the options, the feature
    type and the DP term bound ``C`` (``None`` without DP).  Integer sums (``norm`` row or none)
    travel as exact integer fields in every mode: binary features (each entry of a row's total
    at most ``cap + 1``) and, without DP (whose clipping scales the terms), non-negative integer
    features such as word counts (``counts``; at most ``(cap + 1) * floor(feature_bound)``,
    each owner checking its features against ``--feature-bound``).  Float sums without DP travel
    on the public grid ``2^-f``, ``f = min(PRETRAIN_GRID_BITS, PRETRAIN_GRID_STEP_BITS - ceil(log2 B))``
    for the sum bound ``B`` (plain on a float64 wire where float32 cannot hold ``B 2^f`` steps), so
    every mode returns the same sums bit for bit.
    """
    cap1 = o.degree_cap + 1
    if binary and o.norm != "sym":
        return ValueSpec(integer=True, max_abs=float(cap1), sum_max=int(cap1), owner_checked_sum=True)
    if counts and dp_clip is None and o.norm != "sym":
        top = cap1 * max(math.floor(o.feature_bound), 1)
        return ValueSpec(integer=True, max_abs=float(top), sum_max=int(top), owner_checked_sum=True)
    bound = dp_clip if dp_clip is not None else (1.0 if binary else max(float(o.feature_bound), 1.0))
    # a row's total sums deg(v) + 1 <= cap + 1 terms, each entry bounded by ``bound``
    # (owners check degree and feature bound): cap1 * bound bounds the sum too
    if dp_clip is not None:
        return ValueSpec(max_abs=cap1 * bound, owner_checked_sum=True)
    # float sums on a public grid: every mode returns plain's sums bit for bit
    bits = min(PRETRAIN_GRID_BITS, PRETRAIN_GRID_STEP_BITS - math.ceil(math.log2(cap1 * bound)))
    return ValueSpec(
        max_abs=cap1 * bound,
        owner_checked_sum=True,
        tolerance=2.0 ** -(bits + 2),
        float64_wire=cap1 * bound * 2.0**bits > 2.0**24,
        grid_bits=bits,
    )


def dp_applies(cfg, protocol) -> bool:
    """DP applies to the pre-training exchange: the run has DP and :data:`TAG` is in its scope."""
    dp = getattr(protocol, "dp", None)
    if cfg.dp_epsilon is None or dp is None:
        return False
    in_scope = getattr(dp.config, "in_scope", None)
    return bool(in_scope(TAG)) if in_scope is not None else True


def dp_row_clip(o: FedGCNOptions, cfg) -> float:
    """``C`` of the DP terms (``--dp-row-clip``, else ``--dp-clip``)."""
    C = o.dp_row_clip if o.dp_row_clip is not None else cfg.dp_clip
    if not C >= 1.0:
        raise ConfigError(
            f"FedGCN's DP terms [x, 1] need an L2 bound C >= 1 (the ones column takes 1); "
            f"got {C}. Set --dp-row-clip (e.g. sqrt(typical ones per row + 1))"
        )
    return float(C)


def exchange_dp_request(o: FedGCNOptions, cfg, binary: bool) -> DPRequest:
    """The DP request of the pre-training exchange.

    The DP request of the exchange (module docstring, "Differential privacy"): per-row terms
    bounded by ``C``, edge- or node-level sensitivity, one release, integer noise for integer terms.
    """
    from protocols.dp import edge_level_sensitivity, node_level_sensitivity

    C = dp_row_clip(o, cfg)
    sens = edge_level_sensitivity(C) if resolve_unit(cfg) == "edge" else node_level_sensitivity(C, o.degree_cap)
    return DPRequest(
        clip=math.inf, per_row=True, sensitivity=sens, releases=1, integer=bool(binary) and o.norm != "sym"
    )


def degree_cap_needed(cfg, mode: str, dp_on: bool) -> bool:
    """Whether the run needs a degree cap.

    The cap is a bound some encoding or guarantee relies on: the secure modes size their
    packing / modulus with it, and node-level DP takes its sensitivity from it.  The
    plaintext protocol sums floats and needs no cap.
    """
    return mode != "plain" or (dp_on and resolve_unit(cfg) == "node")


def normalise(totals: torch.Tensor, degrees: torch.Tensor, norm: str) -> torch.Tensor:
    """First-layer input from received totals ``[S_v[:d], S_v[d]]`` and degrees ``d̃_v``."""
    feat = totals[:, :-1]
    if norm == "row":
        return feat / degrees[:, None]
    if norm == "sym":
        return feat * degrees.rsqrt()[:, None]
    return feat


def propagation_graph(c: ClientSubgraph, hops: int, degrees: torch.Tensor | None = None) -> PropGraph:
    """Graph of the layers after the first (see the module docstring).

    hops 1: local subgraph, PyG GCN normalisation of it.  hops 2: own nodes + cross-edge
    endpoints (order of :func:`requested_rows`), local and cross edges both ways plus self
    loops, weights ``d̃_u^{-1/2} d̃_v^{-1/2}`` from ``degrees`` (aligned with that order).
    """
    n = c.num_nodes
    a, b = _local_edges(c)
    if hops <= 1 or not c.cross_edges.numel():
        ei, w = gcn_norm(torch.stack([a, b]), None, n, add_self_loops=True)
        return PropGraph(ei, w.to(torch.float32), n)
    remote_ids, inv = torch.unique(c.cross_edges[1], return_inverse=True)
    mine = _local_positions(c.global_ids, c.cross_edges[0])
    rem = inv + n
    m = n + remote_ids.numel()
    loops = torch.arange(m, device=a.device)
    src = torch.cat([a, mine, rem, loops])
    dst = torch.cat([b, rem, mine, loops])
    dinv = degrees.to(torch.float64).clamp_min(1.0).rsqrt()
    w = (dinv[src] * dinv[dst]).to(torch.float32)
    return PropGraph(torch.stack([src, dst]), w, n)


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------
class FedGCNNet(nn.Module):
    """FedGCN's model: a linear first layer on the received sums, then GCN layers.

    ``Â_k … relu(Z W_1 + b_1) … W_L + b_L``: a linear first layer on the received
    normalised sums, then ``num_layers - 1`` GCN layers over :class:`PropGraph` with fixed
    weights (``GCNConv(normalize=False)``); dropout before every layer, ReLU between them
    (as :class:`~secure_fgl.models.node.GCN`).  Returns the logits of the own nodes only.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int = 2, dropout: float = 0.5):
        super().__init__()
        sizes = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        self.lin = nn.Linear(sizes[0], sizes[1])
        self.convs = nn.ModuleList(
            [GCNConv(a, b, normalize=False, add_self_loops=False, cached=False) for a, b in zip(sizes[1:-1], sizes[2:])]
        )
        self.dropout = dropout

    def _layer(self, i: int, h: torch.Tensor, g: PropGraph) -> torch.Tensor:
        h = dropout(h, self.dropout, self.training)
        return self.lin(h) if i == 0 else self.convs[i - 1](h, g.edge_index, g.edge_weight)

    def embed(self, z: torch.Tensor, g: PropGraph) -> torch.Tensor:
        """Hidden representation entering the last layer (all known nodes)."""
        h = z
        for i in range(len(self.convs)):
            h = F.relu(self._layer(i, h, g))
        return h

    def forward(self, z: torch.Tensor, g: PropGraph) -> torch.Tensor:
        """Class logits of the output nodes (the first ``g.num_out`` rows)."""
        return self._layer(len(self.convs), self.embed(z, g), g)[: g.num_out]


# ---------------------------------------------------------------------------
# the algorithm
# ---------------------------------------------------------------------------
def pretrain_stats(
    tr, rows_up: dict, rows_down: dict, width: int, exchange_rows: int, layout: str, row_order: str
) -> dict:
    """Bytes of the pre-training exchange next to its float32 baseline.

    Bytes of the pre-training exchange from the transcript ``tr``, next to its float32 baseline
    (:func:`protocols.baseline.row_sum_bytes`: ``rows x (d+1) x 4``; sparse -- the rows a
    client uploads / requests; dense -- all rows), per client and in total, the same in every mode.
    """
    f32_up, f32_down = row_sum_bytes(rows_up, rows_down, width, exchange_rows, layout)
    dense = layout == "dense"
    per_client = []
    for k in sorted(rows_up):
        up = sum(m.nbytes for m in tr.select(tag=TAG, sender=client_party(k), receiver=SERVER))
        down = sum(m.nbytes for m in tr.select(tag=TAG, sender=SERVER, receiver=client_party(k)))
        per_client.append(
            {
                "client": k,
                "bytes_up": up,
                "bytes_down": down,
                "rows_up": exchange_rows if dense else rows_up[k],
                "rows_down": exchange_rows if dense else rows_down[k],
                "plaintext_equiv_bytes_up": f32_up[k],
                "plaintext_equiv_bytes_down": f32_down[k],
            }
        )
    tot = {
        key: sum(p[key] for p in per_client)
        for key in (
            "bytes_up",
            "bytes_down",
            "rows_up",
            "rows_down",
            "plaintext_equiv_bytes_up",
            "plaintext_equiv_bytes_down",
        )
    }
    return {
        "pretrain_bytes_up": tot["bytes_up"],
        "pretrain_bytes_down": tot["bytes_down"],
        "pretrain_plaintext_equiv_bytes_up": tot["plaintext_equiv_bytes_up"],
        "pretrain_plaintext_equiv_bytes_down": tot["plaintext_equiv_bytes_down"],
        "pretrain_upload_ratio": (
            tot["bytes_up"] / tot["plaintext_equiv_bytes_up"] if tot["plaintext_equiv_bytes_up"] else None
        ),
        "pretrain_rows_up": tot["rows_up"],
        "pretrain_rows_down": tot["rows_down"],
        "pretrain_row_width": width,
        "pretrain_row_order": row_order,
        "pretrain_exchange_rows": exchange_rows,
        "pretrain_per_client": per_client,
    }


def release_dependencies_of(name: str) -> dict[str, set[str]]:
    """The data each release touches.

    Data each release touches (:mod:`secure_fgl.privacy`): the sums read features over edges; the
    model trains GCN layers over the client's exact local edges.
    """
    return {TAG: {"features", "edges"}, f"{name}/model": {"features", "labels", "edges"}}
