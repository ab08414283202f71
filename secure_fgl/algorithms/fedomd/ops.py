"""FedOMD: federated graph learning with orthogonal layers and central-moment constraints.

"Federated Graph Learning with Center Moment Constraints for Node Classification"
(FedOMD), sec. 4.3-4.6 and Algorithm 1.  Every round, for the sampled clients:

1. **Statistics, round 1** (eq. 10, Algorithm 1 lines 3, 8-10): each client computes the
   hidden features ``Z_k^l`` (``l = 1..L-1``) of the current global model on its subgraph
   and contributes ``(E(Z_k^l), n_k)``; every client receives the global mean
   ``M^l = sum_k n_k E(Z_k^l) / sum_k n_k``.
2. **Statistics, round 2** (lines 12-17): each client contributes
   ``(E((Z_k^l - M^l)^j), n_k)`` for ``j = 2..5`` and receives the pooled central moments
   ``[S^l]_j = E((Z^l - M^l)^j)`` of *all* clients' features (exactly, not an average of
   per-client moments about different centres).
   Both rounds are :meth:`protocols.Protocol.central_moments` (tags
   ``fedomd/hidden<l>/mean`` and ``fedomd/hidden<l>/moments``): in ``ckks``/``mask`` modes
   the server sees neither a client's statistics nor its node count ``n_k``, only the
   recipients learn the totals.
3. **Local training** (eq. 12, lines 19-20)::

       L_k = CE(Z_k^L, Y_k) + alpha * L_ortho_k + beta * sum_l d_CMD(Z_k^l, global^l)

   with ``d_CMD`` of eq. 11 between the client's *own* mean/central moments (about its own
   mean, differentiable) and the received global ones (constants), ``alpha = ortho_weight
   = 0.0005``, ``beta = cmd_weight = 10`` (sec. 4.5).
4. **FedAvg** of the weights (lines 21, 26-29) by FedAvg's strategy (tag ``fedomd/model``).

Every real-valued exchange (the statistics and the model mean) is planned on a public grid
(:meth:`protocols.precision.MeanPrecision.grid_spec`): each client rounds its contribution to
it in every mode, so plain, ckks and mask pool the same bits and train the same model.

Options where the paper is ambiguous (``stats_nodes``, ``act_low``/``act_high``, ``stats_pass``),
the measured effect of the CMD term and the DP mechanism (a row-level DP weighted mean of the
clipped statistics): docs/fedomd.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from protocols import DPRequest, ValueSpec
from protocols.ckks.params import carries_float
from protocols.precision import MeanPrecision, grid_tolerance

from ...engine import rng
from ...models.orthogonal import OrthoGCN
from ..options import FedOMDOptions
from .cmd import central_moments, clip_activations, cmd_from_moments

#: target error of every pooled statistic (mean, central moments of order 2..5) on the public grid
#: (:meth:`FedOMD.stats_spec`): ``2^-34``, i.e. ``2^-18`` relative to a statistic of size ``2^-16``
#: (the higher central moments of features in ``[0, 1]`` are that small); finer grids leave CKKS
#: short of an exact sum at K = 10.  The same grid value in every mode (docs/secure_equals_plain.md).
STATS_MEAN_TOLERANCE = 2.0**-34


#: the ``step`` of :func:`~secure_fgl.engine.rng.client_generator` keying a client's statistics pass
#: (``stats_pass='train'``: dropout), apart from its local steps ``0..local_epochs-1``
STATS_PASS_STEP = 1 << 30


@dataclass
class GlobalStats:
    """What every client receives for one hidden layer: the pooled mean and central moments."""

    mean: torch.Tensor
    moments: dict[int, torch.Tensor]


def stats_dp_requests(
    low: float, high: float, dim: int, orders: tuple[int, ...], num_nodes: int, releases: int, rows: int = 1
) -> tuple[DPRequest, DPRequest]:
    """DP requests of the two statistics rounds (see "Differential privacy" above).

    ``num_nodes`` is the public weight bound ``W`` (the graph size); ``rows`` how many hidden
    rows the protected unit can change (1: one row; ``W``: a whole client).
    """
    c_mean = max(abs(low), abs(high)) * math.sqrt(dim)
    c_mom = math.sqrt(dim * sum((high - low) ** (2 * j) for j in orders)) or 1.0
    w = float(num_nodes)
    scale = math.sqrt(2.0) * min(int(rows), num_nodes) / w
    return (
        DPRequest(clip=c_mean, sensitivity=scale * c_mean, releases=releases, weight_bound=w),
        DPRequest(clip=c_mom, sensitivity=scale * c_mom, releases=releases, weight_bound=w),
    )


def stats_tags(name: str, ortho_layers: int) -> list[str]:
    """The per-layer statistics tags ``<name>/hidden<l>/mean|moments`` (the DP exchanges)."""
    return [f"{name}/hidden{l}/{r}" for l in range(1, ortho_layers + 2) for r in ("mean", "moments")]


def project_moments(mom: np.ndarray, orders, low: float, high: float) -> dict[int, np.ndarray]:
    """Noisy pooled central moments projected onto their feasible range.

    Noisy pooled central moments (``[J, d]``) projected onto their feasible range
    (even orders ``[0, (b-a)^j]``, odd ``[-(b-a)^j, (b-a)^j]``): post-processing of a DP release.
    """
    span = high - low
    return {j: np.clip(mom[i], 0.0 if j % 2 == 0 else -(span**j), span**j) for i, j in enumerate(orders)}


def build_ortho_gcn(opts: FedOMDOptions, cfg, num_features: int, num_classes: int) -> nn.Module:
    """The model of Table 1 (:class:`~secure_fgl.models.orthogonal.OrthoGCN`) with the run's settings."""
    return OrthoGCN(
        num_features,
        cfg.hidden,
        num_classes,
        ortho_layers=opts.ortho_layers,
        dropout=cfg.dropout,
        newton_steps=opts.newton_steps,
        ortho_propagate=opts.ortho_propagate,
        orthogonal=opts.orthogonal,
    )


