"""Shamir t-out-of-n secret sharing over a prime field, for dropout recovery.

Shamir ("How to share a secret", CACM 1979): a secret ``s`` is the constant term of
a random polynomial ``p`` of degree ``t-1`` over ``GF(P)``; holder ``i`` gets
``(i, p(i))``.  Any ``t`` shares determine ``p(0) = s`` by Lagrange interpolation;
any ``t-1`` shares are independent of ``s`` (information-theoretically).

Bonawitz et al. (CCS 2017, §4, rounds ShareKeys/Unmasking) share two secrets per
client: the secret key of its mask key pair and its self-mask seed.  Here only the
self-mask seeds are shared, a batch at a time (the survivors reveal their pairwise
seeds with a dropped client instead of its key: :mod:`.backend`, step 5), so that the
server can remove the self mask of a survivor.  A seed is a 32-byte string, so the
field must exceed 2^256: we use ``P = 2^256 + 297``,
the smallest prime above 2^256 (checked by :func:`_is_probable_prime` in the
tests).  A share is an x-coordinate (a client id + 1, never 0) and a 33-byte value.

Randomness for the polynomial comes from :mod:`secrets` (the OS CSPRNG).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

#: the smallest prime above 2^256
PRIME = 2**256 + 297
SHARE_BYTES = 33  # ceil(257 / 8)
SECRET_BYTES = 32


@dataclass(frozen=True)
class Share:
    """Holder's point ``(x, y)`` on the sharing polynomial (``x >= 1``)."""

    x: int
    y: int

    def to_bytes(self) -> bytes:
        """4-byte x coordinate followed by the big-endian y value."""
        return self.x.to_bytes(4, "big") + self.y.to_bytes(SHARE_BYTES, "big")

    @classmethod
    def from_bytes(cls, data: bytes) -> Share:
        """Parse a share written by :meth:`to_bytes`.

        Raises:
            ValueError: ``data`` is not exactly one share long.
        """
        if len(data) != 4 + SHARE_BYTES:
            raise ValueError(f"a share is {4 + SHARE_BYTES} bytes, got {len(data)}")
        return cls(int.from_bytes(data[:4], "big"), int.from_bytes(data[4:], "big"))


def split_secret(secret: bytes, xs: Sequence[int], threshold: int) -> dict[int, Share]:
    """Shares of a 32-byte ``secret`` for holders at x-coordinates ``xs`` (distinct, >= 1).

    Any ``threshold`` of them reconstruct the secret; fewer reveal nothing.
    """
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secret must be {SECRET_BYTES} bytes")
    xs = [int(x) for x in xs]
    if len(set(xs)) != len(xs) or any(x < 1 or x >= PRIME for x in xs):
        raise ValueError("share x-coordinates must be distinct and in [1, P)")
    if not 2 <= threshold <= len(xs):
        raise ValueError(
            f"threshold {threshold} must lie in [2, {len(xs)}]: with t = 1 every share is the secret itself"
        )
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    out = {}
    for x in xs:
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % PRIME
        out[x] = Share(x, y)
    return out


def combine(shares: Iterable[Share], threshold: int) -> bytes:
    """The secret from at least ``threshold`` shares (Lagrange interpolation at 0).

    Raises ValueError with fewer shares.  With wrong shares the result is garbage:
    callers verify it (e.g. the reconstructed key's public key must match).
    """
    pts: dict[int, int] = {}
    for s in shares:
        pts.setdefault(s.x, s.y)
    if len(pts) < threshold:
        raise ValueError(f"{len(pts)} distinct shares cannot reconstruct a {threshold}-threshold secret")
    chosen = sorted(pts.items())[:threshold]
    weights = _lagrange_at_zero(tuple(x for x, _ in chosen))
    secret = sum(y * w for (_, y), w in zip(chosen, weights)) % PRIME
    if secret >= 2 ** (8 * SECRET_BYTES):
        raise ValueError("reconstructed value is not a 32-byte secret: the shares are inconsistent")
    return secret.to_bytes(SECRET_BYTES, "big")


@lru_cache(maxsize=256)
def _lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange weights at 0 for the points ``xs``: ``w_i = prod_{j != i} x_j / (x_j - x_i)`` mod P.

    Public (they depend on the holders' x-coordinates only), so memoised: every self-mask seed of an exchange is
    reconstructed from the shares of the same holders.
    """
    weights = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        weights.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(weights)


def _is_probable_prime(n: int, rounds: int = 40) -> bool:
    """Miller-Rabin (used by the tests to check :data:`PRIME`)."""
    if n < 2:
        return False
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for _ in range(rounds):
        a = secrets.randbelow(n - 3) + 2
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True
