"""What both halves of a mask exchange derive from public data alone.

The run's parameter fingerprint, the Shamir threshold, the mask stream ids, a dealer's share commitments, the size
of a survivor-set MAC, the wire format of ring elements and the row positions of a block subset.
"""

from __future__ import annotations

import hashlib
from typing import Any, cast

import numpy as np

from ..errors import IntegrityError, ShapeError
from .prg import stream_id
from .quantize import FixedPoint
from .shamir import Share

#: domain separator of a dealer's commitment to one Shamir share
SHARE_COMMITMENT_DOMAIN = b"secure-fgl/mask-share-commitment/v1"
COMMITMENT_BYTES = 32
#: bytes of one consistency-round MAC of the survivor set (HMAC-SHA256, untruncated)
SURVIVOR_MAC_BYTES = 32


def share_commitment(run_id: bytes, dealer: int, seq: int, share: Share) -> bytes:
    """The dealer's commitment to one share of its self-mask seed.

    ``SHA-256(domain, run, dealer, exchange, x, y)``: the dealer's commitment to the share of its
    self-mask seed for exchange ``seq`` held by the client at ``x = holder + 1``.  The dealer sends
    every commitment to the server in a message it signs; the server checks each share revealed
    for unmasking against it, so a corrupted share is refused naming its sender.  A share is a
    uniform element of a 256-bit prime field: its hash reveals nothing about the seed.
    """
    return hashlib.sha256(
        SHARE_COMMITMENT_DOMAIN
        + bytes(run_id)
        + int(dealer).to_bytes(4, "big")
        + int(seq).to_bytes(8, "big")
        + share.to_bytes()
    ).digest()


def positions(ids: np.ndarray, subset: np.ndarray) -> slice | np.ndarray:
    """Row positions of ``subset`` (sorted, contained) within ``ids`` (sorted)."""
    if subset.size == ids.size:
        return slice(None)
    return np.searchsorted(ids, subset)


def shamir_threshold(n: int, threshold: int | None, max_colluders: int) -> int:
    """The Shamir threshold ``t`` of an exchange with ``n`` contributors.

    It comes from the run's public setup only (never from a plan): the run's ``threshold`` capped at ``n``, by
    default the smallest ``t`` with ``2t > n + c`` (``c``: the run's max colluders), ``floor((n + c) / 2) + 1`` --
    so the server cannot gather ``t`` answers from two disjoint sets of honest clients (the active-adversary
    condition of Bonawitz et al., CCS 2017, docs/security.md); with ``c = 0`` an honest majority.
    """
    t = (int(n) + int(max_colluders)) // 2 + 1 if threshold is None else int(threshold)
    return max(1, min(t, int(n)))


def mask_fingerprint(num_clients: int, options: dict[str, Any]) -> str:
    """Public fingerprint of the run's mask parameters (every party computes it from the setup)."""
    o = options
    params = (
        f"mask:{num_clients}:ring{o['ring_bits']}:frac{o['frac_bits']}:reveal{int(o['reveal_to_server'])}:"
        f"recovery{int(o['dropout_recovery'])}:t{o['threshold']}:block{o['block_size']}:"
        f"batch{o['self_mask_batch']}"
    )
    return hashlib.sha256(params.encode()).hexdigest()[:16]


def stream_ids(run_id: bytes, seq: int, tag: str, rnd: int) -> dict[str, bytes]:
    """The AES-CTR stream ids of one exchange's pairwise, self and output masks."""
    return {p: stream_id(p, run_id, seq, tag, rnd) for p in ("pairwise", "self", "output")}


def read_words(data: object, enc: FixedPoint, shape: tuple[int, int], what: str, where: dict[str, Any]) -> np.ndarray:
    """Ring elements of an upload or download: raw bytes, exactly ``shape`` values of ``b/8`` bytes."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ShapeError(
            f"{what} must carry raw bytes of {enc.ring_bits}-bit ring elements, got "
            f"{type(data).__name__}{'/' + str(data.dtype) if hasattr(data, 'dtype') else ''}",
            **where,
        )
    want = shape[0] * shape[1] * enc.bytes_per_value
    if len(data) != want:
        raise IntegrityError(
            f"{what} is {len(data)} bytes, expected {want} ({shape[0]} blocks x {shape[1]} values "
            f"x {enc.bytes_per_value} bytes): truncated or corrupted",
            **where,
        )
    return enc.from_wire(cast(bytes, data), shape)
