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
(output in bit-reversed order); inverse: Gentleman-Sande butterflies with the inverse
powers, then multiplication by ``N^{-1}`` (Longa and Naehrig, "Speeding up the Number
Theoretic Transform for Faster Ideal Lattice-Based Cryptography", CANS 2016, Alg. 1-2).
Each of the ``log2 N`` stages is one numpy operation over all primes and a batch of
polynomials, with one ``%`` (the twiddle product) and branch-free conditional subtractions
for the sums.  A ring with fewer primes (a lower "level") uses the first ``L`` rows of the
tables: residues mod the first ``L`` primes are a valid element of ``R_{q_0...q_{L-1}}``.
"""

from __future__ import annotations

from collections.abc import Callable
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


def _min_unsigned(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``min(x, y)`` of int64 arrays read as unsigned, into ``x``.

    With ``y = x - q`` (``x`` in ``[0, 2q)``) or ``y = x + q`` (``x`` in ``(-q, q)``) it is ``x mod q``: the
    negative one of the two reads as a huge unsigned word.
    """
    np.minimum(x.view(np.uint64), y.view(np.uint64), out=x.view(np.uint64))
    return x


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
        rev = _bit_reverse(n)
        fwd, inv = [], []
        for q in self.primes:
            psi = primitive_root_2n(q, n)
            powers = np.array([pow(psi, int(e), q) for e in range(n)], dtype=np.int64)
            ipowers = np.array([pow(psi, (2 * n - int(e)) % (2 * n), q) for e in range(n)], dtype=np.int64)
            fwd.append(powers[rev])
            inv.append(ipowers[rev])
        self._psi_rev_u = np.stack(fwd).astype(np.uint64)  # [L, N]
        self._psi_inv_rev_u = np.stack(inv).astype(np.uint64)
        self._n_inv_u = np.array([pow(n, -1, q) for q in self.primes], dtype=np.uint64)[:, None]

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
        """Small signed integer polynomial(s) ``[..., N]`` (|x| < 2^62) -> residues ``[..., L, N]``."""
        x = np.asarray(x, dtype=np.int64)
        residues: np.ndarray = np.mod(x[..., None, :], self.q[:level])
        return residues

    def from_limbs(self, limbs: np.ndarray, limb_bits: int, shift: int, level: int) -> np.ndarray:
        """``sum_l limbs[l] 2^(limb_bits l) - 2^shift`` (non-negative limbs < 2^31) -> residues.

        Carries big integers (e.g. smudging noise of ~80 bits) into RNS without multi-precision.
        """
        q = self.q[:level]
        out = np.zeros(limbs.shape[1:-1] + (level, self.n), dtype=np.int64)
        for i, limb in enumerate(limbs):
            w = np.array([pow(2, limb_bits * i, int(p)) for p in self.primes[:level]], dtype=np.int64)[:, None]
            out = (out + np.mod(limb[..., None, :], q) * w) % q
        sub = np.array([pow(2, shift, int(p)) for p in self.primes[:level]], dtype=np.int64)[:, None]
        return (out - sub) % q

    def rescale(self, a: np.ndarray, level: int) -> np.ndarray:
        """Divide coefficient-form residues by the dropped primes and round.

        Coefficient-form residues ``[..., L, N]`` of ``x`` -> residues ``[..., level, N]`` of
        ``x / P`` rounded, ``P = q_level ... q_{L-1}`` (the dropped primes).

        One prime at a time, last first: ``x <- (x - [x]_{q_l}) q_l^{-1}`` with ``[x]_{q_l}`` the
        centred residue, an exact division in every remaining ``Z_{q_j}``; the rounding error of
        all the steps together is below 1 per coefficient.
        """
        x = np.array(a, dtype=np.int64)
        for last in range(x.shape[-2] - 1, level - 1, -1):
            q_l = self.primes[last]
            r = x[..., last, :]
            r = np.where(r > q_l // 2, r - q_l, r)[..., None, :]
            q = self.q[:last]
            inv = np.array([pow(q_l, -1, p) for p in self.primes[:last]], dtype=np.int64)[:, None]
            x = (x[..., :last, :] - r) % q * inv % q
        return x

    # ------------------------------------------------------------------ arithmetic
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
        product: np.ndarray = a_hat * b_hat % self._q(a_hat.shape[-2], 2)
        return product

    def _by_chunks(self, a: np.ndarray, transform: Callable[[np.ndarray, int], object]) -> np.ndarray:
        """Apply ``transform`` to ``a`` ``[..., L, N]`` a few polynomials at a time (about 2 MiB: cache-sized)."""
        lead, (level, n) = a.shape[:-2], a.shape[-2:]
        x = np.array(a, dtype=np.int64).reshape(-1, level, n)
        step = max(1, _CHUNK_BYTES // (level * n * 8))
        for i in range(0, x.shape[0], step):
            transform(x[i : i + step].view(np.uint64), level)
        return x.reshape(lead + (level, n))

    def ntt(self, a: np.ndarray) -> np.ndarray:
        """Negacyclic NTT of ``a`` ``[..., L, N]`` (output in bit-reversed order).

        The stages work on unsigned words: ``x - q`` of an ``x < q`` wraps to a large value, so
        ``min(x, x - q)`` reduces ``[0, 2q)`` and ``min(d, d + q)`` reduces ``(-q, q)`` in two passes.
        """
        return self._by_chunks(a, self._ntt_in_place)

    def _ntt_in_place(self, x: np.ndarray, level: int) -> None:
        n = self.n
        q = self.q[:level].reshape(1, level, 1, 1).astype(np.uint64)
        m, t = 1, n
        while m < n:
            t //= 2
            y = x.reshape(-1, level, m, 2 * t)
            s = self._psi_rev_u[:level, m : 2 * m].reshape(1, level, m, 1)
            lo, hi = y[..., :t], y[..., t:]
            v = hi * s
            v %= q
            d = lo - v
            np.minimum(d, d + q, out=hi)
            lo += v
            np.minimum(lo, lo - q, out=lo)
            m *= 2

    def intt(self, a_hat: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`ntt` (coefficients in natural order, residues in ``[0, q_j)``)."""
        return self._by_chunks(a_hat, self._intt_in_place)

    def _intt_in_place(self, x: np.ndarray, level: int) -> None:
        n = self.n
        q = self.q[:level].reshape(1, level, 1, 1).astype(np.uint64)
        m, t = n, 1
        while m > 1:
            h = m // 2
            y = x.reshape(-1, level, h, 2 * t)
            s = self._psi_inv_rev_u[:level, h : 2 * h].reshape(1, level, h, 1)
            lo, hi = y[..., :t], y[..., t:]
            d = lo - hi
            np.minimum(d, d + q, out=d)
            lo += hi
            np.minimum(lo, lo - q, out=lo)
            np.multiply(d, s, out=hi)
            hi %= q
            t *= 2
            m = h
        x *= self._n_inv_u[:level].reshape(1, level, 1)
        x %= q.reshape(1, level, 1)
