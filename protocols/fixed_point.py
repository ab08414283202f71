"""Packed fixed-point codec: real values as signed b-bit integers, several per slot.

A float exchange whose values are publicly bounded can travel as fixed point: each
client quantises its entries ``x`` (``|x| <= B``, checked by the client) to integers
``q = R(x / Delta)`` and packs ``F`` of them into one carrier of ``F b`` exact bits
(a CKKS slot component, :mod:`protocols.ckks.fixed_point`), in base ``2^b`` with
*signed* digits:

    ``P = sum_j q_j 2^(b j)``,   ``j = 0 .. F-1``,   ``|q_j| < 2^(b-1)``

Adding K carriers adds every digit independently as long as every digit of the sum stays
in ``(-2^(b-1), 2^(b-1))``; the recipients read the digits back by centred remainders
(:func:`unpack`).  The quantum is taken from the *public* bound ``S`` on the K-way sum of
one entry (:func:`protocols.precision.kway_sum_bound`: ``K B``, or ``B`` where an owner's
check bounds the total, ``ValueSpec.owner_checked_sum``), never from the data:

    ``Delta = S / (2^(b-1) - 1 - K)``                                   (:class:`FixedPoint`)

Every rounding moves an entry by less than one quantum, so the K-way sum of the ``q``
is at most ``S / Delta + K = 2^(b-1) - 1`` in magnitude: no digit can carry into its
neighbour, and the integer sums are exact.  The decoded sum ``Delta sum_k q_k`` is then
within ``K Delta`` of the exact sum (:attr:`FixedPoint.sum_error`); for a weighted mean
the bound relative to the mean follows from
:meth:`protocols.precision.MeanPrecision.error_bound`.

Rounding (:meth:`FixedPoint.quantize`) is *randomized*: ``floor(y) + 1`` with probability
``y - floor(y)``, so it is unbiased and the errors of different clients cancel on
average.  Its randomness is drawn from the run seed (:func:`rounding_rng`: reproducible
runs), not from the OS CSPRNG: rounding hides nothing (keys, masks and DP noise stay on
the CSPRNG).

Conditional randomized rounding (Kairouz, Liu, Steinke, "The Distributed Discrete
Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML 2021, sec. 4):
with DP on, a vector ``x`` with ``||x||_2 <= c`` is rounded again until

    ``||Delta q||_2 <= min(c + Delta sqrt(d),
                          sqrt(c^2 + Delta^2 d / 4 + sqrt(2 ln(1/beta)) Delta (c + Delta sqrt(d) / 2)))``

so rounding cannot push a clipped vector past the norm the sensitivity was computed for by
more than that slack (:meth:`FixedPoint.conditional_quantize`; the first term holds for
every rounding, the second fails with probability at most ``beta`` per try).

Dyadic grid (:func:`to_grid`): an exchange planned with ``ValueSpec.grid_bits = f``
(:meth:`protocols.precision.MeanPrecision.grid_spec`) is rounded by every client, in every
mode, to the nearest multiple of ``2^-f`` -- deterministically, since the grid is what makes
the modes agree -- and every decoded sum back to that grid.  The packed codec then carries
such an exchange as integers of quantum ``2^-f`` (``FixedPoint(integer=True, grid_bits=f)``):
exact, like every other codec on a grid.

Refusals happen on the client before anything is encrypted: an entry above ``B``
(:class:`~protocols.errors.BoundError`), a plan whose K-way headroom does not fit the
field (:class:`~protocols.errors.PackingOverflowError`).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import IntegrityError, PackingOverflowError
from .precision import kway_sum_bound

#: failure probability per try of conditional randomized rounding (Kairouz et al.'s beta)
CRR_BETA = 2.0**-20
#: tries before conditional rounding gives up (each fails with probability <= CRR_BETA)
CRR_MAX_TRIES = 64


def to_grid(x: np.ndarray, bits: int) -> np.ndarray:
    """``Q(x) = rint(x 2^bits) 2^-bits``: the nearest multiple of ``2^-bits`` (ties to even), float64."""
    return np.ldexp(np.rint(np.ldexp(np.asarray(x, dtype=np.float64), int(bits))), -int(bits))


def grid_sums(blocks: dict[int, np.ndarray], bits: int, where: dict[str, Any]) -> dict[int, np.ndarray]:
    """A recipient's decoded grid blocks rounded back to the grid ``2^-bits``.

    A recipient's decoded blocks of a grid exchange rounded back to the grid ``2^-bits``, after
    checking that the codec landed within its planned error ``2^-(bits+2)`` (the spec's tolerance,
    :meth:`protocols.precision.MeanPrecision.grid_spec`); an IntegrityError refuses the sum otherwise.
    """
    blocks = {b: np.asarray(v, dtype=np.float64) for b, v in blocks.items()}
    exact = {b: to_grid(v, bits) for b, v in blocks.items()}
    off = max((float(np.abs(v - exact[b]).max(initial=0.0)) for b, v in blocks.items()), default=0.0)
    if not off <= 2.0 ** -(bits + 2):
        raise IntegrityError(
            f"a decoded sum lies {off:.3g} off the exchange's grid 2^-{bits}, beyond the codec's "
            f"planned error 2^-{bits + 2}: the sum is not exact and is refused",
            **where,
        )
    return exact


def rounding_rng(seed: int, tag: str, rnd: int, client: int) -> np.random.Generator:
    """The rounding randomness of one client in one exchange, from the run seed (public), so runs reproduce.

    It protects nothing: keys, masks and DP noise come from the CSPRNG (:mod:`protocols.csprng`), and the
    DP guarantee holds for every value of the rounding's uniforms (each moves two inputs apart by less
    than one grid step, which the noise's sensitivity includes: :func:`protocols.dp.grid_slack`), so
    they need not be secret.
    """
    return np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(tag.encode()), int(rnd), int(client)]))


@dataclass(frozen=True)
class FixedPoint:
    """Public fixed-point plan of one exchange (module doc).

    entry_bound:  B, bound on ``|x|`` of every client's entry (the client checks it);
    sum_bound:    S, public bound on ``|sum_k x_k|`` of one entry;
    num_clients:  K, contributions per sum;
    width:        b, bits per signed digit;
    fields:       F, digits per carrier.
    """

    entry_bound: float
    sum_bound: float
    num_clients: int
    width: int
    fields: int
    integer: bool = False  # integer values: quantum 1, no rounding, exact sums
    grid_bits: int = 0  # with integer: values on the grid 2^-grid_bits (quantum 2^-grid_bits, exact sums)

    def __post_init__(self) -> None:
        if self.width * self.fields > 52:
            raise ValueError("a packed carrier must stay below 2^52 to pass through float64 exactly")
        if self.integer:
            if self.sum_bound * 2.0**self.grid_bits > (1 << (self.width - 1)) - 1:
                raise PackingOverflowError(
                    f"{self.width}-bit signed fields cannot hold sums up to "
                    f"{self.sum_bound:g} on the grid 2^-{self.grid_bits}. Fix: use wider fields"
                )
        elif self.levels < 1:
            raise PackingOverflowError(
                f"{self.width}-bit fields leave no room for a {self.num_clients}-way sum (2^{self.width - 1} - 1 "
                f"must exceed K = {self.num_clients}). Fix: use wider fields (fewer per slot)"
            )

    @classmethod
    def integers(
        cls, entry_bound: float, sum_bound: float, num_clients: int, capacity_bits: int, grid_bits: int = 0
    ) -> FixedPoint:
        """The plan for integer (or grid) entries with a bounded sum.

        Integer entries (or multiples of ``2^-grid_bits``, :func:`to_grid`) with ``|sum| <= sum_bound``:
        the narrowest signed fields that hold the sum, as many as fit ``capacity_bits`` (exact, no rounding).
        """
        width = int(math.ceil(sum_bound * 2.0**grid_bits)).bit_length() + 1
        if width > capacity_bits:
            raise PackingOverflowError(
                f"sums up to {sum_bound:g} on the grid 2^-{grid_bits} need {width}-bit signed "
                f"fields, above the {capacity_bits} exact bits of a slot component. Fix: lower "
                "the public bound (or coarsen the grid: a larger tolerance)"
            )
        return cls(
            float(entry_bound), float(sum_bound), int(num_clients), width, capacity_bits // width, True, int(grid_bits)
        )

    @classmethod
    def plan(
        cls,
        entry_bound: float,
        num_clients: int,
        width: int,
        fields: int,
        *,
        owner_checked_sum: bool = False,
        sum_bound: float | None = None,
    ) -> FixedPoint:
        """The plan for entries bounded by ``entry_bound``.

        Sum bound ``K B`` unless an owner's check bounds the total: ``owner_checked_sum`` -> ``B``, or ``sum_bound``
        given.
        """
        if sum_bound is None:
            sum_bound = entry_bound if owner_checked_sum else kway_sum_bound(entry_bound, num_clients)
        return cls(float(entry_bound), float(sum_bound), int(num_clients), int(width), int(fields))

    @property
    def levels(self) -> int:
        """``2^(b-1) - 1 - K``: quanta in the sum bound S."""
        return (1 << (self.width - 1)) - 1 - self.num_clients

    @property
    def quantum(self) -> float:
        """``Delta = S / (2^(b-1) - 1 - K)`` (``2^-grid_bits`` for integers and grid values)."""
        return 2.0**-self.grid_bits if self.integer else self.sum_bound / self.levels

    @property
    def sum_error(self) -> float:
        """Bound on ``|decoded sum - exact sum|`` per entry: ``K Delta`` (0 for integers)."""
        return 0.0 if self.integer else self.num_clients * self.quantum

    def describe(self) -> str:
        """Short text form of the field layout, quantum and sum bound."""
        return f"fixed point {self.fields}x{self.width}b, quantum {self.quantum:.3g} (sum bound {self.sum_bound:g})"

    # ------------------------------------------------------------------ quantisation (client side)
    def quantize(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Randomized rounding of ``x / Delta`` to int64.

        Unbiased; error < 1 quantum; integers and grid values are taken as they are.
        """
        if self.integer:
            return np.rint(np.ldexp(np.asarray(x, dtype=np.float64), self.grid_bits)).astype(np.int64)
        y = np.asarray(x, dtype=np.float64) / self.quantum
        low = np.floor(y)
        return (low + (rng.random(y.shape) < (y - low))).astype(np.int64)

    def conditional_quantize(self, x: np.ndarray, rng: np.random.Generator, norm_bound: float) -> np.ndarray:
        """Conditional randomized rounding within Kairouz et al.'s norm bound.

        Conditional randomized rounding (module doc): re-round until ``||Delta q||_2`` is
        within Kairouz et al.'s bound for a vector of norm ``<= norm_bound``.
        """
        x = np.asarray(x, dtype=np.float64)
        d, c, g = x.size, float(norm_bound), self.quantum
        limit = min(
            c + g * math.sqrt(d),
            math.sqrt(
                c * c + g * g * d / 4.0 + math.sqrt(2.0 * math.log(1.0 / CRR_BETA)) * g * (c + g * math.sqrt(d) / 2.0)
            ),
        )
        for _ in range(CRR_MAX_TRIES):
            q = self.quantize(x, rng)
            if float(np.linalg.norm(q * g)) <= limit:
                return q
        return q  # every rounding already satisfies the deterministic term c + Delta sqrt(d)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """Integers back to reals: x = q * quantum."""
        return np.asarray(q, dtype=np.float64) * self.quantum

    # ------------------------------------------------------------------ packing
    def carriers_for(self, n: int) -> int:
        """Carriers used by ``n`` values."""
        return max(1, math.ceil(n / self.fields))

    def _shifts(self) -> np.ndarray:
        return (np.arange(self.fields, dtype=np.int64) * self.width)[:, None]

    def pack(self, q: np.ndarray) -> np.ndarray:
        """Pack signed integers into int64 carriers.

        Signed integers ``q`` (length n) -> int64 carriers (length ``carriers_for(n)``),
        planar: digit j of carrier i holds ``q[j * carriers + i]``.
        """
        q = np.asarray(q, dtype=np.int64)
        s = self.carriers_for(q.size)
        grid = np.zeros(self.fields * s, dtype=np.int64)
        grid[: q.size] = q
        carriers: np.ndarray = (grid.reshape(self.fields, s) << self._shifts()).sum(axis=0)
        return carriers

    def unpack(self, carriers: np.ndarray, n: int) -> np.ndarray:
        """int64 carriers -> the n signed digit sums (centred remainders, lowest digit first)."""
        p = np.asarray(carriers, dtype=np.int64).copy()
        half, mask = 1 << (self.width - 1), (1 << self.width) - 1
        digits = np.empty((self.fields, p.size), dtype=np.int64)
        for j in range(self.fields):
            d = ((p + half) & mask) - half
            digits[j] = d
            p = (p - d) >> self.width
        return digits.reshape(-1)[:n]
