"""Pairwise-mask secure aggregation: exactness, privacy of the server's view, dropouts, integrity.

Property tests (hypothesis) compare the masked result against (a) our own quantisation of
each input summed in the ring — bit-exact — and (b) PlainProtocol within the quantisation
bound, for every exchange shape.  Sizes and example counts are small: the file runs in well
under a minute.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols import (
    SERVER,
    BoundError,
    ConfigurationError,
    DropoutError,
    IntegrityError,
    NonFiniteError,
    PlainProtocol,
    ValueSpec,
    make_protocol,
)
from protocols.errors import DigestError
from protocols.mask import MaskProtocol
from protocols.mask.client import remove_output_masks
from protocols.mask.keys import ExchangeBinding, MaskKeyPair, output_mask_key, output_mask_keys
from protocols.mask.prg import keystream, ring_mask, stream_id
from protocols.mask.quantize import RING_BITS, STORAGE_DTYPES, FixedPoint, choose_encoding
from protocols.mask.shamir import PRIME, _is_probable_prime, combine, split_secret
from protocols.message import encode_body

#: examples per property test (as many as test_ckks.py's); raise MASK_EXAMPLES for a longer local soak
EXAMPLES = int(os.environ.get("MASK_EXAMPLES", 12))
FAST = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SERVER_KINDS = {
    "masked",
    "public_key",
    "metadata",
    "share",
    "ciphertext",  # ciphertext: relayed channel
    "control",
}  # control: plans the server sends


def _ring_sum_decoded(proto: MaskProtocol, flats: dict[int, np.ndarray]) -> np.ndarray:
    """Our own reference: quantise each input with the exchange's public encoding, sum mod 2^b."""
    enc = proto.last_encoding
    acc = np.zeros(next(iter(flats.values())).size, dtype=enc.dtype)
    for v in flats.values():
        acc += enc.encode(v)
    return enc.decode(acc)


def _inputs(seed, K, shape, scale=1.0):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-scale, scale, size=shape) for k in range(K)}, rng


# ---------------------------------------------------------------------- building blocks
def test_shamir_prime_and_threshold():
    assert PRIME > 2**256 and _is_probable_prime(PRIME)
    secret = bytes(range(32))
    shares = split_secret(secret, [1, 2, 3, 4, 5], threshold=3)
    for subset in ([1, 2, 3], [2, 4, 5], [5, 3, 1, 4]):
        assert combine([shares[x] for x in subset], 3) == secret
    with pytest.raises(ValueError):
        combine([shares[1], shares[2]], 3)
    # t-1 shares are consistent with any secret: two sharings of different secrets give unrelated points
    assert split_secret(secret, [1, 2], 2)[1].y != split_secret(secret, [1, 2], 2)[1].y


def test_prg_offsets_and_domain_separation():
    key, sid = bytes(32), stream_id("pairwise", b"run", 1, "t", 0)
    full = bytes(keystream(key, sid, 0, 5000))
    for off, n in [(0, 16), (3, 100), (17, 999)]:
        assert bytes(keystream(key, sid, off, n)) == full[off : off + n]
    dt = np.dtype("<u8")
    allb = ring_mask(key, sid, np.arange(8), 5, dt)
    assert np.array_equal(ring_mask(key, sid, np.array([1, 2, 6]), 5, dt), allb[[1, 2, 6]])
    # a different tag / round / exchange number / purpose never reuses the keystream
    others = [
        stream_id("pairwise", b"run", 1, "u", 0),
        stream_id("pairwise", b"run", 1, "t", 1),
        stream_id("pairwise", b"run", 2, "t", 0),
        stream_id("output", b"run", 1, "t", 0),
    ]
    for o in others:
        assert not np.array_equal(ring_mask(key, o, np.arange(8), 5, dt), allb)


@FAST
@given(
    ids=st.sets(st.integers(0, 300), min_size=1, max_size=60),
    L=st.integers(1, 9),
    gap=st.sampled_from([0, 16, 1 << 16]),
    span=st.sampled_from([8, 64, 1 << 24]),
)
def test_ring_mask_spans_read_each_block_at_its_own_offset(ids, L, gap, span):
    """Ring mask spans read each block at its own offset.

    However the ids are grouped into AES calls (gap and span limits), block ``b`` is the
    keystream bytes ``[b L w, (b + 1) L w)``.
    """
    import protocols.mask.prg as prg

    key, sid, dt = bytes(range(32)), stream_id("self", b"run", 3, "t", 1), np.dtype("<u4")
    ids = np.array(sorted(ids))
    old = prg.SPAN_GAP_BYTES, prg.SPAN_MAX_BYTES
    prg.SPAN_GAP_BYTES, prg.SPAN_MAX_BYTES = gap, span
    try:
        got = ring_mask(key, sid, ids, L, dt)
    finally:
        prg.SPAN_GAP_BYTES, prg.SPAN_MAX_BYTES = old
    full = np.frombuffer(bytes(keystream(key, sid, 0, (int(ids[-1]) + 1) * L * 4)), dt).reshape(-1, L)
    assert np.array_equal(got, full[ids])


