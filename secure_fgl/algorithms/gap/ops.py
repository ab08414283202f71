r"""FedGCN-GAP: edge-level differentially private FedGCN by aggregation perturbation.

Sajadmanesh, Shamsabadi, Bellet & Gatica-Perez, *GAP: Differentially Private Graph Neural
Networks with Aggregation Perturbation*, USENIX Security 2023, sec. 4 (encoder, aggregation
and classification modules), run federated: the neighbour sums go through FedGCN's
``row_sum`` exchange (Yao et al., NeurIPS 2023) instead of a central server's graph.

Three stages, the only edge-dependent values being noisy sums:

1. **Encoder** (edge-free).  FedAvg (tag ``fedgcn-gap/encoder/model``) trains the run's
   feature-only MLP ``logits = W_L relu(... relu(W_1 x))`` (``--hidden``, ``--num-layers``; the
   same model, initialisation and training as ``--algorithm fedavg --model mlp``) on each
   client's features and labels; the weights of its best round by the federation's validation
   accuracy are kept.  ``E(x)`` is its last hidden layer.  No edge enters, so under edge-level
   DP it costs no budget.
2. **Aggregation** (the private part).  ``H_0 = E(x) / ||E(x)||`` (row-normalised: every row
   has norm 1); with ``--center-embeddings``, ``H_0 = (U - 1 m^T) / ||U - 1 m^T||`` where
   ``U = E(x) / ||E(x)||`` and ``m = (1/N) sum_v U_v`` over all ``N`` nodes of the graph, the
   weighted mean of the clients' own means (tag ``fedgcn-gap/encoder/mean``, weights
   ``n_k / N``; the unit rows of ReLU embeddings share a common direction, which this removes);
   ``m`` reads features only (and the encoder), so at edge level it costs no budget.  For hop
   ``h = 1..K``, client ``k`` contributes for every node ``v`` it knows
   ``P^{(k)}_v = sum_{j in V_k} Ã_vj H_{h-1, j}`` (:func:`~secure_fgl.algorithms.fedgcn.ops.partial_neighbour_sums`,
   ``Ã = A + I``), the protocol adds them with edge-level Gaussian noise
   (tag ``fedgcn-gap/hop/h``, one release each, composed by the run's accountant):

   .. math::  \tilde S_{h,v} = \sum_{j} Ã_{vj} H_{h-1,j} + N(0, \sigma_h^2 I),
              \qquad H_{h,v} = \tilde S_{h,v} / \|\tilde S_{h,v}\|

   Adding or removing one edge ``{u, v}`` changes row ``u`` by ``H_{h-1,v}`` and row ``v`` by
   ``H_{h-1,u}``, both of norm 1: L2 sensitivity ``sqrt(2)``
   (:func:`protocols.dp.edge_level_sensitivity` with C = 1).  ``H_{h-1}`` is itself a
   post-processing of the earlier noisy hops, so the composition is adaptive Gaussian.
3. **Head** (edge-free given the noisy sums).  FedAvg (tag ``fedgcn-gap/model``) trains an
   MLP on ``[H_0, H_1, ..., H_K]`` -- post-processing of the DP sums and of edge-free data.

Model selection (``select='val'``, post-processing): at every evaluation the federation uses
the head or the encoder, whichever has the higher validation accuracy over all clients' validation
nodes -- the same aggregate the run already uses to pick its best round.  At small epsilon
the noisy hops carry little signal and the encoder, i.e. the feature-only MLP, is kept, so the
pipeline does not fall below it by more than the noise of that choice.

What it protects: edge-level DP (one edge added or removed anywhere in the federated
graph) for everything the clients release, with the reported ``(epsilon, delta)``.  No exact
edge reaches a model: no GCN layer over local edges, no denoising with own edges.  It does
*not* protect a node's features or labels (the encoder and head exchanges are exact, unless
``dpsgd`` is on, see :mod:`secure_fgl.dpsgd`).

Node level (``--dp-unit node``; GAP's node-level variant, sec. 5): every node's embedding enters
at most ``D`` (``--max-degree``) neighbours' sums besides its own row -- its owner, the client
that computes its terms, keeps a uniform sample of at most ``D`` of its neighbours, local or
across clients (:func:`bound_out_degree`) -- and the encoder and head are trained by DP-SGD with
per-node gradients (valid on these MLPs, whose output on a node reads only that node's row).
Removing a node ``v`` with its features, label and (sampled) edges changes ``H_{h-1,v}`` in its
own row and in at most ``D`` others, each a unit vector: L2 sensitivity ``sqrt(D + 1)``
(:func:`protocols.dp.node_level_sensitivity` with C = 1).  Row ``v``'s own total (its incoming
edges) is ``v``'s record: it reaches ``v``'s owner and enters only ``v``'s own clipped DP-SGD
examples.
"""

from __future__ import annotations

import dataclasses

import torch

from protocols import BoundError, DPRequest, ValueSpec
from protocols.dp import edge_level_sensitivity, node_level_sensitivity

from ...data.federated import ClientSubgraph
from ...engine.rng import client_generator
from ...validation import ConfigError
from ..fedgcn.ops import _local_positions, local_degrees
from ..options import GAPOptions

