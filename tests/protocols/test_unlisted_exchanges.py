"""Every client refuses a plan for a (round, tag) the run's public schedule does not list.

The listing is derived from the public configuration (:meth:`AlgorithmSpec.exchanges_of`) and carried by the run
manifest; a malicious server half (a subclass of the honest one) that plans an exchange the algorithm never makes,
under a new tag or in a round outside its tag's rounds, is refused in every mode with UnlistedExchangeError, before
the client sends anything.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocols import ValueSpec, make_protocol
from protocols.errors import ConfigurationError, UnlistedExchangeError
from protocols.registry import modes
from protocols.schedule import PublicSchedule

K = 4
SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)
LISTED = {"model": (0, 1), "sums": (0, 0)}


class RetaggingServer:
    """Plans the round-1 ``model`` exchange as ``self.forged`` (tag, round): a sum the algorithm never makes."""

    forged = ("probe", 1)

    def run(self, plan, link):
        if plan.tag == "model" and plan.round == 1:
            tag, rnd = self.forged
            plan = dataclasses.replace(plan, tag=tag, round=rnd)
        return super().run(plan, link)


class LateRoundServer(RetaggingServer):
    """Plans the once-only ``sums`` exchange again, in round 1."""

    forged = ("sums", 1)


def _protocol(mode: str, server_mixin, exchanges=LISTED):
    cls = make_protocol(mode, K).__class__
    server = type(f"Malicious{cls.server_half.__name__}", (server_mixin, cls.server_half), {})
    cls = type(f"Malicious{cls.__name__}", (cls,), {"server_half": server})
    return cls(K, exchanges=exchanges)


def _sum(proto, rnd: int):
    x = {k: np.random.default_rng(k).uniform(-1, 1, 8) for k in range(K)}
    return proto.weighted_sum("model", rnd, x, spec=SPEC, recipients=range(K)), sum(x.values())


@pytest.mark.parametrize("server", [RetaggingServer, LateRoundServer])
@pytest.mark.parametrize("mode", modes())
def test_an_unlisted_round_or_tag_is_refused_in_every_mode(mode, server):
    proto = _protocol(mode, server)
    got, want = _sum(proto, 0)  # listed: honest
    assert np.allclose(got, want, atol=1e-2)
    tag, rnd = server.forged
    with pytest.raises(UnlistedExchangeError, match=f"server plans it in round {rnd}") as err:
        _sum(proto, 1)
    assert (err.value.tag, err.value.round) == (tag, rnd)
    assert not [m for m in proto.transcript.messages if m.tag == tag and m.round == rnd and m.sender != "server"]


def test_without_a_listing_the_retagged_exchange_completes():
    """The refusal is the listing's: a backend driven without one (protocol tests) lets the probe through."""
    proto = _protocol("mask", RetaggingServer, exchanges=None)
    _sum(proto, 0)
    got, want = _sum(proto, 1)
    assert np.allclose(got, want, atol=1e-2)


def test_the_manifest_carries_the_listing_every_client_reads():
    proto = make_protocol("mask", K, exchanges=LISTED)
    assert proto.manifest.security["exchanges"] == {"model": [0, 1], "sums": [0, 0]}
    assert all(half.schedule.exchanges == LISTED for half in proto.clients.values())
    with pytest.raises(ConfigurationError, match="malformed exchange listing"):
        PublicSchedule.of(K, {"exchanges": {"model": 3}})


def test_each_algorithm_lists_its_exchanges_from_the_public_config():
    """What the run manifest lists (the honest runs of tests/algorithms and tests/runtime pass these checks)."""
    from secure_fgl.algorithms.options import FedOMDOptions
    from secure_fgl.config import RunConfig
    from secure_fgl.manifest import public_exchanges

    def listing(algorithm, **kw):
        return public_exchanges(RunConfig(algorithm=algorithm, rounds=3, **kw))

    assert listing("fedavg") == {"fedavg/model": (0, 2)}
    assert listing("local") == {} and listing("centralized") == {}
    assert listing("fedgcn") == {"fedgcn/neighbour_sums": (0, 0), "fedgcn/model": (0, 2)}
    assert listing("fedgcn", options={"hops": 0}) == {"fedgcn/model": (0, 2)}
    gap = listing("fedgcn-gap", options={"encoder_rounds": 2})
    assert gap == {
        "fedgcn-gap/encoder/model": (0, 1),
        "fedgcn-gap/hop/1": (0, 0),
        "fedgcn-gap/hop/2": (0, 0),
        "fedgcn-gap/model": (0, 2),
    }
    layers = 1 + FedOMDOptions().ortho_layers
    per_layer = listing("fedomd", dp_epsilon=1.0)
    assert len(per_layer) == 1 + 2 * layers and "fedomd/hidden1/moments" in per_layer
    assert set(listing("gcfl", options={"mean_norm": "unweighted"})) == {
        f"gcfl/{t}" for t in ("model", "norms", "criterion_mean", "similarity")
    }
