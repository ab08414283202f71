"""Precision planning: one rule for every fixed-point codec, from public bounds only.

Both secure backends carry reals as fixed point: CKKS encodes ``round(x * 2^s)`` into a
slot (:mod:`protocols.ckks.params`), the mask backend ``round(x * 2^f)`` into the ring
``Z_{2^b}`` (:mod:`protocols.mask.quantize`).  Each has a *headroom* ``H`` (``q_0 / 4``
for one CKKS data prime, ``2^(b-1)`` for the ring) that the K-way sum must never reach,
because past it the sum wraps silently.  The only bound every client can check alone is
its own entries, ``|x_k| <= B`` (``ValueSpec.max_abs``), so the sum is planned from

    ``S = K * B``                                   (:func:`kway_sum_bound`)

and the scale is the largest ``2^s`` with ``S * 2^s <= H`` (:func:`largest_scale_bits`).
The codec's absolute error ``eps`` of the decoded sum (CKKS noise, rounding) then follows
from ``s``; a plan is refused when ``eps`` exceeds ``ValueSpec.tolerance``.

Weighted means (FedAvg, FedSpray eq. 14)
----------------------------------------
``Protocol.weighted_mean`` sums ``[w_k v_k, w_k]`` and divides after decoding.  The
absolute tolerance of the sums is meaningful only relative to the weight total: with
FedAvg weights ``n_k / N`` (training nodes over graph size, ~3e-4 on PubMed) a 1e-4
tolerance is a percent-level error of the averaged update.  :class:`MeanPrecision` plans
the exchange from the quantities actually aggregated:

* every weight is in ``[0, W]`` and every value entry in ``[-B, B]`` (public), so every
  entry of ``[w v, w]`` is bounded by ``W * max(B, 1)`` — the spec's ``max_abs``;
* with sum errors ``eps_num, eps_den <= eps`` and weight total ``T = sum_k w_k``,

      ``|mean~ - mean| <= (eps_num + |mean| eps_den) / (T - eps_den)``
                     ``<= eps (1 + B) / (T_min - eps)``         (:meth:`MeanPrecision.error_bound`)

  so a target ``delta`` on the mean holds for ``eps = delta T_min / (1 + B + delta)``
  (the spec's ``tolerance``), where ``T_min`` is a public lower bound on the total.

Algorithms therefore normalise their weights so that ``T_min`` is of order one (FedAvg:
``w_k = n_k / n_train`` with the public size ``n_train`` of the training split, so
``W = 1`` and ``T = 1`` under full participation) and pass ``W``, ``B``, ``T_min`` and the
target ``delta``; the codecs see only the resulting :class:`~protocols.base.ValueSpec`.

Exact means on a public grid (:meth:`MeanPrecision.grid_spec`)
---------------------------------------------------------------
Within ``delta`` is not *equal*: plain's float32 wire, CKKS noise and the mask ring each
miss the exact mean differently, and a chaotic training run (FedOMD's Adam + CMD, GCFL's
split rule) turns 1e-8 differences into different trajectories.  On a grid every mode
returns the same sum: each client rounds every entry of ``[w v, w]`` to the nearest
multiple of ``2^-f`` *before* it is encoded (:func:`protocols.fixed_point.to_grid`, in every
mode, plain included), so the K-way sum is a multiple of ``2^-f`` of magnitude at most
``K B_e`` (``B_e = W max(B, 1)`` rounded up to the grid), which

* plain carries exactly (float32 wire while ``K B_e 2^f <= 2^24``, else float64; the server
  sums in float64, exact below ``2^53``),
* the mask ring carries exactly (its ``2^-s`` fixed point with ``s > f``: the tolerance below
  forces it),
* CKKS decodes within its planned error ``<= 2^-(f+2)`` (the spec's tolerance), and the
  recipient rounds the decoded sum back to the grid (:meth:`protocols.party.ClientHalf.deliver`,
  which refuses a sum that lands further off).

The K-way error is then the grid's alone, the same in every mode: each of the ``2K`` summed
entries of one mean (numerator and weight total) moves by at most ``2^-(f+1)``, so

    ``|mean_grid - mean| <= eps_f (1 + B) / (T - eps_f)``,   ``eps_f = K 2^-(f+1)``

and ``f`` is the coarsest grid with ``eps_f <= eps`` (the plan's sum tolerance): the mean stays
within ``delta``, now deterministically.  A grid too fine for CKKS's precision
(``K B_e 2^-(f+2)`` below its noise) is refused by the CKKS planner, naming the tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .exchange import ValueSpec

#: the float32 resolution (2^-24) of a unit-size value: averaged updates are planned to be as
#: precise as the float32 wire of the plain protocol carries a unit-size parameter
FLOAT32_MEAN_TOLERANCE = 2.0**-24


def kway_sum_bound(entry_bound: float, num_contributors: int) -> float:
    """``K * B``: the bound on the K-way sum that K client-checked entries guarantee."""
    return float(entry_bound) * max(1, int(num_contributors))


def largest_scale_bits(sum_bound: float, headroom: float) -> int:
    """Largest integer ``s`` with ``sum_bound * 2^s <= headroom``."""
    s = math.floor(math.log2(headroom) - math.log2(max(float(sum_bound), 2.0**-30)))
    while sum_bound * 2.0**s > headroom:
        s -= 1
    return s


def grid_tolerance(target: float, num_clients: int) -> float:
    """The target of a grid mean among ``num_clients`` clients.

    The target of a grid mean (:meth:`MeanPrecision.grid_spec`) among ``num_clients`` clients:
    ``target`` up to ten clients, then ``target 2^(ceil(2.5 log2(K / 10)) + 1)``.  CKKS carries a grid
    exactly only while the grid step stays above its noise on the K-way sum; the sum bound grows as
    K, the step a target allows shrinks as 1/K (``eps_f = K 2^-(f+1)``) and the noise as sqrt(K), so
    the finest target CKKS meets grows as ``K^2.5`` (checked for K = 10 .. 100 on FedOMD's plans,
    ``tests/protocols/test_precision.py``).
    """
    k = max(1, int(num_clients))
    return target if k <= 10 else target * 2.0 ** (math.ceil(2.5 * math.log2(k / 10)) + 1)


@dataclass(frozen=True)
class MeanPrecision:
    """Public precision plan of ``sum_k w_k v_k / sum_k w_k`` (module doc).

    value_bound:      B, public bound on ``|v_k|`` entries;
    weight_bound:     W, public bound on every weight ``w_k >= 0``;
    min_weight_total: T_min, public lower bound on ``sum_k w_k`` (> 0);
    tolerance:        delta, target bound on ``|decoded mean - exact mean|`` per entry.
    """

    value_bound: float
    weight_bound: float = 1.0
    min_weight_total: float = 1.0
    tolerance: float = FLOAT32_MEAN_TOLERANCE

    def __post_init__(self) -> None:
        for name in ("value_bound", "weight_bound", "min_weight_total", "tolerance"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"MeanPrecision.{name} must be finite and > 0, got {v!r}")

    @property
    def entry_bound(self) -> float:
        """Bound on every entry of ``[w v, w]``: ``W * max(B, 1)``."""
        return self.weight_bound * max(self.value_bound, 1.0)

    @property
    def sum_tolerance(self) -> float:
        """``eps = delta T_min / (1 + B + delta)``: the sum error that keeps the mean within delta."""
        return self.tolerance * self.min_weight_total / (1.0 + self.value_bound + self.tolerance)

    def spec(self) -> ValueSpec:
        """The :class:`~protocols.base.ValueSpec` of the summed ``[w v, w]`` vector.

        A target
        below float32 resolution (``delta < FLOAT32_MEAN_TOLERANCE``) sets ``float64_wire``:
        the plain protocol's float32 wire would itself miss the target that the secure codecs
        are held to (rounding ``[w v, w]`` to 24 bits), so plain carries these values as float64.
        """
        return ValueSpec(
            max_abs=self.entry_bound, tolerance=self.sum_tolerance, float64_wire=self.tolerance < FLOAT32_MEAN_TOLERANCE
        )

    def grid_bits(self, num_contributors: int) -> int:
        """Coarsest ``f`` with ``K 2^-(f+1) <= eps`` (:attr:`sum_tolerance`): the grid of :meth:`grid_spec`."""
        k = max(1, int(num_contributors))
        f = math.ceil(math.log2(k / (2.0 * self.sum_tolerance)))
        while k * 2.0 ** -(f + 1) > self.sum_tolerance:
            f += 1
        return f

    def grid_spec(self, num_contributors: int) -> ValueSpec:
        """The :class:`~protocols.base.ValueSpec` of the exact mean on the grid.

        The :class:`~protocols.base.ValueSpec` of the exact mean of ``num_contributors`` clients on
        the grid ``2^-f``, ``f =`` :meth:`grid_bits` (module doc): ``max_abs = B_e`` on the grid, codec
        tolerance ``2^-(f+2)`` (CKKS then rounds back exactly), float64 plain wire where float32 cannot
        hold ``K B_e 2^f`` grid steps.  Raises ValueError where no float64 holds them (``> 2^49``).
        """
        k, f = max(1, int(num_contributors)), self.grid_bits(num_contributors)
        bound = math.ceil(self.entry_bound * 2.0**f) * 2.0**-f
        steps = kway_sum_bound(bound, k) * 2.0**f
        if steps > 2.0**49:
            raise ValueError(
                f"a grid of 2^-{f} over sums up to {kway_sum_bound(bound, k):g} needs {steps:.3g} "
                "steps, more than float64 and the codecs hold exactly (2^49): raise the tolerance"
            )
        return ValueSpec(max_abs=bound, tolerance=2.0 ** -(f + 2), float64_wire=steps > 2.0**24, grid_bits=f)

    def grid_error_bound(self, num_contributors: int) -> float:
        """The public bound on ``|mean_grid - mean|`` of :meth:`grid_spec` (the same in every mode)."""
        return self.error_bound(max(1, int(num_contributors)) * 2.0 ** -(self.grid_bits(num_contributors) + 1))

    def error_bound(self, sum_error: float, weight_total: float | None = None, mean_abs: float | None = None) -> float:
        """Bound on the mean's error given the codec's sum error bound ``sum_error``.

        Without arguments beyond ``sum_error`` the public worst case (``T = T_min``,
        ``|mean| <= B``); recipients, who know the decoded total and mean, may pass them for
        the bound of this round.
        """
        total = self.min_weight_total if weight_total is None else float(weight_total)
        mean = self.value_bound if mean_abs is None else float(mean_abs)
        if total <= sum_error:
            return math.inf
        return sum_error * (1.0 + mean) / (total - sum_error)
