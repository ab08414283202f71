"""A refused plan does not poison a mask client for the rest of the run.

The set-up material that travelled with it (the output-mask group seed dealt in the run's first exchange, the
owner-signed mask keys of its peers) is verified and kept, so the next honest exchange includes that client.
Malicious server halves are subclasses of the honest one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocols import ValueSpec
from protocols.errors import TooFewContributorsError
from protocols.mask import MaskProtocol
from protocols.mask.server import MaskServer

SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)
K = 4


def _values(seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, 40) for k in range(K)}


def _alone_plan_server(victim: int, attacked_tag: str) -> type[MaskServer]:
    """A server half that names ``victim`` the only contributor of ``attacked_tag``.

    Sends ``victim`` a plan naming it as the only contributor for ``attacked_tag`` (every other
    client gets the honest plan), so ``victim`` alone refuses that exchange.
    """

    class AlonePlanServer(MaskServer):
        def queue(self, client, msg, stage, part=0):
            if stage == "plan" and client == victim and self.plan.tag == attacked_tag:
                alone = dataclasses.replace(self.plan.for_client(victim), contributors=(victim,))
                msg = dataclasses.replace(msg, payload=alone.to_payload())
            super().queue(client, msg, stage, part)

    return AlonePlanServer


def _protocol(server_half: type[MaskServer]) -> MaskProtocol:
    return type("Proto", (MaskProtocol,), {"server_half": server_half})(K)


def test_a_refused_first_plan_keeps_the_group_seed_for_the_next_exchange():
    """A refused first plan keeps the group seed for the next exchange.

    Client 3 refuses the plan of the run's first exchange, whose bundle also carries client 0's
    output-mask group seed; the next honest exchange still sums client 3's input exactly.
    """
    proto = _protocol(_alone_plan_server(3, "attack"))
    with pytest.raises(TooFewContributorsError, match="fewer than the run's minimum") as err:
        proto.weighted_sum("attack", 0, _values(0), spec=SPEC)
    assert err.value.client == 3
    x = _values(1)
    assert np.allclose(proto.weighted_sum("w", 1, x, spec=SPEC), sum(x.values()), atol=1e-2)


def test_a_refused_plan_keeps_the_peer_mask_keys_broadcast_with_it():
    """A refused plan keeps the peer mask keys broadcast with it.

    Client 1 refuses a plan whose bundle carries the broadcast of client 3's (new) mask key; the
    server sends each key once, so the next honest exchange needs client 1 to have kept it.
    """
    proto = _protocol(_alone_plan_server(1, "attack"))
    x = _values(2)
    first = {k: x[k] for k in (0, 1, 2)}
    assert np.allclose(proto.weighted_sum("w", 0, first, spec=SPEC), sum(first.values()), atol=1e-2)
    with pytest.raises(TooFewContributorsError) as err:
        proto.weighted_sum("attack", 1, x, spec=SPEC)
    assert err.value.client == 1
    y = _values(3)
    assert np.allclose(proto.weighted_sum("w", 2, y, spec=SPEC), sum(y.values()), atol=1e-2)
