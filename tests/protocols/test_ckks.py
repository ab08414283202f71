"""CKKS backend: equality with the plain protocol, exact packing, key custody, refusals."""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np
import pytest
import tenseal as ts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols import (
    BoundError,
    ConfigurationError,
    IntegrityError,
    NonFiniteError,
    PackingOverflowError,
    PlainProtocol,
    ShapeError,
    ValueSpec,
    make_protocol,
)
from protocols.base import BlockTable, ExchangeContext
from protocols.ckks import ChainParams, CKKSProtocol, check_security, wire
from protocols.ckks import params as P
from protocols.ckks.keys import ServerContext
from protocols.ckks.packing import PackingLayout, field_width
from protocols.ckks.seeded import download_bytes, upload_bytes
from protocols.message import encode_body
from protocols.transcript import SERVER

FAST = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _f32_slack(x: np.ndarray, inputs_abs: np.ndarray | float = 0.0) -> float:
    """The plain protocol's own float32 rounding error.

    The plain protocol's own rounding: every input (summing to ``inputs_abs`` in absolute
    value) and the result ``x`` are float32 on the wire, each off by up to 2^-24 relative.
    """
    return float(np.max(np.abs(x) + inputs_abs, initial=0.0)) * 2.0**-23 + 1e-12


# ------------------------------------------------------------------ equality with plain
@FAST
@given(
    k=st.integers(2, 20),
    rows=st.integers(1, 6),
    cols=st.integers(1, 9),
    seed=st.integers(0, 10_000),
    weighted=st.booleans(),
)
def test_weighted_mean_and_sum_match_plain(k, rows, cols, seed, weighted):
    rng = np.random.default_rng(seed)
    vals = {c: rng.uniform(-5, 5, size=(rows, cols)) for c in range(k)}
    w = {c: float(rng.uniform(0.1, 3.0)) for c in range(k)} if weighted else None
    spec = ValueSpec(max_abs=20.0, tolerance=1e-6)
    ck, pl = make_protocol("ckks", k), PlainProtocol(k)
    mean = ck.weighted_mean("t/mean", 0, vals, w, spec=spec)
    bound = ck.last_stats["error_bound"]
    ws = sum((w or {c: 1.0 for c in vals}).values())
    # compare with the exact float64 mean (plain's float32 wire rounds each input, not the mean)
    ref = sum(vals[c] * (1.0 if w is None else w[c]) for c in vals) / ws
    # numerator and denominator (sum of w_k, the last entry of the same exchange) are each within
    # the sum's bound (which includes the release rounding): the mean within (1 + |mean|) bound / ws
    assert (np.abs(mean - ref) <= bound * (1 + np.abs(ref)) / ws + 1e-12).all()
    plain_mean = pl.weighted_mean("t/mean", 0, vals, w, spec=spec)
    assert np.abs(plain_mean - ref).max() <= 5.0 * 2**-23  # float32 rounding of inputs up to 5
    total = ck.weighted_sum("t/sum", 0, vals, w, spec=spec)
    exact = sum(vals[c] * (1.0 if w is None else w[c]) for c in vals)
    assert np.abs(total - exact).max() <= ck.last_stats["error_bound"]
    assert np.abs(total - pl.weighted_sum("t/sum", 0, vals, w, spec=spec)).max() <= ck.last_stats[
        "error_bound"
    ] + _f32_slack(exact, sum(np.abs(vals[c]) * (1.0 if w is None else w[c]) for c in vals))


