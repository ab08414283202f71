"""Multiparty CKKS backend (``ckks-mp``): collective keys, no party holds the secret key.

Modules, one concept each:

* :mod:`.params`     — ring, 128-bit security check, worst-case noise bounds, encoding plan;
* :mod:`.ring`       — RNS ring ``Z_Q[X]/(X^N+1)`` and the negacyclic NTT;
* :mod:`.sampling`   — OS-CSPRNG samplers, the CRS seed, ``a``, per-upload ``c1``, pairwise masks;
* :mod:`.encoding`   — fixed-point fields packed into coefficients, CRT decoding;
* :mod:`.keys`       — key shares, owner-signed recipient and broadcast keys, fingerprint;
* :mod:`.encryption` — encryption under a client's share with a public ``c1``, decryption, wire format;
* :mod:`.keyswitch`  — collective key switching: to a public key (PCKS, Protocol 5) or to the broadcast key (CKS);
* :mod:`.party`      — one client's key holder (key shares, encryption, shares, decryption);
* :mod:`.client`     — the client half (stages, checks; holds its :class:`.party.MPClient`);
* :mod:`.server`     — the server half (forward signed keys, add, combine partial decryptions);
* :mod:`.backend`    — :class:`CKKSMPProtocol`, the algorithms' facade over the halves.
"""

from .backend import CKKSMPProtocol
from .params import MPParams, Plan, check_security, plan_exchange

__all__ = ["CKKSMPProtocol", "MPParams", "Plan", "check_security", "plan_exchange"]
