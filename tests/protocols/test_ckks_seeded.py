"""Shared-key ckks uploads as ``seed || c0`` and downloads as ``sum c0`` plus the seeds (``protocols/ckks/seeded.py``).

Packed uploads carry the very ``c0`` and seed of SEAL's ciphertext at every coefficient up to ``q - 1``; the
recipient's re-expanded sum is the server's SEAL sum bit for bit; malformed uploads and downloads are refused
(the server by a ``ValueError`` turned into ``IntegrityError``, the recipient by ``IntegrityError``), including a
download from a server half that adds a seed.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from tenseal import sealapi

from protocols import ValueSpec
from protocols.ckks import CKKSProtocol
from protocols.ckks import params as P
from protocols.ckks.fixed_point import _load_into, _to_bytes, seal_context, server_load
from protocols.ckks.seeded import (
    SEED_BYTES,
    _pack_bits,
    _primes,
    _unpack_bits,
    download_bytes,
    expand_sum,
    load_seeded,
    load_upload,
    pack_upload,
    upload_bytes,
)
from protocols.ckks.server import CKKSServer
from protocols.errors import IntegrityError

CHAIN = P.NAMED_CHAINS["n4096"]
SCALE = 2.0**20


def _uploads(k: int, seed: int = 0):
    sc = seal_context(CHAIN.poly_modulus_degree, tuple(CHAIN.coeff_mod_bit_sizes))
    secret = sealapi.KeyGenerator(sc).secret_key()
    encryptor, encoder = sealapi.Encryptor(sc, secret), sealapi.CKKSEncoder(sc)
    rng = np.random.default_rng(seed)
    values = [rng.integers(-1000, 1000, CHAIN.poly_modulus_degree // 2).astype(float) for _ in range(k)]
    uploads = []
    for v in values:
        plain = sealapi.Plaintext()
        encoder.encode(v.tolist(), SCALE, plain)
        uploads.append(_to_bytes(encryptor.encrypt_symmetric(plain)))
    return sc, secret, uploads, values


def test_expanded_sum_is_the_servers_seal_sum_bit_for_bit():
    sc, secret, uploads, values = _uploads(3)
    full = server_load(CHAIN, uploads[0], SCALE)
    seeded = load_seeded(CHAIN, uploads[0], SCALE)
    for u in uploads[1:]:
        full.add_(server_load(CHAIN, u, SCALE))
        seeded.add_(load_seeded(CHAIN, u, SCALE))
    full.add_constant_(3.0, 10)  # a missing client's public DP offset
    seeded.add_constant_(3.0, 10)
    body = seeded.serialize()
    assert len(body) == download_bytes(CHAIN, 3) < 0.5 * len(full.serialize())
    ct = expand_sum(CHAIN, body, SCALE, max_uploads=3)
    assert _to_bytes(ct) == full.serialize()
    plain = sealapi.Plaintext()
    sealapi.Decryptor(sc, secret).decrypt(ct, plain)
    want = sum(values)
    want[:10] += 3.0
    np.testing.assert_allclose(sealapi.CKKSEncoder(sc).decode_double(plain), want, atol=1e-2)


@pytest.mark.parametrize("chain", sorted(P.ADD_ONLY_CHAINS, key=lambda c: c.name), ids=lambda c: c.name)
def test_bit_packing_round_trips_at_the_edges_of_every_prime(chain):
    """Every coefficient in ``[0, q)`` survives the packing at the prime's width, ``q - 1`` and 0 included."""
    q, bits, _ = _primes(chain)
    n, rng = chain.poly_modulus_degree, np.random.default_rng(1)
    for prime, b in zip(q[:, 0], bits):
        words = rng.integers(0, int(prime), n, dtype=np.uint64)
        words[::3] = prime - np.uint64(1)  # the top of the range, next to values of every bit pattern
        words[1::7] = 0
        packed = _pack_bits(words, b)
        assert len(packed) == n * b // 8
        assert np.array_equal(_unpack_bits(packed, n, b), words)
    full = np.full(8, (1 << 64) - 1, dtype=np.uint64)  # the 64-bit edge of the word packing
    assert np.array_equal(_unpack_bits(_pack_bits(full, 64), 8, 64), full)


