"""A server (or network) that deviates from the protocol: each attack is refused with a specific
ProtocolError, or gets nothing.  Malicious server halves are subclasses of the honest ones."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocols import SERVER, ValueSpec, make_protocol
from protocols.ckks import CKKSProtocol
from protocols.ckks.backend import CKKSServer
from protocols.errors import AuthenticationError, BoundError, IntegrityError
from protocols.mask import MaskProtocol
from protocols.mask.backend import MaskServer
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


# ---------------------------------------------------------------------- unexpected exception types
class SharedIdsShiftingServer(MaskServer):
    """Re-signs the sparse 'block ids shared with each peer' message to client 1 with other ids."""

    def queue(self, client, msg, stage, part=0):
        if stage == "block_ids" and client == 1 and msg.kind == "metadata":
            msg = dataclasses.replace(msg, payload={j: (np.asarray(c) + 1).astype(np.int32)
                                                    for j, c in msg.payload.items()})
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
    rows = {0: (np.array([0, 1, 2]), np.ones((3, 2))), 1: (np.array([0, 1]), np.full((2, 2), 2.0)),
            2: (np.array([1, 2]), np.ones((2, 2)))}
    with pytest.raises(IntegrityError, match="not a sorted subset"):
        proto.row_sum("r", 0, rows, {0: np.array([0, 1, 2])}, 4, layout="sparse",
                      spec=ValueSpec(max_abs=4, tolerance=1e-3))


def test_plan_past_the_ckks_modulus_is_a_bound_error_not_a_value_error():
    class Proto(CKKSProtocol):
        server_half = ScaleRaisingServer
    proto = Proto(3, fixed_point_bits=20)
    with pytest.raises(BoundError, match="past the chain's modulus"):
        proto.weighted_sum("w", 0, _values(3), spec=SPEC)
