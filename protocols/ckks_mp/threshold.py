"""t-out-of-n key shares of ``ckks-mp``: Shamir sharing of each client's secret over ``R_Q``.

Mouchet, Bertrand, Hubaux, "An Efficient Threshold Access-Structure for RLWE-Based Multiparty
Homomorphic Encryption" (J. Cryptology 2023; ePrint 2022/780), Section 5 (the construction
Lattigo's ``thresholdizer`` implements), with Shamir's scheme (CACM 1979) applied coefficient-wise
in every RNS prime ``q_l`` of ``Q``.  Client i (dealer) draws a polynomial of degree ``t - 1``
with coefficients in ``R_Q``

    ``f_i(X) = s_i + c_{i,1} X + ... + c_{i,t-1} X^{t-1}``,   ``c_{i,k}`` uniform in ``R_Q``,

and gives client j the share ``sigma_{i,j} = f_i(x_j)`` at the public point ``x_j = j + 1``.  The
NTT is linear and a uniform polynomial is uniform in NTT form, so everything is computed in NTT
form.  Any ``t`` shares of ``s_i`` determine it; any ``t - 1`` are uniform and independent of it.

An active set ``A`` of exactly ``t`` clients turns its shares into an additive sharing of the
secret of any set ``U`` of dealers (the uploaders of a block):

    ``sum_{i in U} s_i = sum_{j in A} lambda_j^A sum_{i in U} sigma_{i,j}``,
    ``lambda_j^A = prod_{m in A, m != j} x_m / (x_m - x_j)  (mod q_l)``,

exactly (no noise: the shares are of the secrets, not of noisy decryptions).  Client j uses
``lambda_j^A sum_{i in U} sigma_{i,j}`` where the n-out-of-n protocol uses ``s_j``; every noise
term of its key-switching share (smudging included) is added after this product, so the large
``lambda_j^A`` never multiplies noise.  The coefficients of the sharing polynomial come from the
OS CSPRNG (:class:`protocols.csprng.SecureRandom`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..csprng import SecureRandom
from ..errors import IntegrityError
from .ring import RNSRing


def point(client: int) -> int:
    """The public Shamir point of ``client``: ``x = client + 1`` (never 0, where the secret sits)."""
    return int(client) + 1


def uniform_residues(primes: Sequence[int], n: int, rng: SecureRandom) -> np.ndarray:
    """A uniform element of ``R_Q`` from the CSPRNG.

    A uniform element of ``R_Q`` ``[L, N]`` (one residue per prime, rejection sampling on the
    top 31 bits of CSPRNG words).
    """
    out = np.empty((len(primes), n), dtype=np.int64)
    for row, q in enumerate(primes):
        vals = np.empty(0, dtype=np.int64)
        while vals.size < n:
            words = (rng.words(n - vals.size + 64) >> np.uint64(33)).astype(np.int64)
            vals = np.concatenate([vals, words[words < q]])
        out[row] = vals[:n]
    return out


def share_secret(ring: RNSRing, s_hat: np.ndarray, threshold: int, clients: int) -> dict[int, np.ndarray]:
    """Shamir shares of ``s_hat`` for clients ``0..clients-1`` with threshold ``t``.

    Shamir shares ``{j: f(x_j)}`` ``[L, N]`` (NTT form) of ``s_hat`` for clients ``0..clients-1``,
    threshold ``t`` (module docstring); ``t = 1`` gives every client ``s`` itself.
    """
    if not 1 <= threshold <= clients:
        raise ValueError(f"a threshold in 1..{clients}, got {threshold}")
    level = s_hat.shape[-2]
    rng = SecureRandom()
    coefficients = [uniform_residues(ring.primes[:level], ring.n, rng) for _ in range(threshold - 1)]
    q = ring.q[:level]
    shares = {}
    for j in range(clients):
        x = point(j)
        acc = np.zeros_like(s_hat)
        for c in reversed(coefficients):  # Horner: ((c_{t-1} x + c_{t-2}) x + ... + c_1) x + s
            acc = (acc + c) % q * x % q
        shares[j] = (acc + s_hat) % q
    return shares


def lagrange_coefficient(primes: Sequence[int], active: Sequence[int], me: int) -> np.ndarray:
    """The Lagrange coefficient ``lambda_me^A`` modulo each prime.

    ``lambda_me^A`` modulo each prime ``[L, 1]``: the weight of ``me``'s share when the clients
    ``active`` (distinct, ``me`` among them) interpolate at 0.
    """
    xs = [point(k) for k in active]
    mine = point(me)
    out = []
    for q in primes:
        num = den = 1
        for x in xs:
            if x != mine:
                num = num * x % q
                den = den * (x - mine) % q
        out.append(num * pow(den, -1, q) % q)
    return np.asarray(out, dtype=np.int64)[:, None]


def check_finishers(finishers: Sequence[int], me: int, threshold: int, clients: int, where: dict[str, Any]) -> None:
    """Refuse a finishing set of the key set-up that cannot serve t-out-of-n key switching.

    The clients that finished the set-up, ``F``, must be distinct, sorted clients ``0..clients-1``, ``me`` among them,
    and at least ``t`` (an active set is t of them); ``2t > n + c`` (checked on the public setup) then gives any two
    active sets within ``F`` more than ``c`` common clients, as over all ``n`` (IntegrityError otherwise).
    """
    if (
        len(finishers) < threshold
        or len(set(finishers)) != len(finishers)
        or list(finishers) != sorted(finishers)
        or any(not 0 <= k < clients for k in finishers)
        or me not in finishers
    ):
        raise IntegrityError(
            f"the server names {list(finishers)} as the clients that finished the key set-up: t-out-of-n needs at "
            f"least t = {threshold} distinct, sorted clients of the run's 0..{clients - 1}, this one (client {me}) "
            "among them",
            **where,
        )
