"""Shared-key ckks uploads and downloads without ``c1``: ``c0`` at the primes' widths and the PRNG seeds.

Under symmetric encryption a fresh SEAL ciphertext is ``(c0, c1) = (-a s + m + e, a)`` with ``a``
drawn from a PRNG (SEAL's ``UniformRandomGeneratorInfo``: the PRNG type and a 64-byte seed) and
serialized *seeded*: ``c0`` and the seed, about half a ciphertext.  A sum of K uploads is

    (sum_i c0_i,  sum_i a_i)    with    a_i = expand(seed_i)

so the server sends ``sum c0_i`` (at the primes' own bit widths, no 64-bit words) and the K seeds, and
the recipient re-expands every ``a_i`` with SEAL itself: it loads, for ``i = 1..K``, the seeded
ciphertext ``(c0 = sum c0 if i = 1 else 0, seed_i)`` -- SEAL's own loader expands the seed, so
``a_i`` is the uploader's ``c1`` bit for bit -- and adds the K ciphertexts.  The result is the very
ciphertext the server would have summed, so decryption is unchanged; a download is about half a
full ciphertext.  The seeds are public (``a`` is public in either form), and the recipient learns the
number of uploads in the sum, which the dense layout (where this form is used) makes public anyway:
every contributor uploads every block.

An upload travels the same way (:func:`pack_upload`): ``seed || c0``, ``c0`` packed prime by prime at the
prime's bit width (SEAL's own seeded serialization holds 64-bit words, zstd-compressed); the server reads it
with :func:`load_upload`, which checks its length, the PRNG type and every coefficient against its prime.  The
parameters, NTT form and scale are the exchange plan's, so they are not sent.  The packing is lossless: a
coefficient below a ``b``-bit prime fits ``b`` bits, and value ``i`` of a row occupies bits
``[i b, (i + 1) b)`` of the little-endian bit stream.

The serialization is SEAL's (4.x), read and written here because ``tenseal.sealapi`` neither loads
a ciphertext from given polynomials nor exposes a seeded ciphertext's seed:

    SEAL header (16 B: magic 0xA15E, header size, version, compression mode, reserved, total size)
    body (zstd-compressed by SEAL's ``save``; written uncompressed here, which SEAL loads):
        parms_id (4 x u64) | is_ntt_form (u8) | size (u64) | N (u64) | L (u64) | scale (f64) |
        correction factor (u64) | DynArray [SEAL header | count (u64) | count x u64] |
        PRNG info [SEAL header | prng type (u8) | seed (64 B)]

A seeded ciphertext's DynArray holds only ``c0`` (``N L`` words, prime by prime); a full one both
polynomials and no PRNG info.  Every field read from an upload is checked (parameters, NTT form,
size two, scale, every coefficient below its prime, a known PRNG type, no trailing bytes) before
anything is added: the checks SEAL's own loader makes.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import cache

import numpy as np
import zstandard
from tenseal import sealapi

from .fixed_point import _chain_context, _evaluator, _load_into, _to_bytes
from .params import ChainParams

_HEADER = struct.Struct("<HBBBBHQ")  # magic, header size, version major, minor, compression, reserved, size
_MAGIC = 0xA15E
_COMPR_NONE, _COMPR_ZSTD = 0, 2
_MEMBERS = struct.Struct("<32sBQQQdQ")  # parms_id, is_ntt_form, size, N, L, scale, correction factor
_COUNT = struct.Struct("<Q")
#: PRNG info: type (1 = blake2xb, 2 = shake256) and the 64-byte seed
SEED_BYTES = 65
_PRNG_TYPES = (1, 2)
_PLAIN_MEMBERS = struct.Struct("<32sQd")  # parms_id, coeff count, scale
_K = struct.Struct("<H")


def uses_seeded_download(layout: str, encryption: str) -> bool:
    """Whether an exchange's downloads travel as ``sum c0`` plus seeds.

    Symmetric encryption (seeded uploads) in the dense layout, where every contributor uploads every block, so the
    number of seeds in a download (the number of uploads summed) tells a recipient nothing the plan does not.
    """
    return encryption == "symmetric" and layout == "dense"


@cache
def _primes(chain: ChainParams) -> tuple[np.ndarray, tuple[int, ...], bytes]:
    """The data primes (column vector), their bit widths and the first parms_id of ``chain``."""
    sc = _chain_context(chain)
    moduli = sc.first_context_data().parms().coeff_modulus()
    q = np.array([m.value() for m in moduli], dtype=np.uint64).reshape(-1, 1)
    return q, tuple(m.bit_count() for m in moduli), struct.pack("<4Q", *sc.first_parms_id())


@cache
def _seal_version() -> tuple[int, int]:
    """The (major, minor) version the installed SEAL writes (and therefore reads)."""
    _magic, _size, major, minor, *_ = _HEADER.unpack_from(_to_bytes(sealapi.Plaintext()), 0)
    return major, minor


def _seal_header(body_size: int) -> bytes:
    major, minor = _seal_version()
    return _HEADER.pack(_MAGIC, _HEADER.size, major, minor, _COMPR_NONE, 0, _HEADER.size + body_size)


def _body(data: bytes, expected: int) -> bytes:
    """The uncompressed body of a SEAL serialization of ``expected`` body bytes; ``ValueError`` otherwise."""
    if len(data) < _HEADER.size:
        raise ValueError("is shorter than a SEAL header")
    magic, hsize, major, _, compr, _, total = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC or hsize != _HEADER.size or major != 4 or total != len(data):
        raise ValueError("does not carry a valid SEAL header")
    if compr == _COMPR_NONE:
        body = bytes(data[_HEADER.size :])
    elif compr == _COMPR_ZSTD:
        try:
            body = zstandard.ZstdDecompressor().decompress(bytes(data[_HEADER.size :]), max_output_size=expected)
        except zstandard.ZstdError as exc:
            raise ValueError(f"does not decompress ({exc})") from None
    else:
        raise ValueError(f"uses compression mode {compr}, not SEAL's zstd or none")
    if len(body) != expected:
        raise ValueError(f"has a body of {len(body)} bytes, expected {expected}")
    return body


def _dyn_array(body: bytes, offset: int, count: int) -> np.ndarray:
    """The ``count`` words of the DynArray at ``offset``; ``ValueError`` if its header or count differ."""
    magic, hsize, major, _, compr, _, total = _HEADER.unpack_from(body, offset)
    (n,) = _COUNT.unpack_from(body, offset + _HEADER.size)
    if (magic, hsize, major, compr) != (_MAGIC, _HEADER.size, 4, _COMPR_NONE) or n != count:
        raise ValueError("carries a malformed coefficient array")
    if total != _HEADER.size + _COUNT.size + 8 * count:
        raise ValueError("carries a coefficient array of the wrong size")
    start = offset + _HEADER.size + _COUNT.size
    return np.frombuffer(body, dtype="<u8", count=count, offset=start).astype(np.uint64)


def _dyn_array_bytes(words: np.ndarray) -> bytes:
    size = _COUNT.size + 8 * words.size
    return _seal_header(size) + _COUNT.pack(words.size) + words.astype("<u8").tobytes()


def _mod_add(a: np.ndarray, b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``(a + b) mod q`` per prime row, for ``a, b < q < 2^62``."""
    s: np.ndarray = a + b
    np.subtract(s, q, out=s, where=s >= q)
    return s


