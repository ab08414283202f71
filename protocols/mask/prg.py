"""The mask PRG: AES-256-CTR keystream read as ring elements.

Bonawitz et al. (CCS 2017, §4) expand each 32-byte seed with a PRG into a mask
vector over ``Z_R``; security of the masked inputs reduces to the PRG's.  We use
AES-256 in counter mode from ``cryptography`` (OpenSSL, AES-NI/VAES: ~3-5 GB/s on
this machine, see research/he_dp_measurements.md §3), read as little-endian
unsigned b-bit integers.  numpy's generators are *not* used for masks: they are
not cryptographic, and their state can be recovered from outputs.

Keystream layout — no (key, counter) pair is ever used twice:

* every key is used for exactly one exchange: pairwise seeds are derived from
  fresh per-exchange X25519 keys with HKDF info binding the run, the exchange
  sequence number, tag and round (:mod:`.keys`); self-mask seeds are fresh random
  bytes; output-mask keys are HKDF(group seed, info binding the exchange and client).
* the 128-bit initial counter block is ``stream_id (8 bytes) || block offset (8 bytes)``
  where ``stream_id = SHA-256(purpose, run, seq, tag, round)[:8]`` binds the exchange a
  second time, and a block at index ``i`` of ``L`` values of ``w`` bytes reads the
  keystream bytes ``[i*L*w, (i+1)*L*w)`` of that stream.  The index is the block's
  *rank* in a set both ends know where one exists — a pairwise mask over the pair's
  common blocks, a self mask over its owner's announced blocks (:func:`ranked_mask`: one
  AES call, nothing read in vain, however scattered the ids) — and the block id for the
  output masks, whose blocks differ between the contributor and each recipient
  (:func:`ring_mask`).  Distinct blocks therefore read disjoint keystream.  The 64-bit
  offset half never carries into the stream id for streams below 2^68 bytes.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_AES_BLOCK = 16
#: runs of blocks closer than this many keystream bytes are read by one AES call (the bytes in
#: between cost less than setting up another call); a span never exceeds SPAN_MAX_BYTES
SPAN_GAP_BYTES = 1 << 16
SPAN_MAX_BYTES = 1 << 24


@lru_cache(maxsize=1024)
def stream_id(purpose: str, run_id: bytes, seq: int, tag: str, rnd: int) -> bytes:
    """8-byte public stream identifier of one mask stream.

    8-byte stream identifier binding (purpose, run, exchange number, tag, round); public, so
    memoised (every party derives the same few per exchange).
    """
    h = hashlib.sha256()
    for part in (
        b"secure_fgl/mask/stream/v1",
        purpose.encode(),
        run_id,
        seq.to_bytes(8, "big"),
        tag.encode(),
        rnd.to_bytes(8, "big", signed=True),
    ):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return h.digest()[:8]


#: zero plaintext fed to the cipher (CTR keystream = encryption of zeros), reused
_ZEROS = memoryview(bytes(1 << 22))


def keystream(key: bytes, sid: bytes, offset: int, nbytes: int) -> memoryview:
    """``nbytes`` bytes of AES-256-CTR(key) starting ``offset`` bytes into stream ``sid``."""
    if len(key) != 32 or len(sid) != 8:
        raise ValueError("keystream needs a 32-byte key and an 8-byte stream id")
    first, skip = divmod(offset, _AES_BLOCK)
    enc = Cipher(algorithms.AES(key), modes.CTR(sid + first.to_bytes(8, "big"))).encryptor()
    if skip:
        enc.update(_ZEROS[:skip])
    # update_into needs len(data) + 15 bytes of room; encrypt zeros chunk by chunk
    view = np.empty(nbytes + _AES_BLOCK, dtype=np.uint8).data  # no zero-fill: fully overwritten
    chunk = len(_ZEROS)
    for i in range(0, nbytes, chunk):
        n = min(chunk, nbytes - i)
        enc.update_into(_ZEROS[:n], view[i:])
    return view[:nbytes]


def ring_mask(key: bytes, sid: bytes, block_ids: np.ndarray, block_len: int, dtype: np.dtype) -> np.ndarray:
    """Mask rows ``[len(block_ids), block_len]`` of ring elements for the given block ids.

    Nearby ids share one AES call (a span), whose blocks are gathered by one index.
    ``block_ids`` must be sorted and unique.
    """
    dtype = np.dtype(dtype)
    w = dtype.itemsize
    ids = np.asarray(block_ids, dtype=np.int64)
    if ids.size == 0:
        return np.empty((0, block_len), dtype=dtype)
    row_bytes = block_len * w
    if ids[-1] - ids[0] + 1 == ids.size:  # one contiguous run (always so in the dense layout): no copy
        return np.frombuffer(keystream(key, sid, int(ids[0]) * row_bytes, ids.size * row_bytes), dtype=dtype).reshape(
            ids.size, block_len
        )
    # spans of nearby blocks: a new span where the gap exceeds SPAN_GAP_BYTES or the span would
    # exceed SPAN_MAX_BYTES; each span is one AES call, its blocks gathered by one index
    starts = [0]
    for cut in (np.flatnonzero((np.diff(ids) - 1) * row_bytes > SPAN_GAP_BYTES) + 1).tolist() + [ids.size]:
        while cut - starts[-1] > 1 and (ids[cut - 1] - ids[starts[-1]] + 1) * row_bytes > SPAN_MAX_BYTES:
            room = max(1, SPAN_MAX_BYTES // row_bytes)  # blocks per span (at least one)
            starts.append(starts[-1] + max(1, int(np.searchsorted(ids[starts[-1] : cut], ids[starts[-1]] + room))))
        starts.append(cut)
    out = np.empty((ids.size, block_len), dtype=dtype)
    for s, e in zip(starts[:-1], starts[1:]):
        first = int(ids[s])
        span = np.frombuffer(
            keystream(key, sid, first * row_bytes, (int(ids[e - 1]) - first + 1) * row_bytes), dtype=dtype
        ).reshape(-1, block_len)
        out[s:e] = span[ids[s:e] - first]
    return out


def ranked_mask(key: bytes, sid: bytes, num_blocks: int, block_len: int, dtype: np.dtype) -> np.ndarray:
    """Mask rows for blocks indexed by their rank.

    Mask rows ``[num_blocks, block_len]`` for blocks indexed by their rank ``0 .. num_blocks - 1``
    in a set both ends of the mask know (one contiguous keystream read).
    """
    return ring_mask(key, sid, np.arange(num_blocks), block_len, dtype)