def test_packed_upload_carries_the_ciphertext_and_decrypts_exactly():
    """The packed form is the seed and ``c0`` of SEAL's ciphertext, and the sum decrypts to the exact integers."""
    sc, secret, uploads, values = _uploads(3)
    packed = [pack_upload(CHAIN, u, SCALE) for u in uploads]
    assert all(len(p) == upload_bytes(CHAIN) < 0.95 * len(u) for p, u in zip(packed, uploads))
    acc = None
    for p, u in zip(packed, uploads):
        term, seal_term = load_upload(CHAIN, p, SCALE), load_seeded(CHAIN, u, SCALE)
        assert term.seeds == seal_term.seeds and np.array_equal(term.c0, seal_term.c0)
        acc = term if acc is None else acc.add_(term)
    ct = expand_sum(CHAIN, acc.serialize(), SCALE, max_uploads=3)
    plain = sealapi.Plaintext()
    sealapi.Decryptor(sc, secret).decrypt(ct, plain)
    got = np.asarray(sealapi.CKKSEncoder(sc).decode_double(plain))
    assert np.array_equal(np.rint(got), sum(values)) and np.abs(got - sum(values)).max() < 1e-2


def test_malformed_packed_uploads_are_refused_by_the_server():
    _, _, uploads, _ = _uploads(1)
    body = pack_upload(CHAIN, uploads[0], SCALE)
    high = bytearray(body)
    high[SEED_BYTES : SEED_BYTES + 8] = b"\xff" * 8  # the first coefficient: all ones, above the prime
    prng = bytearray(body)
    prng[0] = 7  # no such PRNG type
    for data, why in [
        (high, "above its prime"),
        (prng, "unknown PRNG type"),
        (body[:-1], "not a packed upload"),
        (body + b"\0", "not a packed upload"),
        (uploads[0], "not a packed upload"),
    ]:
        with pytest.raises(ValueError, match=why):
            load_upload(CHAIN, bytes(data), SCALE)


def _uncompressed(data: bytes) -> bytearray:
    """A seeded upload re-serialized without compression (SEAL loads both)."""
    import zstandard

    body = zstandard.ZstdDecompressor().decompress(data[16:], max_output_size=1 << 22)
    header = bytearray(data[:16])
    header[5] = 0  # compression mode none
    header[8:16] = struct.pack("<Q", 16 + len(body))
    return header + body


def test_malformed_uploads_are_refused_by_the_server():
    _, _, uploads, _ = _uploads(1)
    raw = _uncompressed(uploads[0])
    assert load_seeded(CHAIN, bytes(raw), SCALE).seeds  # the uncompressed form loads
    c0_at = 16 + 73 + 16 + 8  # SEAL header, members, the coefficient array's header and count
    high = bytearray(raw)
    high[c0_at : c0_at + 8] = struct.pack("<Q", (1 << 64) - 2)  # above the prime
    prng = bytearray(raw)
    prng[-SEED_BYTES] = 7  # no such PRNG type
    sc = seal_context(CHAIN.poly_modulus_degree, tuple(CHAIN.coeff_mod_bit_sizes))
    unseeded = _to_bytes(_load_into(sealapi.Ciphertext(sc), sc, uploads[0]))  # both polynomials
    for data, why in [
        (high, "above its prime"),
        (prng, "unknown PRNG type"),
        (unseeded, "body of"),
        (raw[:-1], "valid SEAL header"),
    ]:
        with pytest.raises(ValueError, match=why):
            load_seeded(CHAIN, bytes(data), SCALE)
    with pytest.raises(ValueError, match="parameters"):
        load_seeded(CHAIN, uploads[0], 2 * SCALE)


def test_malformed_downloads_are_refused_by_the_recipient():
    _, _, uploads, _ = _uploads(2)
    acc = load_seeded(CHAIN, uploads[0], SCALE).add_(load_seeded(CHAIN, uploads[1], SCALE))
    body = acc.serialize()
    with pytest.raises(ValueError, match="seeds does not fit"):
        expand_sum(CHAIN, body, SCALE, max_uploads=1)
    with pytest.raises(ValueError, match="seeds does not fit"):
        expand_sum(CHAIN, body[:-1], SCALE, max_uploads=2)
    high = bytearray(body)
    at = 2 + 2 * SEED_BYTES
    high[at : at + 8] = b"\xff" * 8  # the first packed coefficient: all ones, above the prime
    with pytest.raises(ValueError, match="above its prime"):
        expand_sum(CHAIN, bytes(high), SCALE, max_uploads=2)


class SeedAddingServer(CKKSServer):
    """Sends every download with one seed more than the sum has terms (an upload counted twice)."""

    def add_chunk(self, x, loaded, needed):
        for _, vecs in loaded.values():
            for v in vecs:
                v.seeds = v.seeds * 2
        return super().add_chunk(x, loaded, needed)


def test_a_download_with_more_seeds_than_contributors_is_refused():
    class Proto(CKKSProtocol):
        server_half = SeedAddingServer

    values = {k: np.full(6, 1.0 + k) for k in range(3)}
    with pytest.raises(IntegrityError, match="seeds does not fit"):
        Proto(3).weighted_sum("w", 0, values, spec=ValueSpec(max_abs=10, tolerance=1e-6))