@FAST
@given(ikm=st.binary(min_size=32, max_size=32), salt=st.binary(max_size=32), info=st.binary(max_size=200))
def test_hkdf_is_rfc5869(ikm, salt, info):
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    from protocols.mask.keys import _hkdf

    assert _hkdf(ikm, salt, info) == HKDF(algorithm=hashes.SHA256(), length=32, salt=salt or None, info=info).derive(
        ikm
    )


def test_pairwise_seed_symmetric_and_bound():
    a, b = MaskKeyPair.generate(), MaskKeyPair.generate()
    bind = ExchangeBinding(b"r" * 16, 1, "t", 0)
    assert a.pairwise_seed(0, 1, b.public_bytes, bind) == b.pairwise_seed(1, 0, a.public_bytes, bind)
    assert a.pairwise_seed(0, 1, b.public_bytes, bind) != a.pairwise_seed(
        0, 1, b.public_bytes, ExchangeBinding(b"r" * 16, 2, "t", 0)
    )
    rebuilt = MaskKeyPair.from_private_bytes(a.private_bytes())
    assert rebuilt.public_bytes == a.public_bytes
    assert output_mask_key(bytes(32), 0, bind) != output_mask_key(bytes(32), 1, bind)


def test_encoding_refuses_impossible_configs():
    with pytest.raises(BoundError):  # 20 x 100 does not fit int8 at any precision
        choose_encoding(max_abs=100, integer=False, tolerance=1e-3, num_contributors=20, ring_bits=8)
    with pytest.raises(BoundError):  # fits, but too coarse for the tolerance
        choose_encoding(max_abs=1e4, integer=False, tolerance=1e-6, num_contributors=20, ring_bits=32)
    with pytest.raises(BoundError):
        choose_encoding(max_abs=1.0, integer=False, tolerance=1e-3, num_contributors=2, frac_bits=62)
    enc = choose_encoding(max_abs=3.0, integer=False, tolerance=1e-9, num_contributors=20, dp_noise_std=0.5)
    assert enc.entry_bound == pytest.approx(8.0) and 20 * (8.0 * 2**enc.frac_bits + 1) < 2**63


# ---------------------------------------------------------------------- exactness, all shapes
@FAST
@given(
    K=st.integers(2, 20),
    shape=st.tuples(st.integers(1, 5), st.integers(1, 700)),
    seed=st.integers(0, 2**31),
    reveal=st.booleans(),
    ring_bits=st.sampled_from([32, 40, 48, 56, 64]),
)
def test_weighted_sum_equals_ring_sum_and_plain(K, shape, seed, reveal, ring_bits):
    vals, rng = _inputs(seed, K, shape, scale=3.0)
    weights = {k: float(rng.uniform(0, 2)) for k in range(K)}
    spec = ValueSpec(max_abs=6.0, tolerance=1e-5)
    proto = MaskProtocol(K, reveal_to_server=reveal, ring_bits=ring_bits, block_size=512)
    got = proto.weighted_sum("t/sum", 0, vals, weights, spec=spec)
    flats = {k: vals[k].ravel() * weights[k] for k in range(K)}
    assert np.array_equal(got.ravel(), _ring_sum_decoded(proto, flats))  # bit-exact
    exact = sum(flats.values())
    assert np.abs(got.ravel() - exact).max() <= proto.last_encoding.error_bound
    plain = PlainProtocol(K).weighted_sum("t/sum", 0, vals, weights, spec=spec)  # float32 wire
    np.testing.assert_allclose(got, plain, atol=1e-5 * K)


@FAST
@given(K=st.integers(2, 20), n=st.integers(1, 300), d=st.integers(1, 6), seed=st.integers(0, 2**31))
def test_weighted_mean_and_classwise_mean_match_plain(K, n, d, seed):
    vals, rng = _inputs(seed, K, (n, d))
    w = {k: float(rng.integers(1, 50)) for k in range(K)}
    spec = ValueSpec(max_abs=100.0, tolerance=1e-6)
    mask, plain = MaskProtocol(K), PlainProtocol(K)
    got = mask.weighted_mean("t/mean", 0, vals, w, spec=spec)
    flats = {k: np.concatenate([vals[k].ravel() * w[k], [w[k]]]) for k in range(K)}
    ref = _ring_sum_decoded(mask, flats)
    assert np.array_equal(got.ravel(), ref[:-1] / ref[-1])
    np.testing.assert_allclose(got, plain.weighted_mean("t/mean", 0, vals, w, spec=spec), atol=1e-5)
    # class-wise: some clients lack some classes (zero weight)
    C = min(n, 7)
    cls_vals = {k: vals[k][:C] for k in range(K)}
    cls_w = {k: rng.integers(0, 5, size=C).astype(float) for k in range(K)}
    m_mean, m_present = mask.classwise_mean("t/cls", 0, cls_vals, cls_w, spec=spec)
    p_mean, p_present = plain.classwise_mean("t/cls", 0, cls_vals, cls_w, spec=spec)
    assert np.array_equal(m_present, p_present)
    np.testing.assert_allclose(m_mean, p_mean, atol=1e-5)


