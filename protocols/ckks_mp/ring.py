"""RNS polynomial ring ``R_Q = Z_Q[X] / (X^N + 1)`` with a vectorised negacyclic NTT.

``Q = q_0 q_1 ... q_{L-1}`` is a product of distinct primes ``q_j = 1 (mod 2N)`` below
2^31, so a product of two residues is below 2^62 and every modular product is exact in
int64 numpy arithmetic.  A polynomial is an int64 array ``[..., L, N]`` of residues in
``[0, q_j)`` (the Chinese remainder theorem makes ``R_Q`` the product of the ``R_{q_j}``).

The NTT evaluates a polynomial at the odd powers of a primitive 2N-th root of unity
``psi_j`` (mod ``q_j``), so a product in ``R_{q_j}`` (negacyclic convolution) becomes a
slot-wise product:

    ``NTT(a * b) = NTT(a) . NTT(b)``   in ``Z_{q_j}[X] / (X^N + 1)``.

Forward: Cooley-Tukey butterflies with the powers of ``psi`` in bit-reversed order
(output in bit-reversed order; Longa and Naehrig, "Speeding up the Number Theoretic Transform
for Faster Ideal Lattice-Based Cryptography", CANS 2016, Alg. 1).  Inverse: the same butterfly on
the bit-reversed input (decimation in time) with the powers of ``omega^{-1} = psi^{-2}``, then one
product with ``N^{-1} psi^{-k}`` per coefficient ``k``, which undoes the negacyclic twist.  Each of the
``log2 N`` stages is one numpy operation over all primes and a batch of polynomials:

    ``v = hi w mod q``,   ``(lo, hi) <- (lo + v, lo - v + q)``

on unsigned 64-bit words with lazy reduction: outputs grow by at most ``q`` a stage, so
operands below ``4q`` keep ``hi w < 4 q^2 < 2^64`` and the words are reduced (one ``%``) only every
fourth stage.  The one ``%`` per butterfly is the dominant cost.  Stages whose butterflies
pair words fewer than ``C = 64`` apart run on the transposed ``[C, N / C]`` view of each
polynomial, so every numpy loop runs over ``N / C`` contiguous words, never a handful.
A ring with fewer primes (a lower "level") uses the first ``L`` rows of the tables: residues
mod the first ``L`` primes are a valid element of ``R_{q_0...q_{L-1}}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import numpy as np


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for ``n < 3.4e14`` (bases 2, 3, 5, 7, 11, 13, 17)."""
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17):
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in (2, 3, 5, 7, 11, 13, 17):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@cache
def ntt_primes(n: int, count: int, below: int = 1 << 31) -> tuple[int, ...]:
    """The ``count`` largest primes ``q < below`` with ``q = 1 (mod 2n)``, descending."""
    out: list[int] = []
    q = (below - 1) // (2 * n) * (2 * n) + 1
    while len(out) < count:
        if q < 2 * n:
            raise ValueError(f"not enough NTT primes below {below} for N={n}")
        if q < below and is_prime(q):
            out.append(q)
        q -= 2 * n
    return tuple(out)


