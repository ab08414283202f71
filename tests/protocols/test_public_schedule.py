"""The public schedule every client checks plans against.

Client sampling recomputed from the run manifest's seed, the broadcast role of a model exchange, and the same model
for everyone (model inconsistency, Pasquini et al., CCS 2022). Each attack drives a malicious server half (a
subclass of the honest one) and is refused with a specific ProtocolError, nothing sent.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocols import ValueSpec, make_protocol
from protocols.client_sampling import sample_clients, sample_size
from protocols.errors import ConfigurationError, InconsistentViewError, SampleMismatchError, ScheduleRoleError
from protocols.schedule import BROADCAST, PublicSchedule

SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)
K, SEED, FRACTION = 6, 7, 0.5
SCHEDULE = dict(seed=SEED, client_fraction=FRACTION, roles={"model": BROADCAST})
SECURE = ("mask", "ckks", "ckks-mp")


def _values(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.uniform(-1, 1, n) for k in range(K)}


def _protocol(mode: str, server_mixin=None, **options):
    cls = make_protocol(mode, K).__class__
    if server_mixin is not None:
        server = type(f"Malicious{cls.server_half.__name__}", (server_mixin, cls.server_half), {})
        cls = type(f"Malicious{cls.__name__}", (cls,), {"server_half": server})
    return cls(K, **{**SCHEDULE, **options})


def _model_round(proto, rnd: int, seed: int = 0):
    """One round of the broadcast model exchange: the round's sample contributes, everyone receives."""
    x = _values(seed=seed)
    sample = sample_clients(SEED, rnd, K, FRACTION)
    got = proto.weighted_sum("model", rnd, {k: x[k] for k in sample}, spec=SPEC, recipients=range(K))
    return got, sum(x[k] for k in sample)


# ---------------------------------------------------------------------- the sampling PRF
def test_sample_is_a_deterministic_public_function_of_seed_and_round():
    rounds = [sample_clients(SEED, r, 10, 0.3) for r in range(20)]
    assert rounds == [sample_clients(SEED, r, 10, 0.3) for r in range(20)]
    assert all(len(s) == 3 and s == sorted(set(s)) and set(s) <= set(range(10)) for s in rounds)
    assert len({tuple(s) for s in rounds}) > 5  # the sample changes from round to round
    assert rounds != [sample_clients(SEED + 1, r, 10, 0.3) for r in range(20)]
    assert sample_clients(SEED, 4, 10, 1.0) == list(range(10))
    assert (sample_size(10, 0.01), sample_size(10, 0.25)) == (1, 2)
    with pytest.raises(ConfigurationError, match="client-fraction"):
        sample_size(10, 0.0)


def test_the_manifest_carries_the_schedule_every_client_reads():
    proto = make_protocol("mask", K, **SCHEDULE)
    sec = proto.manifest.security
    assert (sec["sample_seed"], sec["client_fraction"], sec["roles"]) == (SEED, FRACTION, {"model": BROADCAST})
    assert all(half.schedule == proto.schedule for half in proto.clients.values())
    with pytest.raises(ConfigurationError, match="unknown exchange roles"):
        PublicSchedule.of(K, {"roles": {"model": "to-the-server"}})


@pytest.mark.parametrize("mode", SECURE)
def test_honest_sampled_broadcast_rounds_pass(mode):
    proto = _protocol(mode)
    for rnd in range(2):
        got, want = _model_round(proto, rnd, seed=rnd)
        assert np.allclose(got, want, atol=1e-2)


# ---------------------------------------------------------------------- attack: the wrong sample
class WrongSampleServer:
    """Plans round 1's model exchange over the clients round 1 does not sample (as many)."""

    def run(self, plan, link):
        if plan.tag == "model" and plan.round == 1:
            others = tuple(k for k in range(K) if k not in sample_clients(SEED, 1, K, FRACTION))
            plan = dataclasses.replace(plan, contributors=others)
        return super().run(plan, link)