@settings(max_examples=6, deadline=None)
@given(K=st.integers(2, 12), d=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_central_moments_match_plain(K, d, seed):
    rng = np.random.default_rng(seed)
    samples = {k: rng.normal(size=(int(rng.integers(1, 40)), d)) for k in range(K)}
    spec = ValueSpec(max_abs=1e4, tolerance=1e-6)
    mu, mom = MaskProtocol(K).central_moments("t/mom", 0, samples, spec=spec)
    pmu, pmom = PlainProtocol(K).central_moments("t/mom", 0, samples, spec=spec)
    np.testing.assert_allclose(mu, pmu, atol=1e-5)
    for j in pmom:
        np.testing.assert_allclose(mom[j], pmom[j], atol=1e-3, rtol=1e-5)


@FAST
@given(
    K=st.integers(2, 20),
    num_rows=st.integers(1, 400),
    d=st.integers(1, 5),
    seed=st.integers(0, 2**31),
    layout=st.sampled_from(["sparse", "dense"]),
    reveal=st.booleans(),
)
def test_row_sum_scoped_return(K, num_rows, d, seed, layout, reveal):
    rng = np.random.default_rng(seed)
    contrib, dense_total = {}, np.zeros((num_rows, d))
    for k in range(K):
        ids = rng.choice(num_rows, size=int(rng.integers(0, num_rows + 1)), replace=False)
        rows = rng.uniform(-1, 1, size=(ids.size, d))
        contrib[k] = (ids, rows)
        dense_total[ids] += rows
    requests = {k: rng.choice(num_rows, size=int(rng.integers(0, num_rows + 1)), replace=False) for k in range(K)}
    spec = ValueSpec(max_abs=1.0, tolerance=1e-6)
    proto = MaskProtocol(K, reveal_to_server=reveal, block_size=64)
    got = proto.row_sum("t/rows", 0, contrib, requests, num_rows, layout=layout, spec=spec)
    plain = PlainProtocol(K).row_sum("t/rows", 0, contrib, requests, num_rows, layout=layout, spec=spec)
    enc = proto.last_encoding
    for k, r in requests.items():
        assert got[k].shape == (r.size, d)  # exactly its rows, in its order
        assert np.abs(got[k] - dense_total[r]).max(initial=0) <= enc.error_bound
        np.testing.assert_allclose(got[k], plain[k], atol=1e-5)
    # each recipient downloaded only the blocks holding its rows
    rpb = max(1, 64 // d)
    for k, r in requests.items():
        (down,) = [
            m for m in proto.transcript.select(tag="t/rows", receiver=f"client{k}") if m.kind in ("masked", "plain")
        ]
        want = np.arange(-(-num_rows // rpb)) if layout == "dense" else np.unique(r // rpb)
        assert np.array_equal(down.payload["block_ids"], want)


@FAST
@given(ring_bits=st.sampled_from(RING_BITS), n=st.integers(0, 200), seed=st.integers(0, 2**31))
def test_byte_ring_wire_is_b_over_8_bytes_and_decodes_through_carries(ring_bits, n, seed):
    """Byte ring wire is b over 8 bytes and decodes through carries.

    Every ring costs exactly b/8 bytes a value, and a sum carried past bit b in the wider
    memory word (24, 40, 48, 56 bits) still decodes to the signed residue mod 2^b.
    """
    rng = np.random.default_rng(seed)
    enc = FixedPoint(ring_bits, 0, float(2 ** (ring_bits - 2)), True, 1)
    half = 2 ** (ring_bits - 2)
    x = (
        rng.integers(-half, half, size=n, dtype=np.int64).astype(np.float64)
        if ring_bits < 56
        else rng.integers(-(2**52), 2**52, size=n, dtype=np.int64).astype(np.float64)
    )
    wire = enc.to_wire(enc.encode(x))
    assert len(wire) == n * ring_bits // 8
    words = enc.from_wire(wire, (n,))
    assert words.dtype == np.dtype(STORAGE_DTYPES[ring_bits])
    spare = 8 * words.dtype.itemsize - ring_bits  # bits above the ring in a memory word
    carry = (
        rng.integers(0, 2**spare, size=n).astype(words.dtype) << words.dtype.type(ring_bits)
        if spare
        else np.zeros_like(words)
    )
    carried = words + carry  # same residue mod 2^b, other high bits
    assert np.array_equal(enc.decode(carried), x)
    with pytest.raises(ValueError):
        enc.from_wire(wire + b"\0", (n,))


@FAST
@given(
    K=st.integers(2, 20),
    num_rows=st.integers(1, 300),
    d=st.integers(1, 8),
    seed=st.integers(0, 2**31),
    ring_bits=st.sampled_from([16, 24, 32, 40, 64]),
)
def test_integer_exchange_is_exact(K, num_rows, d, seed, ring_bits):
    rng = np.random.default_rng(seed)
    contrib, total = {}, np.zeros((num_rows, d))
    for k in range(K):
        ids = rng.choice(num_rows, size=int(rng.integers(0, num_rows + 1)), replace=False)
        rows = rng.integers(0, 2, size=(ids.size, d)).astype(float)  # binary features
        contrib[k] = (ids, rows)
        total[ids] += rows
    spec = ValueSpec(max_abs=1, integer=True, sum_max=K, tolerance=0.0)
    proto = MaskProtocol(K, ring_bits=ring_bits)
    got = proto.row_sum("t/counts", 0, contrib, {k: np.arange(num_rows) for k in range(K)}, num_rows, spec=spec)
    assert proto.last_encoding.frac_bits == 0
    for k in range(K):
        assert np.array_equal(got[k], total)


def test_integer_exchange_rejects_fractions_and_overflowing_ring():
    proto = MaskProtocol(3, ring_bits=8)
    spec = ValueSpec(max_abs=1, integer=True, sum_max=3)
    with pytest.raises(BoundError, match="client 1"):
        proto.weighted_sum("t/c", 0, {0: [1.0], 1: [0.5], 2: [0.0]}, spec=spec)
    with pytest.raises(BoundError):  # 3 x 100 > 127: the int8 ring could wrap
        proto.weighted_sum("t/c", 0, {k: [1.0] for k in range(3)}, spec=ValueSpec(max_abs=100, integer=True))


def test_dp_headroom_accepts_noisy_values_beyond_max_abs():
    from protocols.base import BlockTable, ExchangeContext

    proto = MaskProtocol(2)
    vals = {0: np.array([[1.4, -0.3]]), 1: np.array([[-1.2, 0.9]])}  # beyond max_abs=1 by < 10 sigma
    ctx = ExchangeContext(
        "t/dp",
        0,
        ValueSpec(max_abs=1.0, tolerance=1e-6),
        {k: BlockTable(np.arange(1), v) for k, v in vals.items()},
        {0: np.arange(1)},
        1,
        2,
        dp_noise_std=0.1,
    )
    out = proto._aggregate(ctx)
    np.testing.assert_allclose(out[0][0], vals[0][0] + vals[1][0], rtol=0, atol=proto.last_encoding.error_bound)


def test_integer_exchange_with_dp_noise_stays_exact():
    from protocols.base import BlockTable, ExchangeContext

    proto = MaskProtocol(3)
    vals = {0: np.array([[3.0, -4.0]]), 1: np.array([[-2.0, 0.0]]), 2: np.array([[1.0, 7.0]])}  # noisy counts
    ctx = ExchangeContext(
        "t/dpi",
        0,
        ValueSpec(max_abs=1, integer=True),
        {k: BlockTable(np.arange(1), v) for k, v in vals.items()},
        {0: np.arange(1)},
        1,
        2,
        dp_noise_std=1.0,
    )
    out = proto._aggregate(ctx)
    assert proto.last_encoding.frac_bits == 0
    assert np.array_equal(out[0][0], [2.0, 3.0])


def test_dropout_refused_under_distributed_dp():
    from protocols import DPRequest
    from protocols.dp import DPConfig

    K = 4
    proto = MaskProtocol(K, dp=DPConfig(epsilon=5.0, placement="distributed"))
    proto.drop_clients({2}, stage="upload")
    with pytest.raises(DropoutError, match=r"client\(s\) 2 .*short of DP noise"):
        proto.weighted_sum(
            "t/dp", 0, {k: np.zeros(20) for k in range(K)}, spec=ValueSpec(max_abs=1.0), dp=DPRequest(clip=1.0)
        )


# ---------------------------------------------------------------------- the server's view
def test_server_view_holds_no_plaintext_and_no_secret():
    K, rng = 6, np.random.default_rng(1)
    proto = make_protocol("mask", K)
    proto.weighted_mean("fedavg/model", 0, {k: rng.normal(size=300) for k in range(K)}, {k: 1.0 + k for k in range(K)})
    contrib = {k: (rng.choice(500, 50, replace=False), rng.normal(size=(50, 3))) for k in range(K)}
    proto.row_sum("fedgcn/sums", 0, contrib, {k: rng.choice(500, 20, replace=False) for k in range(K)}, 500)
    proto.drop_clients({2}, stage="upload")
    proto.weighted_sum("fedavg/model", 1, {k: rng.normal(size=300) for k in range(K)})
    view = proto.transcript.view("server")
    assert view and {m.kind for m in view} <= SERVER_KINDS
    assert "share" in {m.kind for m in view}  # the recovery round happened
    for m in view:
        payloads = m.payload.values() if isinstance(m.payload, dict) else [m.payload]
        for p in payloads:
            assert not (isinstance(p, np.ndarray) and p.dtype.kind == "f"), (m.kind, m.sender)
    # client-only material reaches the server only as channel ciphertexts it relays
    assert all(m.kind not in ("secret_key",) for m in view)
    assert any(
        m.kind == "ciphertext" and m.relay == "server" and "group seed" in m.note and m.sender == "client0"
        for m in view
    )
    # every recorded message has its real wire size: signature + envelope header + canonical body
    up = [m for m in proto.transcript.select(tag="fedgcn/sums") if m.kind == "masked" and m.receiver == "server"]
    for m in up:
        assert m.nbytes == len(m.auth) + 4 + len(encode_body(m.payload))
        assert m.nbytes - (len(m.payload["data"]) + 4 * len(m.payload["block_ids"])) < 600


def _words(enc, data: bytes) -> np.ndarray:
    """Ring elements of a payload's wire bytes, in memory words."""
    return enc.from_wire(data, (len(data) // enc.bytes_per_value,))


def _upload_of(proto, client, tag):
    (m,) = [m for m in proto.transcript.select(tag=tag, sender=f"client{client}") if m.kind == "masked"]
    return _words(proto.last_encoding, m.payload["data"])


def _looks_uniform(words: np.ndarray, enc) -> None:
    """Ring elements (reduced mod 2^b, as on the wire) whose bytes and bits look uniform."""
    b = np.frombuffer(enc.to_wire(words), dtype=np.uint8)
    counts = np.bincount(b, minlength=256)
    chi2 = ((counts - b.size / 256) ** 2 / (b.size / 256)).sum()
    assert chi2 < 400, chi2  # 255 dof: mean 255, sd 22.6
    bits = np.unpackbits(b).mean()
    assert abs(bits - 0.5) < 0.01


@pytest.mark.parametrize("K,reveal", [(2, False), (3, False), (3, True)])
def test_single_upload_is_indistinguishable_from_uniform(K, reveal):
    n = 20000
    proto = MaskProtocol(K, reveal_to_server=reveal)
    zeros = {k: np.zeros(n) for k in range(K)}  # the most structured input there is
    proto.weighted_sum("t/u", 0, zeros)
    for k in range(K):
        y = _upload_of(proto, k, "t/u")
        _looks_uniform(y, proto.last_encoding)
        assert np.mean(y == 0) < 1e-3  # q(0) = 0: the mask covers every word (padding too)
    # the same input again (in another exchange) never gives the same upload: no keystream reuse
    proto.weighted_sum("t/u-again", 0, zeros)
    ups = [
        m
        for tag in ("t/u", "t/u-again")
        for m in proto.transcript.select(tag=tag, sender="client0")
        if m.kind == "masked"
    ]
    assert ups[0].payload["data"] != ups[1].payload["data"]


def test_server_sum_is_masked_by_default_and_revealed_on_request():
    K, n = 4, 5000
    vals = {k: np.full(n, 0.5) for k in range(K)}
    for reveal in (False, True):
        proto = MaskProtocol(K, reveal_to_server=reveal)
        proto.weighted_sum("t/s", 0, vals, spec=ValueSpec(max_abs=1.0))
        enc = proto.last_encoding
        ring_sum = sum(_upload_of(proto, k, "t/s") for k in range(K))  # unsigned: wraps mod 2^b
        decoded = enc.decode(ring_sum)[:n]
        down = [
            m
            for m in proto.transcript.select(tag="t/s")
            if m.sender == "server" and m.kind not in ("public_key", "metadata", "control")
        ]
        assert len(down) == K
        if reveal:  # standard Bonawitz: the server's sum (after self-mask removal) is the aggregate
            assert all(m.kind == "plain" for m in down)
            np.testing.assert_allclose(enc.decode(_words(enc, down[0].payload["data"]))[:n], 2.0)
        else:  # the server's sum still carries the clients' output masks
            assert all(m.kind == "masked" for m in down)
            assert np.abs(decoded - 2.0).mean() > 1.0
            _looks_uniform(ring_sum, enc)


@FAST
@given(K=st.integers(2, 9), n_blocks=st.integers(1, 6), data=st.data())
def test_telescoped_output_masks_cancel_for_any_included_set(K, n_blocks, data):
    """sum_{k in S_b} (P_k - P_{k+1}) is what a recipient removes, for every block's set S_b."""
    members = np.array(
        data.draw(st.lists(st.lists(st.booleans(), min_size=K, max_size=K), min_size=n_blocks, max_size=n_blocks)),
        dtype=bool,
    )
    G, bind, sid, L = os.urandom(32), ExchangeBinding(b"r" * 16, 3, "t/o", 1), b"\x07" * 8, 5
    bids = np.arange(n_blocks) * 2
    rows = np.zeros((n_blocks, L), np.uint64)
    for b in range(n_blocks):
        for k in np.flatnonzero(members[b]):
            for sign, key in zip((1, -1), output_mask_keys(G, int(k), K, bind)):
                m = ring_mask(key, sid, bids[b : b + 1], L, np.uint64)[0]
                rows[b] = rows[b] + m if sign > 0 else rows[b] - m
    masked = rows.copy()
    remove_output_masks(rows, members, G, K, bind, sid, bids, L)
    assert not rows.any()
    # a block with any contributor stays masked to whoever lacks G (the smallest member's P_m survives)
    assert np.all(masked[members.any(axis=1)] != 0)


def test_server_sum_stays_masked_when_clients_drop():
    """Server sum stays masked when clients drop.

    With dropouts the included set has gaps ({0, 1, 3, 4}, {1, 2, 3, 4}): the server's sum
    still looks uniform, and every recipient gets the exact survivors' sum.
    """
    K, n = 5, 6000
    vals = {k: np.full(n, 0.25) for k in range(K)}
    for dropped in ([2], [0], [4]):
        proto = MaskProtocol(K)
        proto.drop_clients(dropped, "upload")
        out = proto.weighted_sum("t/d", 0, vals, spec=ValueSpec(max_abs=1.0))
        enc = proto.last_encoding
        assert proto.last_included == tuple(k for k in range(K) if k not in dropped)
        np.testing.assert_allclose(out, 0.25 * (K - 1), atol=1e-3)
        down = [m for m in proto.transcript.select(tag="t/d") if m.sender == "server" and m.kind == "masked"]
        server_view = _words(enc, down[0].payload["data"])[:n]
        assert np.abs(enc.decode(server_view) - 0.25 * (K - 1)).mean() > 1.0
        _looks_uniform(server_view, enc)


# ---------------------------------------------------------------------- dropouts
@FAST
@given(
    K=st.integers(3, 10),
    seed=st.integers(0, 2**31),
    reveal=st.booleans(),
    layout=st.sampled_from(["sparse", "dense"]),
    data=st.data(),
)
def test_dropout_recovery_gives_survivors_exact_sum(K, seed, reveal, layout, data):
    t = K // 2 + 1
    dropped = data.draw(st.sets(st.integers(0, K - 1), min_size=1, max_size=K - t))
    rng = np.random.default_rng(seed)
    num_rows, d = 200, 3
    contrib = {k: (rng.choice(num_rows, 80, replace=False), rng.uniform(-1, 1, (80, 3))) for k in range(K)}
    proto = MaskProtocol(K, reveal_to_server=reveal, block_size=32)
    proto.drop_clients(dropped, stage="upload")
    req = {k: np.arange(num_rows) for k in range(K)}
    spec = ValueSpec(max_abs=1.0)
    got = proto.row_sum("t/drop", 0, contrib, req, num_rows, layout=layout, spec=spec)
    survivors = tuple(k for k in range(K) if k not in dropped)
    assert proto.last_included == survivors and set(proto.last_dropped) == dropped
    enc = proto.last_encoding  # chosen for the K counted-in contributors
    ring = np.zeros((num_rows, d), dtype=enc.dtype)
    total = np.zeros((num_rows, d))
    for s in survivors:
        dense = np.zeros((num_rows, d))
        dense[contrib[s][0]] = contrib[s][1]
        ring += enc.encode(dense)
        total += dense
    for k in range(K):
        assert np.array_equal(got[k], enc.decode(ring))  # the survivors' exact ring sum
        assert np.abs(got[k] - total).max() <= enc.error_bound
    assert any(m.kind == "share" and m.receiver == "server" for m in proto.transcript.messages)


def test_dropout_exact_ring_sum_dense():
    K, n = 5, 1000
    vals, _ = _inputs(7, K, (n,))
    proto = MaskProtocol(K)
    proto.drop_clients({1, 3}, stage="upload")
    got = proto.weighted_sum("t/d", 0, vals)
    assert proto.last_included == (0, 2, 4)
    assert np.array_equal(got, _ring_sum_decoded(proto, {k: vals[k] for k in (0, 2, 4)}))


def test_unmask_stage_dropout_in_reveal_mode_keeps_its_input():
    K, n = 5, 300
    vals, _ = _inputs(3, K, (n,))
    proto = MaskProtocol(K, reveal_to_server=True)
    proto.drop_clients({4}, stage="unmask")  # uploaded, but does not answer the unmasking round
    got = proto.weighted_sum("t/d", 0, vals)
    assert proto.last_included == tuple(range(K))
    assert np.array_equal(got, _ring_sum_decoded(proto, vals))


def test_keys_stage_dropout_is_a_clean_exclusion():
    K, n = 4, 100
    vals, _ = _inputs(5, K, (n,))
    proto = MaskProtocol(K, dropout_recovery=False)
    proto.drop_clients({0}, stage="keys")
    got = proto.weighted_sum("t/d", 0, vals)
    assert proto.last_included == (1, 2, 3)
    assert np.abs(got - (vals[1] + vals[2] + vals[3])).max() <= proto.last_encoding.error_bound


def test_dropout_aborts_when_recovery_disabled_or_too_few_survive():
    K = 5
    vals, _ = _inputs(9, K, (50,))
    proto = MaskProtocol(K, dropout_recovery=False)
    proto.drop_clients({3}, stage="upload")
    with pytest.raises(DropoutError, match=r"client\(s\) 3 ") as e:
        proto.weighted_sum("t/a", 0, vals)
    assert e.value.clients == (3,)
    assert not [m for m in proto.transcript.messages if m.sender == "server" and m.kind == "masked"]
    proto = MaskProtocol(K)  # t = 3: dropping 3 of 5 leaves 2 < t
    proto.drop_clients({0, 2, 4}, stage="upload")
    with pytest.raises(DropoutError, match="0, 2, 4"):
        proto.weighted_sum("t/a", 0, vals)
    proto = MaskProtocol(K, threshold=5)  # anyone missing in the unmasking round is too many
    proto.drop_clients({1}, stage="upload")
    with pytest.raises(DropoutError, match="client"):
        proto.weighted_sum("t/a", 0, vals)
    proto = MaskProtocol(2)  # 2 clients: a dropout would expose the survivor
    proto.drop_clients({1})
    with pytest.raises(DropoutError):
        proto.weighted_sum("t/a", 0, {0: [0.1], 1: [0.2]})
    # the next exchange is unaffected
    np.testing.assert_allclose(proto.weighted_sum("t/a", 1, {0: [0.1], 1: [0.2]}), [0.3], atol=1e-4)
    with pytest.raises(ConfigurationError):
        MaskProtocol(3, threshold=1)
    with pytest.raises(ConfigurationError):
        proto.drop_clients({0}, stage="later")


# ---------------------------------------------------------------------- integrity
def _tamper(edit):
    def hook(msg):
        return edit(msg) if (msg.kind == "masked" and msg.sender == "client1") else msg

    return hook


def _bad_dtype(m):
    return dataclasses.replace(
        m, payload={**m.payload, "data": np.frombuffer(m.payload["data"], np.uint8).astype(np.float32)}
    )


TAMPERS = {
    "round": (lambda m: dataclasses.replace(m, round=m.round + 1), IntegrityError),
    "tag": (lambda m: dataclasses.replace(m, tag="other/tag"), IntegrityError),
    "fingerprint": (lambda m: dataclasses.replace(m, fingerprint="0" * 16), IntegrityError),
    "protocol": (lambda m: dataclasses.replace(m, protocol="plain"), IntegrityError),
    "sender": (lambda m: dataclasses.replace(m, sender="client2"), IntegrityError),
    "truncated": (
        lambda m: dataclasses.replace(m, payload={**m.payload, "data": m.payload["data"][:-5]}),
        IntegrityError,
    ),
    # caught by the signed envelope (shape) and the body digest (dtype) before any parsing
    "shape": (lambda m: dataclasses.replace(m, shape=(m.shape[0], m.shape[1] + 1)), IntegrityError),
    "dtype": (_bad_dtype, IntegrityError),
    "block_ids": (
        lambda m: dataclasses.replace(m, payload={**m.payload, "block_ids": m.payload["block_ids"] + 1}),
        IntegrityError,
    ),
}


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_tampered_upload_is_rejected_naming_client_and_exchange(name):
    edit, err = TAMPERS[name]
    proto = MaskProtocol(3)
    proto.intercept = _tamper(edit)
    with pytest.raises(err, match=r"exchange 'x/t', round 4, client 1"):
        proto.weighted_sum("x/t", 4, {k: np.ones(10) * k / 10 for k in range(3)}, spec=ValueSpec(max_abs=1.0))
    assert not [m for m in proto.transcript.messages if m.sender == "server" and m.kind == "masked"]


def test_tampered_setup_messages_are_rejected():
    proto = MaskProtocol(3)
    proto.intercept = lambda m: (
        dataclasses.replace(m, payload=m.payload[:31]) if m.kind == "public_key" and m.sender == "client2" else m
    )
    with pytest.raises(IntegrityError, match="client 2"):
        proto.weighted_sum("x/t", 0, {k: np.zeros(4) for k in range(3)})
    proto = MaskProtocol(3)
    proto.intercept = lambda m: dataclasses.replace(m, round=9) if m.kind == "metadata" else m
    with pytest.raises(IntegrityError, match="round"):
        proto.row_sum("x/r", 0, {k: (np.array([k]), np.ones((1, 2))) for k in range(3)}, {0: np.array([0])}, 10)
    # a recovery share corrupted in transit is caught by the body digest, never used silently
    proto = MaskProtocol(4)
    proto.drop_clients({0})

    def corrupt(m):
        if m.kind == "share" and m.receiver == "server":
            seeds = {d: raw[:-1] + bytes([raw[-1] ^ 1]) for d, raw in m.payload["pairwise"].items()}
            return dataclasses.replace(m, payload={**m.payload, "pairwise": seeds})
        return m

    proto.intercept = corrupt
    with pytest.raises(DigestError, match="client 1"):
        proto.weighted_sum("x/t", 0, {k: np.zeros(4) for k in range(4)})


def test_out_of_range_and_nan_rejected_before_anything_is_sent():
    proto = MaskProtocol(3)
    vals = {0: np.zeros(5), 1: np.array([0, 0, 2.5, 0, 0]), 2: np.zeros(5)}
    with pytest.raises(BoundError, match="client 1"):
        proto.weighted_sum("x/b", 0, vals, spec=ValueSpec(max_abs=2.0))
    # the clients got the exchange's plan (and the once-per-run keys), but none of them sent anything
    assert not [m for m in proto.transcript.messages if m.receiver == SERVER and m.tag == "x/b"]
    vals[1] = np.array([0, np.nan, 0, 0, 0])
    with pytest.raises(NonFiniteError, match="client 1"):
        proto.weighted_sum("x/b", 1, vals)
    from protocols.base import BlockTable, ExchangeContext  # defence in depth: NaN reaching the backend

    ctx = ExchangeContext(
        "x/b",
        2,
        ValueSpec(),
        {0: BlockTable(np.arange(1), np.array([[np.nan, 1.0]])), 1: BlockTable(np.arange(1), np.array([[0.0, 1.0]]))},
        {0: np.arange(1)},
        1,
        2,
    )
    with pytest.raises(NonFiniteError, match="client 0"):
        proto._aggregate(ctx)
    assert not [m for m in proto.transcript.messages if m.receiver == SERVER and m.tag == "x/b"]


def test_auto_ring_picks_the_smallest_sufficient_ring():
    K = 10
    counts = {k: np.random.default_rng(k).integers(0, 2, 3000).astype(float) for k in range(K)}
    proto = MaskProtocol(K)
    got = proto.weighted_sum("t/ring", 0, counts, spec=ValueSpec(max_abs=1, integer=True))
    assert proto.last_encoding.ring_bits == 8 and np.array_equal(got, sum(counts.values()))
    up = [m for m in proto.transcript.select(tag="t/ring") if m.kind == "masked" and m.receiver == "server"]
    assert up[0].nbytes - len(up[0].auth) - 4 - 3000 < 100  # one byte per count + envelope
    floats = {k: np.random.default_rng(k).uniform(-1, 1, 3000) for k in range(K)}
    got = proto.weighted_sum("t/ring", 1, floats, spec=ValueSpec(max_abs=1.0, tolerance=1e-4))
    assert proto.last_encoding.ring_bits == 24  # 3 bytes a value: under float32
    assert np.abs(got - sum(floats.values())).max() <= proto.last_encoding.error_bound <= 1e-4
    up = [m for m in proto.transcript.select(tag="t/ring", round=1) if m.kind == "masked" and m.receiver == "server"]
    assert up[0].nbytes - len(up[0].auth) < 3 * 3000 + 100
    proto.weighted_sum("t/ring", 2, floats, spec=ValueSpec(max_abs=1.0, tolerance=1e-9))
    assert proto.last_encoding.ring_bits == 40  # byte rings between 32 and 64 bits
    proto.weighted_sum("t/ring", 3, floats, spec=ValueSpec(max_abs=1.0, tolerance=1e-12))
    assert proto.last_encoding.ring_bits == 48
    proto.weighted_sum("t/ring", 4, floats, spec=ValueSpec(max_abs=1.0, tolerance=3e-15))
    assert proto.last_encoding.ring_bits == 64
    assert set(proto.last_stats["client_upload_s"]) == set(range(K))


def test_make_protocol_and_fingerprint():
    p = make_protocol("mask", 4, ring_bits=32, seed=3)
    assert isinstance(p, MaskProtocol) and p.mode == "mask" and p.upload_kind == "masked"
    assert p.fingerprint != make_protocol("mask", 4).fingerprint
    assert p.block_capacity(ValueSpec()) == 4096


@settings(max_examples=EXAMPLES // 2 + 1, deadline=None)
@given(seed=st.integers(0, 2**31), batch=st.sampled_from([1, 2, 64]), data=st.data())
def test_runs_of_exchanges_with_changing_contributors_and_dropouts_stay_exact(seed, batch, data):
    """Runs of exchanges with changing contributors and dropouts stay exact.

    One protocol object across exchanges whose contributor sets change and whose clients drop:
    self-mask batches (per contributor set), run-long keys and the participant lists keep every
    sum the exact ring sum of the included clients.
    """
    K = 6
    proto = MaskProtocol(K, self_mask_batch=batch)
    for rnd in range(6):
        contributors = sorted(data.draw(st.sets(st.integers(0, K - 1), min_size=3, max_size=K)))
        t = len(contributors) // 2 + 1
        dropped = data.draw(st.sets(st.sampled_from(contributors), max_size=len(contributors) - t))
        stage = data.draw(st.sampled_from(["upload", "keys"]))
        vals, rng = _inputs(seed + rnd, K, (40,))
        vals = {k: vals[k] for k in contributors}
        proto.drop_clients(dropped, stage=stage)
        survivors = {k: v for k, v in vals.items() if k not in dropped}
        if data.draw(st.booleans()):  # dense layout
            got = proto.weighted_sum("t/run", rnd, vals, spec=ValueSpec(max_abs=1.0), recipients=contributors)
            assert np.array_equal(got, _ring_sum_decoded(proto, survivors))
        else:  # sparse layout: each client touches some of 60 rows
            rows = {k: np.sort(rng.choice(60, 25, replace=False)) for k in contributors}
            contrib = {k: (rows[k], rng.uniform(-1, 1, (25, 2))) for k in contributors}
            got = proto.row_sum(
                "t/rows",
                rnd,
                contrib,
                {k: np.arange(60) for k in contributors},
                60,
                layout="sparse",
                spec=ValueSpec(max_abs=1.0),
            )
            enc, ring = proto.last_encoding, np.zeros((60, 2), dtype=proto.last_encoding.dtype)
            for k in survivors:
                dense = np.zeros((60, 2))
                dense[contrib[k][0]] = contrib[k][1]
                ring += enc.encode(dense)
            assert all(np.array_equal(got[k], enc.decode(ring)) for k in contributors)
        assert proto.last_included == tuple(sorted(survivors))
