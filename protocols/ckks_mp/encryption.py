"""Encryption under a client's own key share with a public ``c1``, decryption, and the wire format.

Upload of client i, piece ``j`` of block ``b`` in exchange ``x`` (secret-key RLWE encryption):

    ``c0_i = -a_{x,b,j} s_i + e_i + Delta m_i``,   ``c1 = a_{x,b,j}`` (public, not sent),

with ``a_{x,b,j}`` expanded from the run's CRS seed (:func:`.sampling.upload_c1`) and ``e_i``
centered binomial from the OS CSPRNG.  The sum over the contributors ``S`` of the block,
``(sum_S c0_i, a_{x,b,j})``, is an encryption of ``sum_S m_i`` under ``s_S = sum_S s_i``:
``sum c0_i + s_S a = Delta sum m_i + sum e_i``.  ``c1`` is fresh per ciphertext of a run (a reused
``c1`` would give ``c0_i - c0'_i = Delta (m_i - m'_i) + small``).  Uploads travel in coefficient form:
a client computes ``s_i c1`` once (:func:`key_product`, one inverse NTT) for its upload and uses it again
for its key-switching share of the same exchange, and the server adds and switches down without a
transform.

Key-switching shares and key-switched downloads are switched down before they leave their
sender (:meth:`.ring.RNSRing.rescale`; :func:`switch_down` from NTT form): coefficient form at
the plan's switch level ``L'``, each residue ``round(x / P)`` for the product ``P`` of the
dropped primes (:mod:`.params`); a recipient decrypts them with :func:`decrypt_switched`.

Wire format: ``count`` polynomials ``[count, L, N]`` (uploads), two-polynomial
shares and ciphertexts ``[count, 2, L', N]`` (public-key switching) or one-polynomial shares and downloads
``[count, L', N]`` (switching to the broadcast key), all in coefficient form, as little-endian uint32 residues
(4 bytes per residue; the size is a function of public shapes only).  :func:`from_bytes`
refuses a wrong length or a residue outside ``[0, q_j)``.
"""

from __future__ import annotations

import numpy as np

from .ring import RNSRing
from .sampling import centered_binomial


def key_product(ring: RNSRing, s_hat: np.ndarray, c1_hat: np.ndarray) -> np.ndarray:
    """``s c1`` in coefficient form ``[B, L, N]``.

    For the public ``c1_hat`` ``[B, L, N]`` (NTT form) and a key ``s_hat`` ``[L', N]`` or one per ciphertext
    ``[B, L', N]`` (NTT form, ``L' >= L``): one product and one inverse NTT, a cache-sized batch at a time.
    """
    level = c1_hat.shape[-2]
    s_hat = s_hat[..., :level, :]
    out = np.empty(c1_hat.shape, dtype=np.int64)
    for rows in ring.batches(c1_hat.shape[0], level):
        out[rows] = ring.intt(ring.mul(c1_hat[rows], s_hat if s_hat.ndim == 2 else s_hat[rows]))
    return out


def encrypt(ring: RNSRing, s_c1: np.ndarray, plain: np.ndarray, eta: int) -> np.ndarray:
    """Encrypt plaintexts under a secret key share: ``c0 = e + plain - s c1`` (coefficient form).

    ``s_c1`` = :func:`key_product` of the share and the public ``c1``; ``plain`` ``[B, L, N]`` (coefficient form).
    One reduction per residue: ``plain + (2q - s c1) + e`` lies in ``(0, 3q)`` for ``|e| <= eta < q``.
    """
    batch, level = plain.shape[0], plain.shape[1]
    e = centered_binomial((batch, ring.n), eta)
    q = ring.q[:level]
    out = np.empty(plain.shape, dtype=np.int64)
    for rows in ring.batches(batch, level):
        x = plain[rows] + (2 * q - s_c1[rows])
        x += e[rows, None, :]
        out[rows] = ring.reduce(x)
    return out


def decrypt(ring: RNSRing, s_hat: np.ndarray, ct_hat: np.ndarray) -> np.ndarray:
    """``c0 + s c1`` in coefficient form, ``[..., L, N]``."""
    level = ct_hat.shape[-2]
    return ring.intt(ring.add(ct_hat[..., 0, :, :], ring.mul(ct_hat[..., 1, :, :], s_hat[:level])))


def switch_down(ring: RNSRing, ct_hat: np.ndarray, level: int) -> np.ndarray:
    """Switch NTT-form polynomials down to ``level`` in coefficient form.

    Polynomials ``[..., L, N]`` in NTT form -> coefficient form at ``level``, divided by the
    product of the dropped primes and rounded (:meth:`.ring.RNSRing.rescale`).
    """
    return ring.rescale(ring.intt(ct_hat), level)


def decrypt_switched(ring: RNSRing, s_hat: np.ndarray, ct: np.ndarray) -> np.ndarray:
    """``c0 + s c1`` of switched-down ciphertexts ``[..., 2, L', N]`` (coefficient form), in coefficient form."""
    level = ct.shape[-2]
    return ring.add(ct[..., 0, :, :], ring.intt(ring.mul(ring.ntt(ct[..., 1, :, :]), s_hat[:level])))


def decrypt_broadcast(ring: RNSRing, c0: np.ndarray, s_c1: np.ndarray) -> np.ndarray:
    """``c0' + s_B c1`` of broadcast downloads, in coefficient form at the switch level.

    ``c0`` ``[..., L', N]`` (switched down, coefficient form) and ``s_c1`` = :func:`key_product` of ``s_B`` and
    the public ``c1`` at the upload level, switched down here like ``c0`` (rounding below 1 per coefficient).
    """
    return ring.add(c0, ring.rescale(s_c1, c0.shape[-2]))


def to_bytes(polys: np.ndarray) -> bytes:
    """Serialise RNS polynomials as little-endian uint32 words."""
    return np.ascontiguousarray(polys, dtype="<u4").tobytes()


def from_bytes(ring: RNSRing, data: bytes, shape: tuple[int, ...], *, words: bool = False) -> np.ndarray:
    """Parse residues of ``shape`` (``[..., L, N]``); ``ValueError`` naming what is wrong.

    int64 residues, or with ``words`` the checked uint32 words themselves (a read-only view of ``data``, no copy:
    what the server adds into its int64 sums).
    """
    expected = int(np.prod(shape)) * 4
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != expected:
        got = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else type(data).__name__
        raise ValueError(f"expected {expected} bytes ({shape} uint32 residues), got {got}")
    residues = np.frombuffer(data, dtype="<u4").reshape(shape)
    if (residues >= ring.q[: shape[-2]].astype(np.uint32)).any():
        raise ValueError("a residue is not reduced modulo its prime (corrupted bytes)")
    return residues if words else residues.astype(np.int64)
