"""A server (or network) that deviates from the protocol.

Each attack is refused with a specific ProtocolError, or gets nothing. Malicious server halves are subclasses of the
honest ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocols import SERVER, ValueSpec, make_protocol
from protocols.ckks import CKKSProtocol
from protocols.ckks.server import CKKSServer
from protocols.errors import (
    AuthenticationError,
    BoundError,
    ConfigurationError,
    ConsistencyError,
    IntegrityError,
    PlanRefusedError,
    RepeatedContributionError,
    ShareIntegrityError,
    ThresholdRefusedError,
    TooFewContributorsError,
)
from protocols.framing import message_to_bytes, pack_bundle
from protocols.mask import MaskProtocol
from protocols.mask.client import MaskClient
from protocols.mask.server import MaskServer
from protocols.mask.shamir import Share, split_secret
from protocols.party import envelope_of

SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)
MODES = ("plain", "mask", "ckks", "ckks-mp")


def _values(K, n=40, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, n) for k in range(K)}


# ---------------------------------------------------------------------- exchange numbers
@pytest.mark.parametrize("mode", MODES)
def test_unsigned_packet_cannot_advance_a_clients_exchange(mode):
    """Unsigned packet cannot advance a clients exchange.

    A packet claiming sender 'server' with exchange + 1000 and no valid signature is refused
    and leaves the client's exchange number alone: the next honest exchange still reaches it.
    """
    K = 3
    proto = make_protocol(mode, K)
    x = _values(K)
    proto.weighted_sum("w", 0, x, spec=SPEC)
    last = [m for m in proto.transcript.messages if m.sender == SERVER and m.receiver == "client1" and m.auth][-1]
    env = envelope_of(last)
    forged_env = dataclasses.replace(env, exchange=env.exchange + 1000)
    forged = dataclasses.replace(last, auth=bytes(64) + forged_env.header_bytes())
    with pytest.raises(AuthenticationError):
        proto.clients[1].handle("plan", pack_bundle([message_to_bytes(forged)]))
    assert proto.clients[1].exchange == env.exchange
    y = _values(K, seed=1)
    got = proto.weighted_sum("w", 1, y, spec=SPEC)
    assert np.allclose(got, sum(y.values()), atol=1e-2)


# ---------------------------------------------------------------------- unexpected exception types
class SharedIdsShiftingServer(MaskServer):
    """Re-signs the sparse 'block ids shared with each peer' message to client 1 with other ids."""

    def queue(self, client, msg, stage, part=0):
        if stage == "block_ids" and client == 1 and msg.kind == "metadata":
            msg = dataclasses.replace(
                msg, payload={j: (np.asarray(c) + 1).astype(np.int32) for j, c in msg.payload.items()}
            )
        super().queue(client, msg, stage, part)


class ScaleRaisingServer(CKKSServer):
    """Plans a CKKS scale 2^30 past the one the public bounds give (past the chain's modulus)."""

    def begin(self, plan, link, fingerprint, extra=()):
        encoding = dict(plan.encoding)
        encoding["plan"] = {**encoding["plan"], "scale_bits": int(encoding["plan"]["scale_bits"]) + 30}
        super().begin(dataclasses.replace(plan, encoding=encoding), link, fingerprint, extra)


def test_resigned_sparse_block_ids_are_refused_not_an_index_error():
    class Proto(MaskProtocol):
        server_half = SharedIdsShiftingServer

    proto = Proto(3, block_size=2)
    rows = {
        0: (np.array([0, 1, 2]), np.ones((3, 2))),
        1: (np.array([0, 1]), np.full((2, 2), 2.0)),
        2: (np.array([1, 2]), np.ones((2, 2))),
    }
    with pytest.raises(IntegrityError, match="not a sorted subset"):
        proto.row_sum(
            "r", 0, rows, {0: np.array([0, 1, 2])}, 4, layout="sparse", spec=ValueSpec(max_abs=4, tolerance=1e-3)
        )


def test_plan_past_the_ckks_modulus_is_a_bound_error_not_a_value_error():
    class Proto(CKKSProtocol):
        server_half = ScaleRaisingServer

    proto = Proto(3, fixed_point_bits=20)
    with pytest.raises(BoundError, match="past the chain's modulus"):
        proto.weighted_sum("w", 0, _values(3), spec=SPEC)


# ---------------------------------------------------------------------- clients check every plan
def _server_planning(base: type, tamper):
    """A server half of ``base`` that runs every exchange on ``tamper(plan)`` instead of its plan."""

    class Tampering(base):
        def run(self, plan, link):
            return super().run(tamper(plan), link)

    return Tampering


def _protocol(mode: str, server_tamper, K: int = 4, **options):
    cls = make_protocol(mode, K).__class__
    server = _server_planning(cls.server_half, server_tamper)
    return type(f"Tampered{cls.__name__}", (cls,), {"server_half": server})(K, **options)


def _single_contributor(plan):
    """Item 1 of the attacks: the victim (client 2) alone, delivered to a colluder (client 1)."""
    if plan.tag != "attack":
        return plan
    return dataclasses.replace(plan, contributors=(2,), requests={1: plan.requests[1]})


@pytest.mark.parametrize("mode", ["mask", "ckks", "ckks-mp"])
def test_single_contributor_exchange_is_refused(mode):
    proto = _protocol(mode, _single_contributor)
    x = _values(4)
    assert np.allclose(proto.weighted_sum("w", 0, x, spec=SPEC), sum(x.values()), atol=1e-2)
    with pytest.raises(TooFewContributorsError, match="fewer than the run's minimum of 2") as err:
        proto.weighted_sum("attack", 1, x, spec=SPEC, recipients=[1])
    assert err.value.client == 2
    assert not [m for m in proto.transcript.messages if m.tag == "attack" and m.sender == "client2"]


@pytest.mark.parametrize("mode", ["mask", "ckks"])
def test_min_contributors_is_a_run_parameter_not_a_plan_field(mode):
    """With c = 1 every client requires 3 contributors; a 2-contributor plan is refused."""
    x = _values(4)
    with pytest.raises(TooFewContributorsError, match="minimum of 3"):
        make_protocol(mode, 4, max_colluders=1).weighted_sum("w", 0, {0: x[0], 1: x[1]}, spec=SPEC)
    proto = make_protocol(mode, 4, max_colluders=1)
    assert np.allclose(
        proto.weighted_sum("w", 0, {k: x[k] for k in (0, 1, 2)}, spec=SPEC), x[0] + x[1] + x[2], atol=1e-2
    )
    with pytest.raises(ConfigurationError, match="--min-contributors >= 3"):
        make_protocol(mode, 4, max_colluders=1, min_contributors=2)


class _Differencing:
    """The differencing attack.

    The same (round, tag) summed twice, the second time without the victim (client 3): the difference is the
    victim's input.
    """

    def __init__(self):
        self.seen = set()

    def __call__(self, plan):
        key = (plan.round, plan.tag)
        if key in self.seen:
            return dataclasses.replace(plan, contributors=tuple(k for k in plan.contributors if k != 3))
        self.seen.add(key)
        return plan


@pytest.mark.parametrize("mode", ["mask", "ckks", "ckks-mp"])
def test_differencing_two_sums_of_one_round_and_tag_is_refused(mode):
    proto = _protocol(mode, _Differencing())
    x = _values(4)
    proto.weighted_sum("w", 0, x, spec=SPEC)
    with pytest.raises(RepeatedContributionError, match="already contributed"):
        proto.weighted_sum("w", 0, x, spec=SPEC)


# ---------------------------------------------------------------------- mask: t from the run
def _lower_threshold(plan):
    return dataclasses.replace(plan, encoding={**plan.encoding, "threshold": 1})


def test_mask_threshold_comes_from_the_run_not_the_plan():
    """A server that plans t = 1 (every share the secret itself) is refused before any share is dealt."""
    proto = _protocol("mask", _lower_threshold)
    with pytest.raises(ThresholdRefusedError, match="the run's setup gives t=3"):
        proto.weighted_sum("w", 0, _values(4), spec=SPEC)
    assert not [m for m in proto.transcript.messages if m.tag == "w" and envelope_of(m).stage == "share_keys"]


def test_shamir_split_refuses_a_threshold_below_two_or_above_n():
    for t in (0, 1, 4):
        with pytest.raises(ValueError, match=r"must lie in \[2, 3\]"):
            split_secret(bytes(32), [1, 2, 3], t)


def test_an_explicit_threshold_below_the_active_condition_is_refused():
    """A threshold t = 2 of 5 contributors: two disjoint sets of 2 could each unmask; 2t > n + c fails."""
    with pytest.raises(ThresholdRefusedError, match="2t > n \\+ c"):
        MaskProtocol(5, threshold=2).weighted_sum("w", 0, _values(5), spec=SPEC)


# ---------------------------------------------------------------------- mask: share integrity
class ShareCorruptingClient(MaskClient):
    """Client 1 adds 1 to every share it reveals for unmasking, and signs the result."""

    def stage_unmask(self, inbox):
        out = super().stage_unmask(inbox)
        if self.id != 1:
            return out
        ((msg, _),) = out
        shares = {
            u: Share(Share.from_bytes(raw).x, Share.from_bytes(raw).y + 1).to_bytes()
            for u, raw in msg.payload["self_mask"].items()
        }
        return [self.seal(dataclasses.replace(msg, payload={**msg.payload, "self_mask": shares}), "unmask")]


def test_a_corrupted_share_is_refused_naming_its_sender():
    class Proto(MaskProtocol):
        client_half = ShareCorruptingClient

    with pytest.raises(ShareIntegrityError, match="corrupted by client 1") as err:
        Proto(4).weighted_sum("w", 0, _values(4), spec=SPEC)
    assert err.value.client == 1


# ---------------------------------------------------------------------- the run: options, result.json
SMALL = dict(
    algorithm="fedavg",
    dataset="sbm",
    synthetic={"num_nodes": 120, "num_features": 8, "num_classes": 3},
    rounds=1,
    seed=0,
)


def test_too_few_sampled_clients_fail_before_work_naming_the_option():
    from secure_fgl.config import ConfigError, RunConfig
    from secure_fgl.experiment import run_experiment

    with pytest.raises(ConfigError, match="--min-contributors") as err:
        run_experiment(RunConfig(mode="mask", clients=3, max_colluders=2, **SMALL), progress=False)
    assert "\n" not in str(err.value)


def test_result_records_the_threat_model():
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment

    res = run_experiment(RunConfig(mode="mask", clients=4, max_colluders=1, **SMALL), progress=False)
    tm = res["threat_model"]
    assert (tm["mode"], tm["max_colluders"], tm["min_contributors"]) == ("mask", 1, 3)
    assert "consistency round" in tm["holds"] and "2t > n + c" in tm["holds"] and tm["not_protected"]


# ---------------------------------------------------------------------- mask: consistency round
class SplitUnmaskingServer(MaskServer):
    """Tells client 3 that client 4 dropped while the others see no dropout.

    Tells client 3 that client 4 dropped (so it would reveal its pairwise seed with client 4)
    while the others are told client 4 survived (so they reveal their shares of its self mask):
    together, client 4's input unmasked.
    """

    def _msg(self, k, kind, shape, payload, note=""):
        if note in ("survivor set", "unmasking request") and k == 3 and self.plan.tag == "split":
            if note == "survivor set":
                payload = {"survivors": np.asarray([0, 1, 2, 3], np.int32)}
            else:
                payload = {
                    **payload,
                    "self_mask": np.asarray([0, 1, 2, 3], np.int32),
                    "pairwise": np.asarray([4], np.int32),
                }
        return super()._msg(k, kind, shape, payload, note)


def test_split_unmasking_requests_are_refused_by_the_consistency_round():
    """K = 5, t = 3: the server cannot gather 3 signatures over each of two survivor sets."""

    class Proto(MaskProtocol):
        server_half = SplitUnmaskingServer

    proto = Proto(5)
    x = _values(5)
    assert np.allclose(proto.weighted_sum("w", 0, x, spec=SPEC), sum(x.values()), atol=1e-2)
    with pytest.raises(ConsistencyError, match="client 3") as err:
        proto.weighted_sum("split", 0, x, spec=SPEC)
    assert "different survivor sets" in str(err.value)
    answers = [m for m in proto.transcript.messages if m.tag == "split" and m.kind == "share"]
    assert not [m for m in answers if len(m.payload["pairwise"])]  # no pairwise seed with client 4 left


class MacRelayServer(MaskServer):
    """Keeps the survivor-set MACs of the consistency round and changes what it relays to client 3 as client 0's.

    ``swap``: ``misrouted`` relays the MAC client 0 addressed to client 1, ``reflected`` the one client 3 itself
    addressed to client 0, ``forged`` 32 random bytes.
    """

    swap = "misrouted"

    def stage_consistency(self, ex, link):
        super().stage_consistency(ex, link)
        self.held = ex.macs

    def _msg(self, k, kind, shape, payload, note=""):
        if note == "unmasking request" and k == 3 and self.plan.tag == "attack":
            relayed = {"misrouted": self.held[0][1], "reflected": self.held[3][0], "forged": bytes(range(32))}
            senders = [int(i) for i in payload["mac_senders"]]
            assert senders[0] == 0  # client 0's MAC comes first
            payload = {**payload, "macs": relayed[self.swap] + payload["macs"][32:]}
        return super()._msg(k, kind, shape, payload, note)


def _attack_outcome(proto):
    """What left the clients in exchange 'attack': their unmasking answers and any download."""
    msgs = [m for m in proto.transcript.messages if m.tag == "attack"]
    return [m for m in msgs if m.kind == "share"], [m for m in msgs if m.sender == SERVER and m.kind == "masked"]


@pytest.mark.parametrize("swap", ["misrouted", "reflected", "forged"])
def test_a_survivor_set_mac_relayed_to_the_wrong_client_or_forged_is_refused(swap):
    """A MAC is bound to its key, its sender and its receiver: the server can only relay it to that receiver."""

    class Proto(MaskProtocol):
        server_half = type("Server", (MacRelayServer,), {"swap": swap})

    proto = Proto(5)
    x = _values(5)
    assert np.allclose(proto.weighted_sum("w", 0, x, spec=SPEC), sum(x.values()), atol=1e-2)
    with pytest.raises(ConsistencyError, match="client 0's pairwise-MAC signature is not over") as err:
        proto.weighted_sum("attack", 0, x, spec=SPEC)
    assert err.value.client == 3
    answers, downloads = _attack_outcome(proto)
    assert not [m for m in answers if m.sender == "client3"] and not downloads
    assert all(half._result is None for half in proto.clients.values())


class SplitMacServer(MaskServer):
    """Tells clients 2 and 3 that client 4 dropped, the others that it survived; relays only the MACs that verify.

    Each group is sent the MACs of its own members alone, so no client sees a MAC over another set: the split
    must fail on the count, ``t`` MACs over one set.
    """

    SPLIT = (2, 3)

    def _msg(self, k, kind, shape, payload, note=""):
        if self.plan.tag == "attack" and note in ("survivor set", "unmasking request"):
            group = self.SPLIT if k in self.SPLIT else (0, 1, 4)
            if note == "survivor set" and k in self.SPLIT:
                payload = {"survivors": np.asarray([0, 1, 2, 3], np.int32)}
            elif note == "unmasking request":
                kept = [n for n, i in enumerate(payload["mac_senders"]) if i in group]
                payload = {
                    **payload,
                    "mac_senders": np.asarray(payload["mac_senders"])[kept],
                    "macs": b"".join(payload["macs"][32 * n : 32 * (n + 1)] for n in kept),
                }
                if k in self.SPLIT:
                    payload.update(self_mask=np.asarray([0, 1, 2, 3], np.int32), pairwise=np.asarray([4], np.int32))
        return super()._msg(k, kind, shape, payload, note)


def test_a_split_survivor_set_gets_fewer_than_t_macs_and_is_refused():
    """K = 5, t = 3: the group told that client 4 dropped holds 2 MACs over its set, and reveals nothing."""

    class Proto(MaskProtocol):
        server_half = SplitMacServer

    proto = Proto(5)
    x = _values(5)
    with pytest.raises(ConsistencyError, match="only 2 survivors signed the survivor set, fewer than t=3") as err:
        proto.weighted_sum("attack", 0, x, spec=SPEC)
    assert err.value.client in SplitMacServer.SPLIT
    answers, downloads = _attack_outcome(proto)
    assert not [m for m in answers if len(m.payload["pairwise"])] and not downloads  # no seed with client 4
    assert not [m for m in answers if m.sender in ("client2", "client3")]
    assert all(half._result is None for half in proto.clients.values())


class IgnoresRefusalServer(MaskServer):
    """Plans client 2 alone for tag 'attack' and, when refused, asks it for its upload anyway."""

    def run(self, plan, link):
        if plan.tag != "attack":
            return super().run(plan, link)
        plan = dataclasses.replace(plan, contributors=(2,), requests={1: plan.requests[1]})
        self.begin(plan, link, self.fingerprint)
        with pytest.raises(TooFewContributorsError):
            self.call(link, "masked_upload", {2: []})
        return tuple(self.call(link, "masked_upload", {2: []}))


def test_a_refused_plan_is_never_contributed_to_later_in_the_exchange():
    class Proto(MaskProtocol):
        server_half = IgnoresRefusalServer

    proto = Proto(4)
    proto.weighted_sum("w", 0, _values(4), spec=SPEC)
    with pytest.raises(PlanRefusedError, match="takes no further part"):
        proto.weighted_sum("attack", 1, _values(4), spec=SPEC, recipients=[1])
    assert not [m for m in proto.transcript.messages if m.tag == "attack" and m.sender == "client2"]
