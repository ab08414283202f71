"""Key material of ``ckks-mp``.

Mouchet, Troncoso-Pastoriza, Bossuat, Hubaux, "Multiparty Homomorphic Encryption from Ring-Learning-with-Errors",
PoPETs 2021.

Every party derives the public common polynomial ``a`` from the run's public seed
(:func:`.sampling.crs_seed`, :func:`.sampling.common_polynomial`).  Client i samples its
secret share ``s_i`` (ternary) from the OS CSPRNG; the collective secret is
``s = sum_i s_i``, which no party ever holds.  No collective *public* key is formed: each
client encrypts under its own share with a public per-ciphertext ``c1`` (:mod:`.encryption`),
so there is nothing a server or a colluder speaking last could substitute or bias.

A recipient key (PCKS target) is an ordinary single-party key pair ``(s_R; p_R = -a s_R + e_R)``,
published signed by its owner's identity key (:func:`protocols.auth.sign_public_key`).  All keys
are kept in NTT form, at the full modulus; an exchange at level ``L`` uses their first ``L``
residue rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from .ring import RNSRing
from .sampling import centered_binomial, ternary

#: kinds of the owner-signed public-key statements (:func:`protocols.auth.key_statement`)
RECIPIENT_KEY = "ckks-mp/recipient"
BROADCAST_KEY = "ckks-mp/broadcast"


@dataclass
class KeyPair:
    """A secret (``s_hat``, never leaves its owner) and its public key ``p_hat = -a s + e``."""

    s_hat: np.ndarray = field(repr=False)
    p_hat: np.ndarray


def secret_key(ring: RNSRing, level: int) -> np.ndarray:
    """A ternary secret ``s`` in NTT form (OS CSPRNG)."""
    return ring.ntt(ring.from_signed(ternary((ring.n,)), level))


def key_pair(ring: RNSRing, a_hat: np.ndarray, eta: int) -> KeyPair:
    """Sample ``s`` (ternary) and ``e`` (centered binomial) and return ``(s, -a s + e)`` in NTT form."""
    level = a_hat.shape[0]
    s_hat = secret_key(ring, level)
    e_hat = ring.ntt(ring.from_signed(centered_binomial((ring.n,), eta), level))
    return KeyPair(s_hat, ring.add(ring.neg(ring.mul(a_hat, s_hat)), e_hat))


def key_fingerprint(params_text: str, seed: bytes, broadcast_pk: bytes) -> str:
    """The public context's fingerprint.

    Sha256 of the parameters, the CRS seed and ``p_B`` (every party computes it; a client refuses a plan naming
    another).
    """
    return hashlib.sha256(b"ckks-mp" + params_text.encode() + seed + broadcast_pk).hexdigest()[:16]