# ---------------------------------------------------------------------- bit packing
@cache
def _bit_layout(n: int, bits: int) -> tuple[np.ndarray, ...]:
    """Where each of ``n`` values of ``bits`` bits lies in the packed stream of 64-bit words.

    Value ``i`` occupies stream bits ``[i b, (i + 1) b)``: word ``w_i = floor(i b / 64)`` from bit
    ``s_i = i b mod 64``, and, where ``s_i + b > 64``, the low bits of word ``w_i + 1``.
    Returns ``w``, ``s``, the first value of every word (for a reduction), those words, the values
    that carry into the next word, those next words and the shift back of their high part.
    """
    offset = np.arange(n, dtype=np.uint64) * np.uint64(bits)
    word = (offset >> np.uint64(6)).astype(np.int64)
    shift = offset & np.uint64(63)
    starts = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
    carries = np.flatnonzero(shift + np.uint64(bits) > np.uint64(64))
    back = np.uint64(64) - shift[carries]
    return word, shift, starts, word[starts], carries, word[carries] + 1, back


def _pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Words below ``2^bits`` packed at ``bits`` bits each (little-endian bit order, ``n bits / 8`` bytes)."""
    n = values.size
    word, shift, starts, first, carries, nxt, back = _bit_layout(n, bits)
    v = values.astype(np.uint64, copy=False)
    out = np.zeros(-(-n * bits // 64) + 1, dtype="<u8")
    out[first] = np.bitwise_or.reduceat(v << shift, starts)  # a word's values share none of its bits
    out[nxt] |= v[carries] >> back
    return out.view(np.uint8)[: n * bits // 8].tobytes()


def _unpack_bits(data: bytes, n: int, bits: int) -> np.ndarray:
    """Inverse of :func:`_pack_bits`: ``n`` words of ``bits`` bits from ``n bits / 8`` bytes."""
    word, shift, _, _, carries, nxt, back = _bit_layout(n, bits)
    buf = np.zeros((-(-n * bits // 64) + 1) * 8, dtype=np.uint8)
    buf[: n * bits // 8] = np.frombuffer(data, dtype=np.uint8)
    words = buf.view("<u8")
    v: np.ndarray = words[word] >> shift
    v[carries] |= words[nxt] << back
    if bits < 64:
        v &= np.uint64((1 << bits) - 1)
    return v


def _pack_c0(chain: ChainParams, c0: np.ndarray) -> bytes:
    """``c0`` (``[L, N]``, NTT form) packed prime by prime at the prime's bit width."""
    _, bits, _ = _primes(chain)
    return b"".join(_pack_bits(r, b) for r, b in zip(c0, bits))