def primitive_root_2n(q: int, n: int) -> int:
    """Smallest-base primitive 2n-th root of unity mod prime ``q`` (``psi^n = -1``)."""
    for g in range(2, q):
        psi = pow(g, (q - 1) // (2 * n), q)
        if pow(psi, n, q) == q - 1:
            return psi
    raise ValueError(f"no primitive {2 * n}-th root of unity mod {q}")


#: bytes of int64 residues one NTT pass works on at a time (fits a core's L2 cache)
_CHUNK_BYTES = 2 << 20
#: butterflies that pair words fewer than this apart run on the transposed ``[C, N / C]`` view
_COLUMNS = 64
#: lazy reduction: operands below ``_LAZY q`` keep ``x w < _LAZY q^2 < 2^64`` for primes below 2^31
_LAZY = 4


def _min_unsigned(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``min(x, y)`` of int64 arrays read as unsigned, into ``x``.

    With ``y = x - q`` (``x`` in ``[0, 2q)``) or ``y = x + q`` (``x`` in ``(-q, q)``) it is ``x mod q``: the
    negative one of the two reads as a huge unsigned word.
    """
    np.minimum(x.view(np.uint64), y.view(np.uint64), out=x.view(np.uint64))
    return x


def _umod(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``x mod q`` in place for non-negative int64 ``x`` (unsigned division: a third of the signed one's cost)."""
    np.remainder(x.view(np.uint64), q.astype(np.uint64), out=x.view(np.uint64))
    return x


def _powers(base: int, count: int, q: int) -> np.ndarray:
    """``base^k mod q`` for ``k < count`` (a power of two) as uint64, by doubling: ``log2(count)`` numpy products."""
    out = np.ones(count, dtype=np.uint64)
    step, done = base % q, 1
    while done < count:
        out[done : 2 * done] = out[:done] * np.uint64(step) % np.uint64(q)
        step, done = step * step % q, 2 * done
    return out


def _bit_reverse(n: int) -> np.ndarray:
    bits = n.bit_length() - 1
    idx = np.arange(n)
    rev = np.zeros(n, dtype=np.int64)
    for b in range(bits):
        rev |= ((idx >> b) & 1) << (bits - 1 - b)
    return rev


class RNSRing:
    """Arithmetic in ``R_Q``, ``Q = prod(primes)``, on int64 residue arrays ``[..., L, N]``."""

    def __init__(self, n: int, primes: tuple[int, ...]):
        if n & (n - 1) or n < 2:
            raise ValueError(f"N must be a power of two, got {n}")
        for q in primes:
            if not (is_prime(q) and q % (2 * n) == 1 and q < 1 << 31):
                raise ValueError(f"{q} is not an NTT-friendly prime below 2^31 for N={n}")
        self.n = n
        self.primes = tuple(int(q) for q in primes)
        self.q = np.array(self.primes, dtype=np.int64)[:, None]  # [L, 1]
        self._qu = self.q.astype(np.uint64)
        self._cols = min(_COLUMNS, n)
        rev = _bit_reverse(n)
        fwd, inv, twist = [], [], []
        for q in self.primes:
            psi = primitive_root_2n(q, n)
            psi_inv, n_inv = pow(psi, -1, q), pow(n, -1, q)
            fwd.append(_powers(psi, n, q)[rev])  # psi^brv(i): Longa-Naehrig's table
            inv_powers = _powers(psi_inv, n, q)
            inv.append(inv_powers[:n:2] if n > 1 else inv_powers[:1])  # omega^-e, e < N / 2
            twist.append(inv_powers * np.uint64(n_inv) % np.uint64(q))  # N^-1 psi^-k
        self._psi_rev_u = np.stack(fwd)  # [L, N]
        self._twist_u = np.stack(twist)  # [L, N]
        #: ``(t, twiddles)`` per stage, each table ``[1, L, ...]`` shaped for the stage's view (:meth:`_stage_views`)
        self._forward_stages = self._stage_tables(self._psi_rev_u, forward=True)
        self._inverse_stages = self._stage_tables(np.stack(inv), forward=False)

    def _stage_tables(self, table: np.ndarray, forward: bool) -> list[tuple[int, np.ndarray]]:
        """Twiddle factors of every stage, contiguous and shaped to broadcast against its ``(lo, hi)`` views.

        Forward (Cooley-Tukey, strides ``t = N/2 .. 1``): ``psi^brv`` entry ``m + i`` for group ``i`` of ``m = N / 2t``.
        Inverse (decimation in time, strides ``t = 1 .. N/2``): ``omega^-(N / 2t) j`` for word ``j < t`` of a half.
        """
        n, cols, level = self.n, self._cols, table.shape[0]
        out = []
        strides = [n >> s for s in range(1, n.bit_length())] if forward else [1 << s for s in range(n.bit_length() - 1)]
        for t in strides:
            if forward:
                m = n // (2 * t)
                w = table[:, m : 2 * m]  # one per group of 2t words
                if t >= cols:
                    w = w.reshape(1, level, m, 1)
                else:  # group r (C / 2t) + g of row g, column r of the transposed view
                    w = w.reshape(level, n // cols, cols // (2 * t)).transpose(0, 2, 1)[None, :, :, None, :]
            else:
                w = table[:, :: n // (2 * t)]  # one per word j of a half
                w = w.reshape((1, level, 1, t) + (() if t >= cols else (1,)))
            out.append((t, np.ascontiguousarray(w)))
        return out

    # ------------------------------------------------------------------ helpers
    def modulus(self, level: int) -> int:
        """``Q_level = q_0 ... q_{level-1}`` as a Python int."""
        out = 1
        for q in self.primes[:level]:
            out *= q
        return out

    def _q(self, level: int, ndim: int) -> np.ndarray:
        return self.q[:level].reshape((level,) + (1,) * (ndim - 1))

    def from_signed(self, x: np.ndarray, level: int) -> np.ndarray:
        """Small signed integer polynomial(s) ``[..., N]`` (|x| < 2^62) -> residues ``[..., L, N]``.

        ``(x + c_j q_j) mod q_j`` with ``c_j q_j`` the least multiple of ``q_j`` at or above ``2^62``: a non-negative
        word below ``2^64``, reduced by unsigned division.
        """
        x = np.asarray(x, dtype=np.int64)
        q = self.q[:level]
        lift = (-(-(1 << 62) // q) * q).astype(np.uint64)  # [L, 1]
        out = x[..., None, :].astype(np.uint64) + lift  # wraps to x + c q >= 0
        return _umod(out.view(np.int64), q)

    def from_limbs(self, limbs: np.ndarray, limb_bits: int, shift: int, level: int) -> np.ndarray:
        """``sum_l limbs[l] 2^(limb_bits l) - 2^shift`` (non-negative limbs < 2^31) -> residues.

        Carries big integers (e.g. smudging noise of ~80 bits) into RNS without multi-precision: with limbs below
        ``2^31`` and weights ``2^(limb_bits l) mod q_j`` below ``2^31``, up to three weighted limbs and the offset
        ``2 q_j - (2^shift mod q_j)`` add up below ``2^64`` and are reduced once.
        """
        q = self.q[:level]
        out = np.zeros(limbs.shape[1:-1] + (level, self.n), dtype=np.uint64)
        for start in range(0, limbs.shape[0], 3):
            if start:  # a fourth limb onwards: reduce the sum so far first (then below q + 3 2^62 < 2^64)
                _umod(out.view(np.int64), q)
            for i in range(start, min(start + 3, limbs.shape[0])):
                w = np.array([pow(2, limb_bits * i, p) for p in self.primes[:level]], dtype=np.uint64)[:, None]
                out += limbs[i][..., None, :].astype(np.uint64) * w
        sub = np.array([2 * p - pow(2, shift, p) for p in self.primes[:level]], dtype=np.uint64)[:, None]
        out += sub
        return _umod(out.view(np.int64), q)

    def rescale(self, a: np.ndarray, level: int) -> np.ndarray:
        """Divide coefficient-form residues by the dropped primes and round.

        Coefficient-form residues ``[..., L, N]`` of ``x`` -> residues ``[..., level, N]`` of
        ``x / P`` rounded, ``P = q_level ... q_{L-1}`` (the dropped primes).

        One prime at a time, last first: ``x <- (x - [x]_{q_l}) q_l^{-1}`` with ``[x]_{q_l}`` the
        centred residue, an exact division in every remaining ``Z_{q_j}``; the rounding error of
        all the steps together is below 1 per coefficient.  Each step is one unsigned ``%``:
        ``(x_j + q_j - [x]_{q_l}) q_l^{-1}`` stays below ``2^64``.
        """
        a = np.asarray(a, dtype=np.int64)
        lead, top = a.shape[:-2], a.shape[-2]
        flat: np.ndarray = a.reshape((-1, top, self.n))
        out = np.empty((flat.shape[0], level, self.n), dtype=np.int64)
        for rows in self.batches(flat.shape[0], top):
            x = flat[rows]
            for last in range(top - 1, level - 1, -1):
                q_l = self.primes[last]
                r = x[:, last, :]
                r = np.where(r > q_l // 2, r - q_l, r)[:, None, :]
                q = self.q[:last]
                inv = np.array([pow(q_l, -1, p) for p in self.primes[:last]], dtype=np.int64)[:, None]
                y = x[:, :last, :] + (q - r)  # in (0, 2 q_j + q_l / 2) < 2^33
                y *= inv
                x = _umod(y, q)
            out[rows] = x
        return out.reshape(lead + (level, self.n))

    def batches(self, count: int, level: int) -> list[slice]:
        """Slices of a batch of ``count`` polynomials ``[L, N]``, about ``_CHUNK_BYTES`` of int64 words each.

        Element-wise work on a cache-sized slice at a time touches no fresh memory for its temporaries.
        """
        step = max(1, _CHUNK_BYTES // (level * self.n * 8))
        return [slice(i, min(i + step, count)) for i in range(0, count, step)]

    # ------------------------------------------------------------------ arithmetic
    def reduce(self, x: np.ndarray) -> np.ndarray:
        """``x mod q_j`` in place, for non-negative words ``[..., L, N]`` (int64 read as unsigned: below ``2^64``)."""
        return _umod(x, self._q(x.shape[-2], 2))

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(a + b) mod q_i per RNS limb; inputs reduced."""
        s = np.add(a, b, dtype=np.int64)
        return _min_unsigned(s, s - self._q(s.shape[-2], 2))

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(a - b) mod q_i per RNS limb; inputs reduced."""
        d = np.subtract(a, b, dtype=np.int64)
        return _min_unsigned(d, d + self._q(d.shape[-2], 2))

    def neg(self, a: np.ndarray) -> np.ndarray:
        """(-a) mod q_i per RNS limb; input reduced."""
        return self.sub(np.zeros_like(a), a)

    def mul(self, a_hat: np.ndarray, b_hat: np.ndarray) -> np.ndarray:
        """Slot-wise product of two polynomials in NTT form."""
        return _umod(np.multiply(a_hat, b_hat, dtype=np.int64), self._q(a_hat.shape[-2], 2))

    def _by_chunks(self, a: np.ndarray, transform: Callable[[np.ndarray, int], np.ndarray]) -> np.ndarray:
        """Apply ``transform`` to ``a`` ``[..., L, N]`` a few polynomials at a time (about 2 MiB: cache-sized)."""
        lead, (level, n) = a.shape[:-2], a.shape[-2:]
        x = np.array(a, dtype=np.int64).reshape(-1, level, n)
        step = max(1, _CHUNK_BYTES // (level * n * 8))
        for i in range(0, x.shape[0], step):
            chunk = x[i : i + step]
            chunk[...] = transform(chunk.view(np.uint64), level).view(np.int64)
        return x.reshape(lead + (level, n))

    def ntt(self, a: np.ndarray) -> np.ndarray:
        """Negacyclic NTT of ``a`` ``[..., L, N]`` (output in bit-reversed order; module docstring)."""
        return self._by_chunks(a, self._ntt_chunk)

    def intt(self, a_hat: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`ntt` (coefficients in natural order, residues in ``[0, q_j)``)."""
        return self._by_chunks(a_hat, self._intt_chunk)

    def _stage_views(self, x: np.ndarray, t: int, transposed: bool) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)`` word views of one stage of stride ``t``.

        Natural layout ``[B, L, N]``: groups of ``2t`` words, ``lo`` the first ``t`` of each; transposed layout
        ``[B, L, C, N / C]`` (``t < C``): rows ``c`` and ``c + t`` of each group of ``2t`` rows.
        """
        b, level = x.shape[:2]
        if not transposed:
            y = x.reshape(b, level, -1, 2, t)
        else:
            y = x.reshape(b, level, self._cols // (2 * t), 2, t, self.n // self._cols)
        return y[:, :, :, 0], y[:, :, :, 1]

    def _butterflies(
        self, x: np.ndarray, stages: Sequence[tuple[int, np.ndarray]], level: int
    ) -> tuple[np.ndarray, int]:
        """Run Cooley-Tukey stages ``(t, twiddles)`` on unsigned words ``x`` ``[B, L, N]`` below ``q``.

        ``v = hi w mod q``, ``(lo, hi) <- (lo + v, lo + q - v)``; the words are reduced before an operand could
        exceed ``_LAZY q`` (module docstring).  Returns the words (possibly a new array) and ``k`` with every word
        below ``k q``.
        """
        b, n, cols = x.shape[0], self.n, self._cols
        q = self._qu[:level]
        v = np.empty(x.size // 2, dtype=np.uint64)
        bound, transposed = 1, False
        for t, w in stages:
            if (t < cols) != transposed:  # swap between [.., N / C, C] and [.., C, N / C]
                rows, inner = (n // cols, cols) if not transposed else (cols, n // cols)
                x = np.ascontiguousarray(x.reshape(b, level, rows, inner).transpose(0, 1, 3, 2))
                transposed = not transposed
            if bound > _LAZY:
                np.remainder(x, q.reshape((1, level) + (1,) * (x.ndim - 2)), out=x)
                bound = 1
            lo, hi = self._stage_views(x, t, transposed)
            qv = q.reshape((1, level) + (1,) * (lo.ndim - 2))
            vv = v.reshape(lo.shape)
            np.multiply(hi, w[:, :level], out=vv)
            vv %= qv
            np.subtract(lo, vv, out=hi)
            hi += qv
            lo += vv
            bound += 1
        if transposed:
            x = np.ascontiguousarray(x.reshape(b, level, cols, n // cols).transpose(0, 1, 3, 2))
        return x.reshape(b, level, n), bound

    def _ntt_chunk(self, x: np.ndarray, level: int) -> np.ndarray:
        y, bound = self._butterflies(x, self._forward_stages, level)
        if bound > 2:
            reduced: np.ndarray = np.remainder(y, self._qu[:level], out=y)
            return reduced
        return _min_unsigned(y.view(np.int64), y.view(np.int64) - self.q[:level]).view(np.uint64)

    def _intt_chunk(self, x: np.ndarray, level: int) -> np.ndarray:
        y, bound = self._butterflies(x, self._inverse_stages, level)
        if bound > _LAZY:
            np.remainder(y, self._qu[:level], out=y)
        y *= self._twist_u[:level]  # times N^-1 psi^-k: below _LAZY q^2 < 2^64
        coefficients: np.ndarray = np.remainder(y, self._qu[:level], out=y)
        return coefficients
