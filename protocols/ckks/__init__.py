"""CKKS backend of the protocol interface (TenSEAL).

Modules, one concept each:

* :mod:`.params`  — parameter chains, 128-bit security check, error model, encoding plan;
* :mod:`.packing` — several bounded integer fields per CKKS slot;
* :mod:`.keys`    — client-side key ring, server-side public context, fingerprints;
* :mod:`.wire`    — framing of serialized ciphertexts (integrity digest);
* :mod:`.backend` — :class:`CKKSProtocol`, the exchange itself.
"""

from .backend import CKKSProtocol
from .params import ADD_ONLY_CHAINS, N4096, N8192, REFERENCE, ChainParams, EncodingPlan, check_security

__all__ = [
    "CKKSProtocol",
    "ChainParams",
    "EncodingPlan",
    "check_security",
    "N8192",
    "N4096",
    "REFERENCE",
    "ADD_ONLY_CHAINS",
]
