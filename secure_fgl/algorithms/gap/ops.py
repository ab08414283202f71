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
   has norm 1).  For hop ``h = 1..K``, client ``k`` contributes for every node ``v`` it knows
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
"""

from __future__ import annotations

import torch

from protocols import BoundError, DPRequest, ValueSpec
from protocols.dp import edge_level_sensitivity

from ...validation import ConfigError
from ..fedgcn.ops import local_degrees
from ..options import GAPOptions

HOP_TAG = "fedgcn-gap/hop"
#: the encoder's FedAvg exchange
ENCODER_TAG = "fedgcn-gap/encoder/model"
#: server -> client control: "keep your current encoder, the best so far"
BEST_TAG = "fedgcn-gap/encoder/best"
SELECT = ("val", "head")


def release_dependencies_of(name: str) -> dict[str, set[str]]:
    """The data each release touches.

    See :mod:`secure_fgl.privacy`. The hop sums read embeddings over edges; the encoder and head touch no exact edge.
    """
    return {
        HOP_TAG: {"features", "labels", "edges"},
        ENCODER_TAG: {"features", "labels"},  # gap (central) runs fedgcn-gap's exchanges under its own name
        f"{name}/encoder": {"features", "labels"},
        f"{name}/model": {"features", "labels"},
        f"{name}/dpsgd": {"features", "labels"},
    }


def hop_dp_request(dp) -> DPRequest | None:
    """A hop sum's edge-level DP request.

    Rows of unit norm: an edge changes one term by at most 1. None without DP (``dp``: the protocol's engine).
    """
    return (
        None
        if dp is None
        else DPRequest(clip=float("inf"), per_row=True, sensitivity=edge_level_sensitivity(1.0), releases=1)
    )


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
