"""Fixed-point quantisation over the power-of-two ring Z_{2^b}.

Pairwise masks cancel only in a finite group, so every client maps its real-valued
contribution into the ring ``Z_{2^b}`` before masking (Bonawitz et al., "Practical
Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017, §3: inputs
are vectors over ``Z_R``).  We use the encoding

    q(x) = round(x * 2^f)  mod 2^b            (two's complement, b in {8, 16, 24, ..., 64})

so that ``sum_k q(x_k) mod 2^b`` decodes, read as a signed b-bit integer and divided
by ``2^f``, to the sum of the rounded inputs — *provided the true integer sum lies
in ``[-2^(b-1), 2^(b-1))``*.  Past that range the ring wraps silently: the server
and the recipients would obtain a wrong sum with no way to notice (masked values
are uniformly distributed, so a per-sum check is impossible).  The only safe place
to enforce the range is the client, before masking, against a *public* bound:

    K * (B * 2^f + 1/2)  <  2^(b-1)

where ``K`` is the number of contributors and ``B`` the public bound on any entry
(``ValueSpec.max_abs`` plus DP headroom of ``DP_SIGMAS`` standard deviations when
clients have already added Gaussian noise).  :func:`choose_encoding` picks the
largest ``f`` satisfying this (best precision, no data dependence: ``f`` must not
leak anything), then checks the worst-case absolute error of the decoded sum,
``K * 2^-(f+1)`` plus the float64 read-out error, against ``ValueSpec.tolerance``.
An impossible configuration raises :class:`~protocols.errors.BoundError`; so does
any individual entry above ``B`` (:meth:`FixedPoint.encode`).

Integer exchanges (``ValueSpec.integer``) use ``f = 0`` and are exact; their entries must
be integral.  With DP on they still are: the DP engine adds *discrete* Gaussian noise to
integer exchanges (protocols/dp.py), so only the bound widens (noisy counts may be
negative).  Sums are returned as float64, which is exact only below ``2^53``: larger
configured bounds are refused.  ``ValueSpec.sum_max`` is deliberately *not* used to size
the ring: a client cannot check the K-way sum before masking, so a sum exceeding an
over-optimistic ``sum_max`` would wrap silently; the verifiable bound ``K * max_abs`` is.

Rings come in whole bytes, ``b = 8, 16, 24, ..., 64``, so that a value costs exactly
``b / 8`` bytes on the wire.  A ring without a native numpy width (24, 40, 48, 56 bits)
is held in the next wider unsigned integer: arithmetic there is mod ``2^32`` or ``2^64``,
a multiple of ``2^b``, so sums of such words agree with the ring sum mod ``2^b``;
:meth:`FixedPoint.to_wire` keeps the low ``b / 8`` bytes of each word (the reduction) and
:meth:`FixedPoint.decode` reads bit ``b - 1`` as the sign.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import BoundError, ConfigurationError, NonFiniteError
from ..precision import kway_sum_bound, largest_scale_bits

#: ring sizes b of Z_{2^b}: whole bytes, so a value costs b/8 bytes on the wire
RING_BITS = (8, 16, 24, 32, 40, 48, 56, 64)
#: the unsigned word that holds a ring element in memory (the narrowest at least b bits wide)
STORAGE_DTYPES = {
    b: np.uint8 if b <= 8 else np.uint16 if b <= 16 else np.uint32 if b <= 32 else np.uint64 for b in RING_BITS
}
#: DP headroom: a Gaussian entry exceeds this many sigmas with probability < 2e-23
DP_SIGMAS = 10.0


@dataclass(frozen=True)
class FixedPoint:
    """The public fixed-point encoding of one exchange.

    The public encoding of one exchange: ring ``Z_{2^ring_bits}``, ``frac_bits``
    fractional bits, and the per-entry bound ``entry_bound`` checked before masking.
    """

    ring_bits: int
    frac_bits: int
    entry_bound: float
    integer: bool
    num_contributors: int

    @property
    def dtype(self) -> np.dtype:
        """The in-memory word of a ring element (wider than the ring for 24, 40, 48, 56 bits)."""
        word: np.dtype = np.dtype(STORAGE_DTYPES[self.ring_bits]).newbyteorder("<")
        return word

    @property
    def _signed(self) -> np.dtype:
        """The signed word of the same width (two's complement)."""
        return np.dtype(f"<i{self.dtype.itemsize}")

    @property
    def bytes_per_value(self) -> int:
        """Bytes of one ring element, ring_bits / 8."""
        return self.ring_bits // 8

    @property
    def error_bound(self) -> float:
        """Worst-case absolute error of the decoded K-way sum (0 for integers)."""
        if self.integer:
            return 0.0
        rounding = self.num_contributors * 2.0 ** (-self.frac_bits - 1)
        readout = self.num_contributors * self.entry_bound * 2.0**-52  # int -> float64
        return rounding + readout

    # ------------------------------------------------------------------ client side
    def encode(
        self, x: np.ndarray, *, tag: str | None = None, round: int | None = None, client: int | None = None
    ) -> np.ndarray:
        """Quantise ``x`` into the ring after checking every entry against the public bound.

        Raises NonFiniteError for NaN/inf, BoundError for an entry above ``entry_bound``
        or (integer exchanges) a non-integral entry.  Nothing is encoded on error.
        """
        x = np.asarray(x, dtype=np.float64)
        if x.size:
            peak = max(abs(float(x.max())), abs(float(x.min())))  # NaN propagates through max/min
            if not math.isfinite(peak):
                raise NonFiniteError(
                    "contribution holds NaN or inf; it cannot be quantised", tag=tag, round=round, client=client
                )
            if peak > self.entry_bound:
                raise BoundError(
                    f"an entry of magnitude {peak:.6g} exceeds the public bound "
                    f"{self.entry_bound:.6g} of the {self.ring_bits}-bit fixed-point encoding; "
                    "raise ValueSpec.max_abs (or clip the contribution)",
                    tag=tag,
                    round=round,
                    client=client,
                )
        if self.integer:  # integral entries below the bound fit the signed word exactly
            q = x.astype(self._signed)
            if not np.array_equal(q, x):
                raise BoundError(
                    "an integer exchange received a non-integral entry; send counts (with DP, "
                    "integer noise: DPRequest(integer=True)), or use a float ValueSpec (integer=False)",
                    tag=tag,
                    round=round,
                    client=client,
                )
        else:
            q = x * 2.0**self.frac_bits  # exact scaling by 2^f (a power of two, no overflow below the bound) ...
            np.rint(q, out=q)  # ... then round half to even
            q = q.astype(self._signed)
        # |q| < 2^(b-1) / K by construction, so the cast to the signed word is exact; its
        # unsigned view is the two's-complement reduction mod the word, a multiple of 2^b
        # (to_wire drops the bits above b).
        return q.view(self.dtype)

    # ------------------------------------------------------------------ the wire
    def to_wire(self, words: np.ndarray) -> bytes:
        """Ring elements as ``b/8`` little-endian bytes each.

        The low bytes of every word, which is the reduction mod ``2^b``.
        """
        w = np.ascontiguousarray(words, dtype=self.dtype)
        if self.dtype.itemsize == self.bytes_per_value:
            return w.tobytes()
        return w.reshape(-1).view(self._low_bytes())["low"].tobytes()

    def _low_bytes(self) -> np.dtype:
        """A word viewed as its ``b/8`` low-order bytes.

        A word seen as its ``b/8`` low-order bytes (a void field at offset 0, little-endian
        words): numpy copies these fields whole, much faster than a strided byte slice.
        """
        return np.dtype(
            {"names": ["low"], "formats": [f"V{self.bytes_per_value}"], "offsets": [0], "itemsize": self.dtype.itemsize}
        )

    def from_wire(self, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
        """The words of :meth:`to_wire` back (a fresh array); ``data`` must hold exactly ``shape``."""
        raw = np.frombuffer(bytes(data), dtype=np.uint8)
        n, width = math.prod(shape), self.dtype.itemsize
        if raw.size != n * self.bytes_per_value:
            raise ValueError(f"{raw.size} bytes do not hold {n} ring elements of {self.bytes_per_value} bytes")
        if width == self.bytes_per_value:
            same_width: np.ndarray = raw.view(self.dtype).reshape(shape).copy()
            return same_width
        words = np.zeros(n, dtype=self.dtype)
        words.view(self._low_bytes())["low"] = raw.view(f"V{self.bytes_per_value}")
        return words.reshape(shape)

    # ------------------------------------------------------------------ recipient side
    def decode(self, ring_sum: np.ndarray) -> np.ndarray:
        """Signed read-out of a ring sum, scaled back to float64.

        The words may carry bits above ``b`` (sums in a wider word): shifting bit ``b - 1``
        up to the word's sign bit and back drops them and sign-extends in one step.
        """
        w = np.asarray(ring_sum, dtype=self.dtype)
        spare = 8 * self.dtype.itemsize - self.ring_bits
        if spare == 0:
            signed = w.view(self._signed)
        else:
            signed = (w << w.dtype.type(spare)).view(self._signed)
            signed >>= spare
        out = signed.astype(np.float64)  # as int64 -> float64 (the read-out term of error_bound)
        if not self.integer:
            out *= 2.0**-self.frac_bits  # exact: a power of two
        return out


def choose_encoding(
    *,
    max_abs: float,
    integer: bool,
    tolerance: float,
    num_contributors: int,
    ring_bits: int | str = 64,
    dp_noise_std: float = 0.0,
    frac_bits: int | None = None,
    tag: str | None = None,
    round: int | None = None,
) -> FixedPoint:
    """The encoding of one exchange, from public parameters only.

    ``ring_bits='auto'`` takes the smallest ring (8, 16, 24, ..., 64 bits) that carries the
    K-way sum within ``tolerance`` (exactly, for integers): bytes on the wire are
    ``b/8`` per value, so e.g. binary-feature counts of 10 clients travel as one byte
    and floats with a 1e-4 tolerance as three or four.  ``frac_bits=None`` picks the largest f
    whose K-way sum cannot leave the signed range; an explicit ``frac_bits`` is
    validated the same way.  Raises BoundError when no f both fits and meets
    ``tolerance``.  Only public values enter: the choice leaks nothing about the data.
    """
    if ring_bits == "auto":
        for b in RING_BITS:
            try:
                return _encoding_for_ring(
                    max_abs, integer, tolerance, num_contributors, b, dp_noise_std, frac_bits, tag, round
                )
            except BoundError:
                if b == RING_BITS[-1]:
                    raise
    return _encoding_for_ring(
        max_abs, integer, tolerance, num_contributors, ring_bits, dp_noise_std, frac_bits, tag, round
    )


def _encoding_for_ring(
    max_abs: float,
    integer: bool,
    tolerance: float,
    num_contributors: int,
    ring_bits: int | str,
    dp_noise_std: float,
    frac_bits: int | None,
    tag: str | None,
    round: int | None,
) -> FixedPoint:
    if ring_bits not in RING_BITS:
        raise ConfigurationError(f"ring_bits must be one of {', '.join(map(str, RING_BITS))}, got {ring_bits}")
    if not (math.isfinite(max_abs) and max_abs > 0):
        raise ConfigurationError(
            f"ValueSpec.max_abs must be a positive finite bound, got {max_abs}", tag=tag, round=round
        )
    K = max(1, int(num_contributors))
    half = 2 ** (ring_bits - 1)
    exact_integer = bool(integer)
    bound = float(max_abs) + DP_SIGMAS * max(0.0, float(dp_noise_std))
    if exact_integer:
        bound = float(math.floor(bound))
        worst = K * bound
        if worst >= half:
            raise BoundError(
                f"{K} contributors x max_abs {bound:.6g} can reach {worst:.6g}, beyond the "
                f"signed range 2^{ring_bits - 1} of the {ring_bits}-bit ring; use a larger ring "
                "(ring_bits=64) or a smaller ValueSpec.max_abs",
                tag=tag,
                round=round,
            )
        if worst >= 2**53:
            raise BoundError(
                f"integer sums up to {worst:.6g} cannot be returned exactly as float64 "
                "(limit 2^53); lower ValueSpec.max_abs",
                tag=tag,
                round=round,
            )
        return FixedPoint(ring_bits, 0, bound, True, K)

    def fits(f: int) -> bool:
        # exact rational check: K * (bound * 2^f + 1/2) < 2^(b-1)
        return bool(K * (bound * 2.0**f + 0.5) < half * (1 - 2**-50))

    if frac_bits is None:
        # the shared rule (protocols.precision): K * B * 2^f <= headroom, less K/2 for rounding
        f = largest_scale_bits(kway_sum_bound(bound, K), half - K / 2.0) if half > K / 2.0 else -1
        while f > -64 and not fits(f):
            f -= 1
        while fits(f + 1):
            f += 1
        if not fits(f):
            raise BoundError(
                f"{K} contributors x bound {bound:.6g} do not fit the {ring_bits}-bit ring at any "
                "precision; use ring_bits=64 or a smaller ValueSpec.max_abs",
                tag=tag,
                round=round,
            )
    else:
        f = int(frac_bits)
        if not fits(f):
            raise BoundError(
                f"frac_bits={f}: {K} contributors x bound {bound:.6g} x 2^{f} overflow the signed "
                f"range of the {ring_bits}-bit ring; lower frac_bits, raise ring_bits or lower "
                "ValueSpec.max_abs",
                tag=tag,
                round=round,
            )
    enc = FixedPoint(ring_bits, f, bound, False, K)
    if enc.error_bound > tolerance:
        raise BoundError(
            f"the {ring_bits}-bit ring leaves {f} fractional bits for {K} contributors with bound "
            f"{bound:.6g}: worst-case sum error {enc.error_bound:.3g} exceeds ValueSpec.tolerance "
            f"{tolerance:.3g}; use ring_bits=64, a smaller max_abs, or a looser tolerance",
            tag=tag,
            round=round,
        )
    return enc
