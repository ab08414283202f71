"""ckks-mp: ring arithmetic, collective decryption, exact packing, coalition attacks, refusals."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import ks_2samp
from support.runs import reachable_objects

from protocols import MODES, BoundError, ConfigurationError, DropoutError, IntegrityError, ValueSpec, make_protocol
from protocols.ckks_mp import MPParams, check_security, encoding, encryption
from protocols.ckks_mp import backend as mp_backend
from protocols.ckks_mp import client as mp_client
from protocols.ckks_mp.params import plan_exchange, ring_of, smudging_bits
from protocols.ckks_mp.ring import RNSRing, ntt_primes
from protocols.errors import DigestError
from protocols.message import Envelope
from protocols.transcript import SERVER, client_party

FAST = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
_PROTOCOLS: dict[int, object] = {}
#: a fresh round for every exchange on a reused protocol: a client contributes to a (round, tag) once
ROUNDS = itertools.count()


def proto(k: int):
    """One protocol (one collective key set-up) per K, reused across examples and tests."""
    if k not in _PROTOCOLS:
        _PROTOCOLS[k] = make_protocol("ckks-mp", k)
    p = _PROTOCOLS[k]
    p.intercept = None
    return p


def fresh(k: int, **options):
    return make_protocol("ckks-mp", k, **options)


def secret(p, k: int):
    """Client k's collective-key share s_i (NTT form) — the attacker's loot in coalition tests."""
    return p._clients[k]._share


def corr(x, y) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return float(np.corrcoef(x, y)[0, 1])


def centred_coeffs(p, residues) -> np.ndarray:
    """Centred coefficients of a decryption, as floats (the attacker's view of ``Delta m + e``)."""
    return np.array([float(c) for c in encoding.crt_centered(p.ring, residues)])


# ------------------------------------------------------------------ ring and parameters
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), n_log=st.integers(1, 5))
def test_ntt_product_is_negacyclic_convolution(seed, n_log):
    n = 2**n_log
    ring = RNSRing(n, ntt_primes(n, 3))
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-(10**6), 10**6, n), rng.integers(-50, 50, n)
    ref = np.zeros(n, dtype=object)
    for i in range(n):
        for j in range(n):
            sign = 1 if i + j < n else -1
            ref[(i + j) % n] += sign * int(a[i]) * int(b[j])
    got = ring.intt(ring.mul(ring.ntt(ring.from_signed(a, 3)), ring.ntt(ring.from_signed(b, 3))))
    assert np.array_equal(got, ring.from_signed(ref.astype(np.int64), 3))
    assert np.array_equal(ring.intt(ring.ntt(ring.from_signed(a, 3))), ring.from_signed(a, 3))


@pytest.mark.parametrize("n", [256, 1024])
def test_ntt_of_a_ring_wider_than_its_transposed_view_is_negacyclic_convolution(n):
    """Rings past the transposed view's 64 columns run stages in both layouts; the product stays exact."""
    ring = RNSRing(n, ntt_primes(n, 4))
    rng = np.random.default_rng(n)
    a, b = rng.integers(-(10**6), 10**6, n), rng.integers(-50, 50, n)
    full = np.convolve(a, b)  # |entries| < n 5e7: exact in int64
    ref = full[:n].copy()
    ref[: n - 1] -= full[n:]
    got = ring.intt(ring.mul(ring.ntt(ring.from_signed(a, 4)), ring.ntt(ring.from_signed(b, 4))))
    assert np.array_equal(got, ring.from_signed(ref, 4))
    top = np.stack([np.full(n, q - 1) for q in ring.primes])  # the largest residues: the lazy bounds' worst case
    assert np.array_equal(ring.intt(ring.ntt(top)), top)


@pytest.mark.parametrize("limbs", [1, 3, 7])
def test_big_integers_enter_rns_exactly(limbs):
    """``from_limbs`` (the smudging noise's way into RNS) equals the Python integer's residues, limbs up to 2^31."""
    ring = RNSRing(16, ntt_primes(16, 5))
    rng = np.random.default_rng(limbs)
    parts = rng.integers(0, 2**31, size=(limbs, 2, 16))
    shift = 30 * limbs - 3
    got = ring.from_limbs(parts, 30, shift, 5)
    for b in range(2):
        for c in range(16):
            value = sum(int(parts[i, b, c]) << (30 * i) for i in range(limbs)) - (1 << shift)
            assert got[b, :, c].tolist() == [value % q for q in ring.primes]