@pytest.mark.parametrize("mode", SECURE)
def test_a_contributor_set_outside_the_rounds_sample_is_refused(mode):
    proto = _protocol(mode, WrongSampleServer)
    _model_round(proto, 0)
    x = _values()
    with pytest.raises(SampleMismatchError, match="not in round 1's sample"):
        proto.weighted_sum("model", 1, x, spec=SPEC, recipients=range(K))
    assert not [m for m in proto.transcript.messages if m.tag == "model" and m.round == 1 and m.sender != "server"]


# ---------------------------------------------------------------------- attack: another role
class ScopedBroadcastServer:
    """Sends a named recipient of the model broadcast only part of its blocks.

    Names client 1 a recipient of the model broadcast but sends it all blocks but the last:
    a scoped delivery where the public schedule has a broadcast.
    """

    def run(self, plan, link):
        if plan.tag == "model":
            plan = dataclasses.replace(plan, requests={**plan.requests, 1: plan.requests[1][:-1]})
        return super().run(plan, link)


@pytest.mark.parametrize("mode", SECURE)
def test_a_broadcast_scoped_to_part_of_its_blocks_is_refused(mode):
    proto = _protocol(mode, ScopedBroadcastServer)
    with pytest.raises(ScheduleRoleError, match="makes 'model' a broadcast") as err:
        _model_round(proto, 0)
    assert err.value.client == 1
    assert not [m for m in proto.transcript.messages if m.tag == "model" and m.sender == "client1"]


# ---------------------------------------------------------------------- attack: model inconsistency
VICTIM = 2


class StaleModelServer:
    """Sends the victim, in round 1, round 0's model download again.

    Re-signed. The victim trains on another model than the others (Pasquini et al.'s model inconsistency, here a
    stale model).
    """

    def call(self, link, stage, messages, *, hook=True):
        if stage == "download" and self.plan.tag == "model" and VICTIM in messages:
            (msg, part), *rest = messages[VICTIM]
            if self.plan.round == 0:
                self.stale = msg.payload
            elif self.plan.round == 1:
                messages = {**messages, VICTIM: [(dataclasses.replace(msg, payload=self.stale), part), *rest]}
        return super().call(link, stage, messages, hook=hook)


class StaleModelUnsignedServer(StaleModelServer):
    """The stale model, with the victim's survivor-set signature left out.

    The stale model, and the victim's survivor-set signature left out of the unmasking request
    (so that the others would unmask a sum holding the victim's update).
    """

    def stage_consistency(self, ex, link):
        super().stage_consistency(ex, link)
        if self.plan.round >= 2:
            ex.macs.pop(VICTIM, None)


def _three_rounds(proto):
    for rnd in range(3):
        _model_round(proto, rnd, seed=rnd)


@pytest.mark.parametrize("mode,refused_in", [("mask", 2), ("ckks-mp", 1)])
def test_a_different_model_to_one_client_aborts_the_next_sum(mode, refused_in):
    """Round 2 binds each contributor's digest of the models it received: the victim's differs.

    In ckks-mp the replayed download is refused in round 1 already: a broadcast download is ``c0'`` under this
    exchange's public ``c1``, so last round's decrypts to noise.
    """
    assert VICTIM in sample_clients(SEED, 2, K, FRACTION)
    proto = _protocol(mode, StaleModelServer)
    with pytest.raises(InconsistentViewError, match="different broadcasts") as err:
        _three_rounds(proto)
    assert err.value.round == refused_in
    assert proto.clients[VICTIM].views.digest("model") != proto.clients[0].views.digest("model")


@pytest.mark.parametrize("mode,refused_in", [("mask", 3), ("ckks-mp", 1)])
def test_a_different_model_stays_refused_after_a_round_without_the_victim(mode, refused_in):
    """A different model stays refused after a round without the victim.

    The broadcast is the mean update each client adds to its model, so a client that was sent
    another one trains on another model from then on.  Round 2 leaves the victim out of the
    contributors and sends every client the same update: in mask the victim's last broadcast then
    equals the others', yet its round-3 contribution is refused (each client binds every broadcast
    it received, not only the last); in ckks-mp the victim refuses the replayed download itself in
    round 1 (it decrypts to noise under round 1's public ``c1``).
    """
    proto = _protocol(mode, StaleModelServer)
    x = _values(seed=2)
    others = [k for k in sample_clients(SEED, 2, K, FRACTION) if k != VICTIM]
    assert VICTIM in sample_clients(SEED, 3, K, FRACTION)
    with pytest.raises(InconsistentViewError, match="different broadcasts") as err:
        for rnd in range(2):
            _model_round(proto, rnd, seed=rnd)
        proto.weighted_sum("model", 2, {k: x[k] for k in others}, spec=SPEC, recipients=range(K))
        _model_round(proto, 3, seed=3)
    assert err.value.round == refused_in


