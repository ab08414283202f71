"""View chains survive checkpoint and resume, and cover the initial model.

A client's digest chain of the broadcasts it trained on (protocols/broadcast_view.py) is saved with its checkpoint
and restored on --resume.  A malicious server half (a subclass of the honest mask server, put in place of the run's
before any exchange; the client halves and runtimes under test are untouched) sends one client another model in the
last round before the checkpoint: after the resume the next sum is refused with InconsistentViewError, where a
client restarted with an empty chain would agree with the others again while training on another model.
"""

from __future__ import annotations

import dataclasses

import pytest

from protocols.errors import InconsistentViewError
from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation
from secure_fgl.runtime import wire
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor

VICTIM, TAG = 1, "fedavg/model"


class ShiftedModelServer:
    """In round 1 sends the victim the mean update plus one grid step in its first entry (Pasquini et al.'s δ)."""

    def stage_download(self, ex, link):
        if (ex.plan.tag, ex.plan.round) != (TAG, 1):
            return super().stage_download(ex, link)
        others = {r: b for r, b in ex.plan.requests.items() if r != VICTIM}
        super().stage_download(dataclasses.replace(ex, plan=dataclasses.replace(ex.plan, requests=others)), link)
        forged = ex.total.copy()
        forged[0, 0] += 1 << max(0, ex.enc.frac_bits - (ex.plan.spec.grid_bits or ex.enc.frac_bits))
        victim = dataclasses.replace(ex.plan, requests={VICTIM: ex.plan.requests[VICTIM]})
        super().stage_download(dataclasses.replace(ex, plan=victim, total=forged), link)


def _config(out) -> RunConfig:
    return RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        clients=3,
        mode="mask",
        rounds=3,
        synthetic={"num_nodes": 120, "num_features": 8, "num_classes": 3},
        out=str(out),
    ).validate()


class OtherSeedExecutor(LocalExecutor):
    """The driver sets the victim's runtime up with another seed: it builds another initial model."""

    def start(self, frames):
        frame = wire.unpack(frames[VICTIM])
        frame["config"] = {**frame["config"], "seed": frame["config"]["seed"] + 1}
        super().start({**frames, VICTIM: wire.pack(frame)})


def _strategy(cfg, malicious: bool, executor=None):
    executor = executor or LocalExecutor()
    protocol = make_runtime_protocol(cfg, cfg.clients, executor)
    if malicious:  # the adversary: the server half of this run, as a malicious subclass
        protocol.server.__class__ = type("ShiftedMaskServer", (ShiftedModelServer, type(protocol.server)), {})
    return make_strategy(cfg, load_federation(cfg), protocol, {}, executor), executor


def _chains(executor) -> dict:
    return {k: rt.half.views.digest(TAG) for k, rt in executor.runtimes.items()}


@pytest.mark.parametrize(
    "malicious", [pytest.param(False, marks=pytest.mark.slow), True]
)  # honest resumes with restored chains also run in tests/runtime/test_runtime.py
def test_a_model_sent_before_the_checkpoint_is_still_refused_after_the_resume(tmp_path, malicious):
    cfg = _config(tmp_path)
    strategy, executor = _strategy(cfg, malicious)
    first = _chains(executor)
    assert len(set(first.values())) == 1 and bytes(32) not in first.values()  # the initial model, chained alike
    for rnd in range(2):
        strategy.train_round(rnd)
    before = _chains(executor)
    assert (before[VICTIM] != before[0]) == malicious
    state = strategy.state_dict()
    executor.shutdown()

    resumed, executor = _strategy(cfg, malicious=False)  # an honest server from here on
    resumed.load_state_dict(state)
    assert _chains(executor) == before  # restored, not restarted from the initial model
    if malicious:
        with pytest.raises(InconsistentViewError, match="different broadcasts") as err:
            resumed.train_round(2)
        assert err.value.round == 2
    else:
        resumed.train_round(2)
    executor.shutdown()


def test_another_initial_model_is_refused_in_the_first_sum(tmp_path):
    """The initial model starts the chain: a client set up with another one is refused in the first model sum."""
    strategy, executor = _strategy(_config(tmp_path), malicious=False, executor=OtherSeedExecutor())
    assert _chains(executor)[VICTIM] != _chains(executor)[0]
    with pytest.raises(InconsistentViewError, match="different broadcasts") as err:
        strategy.train_round(0)
    assert err.value.round == 0
    executor.shutdown()
