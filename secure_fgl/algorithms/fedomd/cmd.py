"""Central Moment Discrepancy (Zellinger et al., ICLR 2017, eq. 4; FedOMD eq. 11).

For samples ``X`` and ``Y`` of bounded vectors with every entry in ``[a, b]``::

    d_CMD(X, Y) = 1/|b-a| * ||E(X) - E(Y)||_2
                  + sum_{j=2..J} 1/|b-a|^j * ||c_j(X) - c_j(Y)||_2,
    c_j(X) = E((X - E(X))^j)            (element-wise power, per dimension)

FedOMD uses ``J = 5`` (Algorithm 1, line 12).  The scaling ``1/|b-a|^j`` makes every
term dimensionless and at most ``sqrt(d)`` (an order-j central moment of values in
``[a, b]`` has modulus at most ``|b-a|^j``), so the bound is only meaningful when the
samples really lie in ``[a, b]``: :func:`clip_activations` clips them.

The bounds are FedOMD's ReLU hidden features: ``a = 0`` (ReLU output) and a public
upper bound ``b`` (an algorithm option, ``act_high``).  Clipping is applied to the
*copies* of the features that enter the statistics, not to the features the next layer
sees, so the model itself is unchanged (see :mod:`secure_fgl.algorithms.fedomd`).

Small pure functions, torch in and out (differentiable where the client needs the
gradient of its own moments).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

#: FedOMD's moment orders besides the mean (Algorithm 1, line 12)
FEDOMD_ORDERS: tuple[int, ...] = (2, 3, 4, 5)


def clip_activations(z: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Entries clipped to ``[low, high]`` (the CMD domain; also the DP sensitivity bound)."""
    if not high > low:
        raise ValueError(f"CMD bounds need low < high, got [{low}, {high}]")
    return z.clamp(min=low, max=high)


def central_moments(
    z: torch.Tensor, orders: Sequence[int] = FEDOMD_ORDERS, center: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """``(mean [d], {j: E((z - c)^j) [d]})`` of samples ``z [n, d]`` about ``c``.

    ``center`` defaults to the sample mean (the client side of eq. 11); pass the
    global mean to get the quantities a client contributes in round 2 of eq. 10.
    """
    if z.ndim != 2:
        raise ValueError(f"samples must be [n, d], got shape {tuple(z.shape)}")
    if z.shape[0] == 0:
        raise ValueError("central moments of an empty sample are undefined")
    mean = z.mean(dim=0)
    diff = z - (mean if center is None else center)
    return mean, {int(j): diff.pow(int(j)).mean(dim=0) for j in orders}


def cmd_from_moments(
    mean_x: torch.Tensor,
    moments_x: Mapping[int, torch.Tensor],
    mean_y: torch.Tensor,
    moments_y: Mapping[int, torch.Tensor],
    low: float,
    high: float,
) -> torch.Tensor:
    """Eq. 11 from the two sides' means and central moments (same orders on both sides)."""
    if set(moments_x) != set(moments_y):
        raise ValueError(f"moment orders differ: {sorted(moments_x)} vs {sorted(moments_y)}")
    span = abs(float(high) - float(low))
    if span == 0:
        raise ValueError("CMD needs a < b")
    d = torch.linalg.vector_norm(mean_x - mean_y) / span
    for j in sorted(moments_x):
        d = d + torch.linalg.vector_norm(moments_x[j] - moments_y[j]) / span**j
    return d


def cmd(
    x: torch.Tensor, y: torch.Tensor, low: float = 0.0, high: float = 1.0, orders: Sequence[int] = FEDOMD_ORDERS
) -> torch.Tensor:
    """``d_CMD`` between samples ``x [n, d]`` and ``y [m, d]`` after clipping both to ``[low, high]``."""
    x, y = clip_activations(x, low, high), clip_activations(y, low, high)
    mx, cx = central_moments(x, orders)
    my, cy = central_moments(y, orders)
    return cmd_from_moments(mx, cx, my, cy, low, high)


__all__ = ["FEDOMD_ORDERS", "central_moments", "clip_activations", "cmd", "cmd_from_moments"]