@pytest.mark.parametrize("mode", ["mask", "ckks-mp"])
def test_no_catch_up_a_client_that_missed_a_broadcast_is_refused_in_a_later_sum(mode):
    """No backend re-delivers a missed broadcast: the client's chain stays behind and a later sum it joins is refused.

    Round 0: the victim misses its download (DropoutError naming it, recorded as undelivered).  Round 1, the victim
    back and sampled: refused (mask: at the consistency round; ckks-mp: its key-switching masks do not cancel).
    """
    from protocols.errors import DropoutError

    victim = sample_clients(SEED, 1, K, FRACTION)[0]
    proto = _protocol(mode)
    proto.link.drop(victim, "download")
    with pytest.raises(DropoutError, match="no result was delivered") as err:
        _model_round(proto, 0)
    assert err.value.client == victim and proto.server.last_undelivered == (victim,)
    proto.link.reconnect(victim)
    with pytest.raises(InconsistentViewError) as err:
        _model_round(proto, 1)
    assert err.value.round == 1
    other = next(k for k in range(K) if k != victim)
    assert proto.clients[victim].views.digest("model") != proto.clients[other].views.digest("model")


def test_mask_an_unsigned_survivor_of_a_broadcast_exchange_is_refused():
    proto = _protocol("mask", StaleModelUnsignedServer)
    with pytest.raises(InconsistentViewError, match=f"survivors \\[{VICTIM}\\] did not sign") as err:
        _three_rounds(proto)
    assert err.value.round == 2
    assert not [m for m in proto.transcript.messages if m.round == 2 and m.kind == "share" and m.sender != "server"]


def test_without_the_broadcast_role_the_stale_model_goes_unnoticed():
    """The binding is what the schedule's role adds: the same attack on an unlisted tag completes."""
    proto = _protocol("mask", StaleModelServer, roles={})
    _three_rounds(proto)
    assert proto.clients[VICTIM].views.digest("model") == proto.clients[0].views.digest("model")


# ---------------------------------------------------------------------- the run: driver and clients agree
def test_a_sampled_mask_run_passes_every_clients_schedule_check():
    """A sampled mask run passes every clients schedule check.

    FedAvg over mask with half the clients each round: the driver samples with the same PRF the
    client halves recompute, and every contributor received the same models.
    """
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment
    from secure_fgl.manifest import public_roles

    cfg = RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        synthetic={"num_nodes": 120, "num_features": 8, "num_classes": 3},
        mode="mask",
        clients=4,
        client_fraction=0.5,
        rounds=3,
        seed=SEED,
    )
    assert public_roles(cfg) == {"fedavg/model": BROADCAST}
    res = run_experiment(cfg, progress=False)  # a sample or a model the clients disagree on would raise
    assert len(res["rounds"]) == 3 and res["threat_model"]["mode"] == "mask"


def test_mask_a_survivor_silent_at_consistency_of_a_broadcast_is_a_dropout_error():
    """Mask a survivor silent at consistency of a broadcast is a dropout error.

    An honest server that misses a survivor's signature in a broadcast exchange stops with a
    DropoutError naming it (the others would refuse to unmask without it), nothing delivered.
    """
    from protocols.errors import DropoutError
    from secure_fgl.runtime.dropouts import DropoutSchedule, DroppingLink, parse_dropouts

    proto = _protocol("mask")
    sample = sample_clients(SEED, 0, K, FRACTION)
    proto.link = DroppingLink(proto.link, DropoutSchedule(parse_dropouts(f"{sample[-1]},@consistency", K, "mask")))
    with pytest.raises(DropoutError, match="every survivor signs") as err:
        _model_round(proto, 0)
    assert tuple(err.value.clients) == (sample[-1],)
    assert all(half._result is None for half in proto.clients.values())