@FAST
@given(k=st.integers(2, 8), classes=st.integers(1, 5), d=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_classwise_mean_matches_plain(k, classes, d, seed):
    rng = np.random.default_rng(seed)
    vals = {c: rng.normal(size=(classes, d)) for c in range(k)}
    wts = {c: rng.integers(0, 4, size=classes).astype(float) for c in range(k)}  # zeros = absent classes
    spec = ValueSpec(max_abs=100.0, tolerance=1e-6)
    ck, pl = make_protocol("ckks", k), PlainProtocol(k)
    m1, p1 = ck.classwise_mean("fedspray/proxies", 0, vals, wts, spec=spec)
    m2, p2 = pl.classwise_mean("fedspray/proxies", 0, vals, wts, spec=spec)
    assert np.array_equal(p1, p2)
    assert np.abs(m1 - m2).max(initial=0) <= 1e-5


@FAST
@given(k=st.integers(2, 6), d=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_central_moments_match_plain(k, d, seed):
    rng = np.random.default_rng(seed)
    samples = {c: rng.normal(size=(int(rng.integers(1, 6)), d)) for c in range(k)}
    spec = ValueSpec(max_abs=1e3, tolerance=1e-6)
    mu1, mom1 = make_protocol("ckks", k).central_moments("fedomd/stats", 0, samples, (2, 3), spec=spec)
    mu2, mom2 = PlainProtocol(k).central_moments("fedomd/stats", 0, samples, (2, 3), spec=spec)
    assert np.abs(mu1 - mu2).max() <= 1e-5
    for j in (2, 3):
        assert np.abs(mom1[j] - mom2[j]).max() <= 1e-5


def _row_inputs(rng, k, num_rows, dim, integer):
    contribs = {}
    for c in range(k):
        ids = np.sort(rng.choice(num_rows, size=int(rng.integers(1, num_rows + 1)), replace=False))
        rows = rng.integers(0, 3, size=(ids.size, dim)).astype(float) if integer else rng.normal(size=(ids.size, dim))
        contribs[c] = (ids, rows)
    requests = {
        c: np.sort(rng.choice(num_rows, size=int(rng.integers(0, num_rows + 1)), replace=False)) for c in range(k)
    }
    return contribs, requests


@FAST
@given(
    k=st.integers(2, 10),
    num_rows=st.integers(1, 40),
    dim=st.integers(1, 7),
    seed=st.integers(0, 10_000),
    layout=st.sampled_from(["sparse", "dense"]),
    integer=st.booleans(),
    packing=st.booleans(),
)
def test_row_sum_matches_plain(k, num_rows, dim, seed, layout, integer, packing):
    rng = np.random.default_rng(seed)
    contribs, requests = _row_inputs(rng, k, num_rows, dim, integer)
    spec = ValueSpec(integer=True, sum_max=2 * k, max_abs=2) if integer else ValueSpec(max_abs=10, tolerance=1e-6)
    ck = make_protocol("ckks", k, packing=packing)
    got = ck.row_sum("fedgcn/neighbour_sums", 0, contribs, requests, num_rows, layout=layout, spec=spec)
    ref = PlainProtocol(k).row_sum("fedgcn/neighbour_sums", 0, contribs, requests, num_rows, layout=layout, spec=spec)
    for c in requests:
        assert got[c].shape == (requests[c].size, dim)
        if integer:
            assert np.array_equal(got[c], ref[c])  # exact, packed or not
        else:
            assert np.abs(got[c] - ref[c]).max(initial=0) <= ck.last_stats["error_bound"] + _f32_slack(ref[c], 10.0 * k)
    if integer and packing:
        assert ck.last_stats["encoding"] == "packed" and ck.last_stats["fields_per_slot"] > 1


def test_scoped_return_downloads_only_requested_blocks():
    k, num_rows, dim = 3, 5000, 2  # 2 rows per packed... several blocks of rows
    rng = np.random.default_rng(0)
    contribs = {
        c: (np.arange(c, num_rows, 3), rng.integers(0, 2, size=(len(range(c, num_rows, 3)), dim)).astype(float))
        for c in range(k)
    }
    requests = {0: np.array([0, 1, 2]), 1: np.array([4999]), 2: np.array([], dtype=np.int64)}
    ck = make_protocol("ckks", k, packing=False)
    spec = ValueSpec(integer=True, sum_max=1, max_abs=1)
    got = ck.row_sum("fedgcn/neighbour_sums", 0, contribs, requests, num_rows, layout="sparse", spec=spec)
    full = np.zeros((num_rows, dim))
    for c, (ids, rows) in contribs.items():
        full[ids] += rows
    for c, r in requests.items():
        assert np.array_equal(got[c], full[r])
    downs = {m.receiver: m for m in ck.transcript.select(tag="fedgcn/neighbour_sums", sender=SERVER)}
    assert downs["client0"].shape[0] == 1 and downs["client1"].shape[0] == 1 and downs["client2"].shape[0] == 0
    assert downs["client2"].payload == [] and downs["client2"].nbytes < 512  # the signed envelope only
    assert len(downs["client0"].payload) == ck.last_stats["ciphertexts_per_block"]


def test_packed_exact_at_k100_at_the_field_limit():
    k, n = 100, 3000
    sum_max = 255
    spec = ValueSpec(integer=True, sum_max=sum_max, max_abs=3, owner_checked_sum=True)
    vals = {c: np.full(n, 3.0 if c < 85 else 0.0) for c in range(k)}  # sums hit 255 = 2^8 - 1
    ck = make_protocol("ckks", k)
    got = ck.weighted_sum("t", 0, vals, spec=spec)
    assert np.array_equal(got, np.full(n, 255.0))
    st_ = ck.last_stats
    assert st_["encoding"] == "packed" and st_["field_bits"] == 8 and st_["scale_bits"] <= 20
    assert st_["error_bound"] <= P.ROUNDING_TARGET


def test_packed_with_dp_noise_offsets_sparse_padding():
    """Packed with DP noise offsets sparse padding.

    Integer DP noise (negative values) through the offset path, with blocks uploaded by
    fewer than K clients (the server pads the missing offsets).
    """
    k, block_len, nb = 4, 64, 3
    rng = np.random.default_rng(5)
    spec = ValueSpec(integer=True, sum_max=8, max_abs=2)
    std = 3.0
    ck = CKKSProtocol(k)
    contribs = {}
    for c in range(k):
        ids = np.array([0, 2]) if c % 2 else np.array([0, 1, 2])
        clean = rng.integers(0, 3, size=(ids.size, block_len)).astype(float)
        noisy = clean + np.rint(rng.normal(0, std, size=clean.shape))
        contribs[c] = BlockTable(ids, noisy)
    ctx = ExchangeContext(
        "dp/test", 0, spec, contribs, {c: np.arange(nb) for c in range(k)}, nb, block_len, "sparse", dp_noise_std=std
    )
    out = ck._aggregate(ctx)
    exact = np.zeros((nb, block_len))
    for t in contribs.values():
        exact[t.ids] += t.values
    assert ck.last_stats["encoding"] == "packed"
    for r in out:
        for b in range(nb):
            assert np.array_equal(out[r][b], exact[b])


def test_streaming_chunks_give_the_same_result_and_one_message_per_client():
    k = 3
    rng = np.random.default_rng(1)
    vals = {c: rng.normal(size=20_000) for c in range(k)}
    small = make_protocol("ckks", k, chunk_bytes=1, params="n4096")  # one block per chunk
    got = small.weighted_sum("t", 0, vals, spec=ValueSpec(max_abs=10, tolerance=1e-6))
    assert small.last_stats["chunks"] > 1
    assert np.abs(got - sum(vals.values())).max() <= small.last_stats["error_bound"]
    ups = small.transcript.select(tag="t", receiver=SERVER)
    assert len(ups) == k and all(m.payload is None and "streamed" in m.note for m in ups)
    assert sum(m.nbytes for m in ups) == sum(small.last_stats["bytes_up"].values())


# ------------------------------------------------------------------ parameters and error model
def test_add_only_chains_and_reference():
    assert all(c.data_primes == 1 for c in P.ADD_ONLY_CHAINS)
    for c in (*P.ADD_ONLY_CHAINS, P.REFERENCE):
        check_security(c)
    ck = make_protocol("ckks", 3)
    plan = ck.plan(ValueSpec(max_abs=1.0, tolerance=1e-3), block_len=4096)
    assert plan.chain.data_primes == 1 and plan.chain != P.REFERENCE
    ref = make_protocol("ckks", 3, params="default")
    plan = ref.plan(ValueSpec(integer=True, sum_max=100, max_abs=100))
    assert plan.chain == P.REFERENCE and plan.scale_bits == 40 and plan.encoding == "float"
    vals = {c: np.arange(10.0) for c in range(3)}
    assert np.abs(ref.weighted_sum("t", 0, vals) - 3 * np.arange(10.0)).max() < 1e-6


def test_float_scale_from_public_bound_and_tolerance_refusal():
    ck = make_protocol("ckks", 10, params="n8192")
    p1 = ck.plan(ValueSpec(max_abs=1.0, tolerance=1e-3))
    p2 = ck.plan(ValueSpec(max_abs=1e6, tolerance=1e-3))
    assert p1.scale_bits > p2.scale_bits
    assert p2.sum_bound * 2.0**p2.scale_bits <= P.N8192.data_modulus() / 4
    with pytest.raises(BoundError, match="tolerance"):
        ck.plan(ValueSpec(max_abs=1e12, tolerance=1e-6))


@pytest.mark.parametrize("encryption", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("chain", [P.N8192, P.N4096, P.N8192_Q40])
def test_error_model_holds(encryption, chain):
    """The documented error model bounds the measured error (and is not absurdly loose)."""
    from protocols.ckks.keys import make_secret_context

    ctx = make_secret_context(chain, encryption)
    rng = np.random.default_rng(0)
    s = 20
    for k in (1, 10, 40):
        xs = [rng.uniform(-1, 1, chain.slots) for _ in range(k)]
        acc = None
        for x in xs:
            v = ts.ckks_vector(ctx, x.tolist(), 2.0**s)
            acc = v if acc is None else acc + v
        err = np.abs(np.array(acc.decrypt()) - sum(xs)).max()
        bound = P.noise_bound(chain, s, k, encryption)
        assert err <= bound, (k, err, bound)
        assert err >= bound / 256, (k, err, bound)


def test_security_check_refuses_insecure_parameters():
    with pytest.raises(ConfigurationError, match="128-bit"):
        check_security(ChainParams("bad", 4096, (60, 60)))
    with pytest.raises(ConfigurationError, match="128-bit"):
        make_protocol("ckks", 2, params=ChainParams("bad", 8192, (60, 60, 60, 60)))
    with pytest.raises(ConfigurationError):
        make_protocol("ckks", 2, params="nope")


def test_slot_capacity_matches_59_minus_scale():
    assert P.slot_capacity_bits(P.N8192, 20) == 39
    assert P.slot_capacity_bits(P.N8192, 18) == 41


# ------------------------------------------------------------------ packing codec
@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(1, 12),
    fields=st.integers(1, 4),
    k=st.integers(1, 30),
    n=st.integers(1, 50),
    offset=st.integers(0, 5),
    seed=st.integers(0, 10_000),
)
def test_packing_sum_is_exact_without_carry(width, fields, k, n, offset, seed):
    """Packing sum is exact without carry.

    Slot-wise sums of packed values unpack to the field-wise sums whenever the sum
    (plus offsets) fits the field: no carry into the neighbour field.
    """
    rng = np.random.default_rng(seed)
    if width * fields > 52 or k * offset > (1 << width) - 1:  # the plan's width always covers K*offset
        return
    lay = PackingLayout(width=width, fields=fields, slots=64, offset=offset, num_clients=k)
    n = min(n, lay.capacity)
    # shifted values t = v + offset >= 0 whose K-way sum fits the field: split random totals
    totals = rng.integers(0, 1 << width, size=n)
    cuts = np.sort(rng.integers(0, 1 << width, size=(k - 1, n)), axis=0) if k > 1 else np.zeros((0, n), int)
    edges = np.vstack([np.zeros(n, int), np.minimum(cuts, totals), totals])
    parts = np.diff(edges, axis=0) - offset  # client values, as low as -offset (DP noise)
    packed = sum(lay.pack(p) for p in parts)
    out, residual, ok = lay.unpack(packed, n)
    assert ok and residual == 0
    assert np.array_equal(out, parts.sum(axis=0))


def test_field_width_from_public_bound():
    assert field_width(169) == 8 and field_width(255) == 8 and field_width(256) == 9 and field_width(1) == 1


# ------------------------------------------------------------------ key custody and transcript
def test_server_context_is_public_and_cannot_decrypt():
    ck = make_protocol("ckks", 3)
    vals = {c: np.ones(5) for c in range(3)}
    ck.weighted_sum("t", 0, vals)
    server = ck.server_context()
    assert not server.is_private() and not server.has_secret_key()
    assert not server.has_galois_keys() and not server.has_relin_keys()
    up = ck.transcript.select(tag="t", receiver=SERVER)[0]
    from protocols.ckks.seeded import load_upload

    assert load_upload(ck._active, wire.unframe(up.payload[0]), ck._last_plan.scale).seeds  # it loads...
    with pytest.raises(ValueError, match="public"):
        server.secret_key()  # ...and cannot decrypt
    keymsgs = ck.transcript.select(tag="ckks/keys")
    pub = [m for m in keymsgs if m.receiver == SERVER]
    sec = [m for m in keymsgs if m.relay == SERVER]  # secret context: channel ciphertext, relayed
    assert len(pub) == 1 and pub[0].kind == "public_key"
    assert pub[0].nbytes == len(pub[0].auth) + 4 + len(encode_body(pub[0].payload))  # signed envelope
    assert ck.fingerprint == pub[0].fingerprint
    assert len(sec) == 2 and all(
        m.sender == "client0" and m.receiver.startswith("client") and m.kind == "ciphertext" and m.nbytes > 10_000
        for m in sec
    )
    # a secret context serialized for the server is refused
    from protocols.ckks.keys import MAGIC

    with pytest.raises(ConfigurationError):
        leaky = ck._keys.get(ck._active).context.serialize(save_secret_key=True)
        ServerContext(MAGIC + b"\0" * 16 + len(leaky).to_bytes(4, "big") + leaky, ck._active)


def test_server_receives_only_ciphertexts_and_public_key():
    k = 4
    rng = np.random.default_rng(0)
    ck = make_protocol("ckks", k)
    ck.weighted_mean("fedavg/model", 0, {c: rng.normal(size=30) for c in range(k)}, {c: 1.0 + c for c in range(k)})
    contribs, requests = _row_inputs(rng, k, 30, 3, True)
    for layout in ("sparse", "dense"):  # a client sums a (round, tag) once: a tag per layout
        ck.row_sum(
            f"fedgcn/sums-{layout}",
            0,
            contribs,
            requests,
            30,
            layout=layout,
            spec=ValueSpec(integer=True, sum_max=2 * k, max_abs=2),
        )
    inbound = [m for m in ck.transcript.messages if m.receiver == SERVER]
    assert inbound
    for m in inbound:
        assert m.kind in ("ciphertext", "public_key", "metadata")
        if m.kind == "ciphertext":
            assert isinstance(m.payload, list) and all(isinstance(f, bytes) for f in m.payload)
            assert m.nbytes == len(m.auth) + 4 + len(encode_body(m.payload))  # signed envelope + frames
        elif m.kind == "metadata":  # sparse layout: block ids only (the documented leak)
            assert set(m.payload) == {"block_ids"} and np.issubdtype(m.payload["block_ids"].dtype, np.integer)
    assert not any(isinstance(m.payload, np.ndarray) and m.payload.dtype.kind == "f" for m in inbound)


@pytest.mark.parametrize("params", ["n8192", "n4096-q40", "default"])
def test_message_sizes_depend_only_on_public_shapes(params):
    """Compression (zstd) makes serialized sizes vary; padding makes every message size data-independent."""
    sizes = []
    for seed in range(2):
        rng = np.random.default_rng(seed)
        ck = make_protocol("ckks", 3, params=params)
        ck.weighted_sum(
            "t",
            0,
            {c: rng.normal(size=3000) * 10.0**seed for c in range(3)},
            spec=ValueSpec(max_abs=50.0, tolerance=1e-2),
        )
        sizes.append([(m.sender, m.receiver, m.kind, m.nbytes) for m in ck.transcript.messages])
    assert sizes[0] == sizes[1]


def test_fingerprint_is_per_parameter_set():
    ck = make_protocol("ckks", 2)
    ck.weighted_sum("a", 0, {0: np.ones(3), 1: np.ones(3)}, spec=ValueSpec(max_abs=1, tolerance=1e-3))
    fa = ck.transcript.select(tag="a", receiver=SERVER)[0].fingerprint
    ck.weighted_sum("b", 0, {0: np.ones(3), 1: np.ones(3)}, spec=ValueSpec(max_abs=1e5, tolerance=1e-6))
    fb = ck.transcript.select(tag="b", receiver=SERVER)[0].fingerprint
    assert fa != fb and ck.fingerprint == fb
    assert len({m.fingerprint for m in ck.transcript.select(tag="ckks/keys") if m.receiver == SERVER}) == 2


# ------------------------------------------------------------------ refusals: nothing aggregated
def _nothing_delivered(proto, tag):
    """No result left the server (its exchange plans, kind 'control', carry nothing of a client)."""
    return not [m for m in proto.transcript.select(tag=tag, sender=SERVER) if m.kind != "control"]


def _run(proto, tag="x", k=3, n=6, spec=None, values=None):
    vals = values or {c: np.full(n, 1.0 + c) for c in range(k)}
    return proto.weighted_sum(tag, 0, vals, spec=spec or ValueSpec(max_abs=10, tolerance=1e-6))


def _tamper(proto, client, fn):
    def hook(msg):
        if msg.kind == "ciphertext" and msg.sender == f"client{client}" and msg.receiver == SERVER:  # uploads
            return fn(msg)
        return msg

    proto.intercept = hook


@pytest.mark.parametrize("field,value", [("fingerprint", "0" * 64), ("round", 7), ("tag", "other")])
def test_wrong_envelope_refused(field, value):
    ck = make_protocol("ckks", 3)
    _tamper(ck, 1, lambda m: replace(m, **{field: value}))
    with pytest.raises(IntegrityError, match="client 1"):
        _run(ck)
    assert _nothing_delivered(ck, "x")


@pytest.mark.parametrize("how", ["truncate", "flip", "empty"])
def test_corrupted_ciphertext_bytes_refused(how):
    ck = make_protocol("ckks", 3)

    def corrupt(m):
        f = bytearray(m.payload[0])
        if how == "truncate":
            f = f[: len(f) // 2]
        elif how == "flip":
            f[len(f) // 2] ^= 0x10
        else:
            f = b""
        return replace(m, payload=[bytes(f)] + m.payload[1:])

    _tamper(ck, 2, corrupt)
    with pytest.raises(IntegrityError, match="client 2"):
        _run(ck)
    assert _nothing_delivered(ck, "x")


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_a_flipped_ciphertext_bit_is_refused_by_the_signed_envelope(direction):
    """A flipped ciphertext bit is refused by the signed envelope.

    Frames carry no digest of their own (protocols/ckks/wire.py): the envelope's signed body
    digest covers every frame, uploads and downloads, and refuses one flipped bit before decoding.
    """
    ck = make_protocol("ckks", 3)

    def flip(m):
        upload = m.receiver == SERVER and m.sender == "client2"
        if m.kind == "ciphertext" and (upload if direction == "upload" else m.receiver == "client1"):
            f = bytearray(m.payload[0])
            f[len(f) // 3] ^= 0x01
            return replace(m, payload=[bytes(f)] + list(m.payload[1:]))
        return m

    ck.intercept = flip
    with pytest.raises(IntegrityError, match="digest its sender signed"):
        _run(ck)


def test_ciphertext_from_another_context_refused():
    ck, other = make_protocol("ckks", 3), make_protocol("ckks", 3, params="n8192")
    _run(other)
    foreign = other.transcript.select(tag="x", receiver=SERVER)[0]
    # (1) honest envelope of the other key pair: fingerprint mismatch
    _tamper(ck, 0, lambda m: replace(m, payload=foreign.payload, fingerprint=foreign.fingerprint))
    with pytest.raises(IntegrityError, match="fingerprint"):
        _run(ck)
    # (2) ciphertext of another parameter set under this exchange's fingerprint, signed by its
    # (malicious) sender so that it passes authentication: does not load
    ck2 = make_protocol("ckks", 3, params="n4096")
    _tamper(ck2, 0, lambda m: ck2._seal(replace(m, payload=foreign.payload), "upload"))
    with pytest.raises(IntegrityError, match="deserialize|parameters"):
        _run(ck2)
    assert _nothing_delivered(ck2, "x")


@pytest.mark.parametrize("encryption", ["symmetric", "asymmetric"])
def test_symmetric_uploads_and_downloads_are_half_ciphertexts(encryption):
    """Symmetric uploads and downloads are half ciphertexts.

    Symmetric encryption uploads SEAL's seeded form (the uniform polynomial as its PRNG seed) and the
    server sends back ``sum c0`` at the prime's width plus the seeds (:mod:`protocols.ckks.seeded`):
    each about half a full ciphertext; asymmetric uploads and downloads whole ciphertexts.
    """
    ck = make_protocol("ckks", 3, params="n4096", encryption=encryption)
    out = ck.weighted_sum(
        "t", 0, {k: np.full(5, k + 1.0) for k in range(3)}, spec=ValueSpec(max_abs=10, tolerance=1e-6)
    )
    np.testing.assert_allclose(out, 6.0, atol=1e-6)
    up, down = (
        [m for m in ck.transcript.select(tag="t", **who) if m.kind == "ciphertext"][0].payload[0]
        for who in ({"receiver": SERVER}, {"sender": SERVER})
    )
    full = ck._active.padded_ciphertext_bytes
    if encryption == "symmetric":
        assert len(up) == wire.HEADER_BYTES + upload_bytes(ck._active)  # the seed and c0 at the prime's width
        assert len(down) == wire.HEADER_BYTES + download_bytes(ck._active, 3)
        assert max(len(up), len(down)) < 0.51 * full
    else:
        assert len(up) == len(down) == full + wire.HEADER_BYTES


def test_wrong_scale_refused():
    """A SEAL ciphertext at another scale is refused (packed uploads carry no scale: theirs is the plan's)."""
    ck = make_protocol("ckks", 2, params="n8192", encryption="asymmetric")

    def rescaled(m):
        from protocols.ckks.fixed_point import client_codec

        key = ck._keys.get(ck._active)
        ct = client_codec(key.context, ck._active, "asymmetric").encrypt([1.0] * 6, 2.0**30)  # a valid size
        return ck._seal(
            replace(m, payload=[wire.frame(ct, ck._active.upload_ciphertext_bytes("asymmetric"))]), "upload"
        )  # signed by its sender: caught by the server's load check

    _tamper(ck, 1, rescaled)
    with pytest.raises(IntegrityError, match="parameters .*scale"):
        _run(ck, k=2)


@pytest.mark.parametrize("how", ["drop", "extra", "shape"])
def test_wrong_shape_refused(how):
    ck = make_protocol("ckks", 3, params="n8192")

    def reshaped(m):
        if how == "drop":
            return replace(m, payload=[])
        if how == "extra":
            return replace(m, payload=m.payload * 2)
        return replace(m, shape=(m.shape[0], m.shape[1] + 1))

    def reshape(m):  # signed by its (faulty) sender, so authentication passes: the shape check catches it
        return ck._seal(reshaped(m), "upload")

    _tamper(ck, 1, reshape)
    with pytest.raises(ShapeError, match="client 1"):
        _run(ck)
    assert _nothing_delivered(ck, "x")


def test_non_finite_and_out_of_range_refused_before_encryption():
    ck = make_protocol("ckks", 2)
    with pytest.raises(NonFiniteError):
        _run(ck, k=2, values={0: np.array([1.0, np.nan]), 1: np.ones(2)})
    with pytest.raises(NonFiniteError):
        _run(ck, k=2, values={0: np.array([1.0, np.inf]), 1: np.ones(2)})
    with pytest.raises(BoundError, match="client 1"):
        _run(ck, k=2, values={0: np.ones(2), 1: np.array([1.0, 11.0])})
    # no client encrypted or sent anything of the exchange (the chain's keys were set up first: the
    # plan the clients check against names them)
    assert not [m for m in ck.transcript.messages if m.receiver == SERVER and m.tag == "x"]


@pytest.mark.parametrize(
    "values,err",
    [
        ({0: np.array([1.0, 2.0]), 1: np.array([4.0, 0.0])}, PackingOverflowError),  # above max_abs/sum_max
        ({0: np.array([1.0, -1.0]), 1: np.array([0.0, 0.0])}, PackingOverflowError),  # negative
        ({0: np.array([1.0, 0.5]), 1: np.array([0.0, 0.0])}, BoundError),  # non-integer
    ],
)
def test_packing_bounds_refused_before_encryption(values, err):
    ck = make_protocol("ckks", 2)
    spec = ValueSpec(integer=True, sum_max=3, max_abs=3)
    with pytest.raises(err, match="exchange 'p'"):
        ck.weighted_sum("p", 0, values, spec=spec)
    assert not [m for m in ck.transcript.messages if m.receiver == SERVER and m.tag == "p"]  # nothing sent


# ------------------------------------------------------------------ benchmark smoke test
def test_protocol_bench_quick(tmp_path):
    from secure_fgl.bench.protocols import run_protocol_bench

    recs = run_protocol_bench(tmp_path, quick=True, clients=3, backends=("plain", "ckks-packed", "ckks-float"))
    assert (tmp_path / "bench.json").exists()
    names = {(r["workload"].split("_")[0], r["backend"]) for r in recs}
    assert ("cora", "ckks-packed") in names and ("cora", "plain") in names
    for r in recs:
        assert r["bytes_up_per_client"] > 0 and math.isfinite(r["max_abs_error"])
        if r["workload"].startswith("cora"):
            assert r["max_abs_error"] == 0


def test_sparse_rows_use_the_smaller_ring_at_equal_bytes_per_value():
    """Sparse rows use the smaller ring at equal bytes per value.

    Packed counts cost the same per value on N=4096 and N=8192; the sparse row_sum takes
    the half-size blocks (fewer untouched rows paid for), the dense one keeps N=8192.
    """
    ck = make_protocol("ckks", 10)
    spec = ValueSpec(integer=True, max_abs=255.0, sum_max=255)
    d = 1434
    assert ck.rows_per_block(spec, d, 2708, "dense") == ck.block_capacity(spec) // d
    sparse = ck.rows_per_block(spec, d, 2708, "sparse")
    assert sparse == ck.row_block_capacity(spec, "sparse") // d
    assert sparse < ck.rows_per_block(spec, d, 2708, "dense")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd (Linux)")
def test_seal_scratch_file_leaves_nothing_on_disk():
    """Seal scratch file leaves nothing on disk.

    sealapi serialises through a path: the scratch file is unlinked at once, so a killed run
    leaves no key or ciphertext bytes behind (only the open descriptor holds them), and the
    descriptor is closed when its thread ends (no unclosed-file ResourceWarning).
    """
    import gc
    import threading
    import warnings

    import tenseal.sealapi as sealapi

    from protocols.ckks import fixed_point as fp

    def serialise(out):
        ctx = fp.seal_context(8192, (60, 40, 60))
        key = sealapi.PublicKey()
        sealapi.KeyGenerator(ctx).create_public_key(key)
        path = fp._scratch_path()
        out.append((fp._to_bytes(key), path, os.readlink(path)))

    out = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        t = threading.Thread(target=serialise, args=(out,))  # a fresh thread: a fresh scratch file
        t.start()
        t.join()
        del t
        gc.collect()
    data, path, target = out[0]
    assert len(data) > 1000 and path.startswith("/proc/self/fd/")
    assert target.endswith("(deleted)")  # no name on disk points at the bytes
    assert not os.path.exists(target.removesuffix(" (deleted)"))
    # the thread's descriptor is closed with its storage, not left to the garbage collector's warning
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_float_sums_leave_the_client_rounded_to_the_tolerance_grid():
    """Float sums leave the client rounded to the tolerance grid.

    Decrypted float sums are rounded to a power-of-two grid within the tolerance before they are
    delivered, so the CKKS noise (which with the exact decryption leaks the key: Li-Micciancio) does
    not leave the client; the released error stays within the tolerance.
    """
    from protocols.ckks.params import release_step

    k, tol = 3, 1e-3
    spec = ValueSpec(max_abs=1.0, tolerance=tol)
    p = make_protocol("ckks", k, packing=False)
    rng = np.random.default_rng(0)
    vals = {c: rng.uniform(-1, 1, 2000) for c in range(k)}
    got = p.weighted_sum("rounded", 0, vals, spec=spec)
    step = release_step(p.plan(spec, 2000), spec)
    assert step is not None and tol / 4 < step <= 2 * tol
    assert np.array_equal(got, np.rint(got / step) * step)  # on the grid: no noise bits left
    exact = sum(vals.values())
    assert np.abs(got - exact).max() <= tol
    # the rounding removes the noise: the released sums are the exact sums' grid points (but for
    # the few within the noise of a half-step boundary)
    assert np.mean(got == np.rint(exact / step) * step) > 0.95