def test_parameters_meet_128_bit_security_and_refuse_more():
    params = MPParams()
    check_security(params)
    assert params.log_q() <= 218 and all(q % (2 * params.n) == 1 for q in params.primes)
    with pytest.raises(ConfigurationError, match="128-bit"):
        check_security(MPParams(num_primes=8))
    with pytest.raises(ConfigurationError, match="eta"):
        check_security(MPParams(eta=4))


@pytest.mark.parametrize("eta", [11, 15, 20])
def test_error_narrower_than_the_standard_is_refused(eta):
    """eta/2 is the error variance: eta 11-20 gives std 2.35-3.16 < 3.19; 21 is the least accepted."""
    with pytest.raises(ConfigurationError, match="error std"):
        check_security(MPParams(eta=eta))
    check_security(MPParams(eta=21))


def test_smudging_has_a_floor_raised_with_the_run_budget():
    with pytest.raises(ConfigurationError, match="smudging_lambda"):
        check_security(MPParams(smudging_lambda=39))
    assert MPParams(max_keyswitches=1 << 10).keyswitch_lambda == 40
    assert MPParams(max_keyswitches=(1 << 10) + 1).keyswitch_lambda == 41
    for t in (1, 1000, 1 << 20, 1 << 33):  # T ciphertexts at 2^-lambda each stay within 2^-30
        assert t * 2.0 ** -MPParams(max_keyswitches=t).keyswitch_lambda <= 2.0**-30


@settings(max_examples=60, deadline=None)
@given(
    k=st.integers(1, 300),
    integer=st.booleans(),
    bound_log=st.floats(-3, 12),
    tol_log=st.floats(-12, 0),
    smudging=st.integers(40, 64),
    budget_log=st.integers(0, 40),
    block_len=st.one_of(st.none(), st.integers(1, 50_000)),
    broadcast=st.booleans(),
)
def test_modulus_plan_never_undershoots(k, integer, bound_log, tol_log, smudging, budget_log, block_len, broadcast):
    """Modulus plan never undershoots.

    Whatever K, field range, smudging and key switch (PCKS to each recipient's key, or CKS to the
    broadcast key), the plan's modulus holds the K-way sum's fields above ``Delta >= 4 B_ks`` without
    wrapping, ``B_ks`` covering the errors, the smudging and the switch-down's rounding recomputed here
    from their definitions, at the upload level and at the shares' and downloads' switch level, within
    the 128-bit bound; the smudging hides the upload errors within ``2^-lambda`` per ciphertext whatever
    the levels; or the planner refuses (BoundError).
    """
    params = MPParams(smudging_lambda=smudging, max_keyswitches=1 << budget_log)
    bound = 2.0**bound_log
    spec = (
        ValueSpec(integer=True, max_abs=math.floor(bound) + 1, sum_max=k * (math.floor(bound) + 1))
        if integer
        else ValueSpec(max_abs=bound, tolerance=2.0**tol_log)
    )
    try:
        plan = plan_exchange(params, spec, k, block_len=block_len, broadcast=broadcast)
    except BoundError:
        return
    lam = max(smudging, 30 + (params.max_keyswitches - 1).bit_length())
    smudge = lam + (params.n * k * params.eta - 1).bit_length()  # 2^b >= 2^lambda N B_ct
    # the statistical distance of one ciphertext's smudging, N B_ct / 2^(b+1), is within 2^-lambda; the
    # switch-down divides the smudged share as a whole (a public function of it), so this holds at every level
    assert smudging_bits(params, k) == smudge and params.n * k * params.eta * 2**lam <= 2 ** (smudge + 1)
    # PCKS adds e_R u_i + s_R e1_i per share; CKS (the broadcast key s_B, public c1) adds nothing more
    b_ks = k * params.eta + k * 2**smudge + (0 if broadcast else 2 * k * params.n * params.eta)
    # shares and downloads switched down to L' <= L: divided by the dropped primes P and rounded, which
    # adds < 1 per summed polynomial (c0, the K shares; CKS: the recipient's own s_B c1) and, PCKS, < N per
    # h1 times the ternary recipient key
    drop = params.modulus(plan.level) // params.modulus(plan.switch_level)
    per_unit = k + 2 if broadcast else 1 + k + params.n * k
    rounding = 0 if plan.switch_level == plan.level else drop * per_unit
    assert plan.broadcast == broadcast and f"{'CKS' if broadcast else 'PCKS'} shares" in plan.describe()
    assert 1 <= plan.switch_level <= plan.level and plan.switch_factor == drop
    assert plan.noise_bound >= b_ks + rounding
    assert 2**plan.scale_bits >= 4 * plan.noise_bound
    assert params.log_q(plan.level) <= 218
    packed_max = 2 ** (plan.fields * plan.width) - 1
    assert packed_max * 2**plan.scale_bits + plan.noise_bound < params.modulus(plan.level) // 2
    # after the switch-down the fields and noise still sit below Q_L' / 2 (no wrap at the recipient)
    assert (packed_max * 2**plan.scale_bits + b_ks) // drop + 1 + rounding // drop < params.modulus(
        plan.switch_level
    ) // 2
    if integer:
        assert 2**plan.width > spec.sum_max + 2 * k * plan.offset
    else:
        assert plan.offset >= spec.max_abs * 2.0**plan.frac_bits  # every field non-negative
        assert 2**plan.width > 2 * k * plan.offset  # the K-way sum fits one field
        assert plan.error_bound == k * 2.0 ** -(plan.frac_bits + 1) <= spec.tolerance


