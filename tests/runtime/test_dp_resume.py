"""DP across a crash.

Every release is recorded (``dp_ledger.json``) before its upload leaves, so a run resumed from an older checkpoint
still counts the releases the checkpoint missed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.runs import protocol_maker

from protocols import DPRequest
from protocols.dp import DPConfig, DPEngine
from secure_fgl.config import RunConfig
from secure_fgl.experiment import DP_LEDGER, run_experiment

SMALL = {"num_nodes": 200, "num_features": 16, "num_classes": 3}
TAG = "fedavg/model"


def cfg(out, **kw) -> RunConfig:
    base = dict(
        algorithm="fedavg",
        mode="plain",
        dataset="sbm",
        clients=3,
        rounds=4,
        synthetic=dict(SMALL),
        seed=0,
        dp_epsilon=4.0,
        out=str(out),
    )
    base.update(kw)
    return RunConfig(**base)


class Crash(Exception):
    pass


def crash_after_upload(monkeypatch, at_round: int, executor: str) -> None:
    """The next run's protocol dies right after a client's upload of ``at_round`` has left."""
    module, name = protocol_maker(cfg(None, executor=executor))
    real = getattr(module, name)

    def make(*args, **kw):
        proto = real(*args, **kw)

        def intercept(msg):
            if msg.round == at_round:
                raise Crash(f"killed in round {msg.round}")
            return msg

        proto.intercept = intercept
        monkeypatch.setattr(module, name, real)
        return proto

    monkeypatch.setattr(module, name, make)


@pytest.mark.parametrize("executor,at_round", [("local", 0), ("local", 2)])
def test_resumed_dp_run_counts_the_interrupted_release(tmp_path, monkeypatch, executor, at_round):
    full = run_experiment(cfg(tmp_path / "full", executor=executor), progress=False)["privacy"]
    out = tmp_path / "crashed"
    crash_after_upload(monkeypatch, at_round, executor)
    with pytest.raises(Crash):
        run_experiment(cfg(out, executor=executor), progress=False)
    ledger = json.loads((out / DP_LEDGER).read_text())
    assert sum(n for _, _, n in ledger["accountant"]["runs"][TAG]) == at_round + 1  # written before the upload
    resumed = run_experiment(cfg(out, resume=True, executor=executor), progress=False)["privacy"]
    assert full["per_tag"][TAG]["releases"] == 4 and full["replayed_releases"] == 0
    assert resumed["per_tag"][TAG]["releases"] == 5  # 4 rounds + the interrupted release
    assert resumed["replayed_releases"] == 1
    assert resumed["total_epsilon"] > full["total_epsilon"]


def test_engine_keeps_ledger_releases_beyond_the_checkpoint():
    def engine():
        return DPEngine(DPConfig(epsilon=1.0), num_clients=2, protocol_mode="plain")

    eng, ledger = engine(), []
    eng.on_release = ledger.append
    req = DPRequest(clip=1.0, releases=3)
    eng.privatize_vectors("t", 0, {0: np.zeros(4)}, req)
    checkpoint = eng.state_dict()
    eng.privatize_vectors("t", 1, {0: np.zeros(4)}, req)  # released, then the process dies
    resumed = engine()
    resumed.load_state_dict(checkpoint, ledger=ledger[-1])
    assert resumed.accountant.releases() == 2 and resumed.replayed_releases == 1
    resumed.privatize_vectors("t", 1, {0: np.zeros(4)}, req)  # round 1 again: allowed, and counted
    resumed.privatize_vectors("t", 2, {0: np.zeros(4)}, req)
    assert resumed.report()["per_tag"]["t"]["releases"] == 4
    stale = engine()
    stale.load_state_dict(ledger[-1], ledger=checkpoint)  # an older ledger never lowers the count
    assert stale.accountant.releases() == 2 and stale.replayed_releases == 0
