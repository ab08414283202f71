"""Collective key generation (Mouchet, Troncoso-Pastoriza, Bossuat, Hubaux, "Multiparty
Homomorphic Encryption from Ring-Learning-with-Errors", PoPETs 2021, Protocol 1 "EncKeyGen").

Every party derives the public common polynomial ``a`` from the run's public seed
(:func:`.sampling.common_polynomial`).  Client i samples its secret share ``s_i`` (ternary)
and error ``e_i`` from the OS CSPRNG and publishes

    ``p_i = -a s_i + e_i``;

the server adds the shares: ``p = sum_i p_i = -a s + e`` with ``s = sum_i s_i``, so
``(p, a)`` is an RLWE public key for the collective secret ``s``, which no party ever holds.

A recipient key (PCKS target) is an ordinary single-party key pair ``(s_R; p_R = -a s_R + e_R)``
of the same form.  All keys are kept in NTT form, at the full modulus; an exchange at level
``L`` uses their first ``L`` residue rows.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from .ring import RNSRing
from .sampling import centered_binomial, ternary


@dataclass
class KeyPair:
    """A secret (``s_hat``, never leaves its owner) and its public key ``p_hat = -a s + e``."""

    s_hat: np.ndarray = field(repr=False)
    p_hat: np.ndarray


def key_pair(ring: RNSRing, a_hat: np.ndarray, eta: int) -> KeyPair:
    """Sample ``s`` (ternary) and ``e`` (centered binomial) and return ``(s, -a s + e)`` in NTT form."""
    level = a_hat.shape[0]
    s_hat = ring.ntt(ring.from_signed(ternary((ring.n,)), level))
    e_hat = ring.ntt(ring.from_signed(centered_binomial((ring.n,), eta), level))
    return KeyPair(s_hat, ring.add(ring.neg(ring.mul(a_hat, s_hat)), e_hat))


def collective_public_key(ring: RNSRing, shares: list[np.ndarray]) -> np.ndarray:
    """Server side: ``p = sum_i p_i`` (NTT form)."""
    total = shares[0]
    for p in shares[1:]:
        total = ring.add(total, p)
    return total


def key_fingerprint(params_text: str, seed: bytes, collective_pk: bytes) -> str:
    """The public context's fingerprint: sha256 of the parameters, the CRS seed and ``p`` (every
    party computes it; a client refuses a plan naming another)."""
    return hashlib.sha256(b"ckks-mp" + params_text.encode() + seed + collective_pk).hexdigest()[:16]
