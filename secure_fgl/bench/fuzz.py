"""Fuzz suite: messages tampered in transit and malformed inputs, per backend and category.

Every case runs one real exchange (K=3 clients, 16 floats in [-1, 1]) of the ``mask``,
``ckks`` or ``ckks-mp`` backend; the test hook ``Protocol.intercept`` tampers with one message in transit
(an upload, a relayed share, or the server's signed download to a client), or the call
itself is malformed, and the outcome is classified:

* ``rejected``          -- a :class:`~protocols.errors.ProtocolError` of the expected class was raised
                           (nothing aggregated);
* ``accepted_correct``  -- no error and the result equals the honest sum (within the plan's bound);
* ``accepted_wrong``    -- no error and a wrong result (the failure this suite exists to find);
* ``unexpected``        -- any other exception type.

Categories with ``in_model: true`` are what a third party or a faulty channel can do, the
server substituting public keys (its own channel, identity or mask key for a peer's, in the
dealer's key directory or mask-key broadcast, re-signed by the server: the run manifest pins
identity keys and every other key is owner-signed, :mod:`protocols.manifest`), and
(``forged_key_switch``, ``key_substitution``, ckks-mp) a malicious server's own signed
requests: the protocol must catch all of them (target 0 accepted-wrong, 0 unexpected).  ``in_model: false``
are a malicious *sender's* own content, signed by it (a ciphertext corrupted before signing,
values encoded past the client check): outside the honest-but-curious model; reported, and
caught where a recipient can (a decoded packed sum out of its public range raises BoundError).

Run: ``secure-fgl bench --suite fuzz --cases 20000 --out DIR`` (prints a table per category,
writes ``DIR/fuzz.json``); ``tests/protocols/test_fuzz.py`` runs a small sample.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from protocols import ValueSpec, make_protocol
from protocols.auth import SigningKey, sign_public_key
from protocols.channel import ChannelKey
from protocols.client_sampling import sample_clients
from protocols.errors import (
    ConsistencyError,
    InconsistentViewError,
    IntegrityError,
    KeySubstitutionError,
    KeySwitchRefusedError,
    ModulusPlanError,
    PlanRefusedError,
    ProtocolError,
    RepeatedContributionError,
    ShareIntegrityError,
)
from protocols.mask.keys import MaskKeyPair, signed_mask_key
from protocols.mask.shamir import PRIME, Share
from protocols.message import SIGNATURE_BYTES, Envelope, body_digest
from protocols.party import AUTH_TAG
from protocols.schedule import BROADCAST
from protocols.transcript import SERVER

K = 3
N_VALUES = 16
SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)
VICTIM = "client1"
#: the public schedule of the runs the schedule categories use: the sample's fraction and seed, and
#: the broadcast tag every client checks plans of (and binds the models it received under) by role
SAMPLED_FRACTION, SAMPLE_SEED, BROADCAST_TAG = 2 / 3, 5, "fuzz/model"
#: broadcast tags one model-inconsistency case each leaves diverged (then a new protocol)
STALE_TAGS = tuple(f"{BROADCAST_TAG}/{i}" for i in range(64))


def _flip(data: bytes, rng, start: int = 0) -> bytes:
    b = bytearray(data)
    i = int(rng.integers(start, len(b)))
    b[i] ^= 1 << int(rng.integers(0, 8))
    return bytes(b)


def _is_upload(m) -> bool:
    return m.sender == VICTIM and m.receiver == SERVER and m.kind in ("masked", "ciphertext")


def _is_download(m) -> bool:
    return (
        m.sender == SERVER
        and m.receiver == VICTIM
        and m.kind in ("masked", "ciphertext", "plain")
        and Envelope.from_header(m.auth[SIGNATURE_BYTES:]).stage == "download"
    )


def _bytes_field(payload: dict) -> str:
    """The payload's ciphertext field: ``data``, or a ckks-mp download's ``broadcast`` when it carries no ``data``."""
    return "broadcast" if "broadcast" in payload and not payload.get("data") else "data"


def _payload_bytes(m) -> bytes:
    if isinstance(m.payload, (bytes, bytearray)):
        return bytes(m.payload)
    return m.payload[_bytes_field(m.payload)] if isinstance(m.payload, dict) else m.payload[0]


def _with_payload_bytes(m, data: bytes):
    if isinstance(m.payload, (bytes, bytearray)):
        return dataclasses.replace(m, payload=data)
    if isinstance(m.payload, dict):
        return dataclasses.replace(m, payload={**m.payload, _bytes_field(m.payload): data})
    return dataclasses.replace(m, payload=[data] + list(m.payload[1:]))


def _recomputed_digest(m, rng):
    """Flip a body bit and rewrite the header's digest to match (the signature cannot follow)."""
    m = _with_payload_bytes(m, _flip(_payload_bytes(m), rng))
    env = Envelope.from_header(m.auth[SIGNATURE_BYTES:])
    digest, n = body_digest(m.payload)
    return dataclasses.replace(
        m, auth=m.auth[:SIGNATURE_BYTES] + dataclasses.replace(env, digest=digest, body_len=n).header_bytes()
    )


