"""A server (or network) that deviates from the protocol: each attack is refused with a specific
ProtocolError, or gets nothing.  Malicious server halves are subclasses of the honest ones."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocols import SERVER, ValueSpec, make_protocol
from protocols.errors import AuthenticationError, ProtocolError
from protocols.framing import message_to_bytes, pack_bundle
from protocols.party import envelope_of

SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)
MODES = ("plain", "mask", "ckks", "ckks-mp")


def _values(K, n=40, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, n) for k in range(K)}


# ---------------------------------------------------------------------- exchange numbers
@pytest.mark.parametrize("mode", MODES)
def test_unsigned_packet_cannot_advance_a_clients_exchange(mode):
    """A packet claiming sender 'server' with exchange + 1000 and no valid signature is refused
    and leaves the client's exchange number alone: the next honest exchange still reaches it."""
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