def stats_rows(c, z: torch.Tensor, stats_nodes: str, side: str = "global") -> torch.Tensor:
    """The rows of ``z`` (client ``c``'s nodes) that enter the statistics.

    ``side``: ``'global'`` (the exchanged statistics) or ``'local'`` (the client side of eq. 11).
    """
    train = stats_nodes == "train" or (stats_nodes == "train_vs_all" and side == "local")
    return z[c.train_mask] if train else z


@torch.no_grad()
def hidden_for_stats(
    model: nn.Module, x, edge_index, c, opts: FedOMDOptions, seed: int, rnd: int, k: int
) -> list[torch.Tensor]:
    """Client k's hidden features on the statistics' node set.

    Client k's hidden features ``[Z^1..Z^(L-1)]`` on the statistics' node set (eval- or
    training-mode pass of the current model: ``stats_pass``; dropout keyed by its own generator).
    """
    model.train(opts.stats_pass == "train")
    with rng.using(rng.client_generator(seed, rnd, k, STATS_PASS_STEP)):
        _, hidden = model(x, edge_index, return_hidden=True)
    return [stats_rows(c, z, opts.stats_nodes) for z in hidden]


def cmd_loss(
    c, hidden: list[torch.Tensor], global_stats: list[GlobalStats] | None, opts: FedOMDOptions, orders: tuple[int, ...]
) -> torch.Tensor:
    """``sum_l d_CMD(Z_k^l, global^l)`` (eq. 11, Algorithm 1 line 19)."""
    total = hidden[0].new_zeros(())
    if global_stats is None:
        return total
    for z, g in zip(hidden, global_stats):
        z = clip_activations(stats_rows(c, z, opts.stats_nodes, "local"), opts.act_low, opts.act_high)
        if z.shape[0] == 0:
            continue
        mean, moments = central_moments(z, orders)
        total = total + cmd_from_moments(mean, moments, g.mean, g.moments, opts.act_low, opts.act_high)
    return total


