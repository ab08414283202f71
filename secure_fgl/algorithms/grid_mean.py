"""A weighted mean that every mode returns bit for bit: the sum is taken on a dyadic grid.

The plain protocol carries float32, CKKS adds noise below its planned tolerance, the mask
backend rounds to its own fixed point: the same FedAvg step then differs between modes in the
last bits, and a chaotic training run (GCFL's split rule, eq. 4-5 of Xie et al., NeurIPS 2021,
compares norms against thresholds) amplifies that into different decisions.  Here each client
puts its contribution on the grid ``2^-GRID_BITS`` *before* it is sent,

    ``c_k = [Q(w_k v_k / 4), F(w_k / 4)]``,   ``Q(x) = round(x 2^GRID_BITS) 2^-GRID_BITS``

(``F``: the same, rounded down), with ``0 <= w_k``, ``sum_k w_k <= 1`` and ``|v_k| <= 1/2``
checked on the client, so every entry of every ``c_k`` and of their sum (at most
``1/8 + K 2^-(GRID_BITS+1)``, resp. ``1/4``) is a multiple of ``2^-GRID_BITS`` not above ``2^-2``: at most 24
significant bits, exact in float32 (the plain wire), in float64 and in the mask ring (its
fixed point is finer).  CKKS is planned with an error below ``2^-(GRID_BITS+2)``, so
rounding the decoded sum back to the grid recovers the exact sum: the exchange's
:data:`GRID_SPEC` names the grid (``ValueSpec.grid_bits``) and every client half rounds its
decoded sum to it (:meth:`protocols.party.ClientHalf.deliver`, the mechanism of
:meth:`protocols.precision.MeanPrecision.grid_spec`, whose plan this one predates: its fixed
``1/4`` shrink keeps the sums float32-exact where ``grid_spec`` would widen plain's wire).  Every mode therefore
returns the same ``mean = S[:-1] / S[-1]``.  The cost is the grid itself: each contribution
moves by at most ``2^-(GRID_BITS+1)``, so the mean by at most ``4 K 2^-(GRID_BITS+1) / sum_k w_k``
(~3e-8 K under full participation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from protocols import ValueSpec
from protocols.errors import BoundError
from protocols.fixed_point import to_grid

__all__ = [
    "GRID_BITS",
    "GRID_RANGE",
    "GRID_SPEC",
    "VALUE_BOUND",
    "grid_contribution",
    "grid_mean_of_sum",
    "grid_weighted_mean",
]

#: grid of the summed entries: 2^-26 ~ 1.5e-8
GRID_BITS = 26
#: every entry and every sum stays below this: a multiple of 2^-26 below 2^-2 has <= 24 significant bits
GRID_RANGE = 0.25
#: public bound on |update entry| (Adam steps at lr 1e-3 stay far below it)
VALUE_BOUND = 0.5
#: entries are divided by this so that |v| <= VALUE_BOUND and weights summing to <= 1 keep every sum below GRID_RANGE
_SHRINK = 4.0
#: the exchange: entries <= GRID_RANGE on the grid 2^-GRID_BITS, CKKS within a quarter step
GRID_SPEC = ValueSpec(max_abs=GRID_RANGE, tolerance=2.0 ** -(GRID_BITS + 2), grid_bits=GRID_BITS)


def grid_contribution(
    value: np.ndarray, weight: float, *, tag: str = "", rnd: int = 0, client: int | None = None
) -> np.ndarray:
    """Client side: ``[Q(w v / 4), F(w / 4)]`` after checking ``|v| <= VALUE_BOUND`` and ``0 <= w <= 1``."""
    value = np.asarray(value, dtype=np.float64).ravel()
    if not 0.0 <= weight <= 1.0:
        raise BoundError(
            f"weight {weight:g} is outside [0, 1]: normalise the weights by the public total",
            tag=tag,
            round=rnd,
            client=client,
        )
    top = float(np.abs(value).max(initial=0.0))
    if not top <= VALUE_BOUND:
        raise BoundError(
            f"an update entry is {top:g}, above the grid mean's bound {VALUE_BOUND}: nothing was sent. "
            "Fix: lower the learning rate or the local steps",
            tag=tag,
            round=rnd,
            client=client,
        )
    weight_down = np.floor(np.ldexp(weight / _SHRINK, GRID_BITS)) * 2.0**-GRID_BITS
    return np.concatenate([to_grid(value * (weight / _SHRINK), GRID_BITS), [weight_down]])


def grid_weighted_mean(
    protocol,
    tag: str,
    rnd: int,
    values: Mapping[int, np.ndarray],
    weights: Mapping[int, float],
    recipients: Sequence[int] | None = None,
) -> np.ndarray:
    """``sum_k Q(w_k v_k / 4) / sum_k Q(w_k / 4)`` through ``protocol.weighted_sum``, equal in every mode.

    ``weights`` must sum to at most 1 (e.g. ``n_k / n_total``); ``values`` entries lie in
    ``[-VALUE_BOUND, VALUE_BOUND]``.
    """
    if sum(weights[k] for k in values) > 1.0 + 1e-12:
        raise BoundError("the weights sum above 1: divide them by the public total", tag=tag, round=rnd)
    contributions = {
        k: grid_contribution(np.asarray(v), float(weights[k]), tag=tag, rnd=rnd, client=k) for k, v in values.items()
    }
    return grid_mean_of_sum(protocol.weighted_sum(tag, rnd, contributions, spec=GRID_SPEC, recipients=recipients))


def grid_mean_of_sum(total: np.ndarray) -> np.ndarray:
    """Recipient side: the mean ``S[:-1] / S[-1]`` from the decoded grid sum.

    Recipient side: the decoded sum of the contributions back on the grid (the client half has
    already rounded it: idempotent), ``S[:-1] / S[-1]``.
    """
    total = to_grid(total, GRID_BITS)
    return total[:-1] / total[-1]
