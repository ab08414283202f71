"""CKKS backend of the protocol interface (TenSEAL).

Modules, one concept each:

* :mod:`.params`  — parameter chains, 128-bit security check, error model, encoding plan;
* :mod:`.packing` — several bounded integer fields per CKKS slot;
* :mod:`.keys`    — client-side key ring, server-side public context, fingerprints;
* :mod:`.wire`    — framing of serialized ciphertexts (integrity digest);
* :mod:`.plan_message` — the public encoding plan as a message body, pieces and chunks;
* :mod:`.memo`    — co-located clients decrypt each distinct ciphertext once;
* :mod:`.client`  — :class:`~.client.CKKSClient`, one client's half (holds the secret context);
* :mod:`.server`  — :class:`~.server.CKKSServer`, the server's half (public contexts only);
* :mod:`.backend` — :class:`CKKSProtocol`, the algorithms' facade over the halves.
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
