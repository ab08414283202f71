"""FGSSL: federated graph semantic and structural learning.

Huang, Ye, Du, Wan, Wang — "Federated Graph Semantic and Structural Learning", IJCAI 2023
(sec. 3.3, Algorithm 1, eq. 6-12).

The server side is FedAvg (Algorithm 1, "Server Side": ``theta <- sum_m |D^m|/|D| theta^m``), run by
FedAvg's strategy (:class:`~secure_fgl.algorithms.fedavg.server.ModelAveragingStrategy`, tag
``fgssl/model``), so plain, ckks and mask all apply unchanged.  Only the client objective differs.

``LocalUpdating(theta_t, m)``: the received global model ``G^g, F^g <- theta_t`` is frozen (evaluated
without dropout); the local model ``G^m, F^m`` starts from it and runs ``E`` epochs on (eq. 12)

    L = L^CE + lambda_C * L^FNSC + lambda_D * L^FGSD

where, for each epoch, a strong view ``G1 = Aug_s(G)`` goes through the local model and a weak view
``G2 = Aug_w(G)`` through the global one (the paper's asymmetric design, Table 3;
:mod:`.augment`: edge removing + feature masking, weak 0.3 / 0.3 and strong 0.8 / 0.5 as in
the released code), ``H^m, Z^m = G^m(G1), F^m(H^m)`` and ``H^g, Z^g = G^g(G2), F^g(H^g)``.

* ``L^CE``: cross-entropy of the local model on the un-augmented graph, training nodes.
* ``L^FNSC`` (eq. 8), federated node semantic contrast, over the training nodes (labels needed)::

      L_i = -1/|P_i| sum_{p in P_i} log( phi(h_i^m, h_p^g) / (phi(h_i^m, h_p^g) + sum_{k in K_i} phi(h_i^m, h_k^g)) )

  with ``phi(a, b) = exp(cos(a, b) / tau)`` (eq. 7), ``P_i`` the training nodes of ``i``'s class
  (``i`` itself included: "pull the node from local view and its pairwise one in global view
  together") and ``K_i`` those of the other classes.  ``h`` is the model's ``embed`` (the
  hidden representation entering the classifier layer).
* ``L^FGSD`` (eq. 9-11), federated graph structure distillation, over every node with neighbours
  in the (un-augmented) local graph ``A_i``::

      S_ij^g = softmax_{j in A_i}(z_i^g . z_j^g / omega),  S_ij^m = softmax_{j in A_i}(z_i^m . z_j^m / omega)
      L_i = sum_{j in A_i} S_ij^g log(S_ij^g / S_ij^m)     (KL(S^g || S^m))

Each term is a mean over its nodes (eq. 12's ``1/N sum_i``, taken per term).

``variant='released-code'`` optimises what the authors' trainer (``wgc-research/fgssl``,
``fgssl/contrib/trainer/FLAG.py``, ``FGCLTrainer1``) actually runs: ``L^CE + 3 * InfoNCE`` between
two *local* views (weak and strong) of the training nodes, with same-class positives and a
SupCon denominator over all positives and negatives, symmetrised (PyGCL ``DualBranchContrast``,
``InfoNCE(tau=0.1)``, mode L2L).  The global-model contrast is computed there but overwritten, and
the structure-distillation terms are computed but never added to the loss; ``lambda_d`` is unused
in this variant and ``lambda_c`` weighs the InfoNCE term (the released code's weight is 3:
``--lambda-c 3``).

Other settings of the paper (sec. 4.1) are run settings, not options: 2-layer GAT with hidden 128
(``--model gat --hidden 128``; the released ``MYGAT`` uses one head per layer: ``--heads 1``), SGD
with momentum 0.9 and weight decay 5e-4 (``--optimizer sgd --momentum 0.9``), 200 rounds, 4 local
epochs, Louvain partition, 60/20/20 split (``--partition louvain --split fgssl``).  Augmentation
draws come from generators keyed by (seed, round, client, epoch, view) and never depend on values,
so every mode trains on the same views.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torch_geometric.utils import softmax as segment_softmax

from ...validation import ConfigError
from ..options import FGSSLOptions
from .augment import AugmentRates, augment, view_generator

VARIANTS = ("paper", "released-code")


def class_contrast(
    anchor: torch.Tensor, sample: torch.Tensor, y: torch.Tensor, tau: float, per_positive: bool = True
) -> torch.Tensor:
    """Supervised contrast of ``anchor[i]`` against ``sample[j]``; positives ``y_j == y_i``.

    ``per_positive=True`` is FGSSL's eq. 8: each positive ``p`` against itself plus the negatives,
    ``-log(phi_ip / (phi_ip + sum_k phi_ik))``, averaged over ``P_i``.  ``False`` is the SupCon /
    PyGCL ``InfoNCE`` form: ``-log(phi_ip / sum_{j in P_i u K_i} phi_ij)``.  ``phi = exp(cos / tau)``.
    Mean over anchors.
    """
    sim = F.normalize(anchor, dim=-1) @ F.normalize(sample, dim=-1).T / tau
    pos = y[:, None] == y[None, :]
    if per_positive:
        neg_lse = sim.masked_fill(pos, float("-inf")).logsumexp(dim=1, keepdim=True)
        log_prob = sim - torch.logaddexp(sim, neg_lse)
    else:
        log_prob = sim - sim.logsumexp(dim=1, keepdim=True)
    return -(log_prob.masked_fill(~pos, 0.0).sum(1) / pos.sum(1)).mean()


def fnsc_loss(h_local: torch.Tensor, h_global: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """Federated node semantic contrast (eq. 8): local anchors, global positives and negatives."""
    return class_contrast(h_local, h_global.detach(), y, tau, per_positive=True)


def neighbour_log_similarity(z: torch.Tensor, edge_index: torch.Tensor, omega: float) -> torch.Tensor:
    """``log S_ij`` of eq. 9/10 for each edge ``(j -> i)``.

    Log-softmax of ``z_i . z_j / omega`` over the neighbours ``j`` of ``i``.
    """
    src, dst = edge_index
    scores = (z[dst] * z[src]).sum(-1) / omega
    return torch.log(segment_softmax(scores, dst, num_nodes=z.size(0)).clamp_min(1e-30))


def fgsd_loss(z_local: torch.Tensor, z_global: torch.Tensor, edge_index: torch.Tensor, omega: float) -> torch.Tensor:
    """Federated graph structure distillation loss (eq. 11).

    Federated graph structure distillation (eq. 11): ``KL(S^g || S^m)`` per node, mean over
    nodes with at least one neighbour (0 for a graph without edges).
    """
    if edge_index.size(1) == 0:
        return z_local.sum() * 0.0
    log_g = neighbour_log_similarity(z_global.detach(), edge_index, omega)
    log_m = neighbour_log_similarity(z_local, edge_index, omega)
    per_edge = log_g.exp() * (log_g - log_m)
    dst = edge_index[1]
    per_node = torch.zeros(z_local.size(0), dtype=per_edge.dtype, device=per_edge.device).index_add_(0, dst, per_edge)
    has_neighbours = torch.bincount(dst, minlength=z_local.size(0)) > 0
    return per_node[has_neighbours].mean()


def fgssl_rates(o: FGSSLOptions, model: torch.nn.Module, model_name: str) -> tuple[AugmentRates, AugmentRates]:
    """The options checked against the model; returns the (weak, strong) augmentation rates."""
    if o.variant not in VARIANTS:
        raise ConfigError(f"--variant must be one of {', '.join(VARIANTS)}, got {o.variant!r}")
    if o.tau <= 0 or o.omega <= 0:
        raise ConfigError(f"--tau and --omega must be > 0, got {o.tau}, {o.omega}")
    if not hasattr(model, "embed_and_logits"):
        raise ConfigError(f"FGSSL needs a message-passing --model (gat, gcn, sage); got {model_name!r}")
    try:
        return (
            AugmentRates(o.weak_edge_drop, o.weak_feature_mask),
            AugmentRates(o.strong_edge_drop, o.strong_feature_mask),
        )
    except ValueError as e:
        raise ConfigError(f"FGSSL augmentation: {e}") from None


def fgssl_views(
    x: torch.Tensor, edge_index: torch.Tensor, weak: AugmentRates, strong: AugmentRates, key: tuple[int, int, int, int]
):
    """``(Aug_s(G), Aug_w(G))`` of a client for ``key = (seed, round, client, epoch)`` (value-independent draws)."""
    return (
        augment(x, edge_index, strong, view_generator(*key, 0, device=x.device)),
        augment(x, edge_index, weak, view_generator(*key, 1, device=x.device)),
    )


def fgssl_objective(
    model: torch.nn.Module,
    global_model: torch.nn.Module,
    x: torch.Tensor,
    edge_index: torch.Tensor,
    train: torch.Tensor,
    y: torch.Tensor,
    o: FGSSLOptions,
    views,
) -> torch.Tensor:
    """One client's FGSSL objective.

    Eq. 12 (``variant='paper'``) or the released code's ``CE + lambda_c * InfoNCE`` of one client;
    ``y`` the labels of its ``train`` nodes, ``views()`` its (strong, weak) views (drawn on use).
    """
    loss = F.cross_entropy(model(x, edge_index)[train], y)
    if o.lambda_c == 0 and (o.lambda_d == 0 or o.variant != "paper"):
        return loss
    strong, weak = views()
    if o.variant == "released-code":
        h_strong, h_weak = model.embed(*strong)[train], model.embed(*weak)[train]
        info_nce = 0.5 * (
            class_contrast(h_weak, h_strong, y, o.tau, per_positive=False)
            + class_contrast(h_strong, h_weak, y, o.tau, per_positive=False)
        )
        return loss + o.lambda_c * info_nce
    h_m, z_m = model.embed_and_logits(*strong)
    with torch.no_grad():
        h_g, z_g = global_model.embed_and_logits(*weak)
    if o.lambda_c:
        loss = loss + o.lambda_c * fnsc_loss(h_m[train], h_g[train], y, o.tau)
    if o.lambda_d:
        loss = loss + o.lambda_d * fgsd_loss(z_m, z_g, edge_index, o.omega)
    return loss
