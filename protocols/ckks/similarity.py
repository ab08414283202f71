"""Encrypted cosine similarities of all pairs under CKKS.

Encrypted cosine similarities of all pairs (docs/design.md shape 4, ckks): the server evaluates
the inner products of the clients' normalised updates without a secret key, and a
designated client decrypts only the resulting matrix.

Protocol (one exchange, tag ``T``; the stages and who holds what: :mod:`protocols.similarity_exchange`;
the parties' steps are the functions below):

1. **Keys** (fresh for every exchange): the designated client ``d`` makes a CKKS key pair on
   :data:`SIMILARITY_CHAIN` with a relinearisation key and Galois (rotation) keys; it sends
   the server the evaluation context (public, relinearisation and Galois keys) and every
   other member the encryption context (public key only), signed.  No one but ``d`` can decrypt.
2. **Upload**: client ``i`` normalises its update ``u_i / ||u_i||`` (entries in [-1, 1]; a
   zero update stays zero), splits it into ``N/2``-slot pieces and encrypts them with the
   public key.
3. **Server**: for every pair ``i < j`` it multiplies the pieces slot-wise (ct x ct,
   relinearise, rescale), adds the pieces and sums the slots by rotations by 1, 2, ...,
   N/4 (TenSEAL ``sum``).  Every piece fills all ``N/2`` slots, so the cyclic rotate-and-add
   leaves the *total* in every slot: no partial sum of coordinates survives.  One result
   ciphertext per pair goes to ``d``.
4. **Decider** ``d`` decrypts them, drops its secret key and returns the ``m(m-1)/2`` inner
   products (float64, in the clear) to the server, which builds the matrix (diagonal 1, or 0
   for a zero update).

Depth: one ct x ct multiplication -> one rescale.  Chain ``N = 8192, [60, 40, 60]``
(scale ``2^40``; the result lives on the 60-bit prime, headroom ``2^19`` for values in
[-1, 1]): 160 coefficient-modulus bits <= 218, the HE standard's 128-bit bound for
N = 8192 (checked by :func:`~protocols.ckks.params.check_security`).

What each party learns: the server sees ciphertexts and the decrypted matrix; ``d`` sees
ciphertexts whose slots all hold one inner product each.  Limitation (as the add-only ckks
backend): ``d`` plus the server could decrypt every upload -- the uploads are signed but not
channel-encrypted, and ``ckks-mp`` would remove the single key holder.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tenseal as ts

from ..errors import BoundError, ConfigurationError, ShapeError
from .params import ChainParams, check_security

__all__ = [
    "SIMILARITY_CHAIN",
    "SIMILARITY_SCALE_BITS",
    "SIMILARITY_TOLERANCE",
    "make_key_pair",
    "public_context",
    "encrypt_unit",
    "inner_products",
    "decrypt_pairs",
    "cosine_from_pairs",
]

SIMILARITY_CHAIN = ChainParams("similarity-n8192", 8192, (60, 40, 60))
SIMILARITY_SCALE_BITS = 40
#: largest |error| accepted on a decrypted cosine (checked in tests/algorithms/test_gcfl.py)
SIMILARITY_TOLERANCE = 1e-4


def make_key_pair() -> tuple[ts.Context, bytes, bytes]:
    """Decider: make a key pair on :data:`SIMILARITY_CHAIN` and the contexts the others need.

    Decider: a key pair on :data:`SIMILARITY_CHAIN` with relinearisation and Galois keys;
    ``(secret context, evaluation context bytes for the server, encryption context bytes
    for the other clients)``.  Neither byte string holds the secret key.
    """
    check_security(SIMILARITY_CHAIN)
    secret = ts.context(
        ts.SCHEME_TYPE.CKKS,
        SIMILARITY_CHAIN.poly_modulus_degree,
        coeff_mod_bit_sizes=list(SIMILARITY_CHAIN.coeff_mod_bit_sizes),
        n_threads=1,
    )
    secret.global_scale = 2.0**SIMILARITY_SCALE_BITS
    secret.generate_galois_keys()
    evaluation = secret.serialize(
        save_public_key=True, save_secret_key=False, save_galois_keys=True, save_relin_keys=True
    )
    encryption = secret.serialize(
        save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False
    )
    return secret, evaluation, encryption


def public_context(data: bytes, tag: str = "", rnd: int = 0) -> ts.Context:
    """A received evaluation or encryption context; refused if it holds a secret key."""
    ctx = ts.context_from(data, n_threads=1)
    if ctx.is_private():
        raise ConfigurationError("a public similarity context holds the secret key", tag=tag, round=rnd)
    return ctx


def encrypt_unit(
    encryption: ts.Context, update: np.ndarray, *, tag: str = "", rnd: int = 0, client: int | None = None
) -> tuple[list[bytes], bool]:
    """Client: encrypt the unit vector ``u / ||u||`` with the public key.

    Client: ``u / ||u||`` (bound ``|entry| <= 1`` checked before encryption; a zero update
    stays zero) in ``N/2``-slot pieces encrypted with the public key; ``(frames, nonzero)``.
    """
    v = np.asarray(update, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(v))
    unit = v / norm if norm > 0 else v
    if np.abs(unit).max(initial=0.0) > 1.0 + 1e-9:
        raise BoundError("a normalised update has an entry above 1", tag=tag, round=rnd, client=client)
    scale = 2.0**SIMILARITY_SCALE_BITS
    return [
        ts.ckks_vector(encryption, piece.tolist(), scale=scale).serialize()
        for piece in _pieces(unit, SIMILARITY_CHAIN.slots)
    ], norm > 0


def inner_products(evaluation: ts.Context, uploads: list[list[bytes]], *, tag: str = "", rnd: int = 0) -> list[bytes]:
    """Server: one ciphertext per pair ``a < b`` (in that order) holding ``<u_a, u_b>`` in every slot."""
    cts = [[ts.ckks_vector_from(evaluation, f) for f in frames] for frames in uploads]
    if len({len(c) for c in cts}) != 1:
        raise ShapeError("uploads differ in their number of ciphertexts", tag=tag, round=rnd)
    results = []
    for a, b in _pairs(len(cts)):
        prod: Any = None  # a TenSEAL vector once the first term is in
        for x, y in zip(cts[a], cts[b]):
            term = x * y
            prod = term if prod is None else prod + term
        results.append(prod.sum().serialize())
    return results


#: the decider rounds the pair values to this power-of-two grid (half a step <= SIMILARITY_TOLERANCE / 2)
#: before releasing them, so the CKKS noise of an exact decryption does not leave it (Li-Micciancio)
RELEASE_STEP = 2.0 ** math.floor(math.log2(SIMILARITY_TOLERANCE))


def decrypt_pairs(secret: ts.Context, results: list[bytes]) -> np.ndarray:
    """Decider: the pair values rounded to :data:`RELEASE_STEP`, nothing else."""
    values = np.array([ts.ckks_vector_from(secret, r).decrypt()[0] for r in results], dtype=np.float64)
    return np.rint(values / RELEASE_STEP) * RELEASE_STEP


def cosine_from_pairs(values: np.ndarray, nonzero: list[bool]) -> np.ndarray:
    """Server: the ``m x m`` matrix (diagonal 1, or 0 for a zero update)."""
    cos = np.diag([1.0 if nz else 0.0 for nz in nonzero])
    for p, (a, b) in enumerate(_pairs(len(nonzero))):
        cos[a, b] = cos[b, a] = float(np.clip(values[p], -1.0, 1.0))
    return cos


def _pairs(m: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(m) for b in range(a + 1, m)]


def _pieces(unit: np.ndarray, slots: int) -> list[np.ndarray]:
    count = -(-unit.size // slots)
    padded = np.zeros(count * slots)
    padded[: unit.size] = unit
    return list(padded.reshape(count, slots))