@dataclass
class Case:
    """One fuzz category: which messages it hits and how (or a malformed call)."""

    name: str
    backends: tuple[str, ...]
    in_model: bool
    target: Callable | None = None  # message predicate (None: the call itself is fuzzed)
    tamper: Callable | None = None  # (msg, rng, fuzzer) -> msg
    call: Callable | None = None  # (fuzzer, rng) -> (values, kwargs, round, tag) for malformed calls
    expected: type = IntegrityError
    tag: str = "fuzz/x"  # the tag of the messages the case may tamper with
    fresh: bool = False  # run on a fresh protocol object (its first exchange)
    scheduled: bool = False  # run on a protocol with a public schedule (BROADCAST_TAG sampled, a broadcast)
    must_reject: bool = False  # an accepted result is the attack succeeding, whatever its value


def _truncate(m, rng):
    if rng.random() < 0.5:
        return dataclasses.replace(m, auth=m.auth[: int(rng.integers(0, len(m.auth)))])
    data = _payload_bytes(m)
    return _with_payload_bytes(m, data[: int(rng.integers(0, len(data)))])


def _tamper_download(m, rng, fz):
    """The server's signed download to the victim, changed in transit.

    A body bit or a signature/header bit flipped, the previous exchange's download replayed, or client 0's download of
    this exchange handed to the victim.
    """
    choice = int(rng.integers(0, 4))
    if choice == 2 and fz.prev_exchange.get((SERVER, m.kind, VICTIM)) is not None:
        return fz.prev_exchange[(SERVER, m.kind, VICTIM)]
    if choice == 3:
        for (ex, sender, kind, receiver, tag), old in fz.sent.items():
            if ex == fz.proto.exchange and sender == SERVER and kind == m.kind and receiver == "client0":
                return old
    if choice == 1:
        return dataclasses.replace(m, auth=_flip(m.auth, rng))
    return _with_payload_bytes(m, _flip(_payload_bytes(m), rng))  # mask: a bit of the ring elements' wire bytes


def _stage(m) -> str:
    return Envelope.from_header(m.auth[SIGNATURE_BYTES:]).stage


def _to_dealer(stage: str):
    """Server -> client0 messages of ``stage`` (client0 deals the ckks secret context / mask group seed)."""
    return lambda m: m.sender == SERVER and m.receiver == "client0" and _stage(m) == stage


def _forged_directory(m, rng, fz, identity: bool = False):
    """The server lists a channel key of its own for a peer of client0.

    Signed by itself or with the peer's original signature; with ``identity``, an identity key of its own as well.
    """
    peer = f"client{int(rng.integers(1, K))}"
    server, mitm = fz.proto.server, ChannelKey(peer)
    entry = dict(m.payload[peer], channel=mitm.public_bytes)
    if identity:
        impostor = SigningKey()
        entry.update(
            signing=impostor.public_bytes,
            channel_signature=sign_public_key(impostor, "channel", server.setup.run_id, peer, mitm.public_bytes),
        )
    elif rng.random() < 0.5:
        entry["channel_signature"] = sign_public_key(
            server.signing, "channel", server.setup.run_id, peer, mitm.public_bytes
        )
    return server.seal(dataclasses.replace(m, payload={**m.payload, peer: entry}), "directory")[0]


def _forged_mask_key(m, rng, fz):
    """The server puts a mask key of its own for a peer into client0's key broadcast.

    Signed by itself or followed by the peer's original signature.
    """
    server = fz.proto.server
    peer = int(rng.choice([j for j in m.payload if int(j) != 0]))
    mitm = MaskKeyPair.generate().public_bytes
    forged = (
        signed_mask_key(server.signing, server.setup.run_id, f"client{peer}", mitm)
        if rng.random() < 0.5
        else mitm + bytes(m.payload[peer][len(mitm) :])
    )
    return server.seal(dataclasses.replace(m, payload={**m.payload, peer: forged}), "advertise_keys")[0]


def _stage_of(fz):
    return "masked_upload" if fz.mode == "mask" else "upload"