def train_client(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x,
    edge_index,
    c,
    opts: FedOMDOptions,
    cfg,
    global_stats: list[GlobalStats] | None,
    orders: tuple[int, ...],
    rnd: int,
    k: int,
) -> tuple[float, dict[str, float]]:
    """Client k's local steps of eq. 12 (Algorithm 1 lines 19-20); returns the loss and its terms."""
    model.train()
    terms = {}
    loss = torch.zeros(())
    for step in range(cfg.local_epochs):
        opt.zero_grad()
        with rng.using(rng.client_generator(cfg.seed, rnd, k, step)):
            logits, hidden = model(x, edge_index, return_hidden=True)
        ce = F.cross_entropy(logits[c.train_mask], c.y[c.train_mask])
        ortho = model.orthogonality_loss() if opts.ortho_weight > 0 else ce.new_zeros(())
        if opts.cmd_weight > 0 and global_stats is not None:
            if opts.stats_pass == "eval" and cfg.dropout > 0:
                model.eval()  # dropout-free features, with gradient
                _, hidden = model(x, edge_index, return_hidden=True)
                model.train()
            dcmd = cmd_loss(c, hidden, global_stats, opts, orders)
        else:
            dcmd = ce.new_zeros(())
        loss = ce + opts.ortho_weight * ortho + opts.cmd_weight * dcmd
        loss.backward()
        opt.step()
        terms = {"ce": float(ce.detach()), "ortho": float(ortho.detach()), "cmd": float(dcmd.detach())}
    return float(loss.detach()), terms


def stats_precision(opts: FedOMDOptions, orders: tuple[int, ...], node_total: int, share: float) -> MeanPrecision:
    """Precision plan of both statistics rounds.

    :class:`protocols.precision.MeanPrecision` with values ``|E(z^j)| <= B = max(|a|, |b|, (b-a)^j)``, weights ``n_k <=
    W = N`` (``node_total``, the node set's public total), ``T_min = N`` under full participation (else the expected
    ``share`` ``m/K`` of it), target ``STATS_MEAN_TOLERANCE`` on every pooled statistic.
    """
    a, b = opts.act_low, opts.act_high
    per_node = max([1.0, abs(a), abs(b)] + [(b - a) ** j for j in orders])
    total = float(max(1, node_total))
    return MeanPrecision(
        value_bound=per_node, weight_bound=total, min_weight_total=share * total, tolerance=STATS_MEAN_TOLERANCE
    )


def stats_grid_spec(
    opts: FedOMDOptions, orders: tuple[int, ...], node_total: int, num_contributors: int, num_clients: int
) -> ValueSpec:
    """The statistics exchanges' spec.

    :func:`stats_precision` exact on its public grid (:meth:`protocols.precision.MeanPrecision.grid_spec`; past ten
    clients the target is coarsened by :func:`protocols.precision.grid_tolerance`), so every mode pools the same
    statistics bit for bit.  The grid's bits and CKKS's scale (a power of two from the public sum bound) both step
    with N, so for some N and K the CKKS noise on the K-way sum exceeds the grid's quarter step by less than 2x;
    there the target is coarsened by the smallest power of two ``2^j`` for which the shared-key CKKS float plan
    carries the grid (:func:`protocols.ckks.params.carries_float`): ``delta_K 2^j``, ``j = 0`` wherever the grid was
    carried already.  A pure function of N, K, the orders and the options, applied in every mode.
    """
    plan = stats_precision(opts, orders, node_total, min(1.0, num_contributors / max(1, num_clients)))
    plan = replace(plan, tolerance=grid_tolerance(plan.tolerance, num_clients))
    spec = plan.grid_spec(num_contributors)
    while not carries_float(spec, num_clients) and spec.grid_bits:
        plan = replace(plan, tolerance=2.0 * plan.tolerance)
        spec = plan.grid_spec(num_contributors)
    return spec


__all__ = ["FedOMDOptions", "GlobalStats"]
