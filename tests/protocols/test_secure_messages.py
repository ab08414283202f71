"""Signed envelopes, authentication, replay, the relayed channel, double masking and the coalition attack."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attacks.coalition import ckks_break, implied_isolation, mask_break
from protocols import SERVER, ValueSpec, make_protocol
from protocols.errors import (
    AuthenticationError,
    DigestError,
    MalformedMessageError,
    MisdirectedError,
    ReplayError,
    UnmaskingRefusedError,
)
from protocols.mask import MaskProtocol
from protocols.mask.client import _unmask_answer
from protocols.message import Envelope, decode_body, encode_body

SPEC = ValueSpec(max_abs=1.0, tolerance=1e-4)


def _values(K, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, n) for k in range(K)}


# ---------------------------------------------------------------------- the envelope
def _signed(proto=None):
    proto = proto or MaskProtocol(3)
    proto.weighted_sum("x/t", 0, _values(3, 50), spec=SPEC)
    return proto, [m for m in proto.transcript.messages if m.kind == "masked" and m.receiver == SERVER][0]


def test_envelope_round_trip_and_strict_parsing():
    _, m = _signed()
    sig, header = m.auth[:64], m.auth[64:]
    env = Envelope.from_header(header)
    assert (env.sender, env.recipient, env.stage, env.tag, env.round) == ("client0", SERVER, "masked_upload", "x/t", 0)
    wire = dataclasses.replace(env, body=encode_body(m.payload)).to_bytes(sig)
    back, sig2 = Envelope.from_bytes(wire)
    assert back == env and sig2 == sig and m.nbytes == len(wire)
    for cut in list(range(0, len(header) + 80, 7)):  # every truncation raises, never parses
        with pytest.raises(MalformedMessageError):
            Envelope.from_bytes(wire[:cut])
    with pytest.raises(MalformedMessageError):
        Envelope.from_bytes(wire + b"\0")
    with pytest.raises(MalformedMessageError):
        Envelope.from_header(header + b"x")
    body = encode_body(m.payload)
    assert encode_body(decode_body(body)) == body
    for cut in range(0, len(body) - 1, max(1, len(body) // 50)):
        with pytest.raises(MalformedMessageError):
            decode_body(body[:cut])


@pytest.mark.parametrize(
    "attack,err",
    [
        ("forge", AuthenticationError),
        ("spoof", AuthenticationError),
        ("recipient", MisdirectedError),
        ("digest", DigestError),
        ("strip", MalformedMessageError),
        ("session", ReplayError),
    ],
)
def test_tampered_envelopes_raise_specific_errors(attack, err):
    proto = MaskProtocol(3)

    def hook(m):
        if m.kind != "masked" or m.sender != "client1":
            return m
        if attack == "forge":
            return dataclasses.replace(m, auth=bytes([m.auth[0] ^ 1]) + m.auth[1:])
        if attack == "spoof":  # client 2 signs a message claiming to be client 1's upload
            return dataclasses.replace(
                proto._seal(dataclasses.replace(m, sender="client2"), "masked_upload"), sender="client1"
            )
        if attack == "recipient":
            return proto._seal(dataclasses.replace(m, receiver="client0"), "masked_upload")
        if attack == "digest":
            data = bytearray(m.payload["data"])
            data[3] ^= 4
            return dataclasses.replace(m, payload={**m.payload, "data": bytes(data)})
        if attack == "strip":
            return dataclasses.replace(m, auth=m.auth[:40])
        current, proto.session = proto.session, bytes(16)  # signed by client 1 in another session
        try:
            return proto._seal(m, "masked_upload")
        finally:
            proto.session = current

    proto.intercept = hook
    with pytest.raises(err, match="exchange 'x/t', round 0, client 1"):
        proto.weighted_sum("x/t", 0, _values(3, 50), spec=SPEC)
    assert not [m for m in proto.transcript.messages if m.sender == SERVER and m.kind == "masked"]


def test_replay_in_same_and_later_exchange_refused():
    proto = MaskProtocol(3)
    proto.weighted_sum("x/t", 0, _values(3, 50), spec=SPEC)
    first = [m for m in proto.transcript.messages if m.kind == "masked" and m.sender == "client1"][0]
    proto.intercept = lambda m: first if (m.kind == "masked" and m.sender == "client1") else m
    with pytest.raises(ReplayError, match="client 1"):  # round 0 (another tag), under a fresh exchange
        proto.weighted_sum("x/t-again", 0, _values(3, 50), spec=SPEC)
    proto.intercept = lambda m: first if (m.kind == "masked" and m.sender == "client1") else m
    with pytest.raises(ReplayError, match="client 1"):  # a later round
        proto.weighted_sum("x/t", 1, _values(3, 50), spec=SPEC)
    # the same exchange (a run's first, where keys are advertised): client 1's advertised key
    # delivered again as its unmasking message, and a duplicate of an accepted upload
    keys = {}

    def swap(m):
        if m.tag == "x/t" and m.sender == "client1" and m.kind in ("public_key", "share"):
            keys.setdefault(m.kind, m)
            return keys["public_key"]
        return m

    fresh = MaskProtocol(3)
    fresh.intercept = swap
    with pytest.raises(ReplayError, match="'advertise_keys' message .* where 'unmask'"):
        fresh.weighted_sum("x/t", 2, _values(3, 50), spec=SPEC)
    proto.intercept = None
    proto.weighted_sum("x/t", 3, _values(3, 50), spec=SPEC)
    up = [m for m in proto.transcript.messages if m.kind == "masked" and m.sender == "client1" and m.round == 3][0]
    with pytest.raises(ReplayError, match="already received"):
        proto._authenticate(up, "client1", SERVER, "masked_upload", 0, "x/t", 3)


# ---------------------------------------------------------------------- signed downloads
def _flip_body(payload):
    """The payload with one bit of its first array or byte string flipped."""
    if isinstance(payload, dict):
        key = "values" if "values" in payload else "data"
        body = payload[key]
        if isinstance(body, (bytes, bytearray)):
            return {**payload, key: bytes([body[0] ^ 1]) + bytes(body[1:])}
        arr = np.array(body, copy=True)
        arr.view(np.uint8).reshape(-1)[0] ^= 1
        return {**payload, key: arr}
    frames = list(payload)
    frames[0] = bytes([frames[0][0] ^ 1]) + frames[0][1:]
    return frames


def _is_download(m, to="client1"):
    return (
        m.tag == "x/t"
        and m.sender == SERVER
        and m.receiver == to
        and Envelope.from_header(m.auth[64:]).stage == "download"
    )


@pytest.mark.parametrize("mode", ["plain", "mask", "ckks"])
@pytest.mark.parametrize(
    "attack,err",
    [("bitflip", DigestError), ("replay", ReplayError), ("redirect", MisdirectedError), ("forge", AuthenticationError)],
)
def test_tampered_download_is_refused_by_its_recipient(mode, attack, err):
    proto = make_protocol(mode, 3)
    x = _values(3, 50)
    proto.weighted_sum("x/t", 0, x, spec=SPEC)
    old = next(m for m in proto.transcript.messages if _is_download(m))
    assert old.auth and old.nbytes > 64  # signed by the server; wire bytes counted
    held = {}

    def hook(m):
        if m.tag == "x/t" and m.sender == SERVER and m.receiver == "client0":
            held["client0"] = m
        if not _is_download(m):
            return m
        if attack == "bitflip":
            return dataclasses.replace(m, payload=_flip_body(m.payload))
        if attack == "replay":  # round 0's download again in round 1
            return old
        if attack == "redirect":  # client 0's download handed to client 1
            return held["client0"]
        return dataclasses.replace(m, auth=bytes([m.auth[0] ^ 1]) + m.auth[1:])

    proto.intercept = hook
    with pytest.raises(err, match="client 1"):  # the next round (a client sums a round once)
        proto.weighted_sum("x/t", 1, x, spec=SPEC)


def test_server_key_is_registered_with_every_client():
    proto, _ = _signed()
    regs = [
        m
        for m in proto.transcript.messages
        if m.sender == SERVER and m.kind == "public_key" and Envelope.from_header(m.auth[64:]).stage == "register"
    ]
    assert sorted(m.receiver for m in regs) == ["client0", "client1", "client2"]
    assert all(m.payload["signing"] == proto.registry.signing[SERVER] for m in regs)


def test_resumed_run_resends_round_under_new_session():
    a, b = MaskProtocol(3), MaskProtocol(3)
    assert a.session != b.session
    x = _values(3, 50)
    assert np.allclose(a.weighted_sum("x/t", 5, x, spec=SPEC), b.weighted_sum("x/t", 5, x, spec=SPEC))


def test_key_fingerprints_registered_once():
    proto, _ = _signed()
    fps = proto.identity_fingerprints()
    assert sorted(fps) == ["client0", "client1", "client2", "server"]
    assert all(len(v["signing"]) == 64 for v in fps.values()) and "channel" not in fps["server"]
    with pytest.raises(AuthenticationError):
        proto.registry.register("client0", proto._signing[1].public_bytes, proto._channel[0].public_bytes)


# ---------------------------------------------------------------------- the relayed channel
def test_server_relays_shares_but_reads_none():
    K = 5
    proto = MaskProtocol(K)
    proto.keep_client_state = True
    proto.drop_clients({3}, stage="upload")
    proto.weighted_sum("x/t", 0, _values(K, 100), spec=SPEC)
    relayed = [m for m in proto.transcript.view(SERVER) if m.relay == SERVER]
    assert len(relayed) >= K * (K - 1)  # shares + group seed, all through the server
    assert all(m.kind == "ciphertext" and isinstance(m.payload, bytes) for m in relayed)
    blob = b"".join(m.payload for m in relayed)
    secrets_ = [proto._group_seed[1]]
    for st in proto.last_client_state.values():
        secrets_ += [b.to_bytes() for b in st.held.values()] + list(st.seeds.values())
    assert all(s[-16:] not in blob for s in secrets_)  # no plaintext share or seed in the server's view
    with pytest.raises(Exception):  # and no key of the server opens them
        proto._channel[0].open("client1", proto.registry.channel["client2"], proto.run_id, relayed[0].payload, b"", {})


def test_ckks_secret_context_travels_encrypted():
    ck = make_protocol("ckks", 3)
    ck.weighted_sum("t", 0, {c: np.ones(4) for c in range(3)}, spec=ValueSpec(max_abs=2, tolerance=1e-3))
    sec = [m for m in ck.transcript.view(SERVER) if m.tag == "ckks/keys" and m.relay == SERVER]
    assert len(sec) == 2 and all(m.kind == "ciphertext" for m in sec)
    secret = ck._keys.get(ck._active).context.serialize(
        save_secret_key=True, save_public_key=False, save_galois_keys=False, save_relin_keys=False
    )
    assert all(m.payload is None or secret[1000:1064] not in m.payload for m in sec)


# ---------------------------------------------------------------------- double masking and coalitions
def test_late_upload_attack_recovers_nothing():
    """Late upload attack recovers nothing.

    Server reconstructs dropped client 2's pairwise key (normal recovery); its upload then
    arrives late; server + one client remove every mask they can.  b_2 still hides it.
    """
    K = 5
    proto = MaskProtocol(K)
    proto.keep_client_state = True
    proto.drop_clients({2}, stage="late")
    x = _values(K)
    got = proto.weighted_sum("x/t", 0, x, spec=SPEC)
    assert np.allclose(got, sum(x[k] for k in range(K) if k != 2), atol=1e-3)
    res = mask_break(proto, "x/t", 0, victim=2, coalition=[0])
    assert "self mask" not in res["removed"] and len([r for r in res["removed"] if r.startswith("pair")]) == K - 1
    assert res["recovered"] <= 1e-3  # ~2^-32 per entry
    assert abs(np.corrcoef(res["decoded"].ravel()[:2000], x[2])[0, 1]) < 0.1


@pytest.mark.parametrize(
    "size,late,expect", [(2, False, 0.0), (3, False, 0.0), (4, False, 1.0), (2, True, 0.0), (3, True, 1.0)]
)
def test_server_plus_coalition_threshold(size, late, expect):
    """A threshold t = 3 for K = 5.

    Server + clients 0..size-1 attack client 4's upload.  The self mask needs
    t shares; the pairwise masks need every other contributor's seed, which only the coalition's
    own members hold (mask keys are never shared) -- or the survivors reveal them when the victim
    is declared dropped (late).  So t colluders learn nothing while an honest peer remains, and
    everything once the victim's pairwise seeds are revealed.
    """
    K = 5
    proto = MaskProtocol(K)
    proto.keep_client_state = True
    x = _values(K, seed=3)
    if late:
        proto.drop_clients({4}, stage="late")
    proto.weighted_sum("x/t", 0, x, spec=SPEC)
    assert proto.last_stats["params"]["threshold"] == 3
    res = mask_break(proto, "x/t", 0, victim=4, coalition=list(range(size)))
    assert res["recovered"] == pytest.approx(expect, abs=1e-3)
    if expect == 0.0:
        assert abs(np.corrcoef(res["decoded"].ravel()[:2000], x[4])[0, 1]) < 0.1
    else:
        assert np.allclose(res["decoded"].ravel()[:2000], x[4], atol=1e-4)


def test_honest_client_refuses_both_shares_of_one_client():
    proto = MaskProtocol(4)
    proto.keep_client_state = True
    proto.weighted_sum("x/t", 0, _values(4, 20), spec=SPEC)
    st = proto.last_client_state[0]
    from protocols.base import ExchangeContext

    ctx = ExchangeContext("x/t", 0, SPEC, {}, {}, 1, 1)
    with pytest.raises(UnmaskingRefusedError, match="client 0"):
        _unmask_answer(st, [2], [1, 2, 3], ctx, 0)
    seeds, b = _unmask_answer(st, [2], [1, 3], ctx, 0)
    assert seeds == {2: st.seeds[2]} and set(b) == {1, 3}


def test_unmasking_round_is_answered_once_and_names_only_dropouts():
    """Unmasking round is answered once and names only dropouts.

    No dropout: the request names no dropped client and every uploader returns self-mask shares
    of all participants, no seed; a second unmasking round in the same exchange is refused.
    """
    proto = MaskProtocol(4)
    proto.weighted_sum("x/u", 0, _values(4, 20), spec=SPEC)
    view = [m for m in proto.transcript.view(SERVER) if m.tag == "x/u"]
    requests = [m for m in view if m.kind == "control" and m.note == "unmasking request"]
    assert len(requests) == 4 and all(
        not len(m.payload["pairwise"]) and len(m.payload["mac_senders"]) == 3 for m in requests
    )
    answers = [m for m in view if m.kind == "share"]
    assert len(answers) == 4 and all(
        sorted(m.payload["self_mask"]) == [0, 1, 2, 3] and not m.payload["pairwise"] for m in answers
    )
    with pytest.raises(UnmaskingRefusedError, match="second unmasking round"):
        proto.clients[1].stage_unmask([])
    proto.drop_clients({2}, stage="upload")  # a dropout: the request names it
    proto.weighted_sum("x/u", 1, _values(4, 20), spec=SPEC)
    req = [m for m in proto.transcript.view(SERVER) if m.round == 1 and m.note == "unmasking request"]
    assert len(req) == 3 and all(list(m.payload["pairwise"]) == [2] for m in req)


def test_ckks_shared_key_coalition_reads_every_upload():
    ck = make_protocol("ckks", 4)
    x = _values(4, 30)
    ck.weighted_sum("t", 0, x, spec=ValueSpec(max_abs=1, tolerance=1e-3))
    read = ckks_break(ck, "t", 0, coalition=[0])
    assert sorted(read) == [1, 2, 3]
    for v, vals in read.items():
        assert np.allclose(vals[:30], x[v], atol=1e-3)


def test_ckks_coalition_reads_an_earlier_exchange_under_another_chain():
    """Ckks coalition reads an earlier exchange under another chain.

    Each upload is decrypted with the key of the chain it names (its fingerprint), not the last
    exchange's: an integer exchange (packed chain) followed by a float one (another chain).
    """
    ck = make_protocol("ckks", 3)
    ints = {k: np.arange(6, dtype=float) % 3 for k in range(3)}
    ck.weighted_sum("ints", 0, ints, spec=ValueSpec(integer=True, max_abs=3, sum_max=9))
    ck.weighted_sum("floats", 0, _values(3, 31), spec=ValueSpec(max_abs=1, tolerance=1e-9))
    assert {m.fingerprint for m in ck.transcript.select(tag="ints")} != {
        m.fingerprint for m in ck.transcript.select(tag="floats")
    }
    assert sorted(ckks_break(ck, "ints", 0, coalition=[0])) == [1, 2]


def test_aggregate_minus_own_isolates_a_single_other_contributor():
    for mode in ("mask", "ckks", "plain"):
        proto = make_protocol(mode, 2)  # a block with two contributors: client 0 and client 1
        contrib = {0: (np.array([0, 1]), np.ones((2, 2))), 1: (np.array([0]), np.full((1, 2), 2.0))}
        out = proto.row_sum(
            "r/s", 0, contrib, {0: np.array([0, 1]), 1: np.array([0])}, 8, spec=ValueSpec(max_abs=4, tolerance=1e-3)
        )
        iso = implied_isolation(proto, "r/s", 0, coalition=[0])
        assert iso["blocks_received"] >= 1 and iso["fraction"] == 1.0, (mode, iso)
        assert np.allclose(out[0][0] - 1.0, 2.0, atol=1e-3)  # the aggregate minus own row = client 1's row


@pytest.mark.parametrize("mode", ["mask", "ckks"])
def test_coalition_attack_in_the_runner_registry(mode):
    from attacks.base import View
    from attacks.runner import ATTACKS

    attack = ATTACKS["coalition"]()
    proto = make_protocol(mode, 4)
    proto.weighted_sum("fedavg/model", 0, _values(4, 40), spec=SPEC)
    view = View.of(proto.transcript, attack.observer)
    res = attack(view, {"public": {}, "coalition_keys": {"protocol": proto, "clients": [0]}})
    assert res.applicable and res.metric == "break_read_fraction"
    if mode == "mask":  # double masking: nothing beyond chance, even for a late upload
        assert res.value <= 1e-3 and res.metrics["break_late_upload_recovered"] <= 1e-3
    else:  # one shared CKKS key: the coalition client decrypts every upload
        assert res.value == 1.0
