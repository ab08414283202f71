"""Every algorithm's model broadcasts are bound: a model sent to one client alone is refused at the next sum.

The model-inconsistency attack (Pasquini et al., CCS 2022) on each algorithm whose spec names broadcasts
(``AlgorithmSpec.broadcasts``, given the schedule's ``broadcast`` role in the run manifest): a malicious mask server
half (a subclass of the run's, put in place before any exchange; client halves and runtimes untouched) sends the
victim the sum plus one grid step in one entry in the first round of one broadcast tag.  The victim's chain of the
broadcasts it trained on (protocols/broadcast_view.py) then differs from the others', and the next sum under that
tag is refused with InconsistentViewError before anything is unmasked.  FedAvg, FedProx and FedGCN are attacked in
tests/runtime/test_view_resume.py and tests/protocols/test_public_schedule.py.

An honest client that missed a bound broadcast (silent at its download) trains on another model from then on: the
strategy puts it out of sync and later sums complete without it, as FedAvg's do (tests/runtime/test_dropouts.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.forgers import ShiftedCommittedMPServer
from support.runs import graph_config, small

from protocols.errors import InconsistentViewError
from secure_fgl.algorithms import get_spec
from secure_fgl.experiment import load_federation
from secure_fgl.manifest import public_roles
from secure_fgl.runtime.build import make_executor, make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor

VICTIM = 1


def forging_server(base: type, tag: str) -> type:
    """``base`` sending the victim alone a shifted sum the first time it delivers ``tag``."""

    class ShiftedModelServer(base):
        forged_round: int | None = None

        def stage_download(self, ex, link):
            if ex.plan.tag != tag or self.forged_round is not None or VICTIM not in ex.plan.requests:
                return super().stage_download(ex, link)
            self.forged_round = ex.plan.round
            others = {r: b for r, b in ex.plan.requests.items() if r != VICTIM}
            super().stage_download(dataclasses.replace(ex, plan=dataclasses.replace(ex.plan, requests=others)), link)
            forged = ex.total.copy()
            forged[0, 0] += 1 << max(0, ex.enc.frac_bits - (ex.plan.spec.grid_bits or ex.enc.frac_bits))
            victim = dataclasses.replace(ex.plan, requests={VICTIM: ex.plan.requests[VICTIM]})
            super().stage_download(dataclasses.replace(ex, plan=victim, total=forged), link)

    return ShiftedModelServer


#: (algorithm, forged tag, options, the tag whose next exchange is refused: FedOMD's statistics are computed on the
#: model, so they bind it and are refused first)
CASES = [
    ("fgssl", "fgssl/model", {}),
    ("fedomd", "fedomd/model", {}, "fedomd/stats/mean"),
    ("fedspray", "fedspray/batch", {}),
    ("fedgcn-gap", "fedgcn-gap/encoder/model", {"encoder_rounds": 2}),
    ("fedgcn-gap", "fedgcn-gap/model", {"encoder_rounds": 1}),
    ("gc-fedavg", "gc-fedavg/model", {}),
    ("gcflplus", "gcflplus/model", {}),
]


@pytest.mark.parametrize(
    ("algorithm", "tag", "options", "refused"), [(*c, c[1])[:4] for c in CASES], ids=[c[1] for c in CASES]
)
def test_a_model_sent_to_one_client_alone_is_refused_at_the_next_sum(algorithm, tag, options, refused):
    if algorithm.startswith("gc"):
        cfg = graph_config(algorithm, "mask", rounds=2)
    else:
        cfg = small(algorithm, "mask", rounds=2, options=options).validate()
    assert public_roles(cfg)[tag] == "broadcast"
    executor = LocalExecutor()
    protocol = make_runtime_protocol(cfg, cfg.clients, executor)
    protocol.server.__class__ = forging_server(type(protocol.server), tag)  # the adversary: this run's server half
    options = get_spec(algorithm).options(**cfg.options)
    strategy = make_strategy(cfg, load_federation(cfg), protocol, options, executor)
    try:
        with pytest.raises(InconsistentViewError, match="different broadcasts") as err:
            strategy.setup()  # fedgcn-gap: the encoder's rounds
            for rnd in range(cfg.rounds):
                strategy.train_round(rnd)
        assert protocol.server.forged_round is not None
        assert (err.value.tag, err.value.round) == (refused, protocol.server.forged_round + 1)
    finally:
        executor.shutdown()


@pytest.mark.parametrize("algorithm", ["fedspray", "gc-fedavg"])
def test_a_client_that_missed_a_bound_broadcast_sits_out_and_the_next_sum_completes(algorithm):
    dropout = "2,@download:r0"
    if algorithm.startswith("gc"):
        cfg = graph_config(algorithm, "mask", rounds=2, simulate_dropouts=dropout)
    else:
        cfg = small(algorithm, "mask", rounds=2, simulate_dropouts=dropout).validate()
    executor = make_executor(cfg)
    protocol = make_runtime_protocol(cfg, cfg.clients, executor)
    strategy = make_strategy(cfg, load_federation(cfg), protocol, get_spec(algorithm).options(**cfg.options), executor)
    try:
        strategy.setup()
        strategy.train_round(0)
        assert strategy.out_of_sync == {2} and 2 in protocol.last_included
        strategy.train_round(1)  # without it: with it, refused (InconsistentViewError)
        assert 2 not in protocol.last_included and len(protocol.last_included) == cfg.clients - 1
    finally:
        executor.shutdown()


def two_sums_server(base: type, tag: str) -> type:
    """``base`` handing the victim a sum one ring unit larger in its first block, under a commitment of its own.

    The released rows of ``tag`` (fedgcn-gap's hop sums): the others get the honest sum and the
    honest commitment, the victim a forged sum whose own commitment its rows verify against.
    """

    class TwoSumsServer(base):
        forged: bool = False

        def stage_download(self, ex, link):
            if ex.plan.tag != tag or self.forged:
                return super().stage_download(ex, link)
            self.forged = True
            others = {r: b for r, b in ex.plan.requests.items() if r != VICTIM}
            super().stage_download(dataclasses.replace(ex, plan=dataclasses.replace(ex.plan, requests=others)), link)
            forged = ex.total.copy()
            forged[int(np.searchsorted(ex.union, ex.plan.requests[VICTIM][0]))] += 1
            victim = dataclasses.replace(ex.plan, requests={VICTIM: ex.plan.requests[VICTIM]})
            super().stage_download(dataclasses.replace(ex, plan=victim, total=forged), link)

    return TwoSumsServer


@pytest.mark.parametrize(("hops", "refused_at"), [(2, "fedgcn-gap/hop/2"), (1, "fedgcn-gap/model")])
def test_a_hop_sum_forged_for_one_client_is_refused_at_the_next_sum(hops, refused_at):
    """fedgcn-gap's hop sums are released rows under a commitment; the next hop or the head binds it."""
    cfg = small("fedgcn-gap", "mask", rounds=1, options={"encoder_rounds": 1, "hops": hops}).validate()
    assert public_roles(cfg)["fedgcn-gap/hop/1"] == "release"
    executor = LocalExecutor()
    protocol = make_runtime_protocol(cfg, cfg.clients, executor)
    protocol.server.__class__ = two_sums_server(type(protocol.server), "fedgcn-gap/hop/1")
    strategy = make_strategy(
        cfg, load_federation(cfg), protocol, get_spec(cfg.algorithm).options(**cfg.options), executor
    )
    try:
        with pytest.raises(InconsistentViewError, match="signature is not over the survivor set") as err:
            strategy.setup()  # the encoder, then the hops
            strategy.train_round(0)
        assert protocol.server.forged
        assert err.value.tag == refused_at
        unmasked = [m for m in protocol.transcript.messages if m.tag == refused_at and m.kind == "share"]
        assert not [m for m in unmasked if m.sender != "server"]
    finally:
        executor.shutdown()


def test_a_statistic_sent_to_one_client_alone_is_refused_at_the_rounds_next_sum():
    """FedOMD's pooled statistics (the schedule's statistic role) are chained into the round's view ``w_r``."""
    cfg = small("fedomd", "mask", rounds=1).validate()
    tag = "fedomd/stats/mean"
    assert public_roles(cfg)[tag] == "statistic"
    executor = LocalExecutor()
    protocol = make_runtime_protocol(cfg, cfg.clients, executor)
    protocol.server.__class__ = forging_server(type(protocol.server), tag)
    strategy = make_strategy(
        cfg, load_federation(cfg), protocol, get_spec(cfg.algorithm).options(**cfg.options), executor
    )
    try:
        with pytest.raises(InconsistentViewError, match="signature is not over the survivor set") as err:
            strategy.train_round(0)
        assert protocol.server.forged_round == 0
        assert (err.value.tag, err.value.round) == ("fedomd/stats/moments", 0)
        assert not [m for m in protocol.transcript.messages if m.tag == err.value.tag and m.kind == "share"]
    finally:
        executor.shutdown()


def test_ckks_mp_a_statistic_sent_to_one_client_alone_is_refused_at_the_rounds_next_sum():
    """ckks-mp commits to what the round's sample decoded of each statistic; every client chains the root."""
    cfg = small("fedomd", "ckks-mp", rounds=1).validate()
    roles = public_roles(cfg)
    tag = next(t for t in sorted(roles) if roles[t] == "statistic" and t.endswith("/mean"))
    executor = LocalExecutor()
    protocol = make_runtime_protocol(cfg, cfg.clients, executor)
    base = type(protocol.server)
    protocol.server.__class__ = type("ShiftedStatisticServer", (ShiftedCommittedMPServer, base), {"forged": tag})
    strategy = make_strategy(
        cfg, load_federation(cfg), protocol, get_spec(cfg.algorithm).options(**cfg.options), executor
    )
    try:
        with pytest.raises(InconsistentViewError, match="masks did not cancel") as err:
            strategy.train_round(0)
        assert protocol.server.forged_round == 0
        assert err.value.round == 0 and roles[err.value.tag] == "statistic" and err.value.tag != tag
    finally:
        executor.shutdown()
