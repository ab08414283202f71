"""The Ray executor (issue 14): the same run as in-process, bytes counted at the actor boundary,
lost actors as protocol dropouts.  One local Ray cluster (2 CPUs) for the module; its actors are
reused from test to test (:data:`secure_fgl.runtime.ray_executor._IDLE_HOSTS`)."""
from __future__ import annotations

import pytest

from protocols import DropoutError
from secure_fgl.experiment import load_federation, make_run_protocol, run_experiment
from secure_fgl.runtime.build import make_strategy
from secure_fgl.runtime.executor import LocalExecutor
from secure_fgl.runtime.fedgcn import IDS_TAG, ORDER_TAG
from secure_fgl.runtime.ray_executor import RayExecutor
from secure_fgl.runtime.strategy import EVAL_TAG

from test_runtime import Recording, protocol_bytes_crossing, small

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[ray]'")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("mode", ["plain", "mask", "ckks"])
def test_ray_gives_the_local_run_and_its_byte_counts(mode):
    cfg = dict(options={"row_order": "signature"}, rounds=2)
    local = run_experiment(small("fedgcn", mode, executor="local", **cfg), progress=False)
    remote = run_experiment(small("fedgcn", mode, executor="ray", **cfg), progress=False)
    assert remote["runtime"]["workers"] == 2
    losses = [[r["train_loss"] for r in run["rounds"]] for run in (local, remote)]
    if mode == "ckks":          # fresh encryption noise: equal within the exchange's tolerance
        assert losses[0] == pytest.approx(losses[1], abs=1e-4)
    else:
        assert losses[0] == losses[1] and local["final"]["test_acc"] == remote["final"]["test_acc"]
    strip = lambda comm: {t: {k: v for k, v in s.items()} for t, s in comm["per_tag"].items()}  # noqa: E731
    assert strip(local["comm"]) == strip(remote["comm"])
    # what the transcript counts is what was handed to / returned from the actors' methods
    stats, tags = remote["runtime"]["stats"]["per_method"], remote["comm"]["per_tag"]
    assert tags[EVAL_TAG]["bytes_up"] == stats["evaluate"]["bytes_from_clients"]
    assert tags[ORDER_TAG]["bytes_up"] == stats[f"contribute:{ORDER_TAG}"]["bytes_from_clients"]
    assert tags[ORDER_TAG]["bytes_down"] == stats[f"contribute:{IDS_TAG}"]["bytes_to_clients"]


def test_fedomd_on_ray_gives_the_local_run():
    """Per-client dropout generators and the statistics stages: the actors' run is the in-process one."""
    runs = [run_experiment(small("fedomd", "mask", executor=ex, rounds=2), progress=False) for ex in ("local", "ray")]
    assert [[(r["train_loss"], r["cmd_loss"]) for r in run["rounds"]] for run in runs] == \
           [[(r["train_loss"], r["cmd_loss"]) for r in runs[0]["rounds"]]] * 2
    assert runs[0]["final"]["test_acc"] == runs[1]["final"]["test_acc"]
    assert runs[0]["comm"]["per_tag"] == runs[1]["comm"]["per_tag"]


class RecordingRayExecutor(Recording, RayExecutor):
    pass


def test_protocol_halves_in_actors_transcript_counts_the_bytes_handed_to_them():
    from secure_fgl.runtime.build import make_runtime_protocol
    cfg = small("fedgcn", "plain", executor="ray", options={"row_order": "signature"}, rounds=2).validate()
    fed = load_federation(cfg)
    executor = RecordingRayExecutor()
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, {"row_order": "signature"}, executor)
    try:
        assert strategy.split and protocol.clients == {}      # the halves (and their keys) live in the actors
        strategy.setup()
        for r in range(cfg.rounds):
            strategy.train_round(r)
    finally:
        executor.shutdown()
    recorded = sum(m.nbytes for m in protocol.transcript.messages
                   if m.tag not in (EVAL_TAG, ORDER_TAG, IDS_TAG))
    assert recorded == protocol_bytes_crossing(executor.frames) > 0


def test_gcfl_on_actors_splits_as_in_process_and_counts_its_report_frames():
    """GCFL (plain, forced split at round 20) with the clients on actors: the same losses and
    splits as the local executor; each reported scalar's recorded bytes are the bytes returned
    from the actors' methods."""
    from test_runtime_graph import build, drive, graph_cfg
    cfg = graph_cfg("gcfl", "plain")
    local, _ = drive(build(cfg, LocalExecutor())[0])
    executor = RayExecutor()
    strategy, protocol, _ = build(cfg, executor)
    try:
        remote, final = drive(strategy)
    finally:
        executor.shutdown()
    assert [r["train_loss"] for r in remote] == [r["train_loss"] for r in local] and final["splits"]
    stats, tags = executor.stats.per_method, protocol.transcript.comm()["per_tag"]
    for tag in ("gcfl/update_norms", "gcfl/mean_norm", "gcfl/similarity"):
        assert tags[tag]["bytes_up"] == stats[f"contribute:{tag}"]["bytes_from_clients"]


class KillingRayExecutor(RayExecutor):
    """Kills the actor hosting ``victim`` just before the ``nth`` call of ``method``."""

    def __init__(self, victim: int, method: str, nth: int = 2, **kw):
        super().__init__(**kw)
        self.victim, self.method, self.nth, self.seen = victim, method, nth, 0

    def _call(self, method, requests):
        self.seen += method == self.method
        if self.seen == self.nth and method == self.method:
            self.kill_actor_of(self.victim)
        return super()._call(method, requests)


def _run(mode, executor, rounds=3):
    from secure_fgl.runtime.build import make_runtime_protocol
    cfg = small(mode=mode, rounds=rounds).validate()
    fed = load_federation(cfg)
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, {}, executor)
    try:
        rows = [strategy.train_round(r) for r in range(cfg.rounds)]
    finally:
        executor.shutdown()
    return strategy, protocol, rows


def test_actor_killed_inside_the_mask_exchange_is_a_dropout_with_recovery():
    """Client 2's actor dies after the key stages of round 1, before its masked upload."""
    with pytest.warns(RuntimeWarning, match=r"client\(s\) \[2\] lost in half:masked_upload of round 1: actor 1 died"):
        strategy, protocol, rows = _run("mask", KillingRayExecutor(victim=2, method="half:masked_upload"))
    assert strategy.split and [r["clients_lost"] for r in rows] == [0, 1, 1]
    assert protocol.last_included == (0, 1)              # the survivors' sum, by mask recovery
    assert strategy.final_metrics()["executor"]["dead_actors"] == {"1": "actor 1 died (ActorDiedError)"}


def test_actor_killed_inside_a_ckks_exchange_stops_it_naming_its_clients():
    with pytest.warns(RuntimeWarning), pytest.raises(DropoutError, match=r"client\(s\) 2 did not answer the 'upload'"):
        _run("ckks", KillingRayExecutor(victim=2, method="half:upload"))


def test_silent_actors_time_out_instead_of_hanging():
    executor = RayExecutor(round_timeout=30)
    cfg = small(rounds=1).validate()
    fed = load_federation(cfg)
    strategy = make_strategy(cfg, fed, make_run_protocol(cfg, fed.num_clients), {}, executor)
    executor.round_timeout = 1e-3
    with pytest.warns(RuntimeWarning, match="no answer within --round-timeout"):
        strategy.ask("local_update", {k: {"round": 0} for k in range(3)})
    assert sorted(strategy.lost) == [0, 1, 2]
    executor.shutdown()

