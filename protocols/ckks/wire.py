"""Wire format of one ciphertext: ``len || ct || zero padding``.

Integrity.  SEAL validates a loaded ciphertext only partly: in a measurement of 300 random
single bit flips in a serialized N=8192 ciphertext, 281 still loaded (a flipped coefficient
bit below the prime is a valid, wrong ciphertext; only flips that push a coefficient above
its prime are caught).  Truncation and corruption in transit are caught before anything is
added by the signed envelope every frame travels in (:mod:`protocols.message`: the sender's
signature covers the SHA-256 of the canonical body, which holds every frame of the message;
the receiver checks both before it reads a frame).  A per-frame digest, which predates the
signed envelopes, is therefore not sent: it cost two more SHA-256 passes over every
ciphertext.  This is transport integrity against faults and forgery by a third party; it is
not a defence against a malicious client, which the honest-but-curious threat model does
not include.

Constant size.  SEAL's zstd makes serialized sizes vary slightly from ciphertext to
ciphertext.  The variation carries no information about the plaintext (a fresh CKKS
ciphertext is uniformly distributed whatever it encrypts), but every body is padded to the
chain's fixed size (:attr:`~protocols.ckks.params.ChainParams.padded_ciphertext_bytes`) so
that every message size is a function of public shapes alone and transcripts of different
inputs are byte-for-byte the same size.  A client re-encrypts (fresh randomness) in the
astronomically unlikely case that a ciphertext exceeds the padded size; a server sum that
exceeds it is sent unpadded.

An empty frame (``b""``) in a download means "no client uploaded this block": the
recipient decodes zeros.  (Only possible in the sparse layout, where the server already
knows which blocks were uploaded.)
"""

from __future__ import annotations

import struct

LENGTH_BYTES = 4
HEADER_BYTES = LENGTH_BYTES
EMPTY = b""


def frame(ciphertext: bytes, padded_size: int | None = None, *, allow_larger: bool = False) -> bytes:
    """Frame ``ciphertext`` padded to ``padded_size`` bytes of ciphertext area.

    ``ValueError`` if it does not fit (unless ``allow_larger``: then it goes unpadded).
    """
    n = len(ciphertext)
    size = n if padded_size is None else padded_size
    if n > size:
        if not allow_larger:
            raise ValueError(f"ciphertext of {n} bytes exceeds the padded size {size}")
        size = n
    return struct.pack(">I", n) + ciphertext + bytes(size - n)


def unframe(data: bytes | bytearray | memoryview) -> bytes:
    """The ciphertext bytes of a frame; ``ValueError`` if shorter than its length field says."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"a ciphertext frame must be bytes, got {type(data).__name__}")
    data = memoryview(data).cast("B")
    if len(data) <= HEADER_BYTES:
        raise ValueError(f"frame of {len(data)} bytes is truncated")
    (n,) = struct.unpack(">I", data[:LENGTH_BYTES])
    if LENGTH_BYTES + n > len(data):
        raise ValueError("frame length field exceeds the frame")
    return bytes(data[LENGTH_BYTES : LENGTH_BYTES + n])
