"""Pairwise-mask secure aggregation (Bonawitz et al., CCS 2017): ``make_protocol('mask', K)``.

Modules, one concept each:

* :mod:`.keys`     — X25519 key agreement, HKDF-SHA256 seed derivation;
* :mod:`.prg`      — AES-256-CTR mask keystream as ring elements;
* :mod:`.quantize` — fixed-point encoding over ``Z_{2^b}`` with range checks;
* :mod:`.shamir`   — Shamir secret sharing for dropout recovery;
* :mod:`.public`   — what both halves derive from public data (threshold, fingerprint, wire format);
* :mod:`.client`   — the client half, one handler per stage (its secrets stay there);
* :mod:`.server`   — the server half, one method per stage (sums, consistency, unmasking);
* :mod:`.backend`  — :class:`MaskProtocol`, the protocol and the algorithms' facade over the halves.
"""

from .backend import MaskProtocol

__all__ = ["MaskProtocol"]
