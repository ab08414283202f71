"""Mask ShareKeys as one signed bundle per client (issue 17): an entry per peer, each entry
channel-encrypted for that peer alone; the server forwards the whole signed bundle."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocols import SERVER, ValueSpec
from protocols.channel import associated_data
from protocols.errors import DigestError, IntegrityError, ProtocolError
from protocols.mask import MaskProtocol
from protocols.message import SIGNATURE_BYTES, Envelope
from protocols.transcript import client_party

SPEC = ValueSpec(max_abs=1.0, tolerance=1e-4)
K = 4


def _values(n=50, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, n) for k in range(K)}


def _bundles(proto, tag="x/t"):
    return [m for m in proto.transcript.select(tag=tag, receiver=SERVER)
            if Envelope.from_header(m.auth[SIGNATURE_BYTES:]).stage == "share_keys"]


def test_one_signed_bundle_per_client_and_the_sum_is_exact():
    proto = MaskProtocol(K)
    x = _values()
    got = proto.weighted_sum("x/t", 0, x, spec=SPEC)
    np.testing.assert_allclose(got, sum(x.values()), atol=1e-3)
    bundles = _bundles(proto)
    assert sorted(m.sender for m in bundles) == [client_party(k) for k in range(K)]
    for m in bundles:                      # one ciphertext entry for every other participant
        assert m.kind == "ciphertext" and sorted(m.payload) == [j for j in range(K) if client_party(j) != m.sender]
    forwarded = [m for m in proto.transcript.select(tag="x/t") if m.relay == SERVER
                 and Envelope.from_header(m.auth[SIGNATURE_BYTES:]).stage == "share_keys"]
    assert len(forwarded) == K * (K - 1)   # the bytes of each copy the server forwards are counted
    assert {bytes(m.auth) for m in forwarded} == {bytes(m.auth) for m in bundles}


def test_an_entry_opens_only_for_its_peer():
    """A recipient that gets another peer's entry (the server moving entries around) cannot open it."""
    proto = MaskProtocol(K)
    proto.weighted_sum("x/t", 0, _values(), spec=SPEC)
    bundle = next(m for m in _bundles(proto) if m.sender == "client1")
    env = Envelope.from_header(bundle.auth[SIGNATURE_BYTES:])
    half = proto.clients[2]
    ad = associated_data(proto.run_id, proto.session, env.exchange, bundle.round, bundle.tag, "share_keys",
                         "client1", "client2")
    channel_of_1 = half.registry.channel["client1"]
    assert half.channel.open("client1", channel_of_1, proto.run_id, bundle.payload[2], ad, {})   # its own: opens
    for other in (0, 3):
        with pytest.raises(IntegrityError, match="does not authenticate"):
            half.channel.open("client1", channel_of_1, proto.run_id, bundle.payload[other], ad, {})


@pytest.mark.parametrize("tamper", ("swap_entries", "drop_entry", "other_exchange"))
def test_a_bundle_changed_by_the_server_is_refused_and_nothing_is_aggregated(tamper):
    proto = MaskProtocol(K)
    proto.weighted_sum("x/t", 0, _values(), spec=SPEC)          # an earlier exchange, to replay from
    earlier = next(m for m in _bundles(proto) if m.sender == "client1")
    forward = proto.server.forward

    def forward_changed(client, msg):
        if msg.sender == "client1" and client == 2 and isinstance(msg.payload, dict):
            if tamper == "swap_entries":
                msg = dataclasses.replace(msg, payload={**msg.payload, 2: msg.payload[3], 3: msg.payload[2]})
            elif tamper == "drop_entry":
                msg = dataclasses.replace(msg, payload={j: c for j, c in msg.payload.items() if j != 2})
            else:
                msg = earlier
        forward(client, msg)

    proto.server.forward = forward_changed
    before = len(proto.transcript.messages)
    with pytest.raises(ProtocolError) as err:
        proto.weighted_sum("x/t", 1, _values(seed=1), spec=SPEC)
    assert isinstance(err.value, (DigestError, IntegrityError)) and err.value.client in (1, 2)
    downloads = [m for m in proto.transcript.messages[before:] if m.sender == SERVER and m.kind == "masked"]
    assert downloads == []                                          # nothing aggregated, nothing delivered