HOP_TAG = "fedgcn-gap/hop"
#: the encoder's FedAvg exchange
ENCODER_TAG = "fedgcn-gap/encoder/model"
#: the mean of the row-normalised embeddings over all nodes (``--center-embeddings``)
MEAN_TAG = "fedgcn-gap/encoder/mean"
#: server -> client control: "keep your current encoder, the best so far"
BEST_TAG = "fedgcn-gap/encoder/best"
SELECT = ("val", "head")
#: the step index of :func:`~secure_fgl.engine.rng.client_generator` that draws the out-degree sample
DEGREE_SAMPLE_STEP = 1 << 30


def release_dependencies_of(name: str, dpsgd: bool = False) -> dict[str, set[str]]:
    """The data each release touches.

    See :mod:`secure_fgl.privacy`. The hop sums read embeddings over edges; the encoder and head touch no exact edge.
    With ``dpsgd`` the model exchanges are post-processing of the DP-SGD steps, which read the training nodes'
    features and labels (and the head's, their noisy hop rows).
    """
    models = set() if dpsgd else {"features", "labels"}
    return {
        HOP_TAG: {"features", "labels", "edges"},
        ENCODER_TAG: models,  # gap (central) runs fedgcn-gap's exchanges under its own name
        MEAN_TAG: {"features", "labels"},  # the encoder's embeddings of every node: no edge
        f"{name}/encoder/dpsgd": {"features", "labels"},
        f"{name}/encoder": models,
        f"{name}/model": models,
        f"{name}/dpsgd": {"features", "labels"},
    }


def hop_dp_request(dp, degree_bound: int | None = None) -> DPRequest | None:
    """A hop sum's DP request: edge level, or node level under an out-degree bound ``D``.

    Rows of unit norm: an edge changes two terms by at most 1 each (``sqrt 2``); a node's term sits
    in its own row and at most ``D`` others (``sqrt(D + 1)``). None without DP (``dp``: the protocol's engine).
    """
    if dp is None:
        return None
    sens = edge_level_sensitivity(1.0) if degree_bound is None else node_level_sensitivity(1.0, degree_bound)
    return DPRequest(clip=float("inf"), per_row=True, sensitivity=sens, releases=1)


def bound_out_degree(c: ClientSubgraph, max_degree: int, generator: torch.Generator) -> ClientSubgraph:
    """``c`` with each own node's outgoing terms cut to at most ``max_degree`` neighbours.

    Row ``a`` receives node ``b``'s term along a local edge ``(a, b)`` and a remote row receives
    node ``j``'s along a cross edge ``(j, remote)``; the owner keeps, for each of its nodes, a
    uniformly random subset of at most ``max_degree`` of these (local and cross-client together),
    drawn from ``generator``.  The self loop is kept apart by :func:`partial_neighbour_sums`.
    """
    a, b = c.edge_index[:, c.edge_index[0] != c.edge_index[1]]
    cross = c.cross_edges
    senders = torch.cat([b, _local_positions(c.global_ids, cross[0]) if cross.numel() else b.new_empty(0)])
    key = torch.rand(senders.numel(), generator=generator, dtype=torch.float64).to(senders.device)
    order = torch.argsort(key + senders.to(torch.float64))  # by sender, random within a sender
    starts = torch.zeros(c.num_nodes + 1, dtype=torch.long, device=senders.device)
    starts[1:] = torch.cumsum(torch.bincount(senders, minlength=c.num_nodes), 0)
    keep = torch.zeros(senders.numel(), dtype=torch.bool, device=senders.device)
    keep[order] = torch.arange(senders.numel(), device=senders.device) - starts[senders[order]] < int(max_degree)
    local = keep[: b.numel()]
    return dataclasses.replace(c, edge_index=torch.stack([a[local], b[local]]), cross_edges=cross[:, keep[b.numel() :]])


def degree_generator(seed: int, client: int) -> torch.Generator:
    """Client ``client``'s generator of the out-degree sample of run ``seed`` (the same for every hop)."""
    return client_generator(seed, 0, client, DEGREE_SAMPLE_STEP)


def row_normalise(h: torch.Tensor) -> torch.Tensor:
    """Each row scaled to unit L2 norm (a zero row stays zero)."""
    return h / h.norm(dim=1, keepdim=True).clamp_min(1e-12)


def check_degree_cap(c, cap: int, client: int) -> None:
    """The owner's check of its own nodes' degrees against the public cap (bounds the sums)."""
    deg = local_degrees(c) - 1
    if c.num_nodes and int(deg.max()) > cap:
        raise BoundError(
            f"a node has degree {int(deg.max())} above --degree-cap {cap}; raise --degree-cap (a public bound)",
            tag=HOP_TAG,
            round=0,
            client=client,
        )


def hop_spec(opts: GAPOptions) -> ValueSpec:
    """Public bounds of a hop sum: at most ``cap + 1`` unit-norm rows per total."""
    return ValueSpec(max_abs=float(opts.degree_cap + 1))


def check_gap_options(opts: GAPOptions, cfg) -> None:
    """ConfigError naming the first setting fedgcn-gap cannot run with."""
    if opts.hops < 1:
        raise ConfigError(f"fedgcn-gap needs --hops >= 1 noisy aggregation hops, got {opts.hops}")
    if opts.select not in SELECT:
        raise ConfigError(f"--select must be one of {', '.join(SELECT)}, got {opts.select!r}")
    if opts.degree_cap < 1:
        raise ConfigError("--degree-cap must be >= 1")
    if cfg.num_layers < 2:
        raise ConfigError("fedgcn-gap embeds nodes with the encoder MLP's last hidden layer: --num-layers >= 2")