def _malicious_ckks(m, rng, fz):
    """The sender corrupts its own ciphertext before framing and signing it."""
    from protocols.ckks import wire

    raw = bytearray(wire.unframe(m.payload[0]))
    i = int(rng.integers(len(raw) // 2, len(raw)))
    raw[i] ^= 1 << int(rng.integers(0, 8))
    framed = wire.frame(bytes(raw), len(m.payload[0]) - wire.HEADER_BYTES)  # the size it had
    return fz.proto._seal(dataclasses.replace(m, payload=[framed] + list(m.payload[1:])), "upload", 0)


def _malicious_mask(m, rng, fz):
    """The sender adds an offset to its own ring elements before signing (values past the check)."""
    enc = fz.proto.last_encoding
    data = m.payload["data"]
    y = enc.from_wire(data, (len(data) // enc.bytes_per_value,))
    with np.errstate(over="ignore"):  # ring arithmetic wraps by design
        y[int(rng.integers(0, y.size))] += y.dtype.type(int(rng.integers(1, 1 << 8)))
    return fz.proto._seal(dataclasses.replace(m, payload={**m.payload, "data": enc.to_wire(y)}), "masked_upload")


def _is_keyswitch_request(m) -> bool:
    return (
        m.sender == SERVER
        and m.receiver == VICTIM
        and Envelope.from_header(m.auth[SIGNATURE_BYTES:]).stage == "keyswitch"
    )


def _forged_key_switch(m, rng, fz):
    """A malicious server's own key-switching request (re-signed by it).

    A ``c1`` of its choosing, a recipient that is no client, a second group for one key, or the broadcast group widened
    to blocks the victim does not receive.
    """
    choice, body = int(rng.integers(0, 4)), dict(m.payload)
    if choice == 0:
        body["c1"] = bytes(rng.integers(0, 256, 4096, dtype=np.uint8))
    elif choice == 1:
        body["groups"] = np.array([[int(rng.integers(K, 1 << 20)), len(body["blocks"])]])
    elif choice == 2:
        body["groups"] = np.concatenate([body["groups"], body["groups"]])
        body["blocks"] = np.concatenate([body["blocks"], body["blocks"]])
    else:
        body["groups"] = np.array([[-1, len(body["blocks"]) + 1]])
        body["blocks"] = np.append(body["blocks"], int(np.max(body["blocks"], initial=0)) + 1)
    return fz.proto._seal(dataclasses.replace(m, payload=_as_planned(body)), "keyswitch")


def _as_planned(body: dict) -> dict:
    """A key-switching request whose planned switch (its first batch's) names the request's own groups and blocks."""
    if "planned" not in body:
        return body
    return {**body, "planned": {"groups": body["groups"], "blocks": body["blocks"]}}


def _substituted_recipient_key(m, rng, fz):
    """A malicious server's request to switch to client 2 under a key of its own.

    The signature is kept random, or client 2's signature of another key.
    """
    ring = fz.proto.ring
    primes = np.array(ring.primes, dtype=np.int64)[:, None]
    key = (rng.integers(0, 1 << 31, (primes.size, ring.n)) % primes).astype("<u4").tobytes()
    body = {
        **m.payload,
        "groups": np.array([[2, len(m.payload["blocks"])]]),
        "keys": {2: {"key": key, "sig": bytes(rng.integers(0, 256, 64, dtype=np.uint8))}},
    }
    return fz.proto._seal(dataclasses.replace(m, payload=_as_planned(body)), "keyswitch")


def _call_nonfinite(fz, rng):
    vals = fz.values(rng)
    vals[1][int(rng.integers(0, N_VALUES))] = [np.nan, np.inf, -np.inf][int(rng.integers(0, 3))]
    return vals, {}, fz.next_round(), "fuzz/x"


def _call_first_exchange(f, rng):
    """A run's first exchange on a fresh protocol object: mask keys are advertised once per run."""
    f.proto = make_protocol(f.mode, K)
    return f.values(rng), {}, f.next_round(), "fuzz/x"


def _call_empty(fz, rng):
    choice = int(rng.integers(0, 3))
    if choice == 0:
        return {}, {}, fz.next_round(), "fuzz/x"
    vals = fz.values(rng)
    vals[1] = np.zeros(0) if choice == 1 else np.zeros((N_VALUES, 0))
    return vals, {}, fz.next_round(), "fuzz/x"


def _call_absurd(fz, rng):
    choice = int(rng.integers(0, 6))
    vals = fz.values(rng)
    rnd, tag = fz.next_round(), "fuzz/x"
    if choice == 0:
        rnd = (1 << 63) + int(rng.integers(0, 1 << 20))
    elif choice == 1:
        tag = "fuzz/\udcff"
    elif choice == 2:
        tag = ""
    elif choice == 3:
        vals[1] = vals[1].astype(np.complex128) + 1j
    elif choice == 4:
        vals[1] = np.array(["a"] * N_VALUES)
    else:
        vals = {7: vals[0], 1: vals[1], 2: vals[2]}  # a client id outside 0..K-1
    return vals, {}, rnd, tag


# ---------------------------------------------------------------------- an actively malicious server
def _stage(m) -> str:
    return Envelope.from_header(m.auth[SIGNATURE_BYTES:]).stage if len(m.auth) > SIGNATURE_BYTES else ""


def _is_plan(m) -> bool:
    return m.sender == SERVER and m.receiver == VICTIM and _stage(m) == "plan"


def _resigned_plan(m, fz, **changes):
    """The victim's plan with ``changes``, signed again by the server (an active server)."""
    return fz.proto._seal(dataclasses.replace(m, payload={**m.payload, **changes}), "plan")


def _plan_contributors(m, rng, fz):
    """The server plans another contributor set for the victim.

    The victim alone, a set with a duplicate, or ids outside the run.
    """
    choice = int(rng.integers(0, 3))
    sets = ([1], [1, 1, 2], [0, 1, int(rng.integers(K, 1 << 20))])
    return _resigned_plan(m, fz, contributors=np.asarray(sets[choice], np.int32))


def _plan_threshold(m, rng, fz):
    """The server plans a Shamir threshold other than the run's (mask)."""
    t = int(m.payload["encoding"]["threshold"])
    other = int(rng.choice([v for v in range(0, 2 * K + 1) if v != t]))
    return _resigned_plan(m, fz, encoding={**m.payload["encoding"], "threshold": other})


def _plan_moduli(m, rng, fz):
    """The server names other moduli or another key switch for the victim (ckks-mp).

    A scale below the plan's, a switch level one prime off, or the switch to the broadcast key dropped from a
    broadcast's plan (whose levels are sized for it).
    """
    from protocols.ckks_mp.keyswitch import planned_broadcast_blocks
    from protocols.ckks_mp.params import plan_exchange
    from protocols.plan import ExchangePlan

    plan, encoding = ExchangePlan.from_payload(m.payload), dict(m.payload["encoding"])
    broadcast = planned_broadcast_blocks(encoding, plan.num_blocks).size == plan.num_blocks
    ep = plan_exchange(fz.proto.params, plan.spec, K, plan.dp_noise_std, plan.block_len, broadcast=broadcast)
    choice = int(rng.integers(0, 3 if broadcast else 2))
    if choice == 0:
        encoding["plan"] = dataclasses.replace(ep, scale_bits=ep.scale_bits - int(rng.integers(1, 9))).describe()
    elif choice == 1:
        step = -1 if ep.switch_level > 1 and rng.random() < 0.5 else 1
        encoding["plan"] = dataclasses.replace(ep, switch_level=ep.switch_level + step).describe()
    else:
        del encoding["broadcast_blocks"], encoding["broadcast_to"]
    return _resigned_plan(m, fz, encoding=encoding)


def _plan_other_request(m, rng, fz):
    """The victim is shown another recipient's request (or one for a client outside the run)."""
    other = int(rng.choice([0, 2, K + int(rng.integers(0, 100))]))
    return _resigned_plan(m, fz, requests={**m.payload["requests"], other: np.arange(1, dtype=np.int64)})


def _call_differencing(fz, rng):
    """The same (round, tag) as the previous case, summed again without client 2.

    The difference of the two sums would be client 2's input.
    """
    vals = fz.values(rng)
    del vals[2]
    return vals, {}, fz.round, "fuzz/x"


def _resigned_share(m, rng, fz):
    """The victim corrupts one share of its unmasking answer and signs the result."""
    shares = dict(m.payload["self_mask"])
    u = int(rng.choice(sorted(shares)))
    share = Share.from_bytes(shares[u])
    shares[u] = Share(share.x, (share.y + int(rng.integers(1, 1 << 62))) % PRIME).to_bytes()
    return fz.proto._seal(dataclasses.replace(m, payload={**m.payload, "self_mask": shares}), "unmask")


def _split_unmasking(m, rng, fz):
    """The server asks the victim for its pairwise seed with a survivor.

    The survivor is declared dropped to the victim only and left out of the victim's self-mask request.
    """
    survivors = [int(u) for u in m.payload["self_mask"] if int(u) != 1]
    u = int(rng.choice(survivors))
    payload = {
        **m.payload,
        "self_mask": np.asarray([k for k in m.payload["self_mask"] if int(k) != u], np.int32),
        "pairwise": np.asarray(sorted([*map(int, m.payload["pairwise"]), u]), np.int32),
    }
    return fz.proto._seal(dataclasses.replace(m, payload=payload), "unmask")


def _call_sampled(fz, rng, victim_contributes: bool = False, tag: str = BROADCAST_TAG):
    """An honest sampled broadcast: the round's sample contributes, every client receives.

    With ``victim_contributes``, the next round whose sample holds the victim.
    """
    rnd = fz.next_round()
    while victim_contributes and 1 not in sample_clients(SAMPLE_SEED, rnd, K, SAMPLED_FRACTION):
        rnd = fz.next_round()
    vals = fz.values(rng)
    sample = sample_clients(SAMPLE_SEED, rnd, K, SAMPLED_FRACTION)
    return {k: vals[k] for k in sample}, {"recipients": range(K)}, rnd, tag


def _plan_outside_sample(m, rng, fz):
    """The server plans the broadcast over a contributor set that leaves the round's sample."""
    sample = sample_clients(SAMPLE_SEED, int(m.payload["round"]), K, SAMPLED_FRACTION)
    outside = [k for k in range(K) if k not in sample]
    sets = (list(range(K)), sorted([int(rng.choice(outside)), int(rng.choice(sample))]))
    return _resigned_plan(m, fz, contributors=np.asarray(sets[int(rng.integers(0, 2))], np.int32))


def _plan_scoped_broadcast(m, rng, fz):
    """The server sends the victim, as a recipient of the broadcast, part of its blocks only."""
    own = np.asarray(m.payload["requests"][1], dtype=np.int64)
    cut = own[: int(rng.integers(0, own.size))]
    return _resigned_plan(m, fz, requests={1: cut})


def _call_stale_model(fz, rng):
    """Two honest broadcasts, the second sent to the victim as the first one again.

    The second is re-signed by the server: a model-inconsistency attack; the case's sum, which the victim joins, then
    binds the models each contributor received (in ckks-mp the victim already refuses the replay: a broadcast
    switched to the broadcast key decrypts to noise under another exchange's ``c1``). Each case takes a broadcast tag
    of its own (it leaves the victim's view of it diverged for good).
    """
    if fz.stale_tags >= len(STALE_TAGS):
        fz.proto = fz.scheduled = fz.new_protocol(scheduled=True)
        fz.stale_tags = 0
    tag, kept, stale = STALE_TAGS[fz.stale_tags], fz.proto.intercept, {}
    fz.stale_tags += 1

    def hook(m):
        if m.tag == tag and m.sender == SERVER and m.receiver == VICTIM and _stage(m) == "download":
            if "payload" not in stale:
                stale["payload"] = m.payload
            else:
                return fz.proto._seal(dataclasses.replace(m, payload=stale["payload"]), "download")
        return m

    fz.proto.intercept = hook
    try:
        for _ in range(2):
            vals, kw, rnd, _ = _call_sampled(fz, rng, tag=tag)
            fz.proto.weighted_sum(tag, rnd, vals, spec=SPEC, **kw)
    finally:
        fz.proto.intercept = kept
    return _call_sampled(fz, rng, victim_contributes=True, tag=tag)


CASES = [
    Case("truncation", ("mask", "ckks", "ckks-mp"), True, _is_upload, lambda m, r, f: _truncate(m, r)),
    Case(
        "bitflip_frame",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(m, auth=_flip(m.auth, r)),
    ),
    Case(
        "bitflip_body_recomputed_digest",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: _recomputed_digest(m, r),
    ),
    Case(
        "bitflip_mask_data",
        ("mask",),
        True,
        _is_upload,
        lambda m, r, f: _with_payload_bytes(m, _flip(_payload_bytes(m), r)),
    ),
    Case(
        "bitflip_ckks_ciphertext",
        ("ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: _with_payload_bytes(m, _flip(_payload_bytes(m), r)),
    ),
    Case(
        "bitflip_mask_public_key",
        ("mask",),
        True,
        lambda m: m.sender == VICTIM and m.kind == "public_key" and m.tag == "fuzz/x",
        lambda m, r, f: dataclasses.replace(m, payload=_flip(m.payload, r)),
        call=_call_first_exchange,
    ),
    Case(
        "bitflip_shares",
        ("mask",),
        True,
        lambda m: m.sender == VICTIM and ((m.kind == "ciphertext" and m.relay == SERVER) or m.kind == "share"),
        lambda m, r, f: (
            dataclasses.replace(m, payload=_flip(m.payload, r))
            if isinstance(m.payload, bytes)
            else dataclasses.replace(
                m, payload={**m.payload, "self_mask": {u: _flip(raw, r) for u, raw in m.payload["self_mask"].items()}}
            )
        ),
    ),
    Case(
        "wrong_fingerprint",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(m, fingerprint=os.urandom(8).hex()),
    ),
    Case(
        "wrong_round",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(m, round=m.round + int(r.integers(1, 1 << 30))),
    ),
    Case(
        "wrong_tag",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(m, tag="fuzz/other"),
    ),
    Case("wrong_stage", ("mask", "ckks", "ckks-mp"), True, _is_upload, lambda m, r, f: f.proto._seal(m, "download")),
    Case(
        "wrong_recipient",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: f.proto._seal(dataclasses.replace(m, receiver="client2"), _stage_of(f)),
    ),
    Case("wrong_session", ("mask", "ckks", "ckks-mp"), True, _is_upload, lambda m, r, f: f.other_session(m)),
    Case(
        "replay_same_round", ("mask", "ckks", "ckks-mp"), True, _is_upload, lambda m, r, f: f.replay(m, same_round=True)
    ),
    Case(
        "replay_later_round",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: f.replay(m, same_round=False),
    ),
    # the victim's upload delivered a second time, in client 2's slot; and a message of an
    # earlier stage of the victim re-delivered at a later stage (mask)
    Case(
        "duplicate_upload",
        ("mask", "ckks", "ckks-mp"),
        True,
        lambda m: m.sender == "client2" and m.receiver == SERVER and m.kind in ("masked", "ciphertext"),
        lambda m, r, f: f.victim_upload(m),
    ),
    Case(
        "duplicate_earlier_stage",
        ("mask",),
        True,
        lambda m: m.sender == VICTIM and m.receiver == SERVER and m.tag == "fuzz/x" and m.kind == "share",
        lambda m, r, f: f.earlier_upload(m),
    ),
    Case(
        "other_client_payload",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(m, payload=f.other_payload(m)),
    ),
    Case(
        "sender_spoofing",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(m, sender="client2"),
    ),
    Case(
        "changed_block_ids",
        ("mask",),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(m, payload={**m.payload, "block_ids": m.payload["block_ids"] + 1}),
    ),
    Case(
        "changed_shape",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(m, shape=(m.shape[0], m.shape[1] + int(r.integers(1, 9)))),
    ),
    Case(
        "changed_dtype",
        ("mask",),
        True,
        _is_upload,
        lambda m, r, f: dataclasses.replace(
            m, payload={**m.payload, "data": np.frombuffer(m.payload["data"], np.uint8).astype(np.float32)}
        ),
    ),
    Case("download_tampering", ("mask", "ckks", "ckks-mp"), True, _is_download, _tamper_download),
    Case("nonfinite_input", ("mask", "ckks", "ckks-mp"), True, call=_call_nonfinite, expected=ProtocolError),
    Case("empty_input", ("mask", "ckks", "ckks-mp"), True, call=_call_empty, expected=ProtocolError),
    Case("absurd_metadata", ("mask", "ckks", "ckks-mp"), True, call=_call_absurd, expected=ProtocolError),
    Case(
        "substituted_channel_key",
        ("mask", "ckks"),
        True,
        _to_dealer("directory"),
        _forged_directory,
        expected=KeySubstitutionError,
        tag=AUTH_TAG,
        fresh=True,
    ),
    Case(
        "substituted_identity_key",
        ("mask", "ckks"),
        True,
        _to_dealer("directory"),
        lambda m, r, f: _forged_directory(m, r, f, identity=True),
        expected=KeySubstitutionError,
        tag=AUTH_TAG,
        fresh=True,
    ),
    Case(
        "substituted_mask_key",
        ("mask",),
        True,
        lambda m: (
            _to_dealer("advertise_keys")(m)
            and m.kind == "public_key"
            and isinstance(m.payload, dict)
            and len(m.payload) > 1
        ),
        _forged_mask_key,
        expected=KeySubstitutionError,
        fresh=True,
    ),
    # an active server (it signs what it sends) and a client that re-signs what it corrupts
    Case("plan_contributors", ("mask", "ckks"), True, _is_plan, _plan_contributors, expected=PlanRefusedError),
    Case("plan_recipients", ("mask", "ckks"), True, _is_plan, _plan_other_request, expected=PlanRefusedError),
    Case("plan_threshold", ("mask",), True, _is_plan, _plan_threshold, expected=PlanRefusedError),
    Case("plan_moduli", ("ckks-mp",), True, _is_plan, _plan_moduli, expected=ModulusPlanError),
    Case(
        "differencing_same_round", ("mask", "ckks"), True, call=_call_differencing, expected=RepeatedContributionError
    ),
    Case(
        "split_unmasking",
        ("mask",),
        True,
        lambda m: m.sender == SERVER and m.receiver == VICTIM and _stage(m) == "unmask" and m.tag == "fuzz/x",
        _split_unmasking,
        expected=ConsistencyError,
    ),
    Case(
        "resigned_shares",
        ("mask",),
        True,
        lambda m: m.sender == VICTIM and m.kind == "share" and m.tag == "fuzz/x",
        _resigned_share,
        expected=ShareIntegrityError,
    ),
    # the public schedule: the round's sample, the broadcast role, the same model for everyone
    Case(
        "plan_outside_sample",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_plan,
        _plan_outside_sample,
        call=_call_sampled,
        expected=PlanRefusedError,
        tag=BROADCAST_TAG,
        scheduled=True,
    ),
    Case(
        "plan_scoped_broadcast",
        ("mask", "ckks", "ckks-mp"),
        True,
        _is_plan,
        _plan_scoped_broadcast,
        call=_call_sampled,
        expected=PlanRefusedError,
        tag=BROADCAST_TAG,
        scheduled=True,
    ),
    Case(
        "model_inconsistency",
        ("mask", "ckks-mp"),
        True,
        call=_call_stale_model,
        expected=InconsistentViewError,
        tag=BROADCAST_TAG,
        scheduled=True,
        must_reject=True,
    ),
    Case("malicious_sender_ciphertext", ("ckks",), False, _is_upload, _malicious_ckks, expected=ProtocolError),
    Case("malicious_sender_values", ("mask",), False, _is_upload, _malicious_mask, expected=ProtocolError),
    # a malicious server's own messages, signed by it (active adversary): must be refused
    Case(
        "forged_key_switch",
        ("ckks-mp",),
        True,
        _is_keyswitch_request,
        _forged_key_switch,
        expected=(KeySwitchRefusedError, IntegrityError),
    ),
    Case(
        "key_substitution",
        ("ckks-mp",),
        True,
        _is_keyswitch_request,
        _substituted_recipient_key,
        expected=KeySubstitutionError,
    ),
]


class Fuzzer:
    """One protocol object per backend (one CKKS context for every case)."""

    def __init__(self, mode: str, seed: int = 0):
        self.mode = mode
        self.proto = self.new_protocol()
        self.scheduled = None  # the protocol with a public schedule (made on first use)
        self.stale_tags = 0  # STALE_TAGS used on it
        self.round = 0
        self.sent: dict[tuple, object] = {}  # (exchange, sender, kind, receiver) -> message, as signed
        self.prev_exchange: dict[tuple, object] = {}

    def new_protocol(self, scheduled: bool = False):
        """A fresh protocol of this backend, optionally with the public client-sampling schedule and broadcast roles."""
        options = {"params": "n4096"} if self.mode == "ckks" else {}
        if not scheduled:
            return make_protocol(self.mode, K, **options)
        roles = {tag: BROADCAST for tag in (BROADCAST_TAG, *STALE_TAGS)}
        return make_protocol(self.mode, K, seed=SAMPLE_SEED, client_fraction=SAMPLED_FRACTION, roles=roles, **options)

    def values(self, rng) -> dict[int, np.ndarray]:
        """Honest inputs: ``N_VALUES`` uniform floats in [-1, 1] per client."""
        return {k: rng.uniform(-1, 1, N_VALUES) for k in range(K)}

    def next_round(self) -> int:
        """Advance to and return the next round number."""
        self.round += 1
        return self.round

    # -- helpers the tampers use
    def _record(self, m):
        self.sent[(self.proto.exchange, m.sender, m.kind, m.receiver, m.tag)] = m

    def other_session(self, m):
        """Tamper: ``m`` re-sealed under another session id."""
        current, self.proto.session = self.proto.session, os.urandom(16)
        try:
            return self.proto._seal(m, _stage_of(self))
        finally:
            self.proto.session = current

    def replay(self, m, same_round: bool):
        """Tamper: the previous exchange's message of this sender, kind and receiver (optionally this round's)."""
        old = self.prev_exchange.get((m.sender, m.kind, m.receiver))
        if old is None:
            return m
        return old if not same_round else dataclasses.replace(old, round=m.round)

    def earlier_upload(self, m):
        """Tamper: another upload of the same sender in this exchange, else its upload of the previous exchange."""
        for (ex, sender, kind, receiver, tag), old in self.sent.items():
            if (
                ex == self.proto.exchange
                and sender == m.sender
                and receiver == SERVER
                and old is not m
                and kind != m.kind
            ):
                return old
        return self.prev_exchange.get((m.sender, m.kind, m.receiver), m)

    def victim_upload(self, m):
        """Tamper: the victim client's upload of the same kind in this exchange."""
        for (ex, sender, kind, receiver, tag), old in self.sent.items():
            if ex == self.proto.exchange and sender == VICTIM and kind == m.kind and receiver == SERVER:
                return old
        return m

    def other_payload(self, m):
        """Tamper: the payload of another client's upload of the same kind."""
        for (ex, sender, kind, receiver, tag), old in self.sent.items():
            if ex == self.proto.exchange and kind == m.kind and receiver == SERVER and sender != m.sender:
                return old.payload
        return self.prev_exchange.get(("client0", m.kind, SERVER), m).payload

    # -- one case
    def run(self, case: Case, rng) -> str:
        """Run one case and classify its outcome, on a fresh or the scheduled protocol when the case asks for one."""
        if not (case.fresh or case.scheduled):
            return self._run(case, rng)
        kept = self.proto, self.sent, self.prev_exchange
        if case.fresh:
            proto = self.new_protocol(case.scheduled)
        else:  # one protocol with the public schedule for every case that needs it
            if self.scheduled is None:
                self.scheduled = self.new_protocol(scheduled=True)
            proto = self.scheduled
        self.proto, self.sent, self.prev_exchange = proto, {}, {}
        try:
            return self._run(case, rng)
        finally:
            self.proto, self.sent, self.prev_exchange = kept

    def _run(self, case: Case, rng) -> str:
        tampered = []

        def hook(m):
            if m.tag not in ("fuzz/x", case.tag):
                return m
            if case.target is not None and case.target(m) and not tampered:
                out = case.tamper(m, rng, self)
                tampered.append(out is not m)
                self._record(m)
                return out
            self._record(m)
            return m

        if case.call is not None:
            try:  # a case's set-up exchanges may already meet the attack (ckks-mp: a replayed broadcast)
                vals, kw, rnd, tag = case.call(self, rng)
            except case.expected:
                return "rejected"
        else:
            vals, kw, rnd, tag = self.values(rng), {}, self.next_round(), "fuzz/x"
        self.proto.intercept = hook
        try:
            got = self.proto.weighted_sum(tag, rnd, vals, spec=SPEC, **kw)
        except case.expected:
            return "rejected"
        except ProtocolError:
            return "unexpected" if case.expected is not ProtocolError else "rejected"
        except Exception:  # noqa: BLE001 -- classifying every other exception is the point
            return "unexpected"
        finally:
            self.proto.intercept = None
            self.prev_exchange = {
                (m.sender, m.kind, m.receiver): m for (ex, *_), m in self.sent.items() if ex == self.proto.exchange
            } or self.prev_exchange
            self.sent = {k: v for k, v in self.sent.items() if k[0] == self.proto.exchange}
        if case.must_reject:
            return "accepted_wrong"
        want = sum(np.asarray(v, dtype=np.float64) for v in vals.values())
        ok = np.shape(got) == np.shape(want) and np.allclose(got, want, atol=SPEC.tolerance * 10)
        return "accepted_correct" if ok else "accepted_wrong"


def run_fuzz(cases: int, *, seed: int = 0, backends=("mask", "ckks", "ckks-mp"), categories=None) -> list[dict]:
    """``cases`` fuzz cases split evenly over every (backend, category) pair; one record per pair."""
    selected = [c for c in CASES if categories is None or c.name in categories]
    pairs = [(b, c) for b in backends for c in selected if b in c.backends]
    per = max(1, cases // max(1, len(pairs)))
    rng = np.random.default_rng(seed)
    fuzzers = {b: Fuzzer(b) for b in backends}
    out = []
    for b, c in pairs:
        fz = fuzzers[b]
        fz.values(rng)
        counts = {"rejected": 0, "accepted_correct": 0, "accepted_wrong": 0, "unexpected": 0}
        for _ in range(per):
            counts[fz.run(c, rng)] += 1
        out.append({"backend": b, "category": c.name, "in_model": c.in_model, "cases": per, **counts})
    return out


def format_table(records: list[dict]) -> str:
    """The fuzz records as a fixed-width text table."""
    head = (
        f"{'backend':<7} {'category':<32} {'model':<5} {'cases':>6} {'rejected':>9} {'acc-ok':>7} "
        f"{'acc-WRONG':>9} {'unexpected':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(
            f"{r['backend']:<7} {r['category']:<32} {'in' if r['in_model'] else 'out':<5} {r['cases']:>6} "
            f"{r['rejected']:>9} {r['accepted_correct']:>7} {r['accepted_wrong']:>9} {r['unexpected']:>10}"
        )
    return "\n".join(lines)


def run_fuzz_bench(out_dir: str, cases: int = 20000, seed: int = 0) -> list[dict]:
    """Run ``cases`` fuzz cases, print the table and write ``OUT/fuzz.json``."""
    t0 = time.perf_counter()
    records = run_fuzz(cases, seed=seed)
    print(format_table(records))
    inm = [r for r in records if r["in_model"]]
    print(
        f"in-model: {sum(r['cases'] for r in inm)} cases, accepted-WRONG {sum(r['accepted_wrong'] for r in inm)}, "
        f"unexpected {sum(r['unexpected'] for r in inm)}; {time.perf_counter() - t0:.0f} s"
    )
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "fuzz.json").write_text(json.dumps(records, indent=1))
    print(f"wrote {path / 'fuzz.json'}")
    return records


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=20000, help="number of tampered messages")
    ap.add_argument("--out", default="runs/bench", help="folder the results are written to")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tampering cases")
    a = ap.parse_args()
    run_fuzz_bench(a.out, a.cases, a.seed)
