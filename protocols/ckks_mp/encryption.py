"""Public-key encryption under the collective key, decryption, and the wire format.

Encryption (RLWE, as in CKKS/BFV public-key encryption; Mouchet et al. 2021, §3):

    ``c0 = p u + e0 + Delta m``,   ``c1 = a u + e1``,

``u`` ternary, ``e0, e1`` centered binomial, all fresh from the OS CSPRNG.  Decryption under
a key ``s`` with ``p = -a s + e``: ``c0 + s c1 = Delta m + e u + e0 + s e1``.  Ciphertexts
stay in NTT form (additions are slot-wise there, and key switching needs ``NTT(c1)``).

Wire format: ``count`` ciphertexts ``[count, 2, L, N]`` as little-endian uint32 residues
(4 bytes per residue; the size is a function of public shapes only).  :func:`from_bytes`
refuses a wrong length or a residue outside ``[0, q_j)``.
"""
from __future__ import annotations

import numpy as np

from .ring import RNSRing
from .sampling import centered_binomial, ternary


def encrypt(ring: RNSRing, p_hat: np.ndarray, a_hat: np.ndarray, plain: np.ndarray, eta: int) -> np.ndarray:
    """Encrypt plaintexts ``plain`` ``[B, L, N]`` (coefficient form) -> ``[B, 2, L, N]`` (NTT form)."""
    batch, level = plain.shape[0], plain.shape[1]
    p_hat, a_hat = p_hat[:level], a_hat[:level]
    u_hat = ring.ntt(ring.from_signed(ternary((batch, ring.n)), level))
    e0 = ring.from_signed(centered_binomial((batch, ring.n), eta), level)
    e1 = ring.from_signed(centered_binomial((batch, ring.n), eta), level)
    c0 = ring.add(ring.mul(p_hat, u_hat), ring.ntt(ring.add(e0, plain)))
    c1 = ring.add(ring.mul(a_hat, u_hat), ring.ntt(e1))
    return np.stack([c0, c1], axis=1)


def decrypt(ring: RNSRing, s_hat: np.ndarray, ct_hat: np.ndarray) -> np.ndarray:
    """``c0 + s c1`` in coefficient form, ``[..., L, N]``."""
    level = ct_hat.shape[-2]
    return ring.intt(ring.add(ct_hat[..., 0, :, :], ring.mul(ct_hat[..., 1, :, :], s_hat[:level])))


def to_bytes(polys: np.ndarray) -> bytes:
    return np.ascontiguousarray(polys, dtype="<u4").tobytes()


def from_bytes(ring: RNSRing, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """Parse residues of ``shape`` (``[..., L, N]``); ``ValueError`` naming what is wrong."""
    expected = int(np.prod(shape)) * 4
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) != expected:
        got = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else type(data).__name__
        raise ValueError(f"expected {expected} bytes ({shape} uint32 residues), got {got}")
    arr = np.frombuffer(data, dtype="<u4").astype(np.int64).reshape(shape)
    q = ring.q[:shape[-2]]
    if (arr >= q).any():
        raise ValueError("a residue is not reduced modulo its prime (corrupted bytes)")
    return arr