def _unpack_c0(chain: ChainParams, data: bytes) -> np.ndarray:
    """Inverse of :func:`_pack_c0`; ``ValueError`` if a coefficient is not below its prime."""
    q, bits, _ = _primes(chain)
    n, at, rows = chain.poly_modulus_degree, 0, []
    for b in bits:
        rows.append(_unpack_bits(data[at : at + n * b // 8], n, b))
        at += n * b // 8
    c0 = np.stack(rows)
    if (c0 >= q).any():
        raise ValueError("has a coefficient above its prime")
    return c0


def packed_c0_bytes(chain: ChainParams) -> int:
    """Bytes of ``sum c0`` at the primes' bit widths (``N`` is a multiple of 8)."""
    _, bits, _ = _primes(chain)
    return sum(chain.poly_modulus_degree * b // 8 for b in bits)


def download_bytes(chain: ChainParams, uploads: int) -> int:
    """Bytes of one seeded download body: the seed count, the seeds and the packed ``sum c0``."""
    return _K.size + SEED_BYTES * uploads + packed_c0_bytes(chain)


def upload_bytes(chain: ChainParams) -> int:
    """Bytes of one packed upload body: the PRNG seed and ``c0`` at the primes' bit widths."""
    return SEED_BYTES + packed_c0_bytes(chain)


# ---------------------------------------------------------------------- server side
@dataclass
class SeededSum:
    """The server's sum of seeded uploads: ``sum c0`` (per prime, mod q) and the seeds of its terms."""

    chain: ChainParams
    c0: np.ndarray  # [L, N] uint64
    seeds: list[bytes]
    scale: float
    #: seeded downloads have an exact, public length: no padding
    padded_bytes = None

    def add_(self, other: SeededSum) -> SeededSum:
        """Add ``other`` in place: ``c0`` prime by prime mod q, and append its seeds (their ``c1`` sum)."""
        q, _, _ = _primes(self.chain)
        self.c0 = _mod_add(self.c0, other.c0, q)
        self.seeds = self.seeds + other.seeds
        return self

    def add_constant_(self, value: float, slots: int) -> SeededSum:
        """Add the public ``value`` to the first ``slots`` slots: it only changes ``c0`` (NTT form)."""
        from ..errors import BoundError

        q, _, parms_id = _primes(self.chain)
        L, n = self.c0.shape
        plain = sealapi.Plaintext()
        try:
            sealapi.CKKSEncoder(_chain_context(self.chain)).encode(
                [float(value)] * slots, list(struct.unpack("<4Q", parms_id)), self.scale, plain
            )
        except ValueError as exc:
            raise BoundError(f"the public offset {value:g} does not fit the ciphertext's scale (SEAL: {exc})") from None
        body = _body(_to_bytes(plain), _PLAIN_MEMBERS.size + _HEADER.size + _COUNT.size + 8 * L * n)
        coeffs = _dyn_array(body, _PLAIN_MEMBERS.size, L * n).reshape(L, n)
        self.c0 = _mod_add(self.c0, coeffs, q)
        return self

    def serialize(self) -> bytes:
        """``K || seeds || sum c0`` packed prime by prime at its bit width."""
        return b"".join([_K.pack(len(self.seeds)), *self.seeds, _pack_c0(self.chain, self.c0)])


def load_seeded(chain: ChainParams, data: bytes, scale: float) -> SeededSum:
    """Server side: a client's seeded upload as a :class:`SeededSum` of one term, every field checked.

    ``ValueError`` (naming what is wrong) unless it is a seeded two-polynomial ciphertext of ``chain`` in NTT form at
    ``scale`` with every coefficient below its prime and a known PRNG type.
    """
    q, _, parms_id = _primes(chain)
    n, L = chain.poly_modulus_degree, q.shape[0]
    expected = _MEMBERS.size + _HEADER.size + _COUNT.size + 8 * n * L + _HEADER.size + SEED_BYTES
    body = _body(data, expected)
    pid, ntt, size, degree, primes, ct_scale, correction = _MEMBERS.unpack_from(body, 0)
    if (pid, ntt, size, degree, primes, correction) != (parms_id, 1, 2, n, L, 1) or not math.isclose(
        ct_scale, scale, rel_tol=1e-9
    ):
        raise ValueError(f"was not encrypted with this exchange's parameters ({chain.describe()}, scale {scale:g})")
    c0 = _dyn_array(body, _MEMBERS.size, n * L).reshape(L, n)
    if (c0 >= q).any():
        raise ValueError("has a coefficient above its prime")
    info = expected - _HEADER.size - SEED_BYTES
    magic, hsize, major, _, compr, _, total = _HEADER.unpack_from(body, info)
    seed = body[info + _HEADER.size :]
    if (magic, hsize, major, compr, total) != (_MAGIC, _HEADER.size, 4, _COMPR_NONE, _HEADER.size + SEED_BYTES):
        raise ValueError("is not seeded (no PRNG info)")
    if seed[0] not in _PRNG_TYPES:
        raise ValueError(f"names an unknown PRNG type {seed[0]}")
    return SeededSum(chain, c0, [seed], scale)


def pack_upload(chain: ChainParams, data: bytes, scale: float) -> bytes:
    """Client side: its seeded SEAL ciphertext as ``seed || c0`` packed prime by prime (:func:`upload_bytes`).

    The ciphertext is read with every check of :func:`load_seeded` (parameters, NTT form, ``scale``); the packed form
    carries neither, since they are the plan's.
    """
    term = load_seeded(chain, data, scale)
    return term.seeds[0] + _pack_c0(chain, term.c0)


def load_upload(chain: ChainParams, body: bytes, scale: float) -> SeededSum:
    """Server side: a packed upload as a :class:`SeededSum` of one term.

    ``ValueError`` (naming what is wrong) unless it is :func:`upload_bytes` long, names a known PRNG type and every
    coefficient is below its prime.
    """
    if len(body) != upload_bytes(chain):
        raise ValueError(f"of {len(body)} bytes is not a packed upload of {upload_bytes(chain)} bytes")
    seed = bytes(body[:SEED_BYTES])
    if seed[0] not in _PRNG_TYPES:
        raise ValueError(f"names an unknown PRNG type {seed[0]}")
    return SeededSum(chain, _unpack_c0(chain, body[SEED_BYTES:]), [seed], scale)


def upload_ciphertext(chain: ChainParams, body: bytes, scale: float) -> sealapi.Ciphertext:
    """The SEAL ciphertext a packed upload carries: its ``c0`` and the expansion of its seed (for a key holder)."""
    return expand_sum(chain, _K.pack(1) + bytes(body), scale, max_uploads=1)


# ---------------------------------------------------------------------- recipient side
def expand_sum(chain: ChainParams, body: bytes, scale: float, max_uploads: int) -> sealapi.Ciphertext:
    """Recipient side: the full summed ciphertext ``(sum c0, sum expand(seed_i))`` of a seeded download.

    ``ValueError`` if the body is malformed or names more than ``max_uploads`` seeds.
    """
    q, _, parms_id = _primes(chain)
    n, L = chain.poly_modulus_degree, q.shape[0]
    if len(body) < _K.size:
        raise ValueError("is truncated")
    (k,) = _K.unpack_from(body, 0)
    if not 1 <= k <= max_uploads or len(body) != download_bytes(chain, k):
        raise ValueError(f"of {len(body)} bytes with {k} seeds does not fit 1..{max_uploads} uploads")
    seeds = [body[_K.size + i * SEED_BYTES : _K.size + (i + 1) * SEED_BYTES] for i in range(k)]
    c0 = _unpack_c0(chain, body[_K.size + k * SEED_BYTES :])
    sc, members = _chain_context(chain), _MEMBERS.pack(parms_id, 1, 2, n, L, scale, 1)
    zero = _dyn_array_bytes(np.zeros(n * L, dtype=np.uint64))
    total = None
    for i, seed in enumerate(seeds):
        if seed[0] not in _PRNG_TYPES:
            raise ValueError(f"names an unknown PRNG type {seed[0]}")
        array = _dyn_array_bytes(c0.reshape(-1)) if i == 0 else zero
        body_i = members + array + _seal_header(SEED_BYTES) + seed
        try:
            ct = _load_into(sealapi.Ciphertext(sc), sc, _seal_header(len(body_i)) + body_i)
        except Exception as exc:  # noqa: BLE001 - SEAL raises ValueError/RuntimeError
            raise ValueError(f"seed {i} does not expand under {chain.describe()}: {exc}") from None
        if total is None:
            total = ct
        else:
            _evaluator(n, tuple(chain.coeff_mod_bit_sizes)).add_inplace(total, ct)
    return total
