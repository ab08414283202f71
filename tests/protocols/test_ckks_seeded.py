"""Shared-key ckks downloads as ``sum c0`` plus the upload seeds (``protocols/ckks/seeded.py``).

The recipient's re-expanded sum is the server's SEAL sum bit for bit; malformed uploads and downloads are refused
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
from protocols.ckks.seeded import SEED_BYTES, download_bytes, expand_sum, load_seeded
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