def test_client_half_checks_the_public_setup_itself():
    """A client builds its parameters from the run's public setup and refuses weak ones there."""
    from protocols.party import PartySetup

    weak = {**mp_backend.params_to_options(MPParams()), "eta": 12}
    setup = PartySetup("ckks-mp", 3, b"r" * 16, b"s" * 16, {"params": weak, "keep_payload_bytes": 1})
    with pytest.raises(ConfigurationError, match="eta=12"):
        mp_client.CKKSMPClient(0, setup.to_bytes())


def test_key_switches_past_the_budget_are_refused():
    from protocols.errors import SmudgingBudgetError

    p = fresh(2, params=MPParams(max_keyswitches=1))
    spec = ValueSpec(max_abs=1.0, tolerance=1e-3)
    p.weighted_sum("a", 0, {0: np.ones(4), 1: np.ones(4)}, spec=spec)
    with pytest.raises(SmudgingBudgetError, match="budget of 1"):
        p.weighted_sum("b", 0, {0: np.ones(4), 1: np.ones(4)}, spec=spec)


def test_mode_is_registered():
    assert "ckks-mp" in MODES
    from secure_fgl.config import RunConfig

    assert RunConfig(mode="ckks-mp").validate().mode == "ckks-mp"


# ------------------------------------------------------------------ correctness
@FAST
@given(k=st.integers(2, 8), length=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_collective_decryption_equals_plaintext_sum(k, length, seed):
    p = proto(k)
    rng = np.random.default_rng(seed)
    vals = {c: rng.uniform(-3, 3, size=length) for c in range(k)}
    spec = ValueSpec(max_abs=3.0, tolerance=1e-6)
    got = p.weighted_sum(f"sum{length}", next(ROUNDS), vals, spec=spec)
    bound = p.last_stats["error_bound"]
    assert 0 < bound <= 1e-6
    assert np.abs(got - sum(vals.values())).max() <= bound


def test_packed_integers_exact_and_dense_rows():
    k, n, d = 5, 300, 40
    p = proto(k)
    rng = np.random.default_rng(3)
    contrib = {c: (np.arange(n), (rng.random((n, d)) < 0.3).astype(float)) for c in range(k)}
    requests = {c: np.arange(n)[c::k] for c in range(k)}
    spec = ValueSpec(integer=True, max_abs=1, sum_max=k)
    got = p.row_sum("packed", 0, contrib, requests, n, layout="dense", spec=spec)
    total = sum(r for _, r in contrib.values())
    for c in range(k):
        assert np.array_equal(got[c], total[requests[c]])
    plan = p.plan(spec)
    assert plan.fields > 1 and plan.integer and plan.error_bound == 0


def test_offsets_padded_when_a_client_skips_a_block():
    p = proto(3)
    spec = ValueSpec(max_abs=2.0, tolerance=1e-5)
    contrib = {0: (np.array([0, 1]), np.ones((2, 3))), 1: (np.array([5]), -np.ones((1, 3)))}
    got = p.row_sum("sparse", 0, contrib, {2: np.array([0, 5, 9])}, 10, layout="sparse", spec=spec)
    assert np.allclose(got[2], [[1, 1, 1], [-1, -1, -1], [0, 0, 0]], atol=1e-5)


# ------------------------------------------------------------------ coalition attacks
def _upload_of(p, tag: str, k: int, plan) -> np.ndarray:
    """Client k's upload ciphertexts (c0 as sent, c1 public), ``[pieces, 2, L, N]``."""
    msg = next(
        m for m in p.transcript.select(tag=tag, sender=client_party(k), receiver=SERVER) if m.kind == "ciphertext"
    )
    return p.upload_ciphertexts(msg, plan)


def test_server_and_k_minus_1_clients_cannot_decrypt_the_kth_upload():
    from attacks.coalition import ckks_mp_break

    k = 4
    p = proto(k)
    rng = np.random.default_rng(7)
    vals = {c: rng.integers(0, 200, 6000).astype(float) for c in range(k)}
    spec = ValueSpec(integer=True, max_abs=200, sum_max=800)
    p.weighted_sum("victim", 0, vals, spec=spec)
    victim = k - 1
    attack = ckks_mp_break(p, "victim", 0, victim, [0, 1, 2], vals[victim], spec)
    assert attack["abs_corr"] < 0.1 and attack["abs_corr"] < 5 * attack["chance"]
    # positive control: the victim's own share s_i (its upload's key) recovers the upload
    assert ckks_mp_break(p, "victim", 0, victim, [victim], vals[victim], spec)["abs_corr"] > 0.999999
    # every other key the coalition holds (its recipient keys, the broadcast key, combined with its
    # collective shares) decrypts the upload to noise too; what it learns is the released sum
    plan = p.plan(spec, block_len=6000)
    ct = _upload_of(p, "victim", victim, plan)[0]
    used = encoding.used_coefficients(plan, 6000)
    truth = centred_coeffs(p, encoding.encode(p.ring, plan, encoding.quantize(vals[victim], plan)))[:used]
    shares = p.ring.add(p.ring.add(secret(p, 0), secret(p, 1)), secret(p, 2))
    for key in (p._clients[0]._own.s_hat, p._clients[0]._broadcast.s_hat):  # every colluder's alike
        for guess in (key, p.ring.add(shares, key)):
            attack = centred_coeffs(p, encryption.decrypt(p.ring, guess, ct))[:used]
            assert abs(corr(attack, truth)) < 5 / np.sqrt(used)


def test_coalition_attack_in_the_runner_registry():
    from attacks.base import View
    from attacks.runner import ATTACKS

    p = proto(3)
    p.weighted_sum("fedavg/model", 0, {c: np.full(8, 0.5) for c in range(3)}, spec=ValueSpec(max_abs=1))
    attack = ATTACKS["coalition"]()
    view = View.of(p.transcript, attack.observer)
    res = attack(view, {"public": {}, "coalition_keys": {"protocol": p, "clients": [0, 1]}})
    assert res.applicable and res.metric == "break_probe_abs_corr"
    assert res.value < 5 * res.chance
    everyone = attack(view, {"public": {}, "coalition_keys": {"protocol": p, "clients": [0, 1, 2]}})
    assert not everyone.applicable and "whole secret key" in everyone.reason


def test_coalition_cannot_read_another_recipients_rows():
    """Coalition cannot read another recipients rows.

    Scoped key switching: recipient 3's blocks are switched to its own key; the other clients'
    collective shares, recipient keys and the broadcast key all decrypt them to noise.
    """
    k, d = 4, 30
    p = proto(k)
    spec = ValueSpec(integer=True, max_abs=50, sum_max=200)
    rpb = p.rows_per_block(spec, d, 10**7)
    rng = np.random.default_rng(11)
    rows = (np.arange(k)[:, None] * rpb + np.arange(400)).ravel()  # 400 rows in each of k blocks
    contrib = {c: (rows, rng.integers(0, 50, (rows.size, d)).astype(float)) for c in range(k)}
    requests = {c: rows[c * 400 : (c + 1) * 400] for c in range(k)}  # recipient c: block c
    got = p.row_sum("scoped", 0, contrib, requests, k * rpb, layout="sparse", spec=spec)
    target = 3
    down = [
        m
        for m in p.transcript.select(tag="scoped", sender=SERVER, receiver=client_party(target))
        if m.kind == "ciphertext" and "key-switched" in m.note
    ][0]
    assert down.payload["to"] == target
    plan = p.plan(spec, block_len=d * rpb)
    cts = encryption.from_bytes(
        p.ring, down.payload["data"], (down.shape[0] * down.shape[1], 2, plan.switch_level, p.params.n)
    )
    used = encoding.used_coefficients(plan, 400 * d)
    assert used >= 500
    own = centred_coeffs(p, encryption.decrypt_switched(p.ring, p._clients[target]._own.s_hat, cts[0]))
    colluders = p.ring.add(p.ring.add(secret(p, 0), secret(p, 1)), secret(p, 2))
    for key in (colluders, p._clients[0]._own.s_hat, p._clients[0]._broadcast.s_hat):
        attack = centred_coeffs(p, encryption.decrypt_switched(p.ring, key, cts[0]))
        assert abs(corr(attack[:used], own[:used])) < 5 / np.sqrt(used)  # chance: std 1/sqrt(used)
    # a recipient receives exactly its rows and nothing else
    total = sum(r for _, r in contrib.values())
    assert set(got) == set(requests)
    for c in range(k):
        assert np.array_equal(got[c], total[c * 400 : (c + 1) * 400])


def _bytes_in(payload):
    if isinstance(payload, (bytes, bytearray)):
        return [bytes(payload)]
    if isinstance(payload, dict):
        return [b for v in payload.values() for b in _bytes_in(v)]
    return []


def test_secret_shares_never_reach_the_server():
    p = proto(3)
    p.weighted_sum("custody", 0, {c: np.ones(5) for c in range(3)}, spec=ValueSpec(max_abs=1))
    view = p.transcript.view(SERVER)
    assert view and all(m.kind != "secret_key" for m in view)
    payloads = [b for m in view for b in _bytes_in(m.payload)]
    assert payloads
    for c, client in p._clients.items():
        assert client._broadcast is not None
        for s_hat in (client._share, client._own.s_hat, client._broadcast.s_hat):
            for form in (s_hat, p.ring.intt(s_hat)):
                for dtype in ("<u4", "<i8"):
                    probe = np.ascontiguousarray(form, dtype=dtype).tobytes()[:256]
                    assert not any(probe in data for data in payloads)


def test_server_half_holds_no_secret_key_share():
    """Server half holds no secret key share.

    Walk every object the server half reaches: no client's key holder, no secret (s_i, s_R,
    s_B) as an object, and none of their bytes inside any array or bytes it holds.
    """
    k = 3
    p = fresh(k)
    p.row_sum(
        "walk",
        0,
        {c: (np.arange(4), np.ones((4, 2))) for c in range(k)},
        {c: np.array([c]) for c in range(k)},
        4,
        spec=ValueSpec(max_abs=1, tolerance=1e-4),
    )
    held = []
    reach = reachable_objects(p.server, data=held)
    secrets = []
    for c, keys in p._clients.items():
        assert id(keys) not in reach and id(p.clients[c]) not in reach
        for s_hat in (keys._share, keys._own.s_hat, keys._broadcast.s_hat):
            assert id(s_hat) not in reach
            secrets += [
                np.ascontiguousarray(form, dtype=dt).tobytes()[:256]
                for form in (s_hat, p.ring.intt(s_hat))
                for dt in ("<u4", "<i8")
            ]
        secrets.append(keys.broadcast_secret()[:256])  # s_B as dealt over the channel
    assert sum(isinstance(b, np.ndarray) for b in held) > 5 and sum(isinstance(b, bytes) for b in held) > 10

    def found(blobs):
        return any(
            probe in (b.tobytes() if isinstance(b, np.ndarray) else bytes(b)) for b in blobs for probe in secrets
        )

    assert not found(held)
    own = []  # positive control: the same scan finds client 0's secrets in its half
    reachable_objects(p.clients[0], data=own)
    assert found(own)


def test_recipient_noise_does_not_depend_on_the_secret(monkeypatch):
    """Recipient noise does not depend on the secret.

    The noise a recipient decrypts (a broadcast exchange: switched to the broadcast key), against
    the upload errors e_ct = c0 + s c1 - Delta m of the aggregate: uncorrelated, smudged (its spread
    is ~2^lambda times e_ct's bound; without smudging it is not), and distributed alike under two
    independent key sets (KS test).
    """
    k = 3
    spec = ValueSpec(integer=True, max_abs=3, sum_max=9)
    vals = {c: np.full(20_000, float(c)) for c in range(k)}

    def noises(p):
        p.weighted_sum("noise", 0, vals, spec=spec)
        plan = p.plan(spec, block_len=20_000, broadcast=True)
        shape = (1, plan.switch_level, p.params.n)  # the download: c0' only, switched down
        uploads = [_upload_of(p, "noise", c, plan) for c in range(k)]
        agg = np.stack([sum(u[:, 0] for u in uploads) % p.ring.q[: plan.level], uploads[0][:, 1]], axis=1)
        s = p.ring.add(p.ring.add(secret(p, 0), secret(p, 1)), secret(p, 2))
        down = [
            m
            for m in p.transcript.select(tag="noise", sender=SERVER, receiver=client_party(0))
            if "key-switched" in m.note
        ][0]
        out = encryption.from_bytes(p.ring, down.payload["broadcast"], shape)

        def residual(decrypted, factor=1):
            """Distance from the Delta grid in the uploads' units (a switched-down download times P)."""
            coeffs = [c * factor for c in encoding.crt_centered(p.ring, decrypted[0])]
            d = plan.scale_bits
            return np.array([float(c - (((c + (1 << (d - 1))) >> d) << d)) for c in coeffs])

        s_b_c1 = encryption.key_product(p.ring, p._clients[0]._broadcast.s_hat, agg[:, 1])
        seen = encryption.decrypt_broadcast(p.ring, out, s_b_c1)
        return residual(encryption.decrypt(p.ring, s, agg)), residual(seen, plan.switch_factor)

    e_ct, seen = noises(fresh(k))
    assert abs(corr(e_ct, seen)) < 0.05
    e_ct2, seen2 = noises(fresh(k))
    assert ks_2samp(seen, seen2).pvalue > 1e-3
    # the smudging is applied: the recipient's noise spans ~K 2^b (uniform, std 2^b sqrt(K/3)), beyond
    # the upload errors e_ct (|e_ct| <= K eta) by ~2^lambda; without it what remains is the switch-down's
    # rounding (P E_r, P = the dropped primes) and a few hundred
    b = mp_client.smudging_bits(MPParams(), k)
    assert np.abs(e_ct).max() <= k * 21 and seen.std() > 2.0 ** (b - 1)
    monkeypatch.setattr(mp_client, "smudging_bits", lambda params, k: 0)
    _, seen3 = noises(fresh(k))
    unsmudged_bound = plan_exchange(MPParams(), spec, k, block_len=20_000, broadcast=True).noise_bound - k * 2**b
    assert np.abs(seen3).max() <= unsmudged_bound and seen3.std() < seen.std() / 2


def test_broadcast_exchanges_switch_once_scoped_ones_per_recipient():
    k = 3
    p = fresh(k)
    p.weighted_mean("bcast", 0, {c: np.ones(4) for c in range(k)}, spec=ValueSpec(max_abs=1))
    shares = [m for m in p.transcript.select(tag="bcast") if m.kind == "share"]
    downs = [m for m in p.transcript.select(tag="bcast") if "key-switched" in m.note]
    assert len(shares) == k and all(m.payload["broadcast"] and not m.payload["data"] for m in downs)
    spec = ValueSpec(integer=True, max_abs=1, sum_max=k)
    rpb = p.rows_per_block(spec, 2, 10**7)
    rows = np.arange(k) * rpb  # one row in each of k blocks
    contrib = {c: (rows, np.ones((k, 2))) for c in range(k)}
    got = p.row_sum(
        "scoped-count", 0, contrib, {c: rows[c : c + 1] for c in range(k)}, k * rpb, layout="sparse", spec=spec
    )
    assert all(np.array_equal(got[c], np.full((1, 2), k)) for c in range(k))
    shares = [m for m in p.transcript.select(tag="scoped-count") if m.kind == "share"]
    downs = [m for m in p.transcript.select(tag="scoped-count") if "key-switched" in m.note]
    assert len(shares) == k * k and sorted(m.payload["to"] for m in downs) == list(range(k))


def test_broadcast_blocks_travel_as_one_polynomial_at_the_switch_level():
    """Switching to the broadcast key (CKS): every share and the download are one polynomial at ``L'``, exact."""
    k, length = 3, 300
    p = fresh(k)
    rng = np.random.default_rng(11)
    vals = {c: rng.integers(0, 4, length).astype(float) for c in range(k)}
    spec = ValueSpec(integer=True, max_abs=3, sum_max=9)
    got = p.weighted_sum("cks", 0, vals, spec=spec)
    assert np.array_equal(got, sum(vals.values()))
    plan = p.plan(spec, block_len=length)
    one_poly = plan.switch_level * p.params.n * 4
    shares = [m for m in p.transcript.select(tag="cks") if m.kind == "share"]
    downs = [m for m in p.transcript.select(tag="cks") if "key-switched" in m.note]
    assert len(shares) == k and {len(m.payload) for m in shares} == {one_poly}
    assert len(downs) == k and {len(m.payload["broadcast"]) for m in downs} == {one_poly}


@settings(max_examples=6, deadline=None)
@given(
    k=st.sampled_from([1, 10, 100]),
    sum_max=st.sampled_from([1, 169, 10**6]),
    noise=st.sampled_from([0.0, 0.5, 1.0, 4.0]),
    seed=st.integers(0, 10_000),
)
def test_vectorised_decode_equals_python_integers(k, sum_max, noise, seed):
    """``encoding.decode`` (limbs) equals the Python-integer CRT reference: fields, max residual, range check.

    The decrypted coefficients are ``(Delta m + e) / P`` with ``|e|`` a multiple ``noise`` of the plan's bound
    (4: beyond it, so the residual check must fire) and one negated coefficient when noise is 4 (out of range).
    """
    params = MPParams()
    ring = ring_of(params)
    plan = plan_exchange(params, ValueSpec(integer=True, max_abs=1, sum_max=sum_max), k)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, plan.capacity + 1))
    used = encoding.used_coefficients(plan, n)
    fields = rng.integers(0, 1 << plan.width, (plan.fields, used))
    bound = int(plan.noise_bound * noise)
    coeffs = []
    for c in range(params.n):
        m = sum(int(fields[j, c]) << (plan.width * j) for j in range(plan.fields)) if c < used else 0
        e = int(rng.integers(-(1 << 62), 1 << 62)) * bound >> 62
        coeffs.append(((m << plan.scale_bits) + e) // plan.switch_factor)
    if noise > 1:
        coeffs[0] = -coeffs[0] - (1 << plan.scale_bits)
    residues = np.array([[c % q for c in coeffs] for q in params.primes[: plan.switch_level]], dtype=np.int64)
    got, residual, in_range = encoding.decode(ring, plan, residues, n)
    centred = [c * plan.switch_factor for c in encoding.crt_centered(ring, residues)]
    d = plan.scale_bits
    packed = [(c + (1 << (d - 1))) >> d for c in centred]
    assert residual == max(abs(c - (q << d)) for c, q in zip(centred, packed))
    expect_in_range = all(0 <= x < 1 << (plan.fields * plan.width) for x in packed[:used]) and not any(packed[used:])
    assert in_range == expect_in_range
    if in_range:
        want = [(x >> (plan.width * j)) & ((1 << plan.width) - 1) for j in range(plan.fields) for x in packed[:used]]
        assert got.tolist() == want[:n]


# ------------------------------------------------------------------ refusals
def _drop(kind: str, sender: int, corrupt: bool = False, unreduced: bool = False, p=None):
    def hook(msg):
        if msg.kind != kind or msg.sender != client_party(sender):
            return msg
        if not corrupt:
            return None
        data = bytearray(msg.payload)
        word = int.from_bytes(data[:4], "little")
        new = 0xFFFFFFFF if unreduced else (word + 2147352577 // 2) % 2147352577  # a valid residue, far off
        data[:4] = new.to_bytes(4, "little")
        env = Envelope.from_header(msg.auth[64:])  # the client itself signs the corrupted share
        return p._seal(replace(msg, payload=bytes(data)), env.stage, env.part)

    return hook


@pytest.mark.parametrize("kind", ["share", "ciphertext"])
def test_missing_message_aborts_naming_the_client(kind):
    p = proto(3)
    p.intercept = _drop(kind, 1)
    with pytest.raises(DropoutError, match="client 1") as err:
        p.weighted_sum(f"missing-{kind}", 0, {c: np.ones(4) for c in range(3)}, spec=ValueSpec(max_abs=1))
    assert err.value.client == 1


@pytest.mark.parametrize("unreduced", [True, False])
def test_corrupted_share_is_refused(unreduced):
    p = proto(3)
    p.intercept = _drop("share", 2, corrupt=True, unreduced=unreduced, p=p)
    with pytest.raises(IntegrityError, match="client 2" if unreduced else "corrupted"):
        p.weighted_sum(f"corrupt-{unreduced}", 0, {c: np.ones(4) for c in range(3)}, spec=ValueSpec(max_abs=1))


@pytest.mark.parametrize("stage", ["upload", "keyswitch", "download"])
def test_message_changed_in_transit_is_refused(stage):
    """Message changed in transit is refused.

    Every ckks-mp message is signed: a bit flipped in transit (upload, key-switch share or c1,
    final download) is refused before it is used.
    """
    p = proto(3)

    def flip(msg):
        if (
            msg.tag != f"transit-{stage}"
            or msg.kind not in ("ciphertext", "share")
            or Envelope.from_header(msg.auth[64:]).stage != stage
            or "client1" not in (msg.sender, msg.receiver)
        ):
            return msg
        if isinstance(msg.payload, dict):  # the c1 or key-switched ciphertexts inside
            name = next(key for key in ("c1", "data", "broadcast") if msg.payload.get(key))
            return replace(
                msg, payload={**msg.payload, name: bytes([msg.payload[name][0] ^ 1]) + msg.payload[name][1:]}
            )
        return replace(msg, payload=bytes([msg.payload[0] ^ 1]) + msg.payload[1:])

    p.intercept = flip
    with pytest.raises(DigestError, match="client 1"):
        p.weighted_sum(f"transit-{stage}", 0, {c: np.ones(4) for c in range(3)}, spec=ValueSpec(max_abs=1))


def test_key_setup_is_signed_and_the_broadcast_key_travels_encrypted():
    p = fresh(3)
    p.weighted_sum("setup", 0, {c: np.ones(4) for c in range(3)}, spec=ValueSpec(max_abs=1))
    keys = p.transcript.select(tag=mp_backend.KEYS_TAG)
    assert keys and all(m.auth and Envelope.from_header(m.auth[64:]).stage == "key_setup" for m in keys)
    relayed = [m for m in keys if m.relay == SERVER]
    assert sorted(m.receiver for m in relayed) == ["client1", "client2"]
    assert "server" in p.identity_fingerprints()


def test_out_of_range_refused_before_encryption():
    p = proto(2)
    with pytest.raises(BoundError, match="client 1"):
        p.weighted_sum("range", 0, {0: np.ones(3), 1: np.array([0.0, 5.0, 0.0])}, spec=ValueSpec(max_abs=1))
    assert not [m for m in p.transcript.select(tag="range") if m.sender != SERVER]  # no client message
    p3 = proto(3)  # each value within max_abs, the sum 9 above sum_max=4: without an owner-checked
    # sum the plan sizes fields from K * max_abs (what K client-checked entries guarantee), so it stays exact
    got = p3.weighted_sum(
        "overflow", 0, {c: np.full(3, 3.0) for c in range(3)}, spec=ValueSpec(integer=True, max_abs=3, sum_max=4)
    )
    np.testing.assert_array_equal(got, np.full(3, 9.0))
    with pytest.raises(BoundError, match="tolerance"):
        p.weighted_sum("tol", 0, {0: np.ones(3), 1: np.ones(3)}, spec=ValueSpec(max_abs=1e4, tolerance=1e-30))


def test_dp_noised_exchanges_stay_within_the_widened_range():
    """DP noised exchanges stay within the widened range.

    Distributed DP noise (integer and float) passes through ckks-mp: the plan widens the range
    by the public DP offset, and the decoded sum equals the sum of the noised contributions.
    """
    from protocols import DPRequest
    from protocols.dp import DPConfig

    k = 3
    p = fresh(k, dp=DPConfig(epsilon=4.0, placement="distributed", tags=("dp/int", "dp/float")))
    seen = {}
    original = p._aggregate

    def spy(ctx):
        seen["sum"] = sum(t.values for t in ctx.contributions.values())
        return original(ctx)

    p._aggregate = spy
    counts = {c: np.full(50, 2.0) for c in range(k)}
    got = p.weighted_sum(
        "dp/int",
        0,
        counts,
        spec=ValueSpec(integer=True, max_abs=2, sum_max=2 * k),
        dp=DPRequest(clip=math.inf, sensitivity=1.0),
    )
    assert np.array_equal(got, seen["sum"][0][:50])
    floats = {c: np.full(20, 0.5) for c in range(k)}
    got = p.weighted_sum("dp/float", 0, floats, spec=ValueSpec(max_abs=1.0, tolerance=1e-5), dp=DPRequest(clip=1.0))
    assert np.abs(got - seen["sum"][0][:20]).max() <= p.last_stats["error_bound"]


def test_protocol_bench_includes_ckks_mp(tmp_path):
    from secure_fgl.bench.protocols import run_protocol_bench

    recs = run_protocol_bench(tmp_path, quick=True, clients=3, backends=("ckks-mp",))
    assert {r["workload"].split("_")[0] for r in recs} == {"cora", "floats", "model"}
    for r in recs:
        assert r["backend"] == "ckks-mp" and r["bytes_up_per_client"] > 0 and r["key_setup"]["bytes_up_per_client"] > 0
        assert r["max_abs_error"] == 0 if r["workload"].startswith("cora") else r["max_abs_error"] <= 1e-4
