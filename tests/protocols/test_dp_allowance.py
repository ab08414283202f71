"""Clients refuse to release a sum missing more contributors than the run's distributed DP noise allows.

With distributed DP each of a plan's n contributors adds a share sized for at most d = ``--dp-dropouts``
missing (protocols/dp.py).  Adversary: a server half that declares honest uploads dropped (it discards
them) and skips its own check of the allowance, so that the sum it releases is short of noise.  Each
client knows d from the run's own DP config, never from the plan: a mask client refuses to reveal its
shares for a survivor set of fewer than n - d members, a t-out-of-n ckks-mp client refuses to key-switch
over so few uploaders (``NoiseAllowanceError``); nothing is delivered.  Control: the same server with
clients that do not check releases the short sum.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from protocols import DPRequest, ValueSpec
from protocols.dp import DPConfig
from protocols.errors import KeySwitchRefusedError, NoiseAllowanceError, UnmaskingRefusedError
from protocols.registry import backend_class

SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)
LENGTH = 64


def declaring_dropped(mode: str, victims: set[int]) -> type:
    """``mode``'s server half that discards the victims' uploads and skips its own ``--dp-dropouts`` check."""

    class DeclaresHonestUploadsDropped(backend_class(mode).server_half):
        def run(self, plan, link):
            unchecked = {**plan.encoding, "provisioned_dropouts": math.inf}  # the server's own check, skipped
            self.covered = super().run(replace(plan, encoding=unchecked), link)
            return self.covered

        def call(self, link, stage, messages, *, hook=True):
            got = super().call(link, stage, messages, hook=hook)
            if stage in ("masked_upload", "upload"):  # received, then declared dropped
                got = {k: v for k, v in got.items() if k not in victims}
            return got

    return DeclaresHonestUploadsDropped


CASES = {
    # mask: 6 clients, t = 4, noise for 1 dropout; 2 declared dropped still leave t survivors
    "mask": (6, {}, {4, 5}, UnmaskingRefusedError),
    # t-out-of-n ckks-mp: 4 clients, t = 3, noise for no dropout; 1 declared dropped is within n - t
    "ckks-mp": (4, {"threshold": 3}, {3}, KeySwitchRefusedError),
}


def protocol(mode: str, victims: set[int], dropouts: int):
    n, options, _, _ = CASES[mode]
    config = DPConfig(epsilon=1.0, placement="distributed", dropouts=dropouts, colluders=0)
    attacked = type("Attacked", (backend_class(mode),), {"server_half": declaring_dropped(mode, victims)})
    return attacked(n, dp=config, **options)


def weighted_sum(proto):
    rng = np.random.default_rng(0)
    values = {k: rng.uniform(-0.5, 0.5, LENGTH) for k in range(proto.num_clients)}
    return proto.weighted_sum("t/sum", 0, values, spec=SPEC, dp=DPRequest(clip=1.0))


@pytest.mark.parametrize("mode", sorted(CASES))
def test_a_sum_short_of_noise_is_refused_by_the_clients(mode):
    _, _, victims, family = CASES[mode]
    proto = protocol(mode, victims, dropouts=len(victims) - 1)
    with pytest.raises(NoiseAllowanceError, match="--dp-dropouts") as err:
        weighted_sum(proto)
    assert isinstance(err.value, family)  # an unmasking / key-switching refusal
    assert all(half._result is None for half in proto.clients.values())  # nothing delivered


@pytest.mark.parametrize("mode", sorted(CASES))
def test_within_the_allowance_or_without_the_clients_check_the_short_sum_is_released(mode):
    """Controls: the attacking server's short sum is released where the clients allow it.

    When d covers the victims, and also when it does not but the clients do not check (the hole
    their check closes).
    """
    _, _, victims, _ = CASES[mode]
    within = protocol(mode, victims, dropouts=len(victims))
    unchecked = protocol(mode, victims, dropouts=len(victims) - 1)
    for half in unchecked.clients.values():
        half.dp_config = None
    for proto in (within, unchecked):
        assert np.isfinite(weighted_sum(proto)).all()
        assert proto.server.covered == tuple(k for k in range(proto.num_clients) if k not in victims)


def test_each_client_runtime_takes_the_allowance_from_the_runs_own_config():
    """The allowance a client runtime hands its half: ``--dp-dropouts`` for distributed noise in scope, else none."""
    from secure_fgl.config import RunConfig
    from secure_fgl.privacy import dp_config

    run = dict(algorithm="fedavg", dp_epsilon=1.0, dp_dropouts=2, dp_exchanges="fedavg/model")
    config = dp_config(RunConfig(mode="mask", **run))
    assert config.allowed_missing("fedavg/model") == 2 and config.allowed_missing("other/sum") is None
    assert dp_config(RunConfig(mode="plain", **run)).allowed_missing("fedavg/model") is None  # local: full sigma each
    assert dp_config(RunConfig(algorithm="fedavg", mode="mask")) is None  # no DP
