"""The Ray executor.

The same run as in-process, bytes counted at the actor boundary, lost actors as protocol dropouts, clients pinned by
resource. One local Ray cluster (2 CPUs, a custom resource ``site_a``) for the module; its actors are reused from
test to test (:data:`secure_fgl.runtime.ray_executor._IDLE_HOSTS`). An actor costs seconds to start, so the tests
that kill actors come last, in file order.
"""

from __future__ import annotations

import pytest
from support.runs import (
    Recording,
    build_graph_run,
    drive_graph_run,
    graph_config,
    protocol_bytes_crossing,
    refusal_keeps_the_other_clients_keys,
    small,
)

from secure_fgl.algorithms.fedgcn.ops import IDS_TAG, ORDER_TAG
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor
from secure_fgl.runtime.messages import FitIns
from secure_fgl.runtime.ray_executor import _IDLE_HOSTS, RayExecutor
from secure_fgl.runtime.strategy import EVAL_TAG

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[ray]'")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(address="local", num_cpus=2, resources={"site_a": 1}, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


#: mask and shared-key ckks also run over Ray below (an actor killed in each one's exchange, a refusal in ckks)
@pytest.mark.parametrize(
    "mode",
    ["plain", pytest.param("mask", marks=pytest.mark.slow), pytest.param("ckks", marks=pytest.mark.slow), "ckks-mp"],
)
def test_ray_gives_the_local_run_and_its_byte_counts(mode):
    cfg = dict(options={"row_order": "signature"}, rounds=2)
    local = run_experiment(small("fedgcn", mode, executor="local", **cfg), progress=False)
    remote = run_experiment(small("fedgcn", mode, executor="ray", **cfg), progress=False)
    assert remote["runtime"]["workers"] == 2
    losses = [[r["train_loss"] for r in run["rounds"]] for run in (local, remote)]
    if mode in ("ckks", "ckks-mp"):  # fresh encryption noise: equal within the exchange's tolerance
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
    assert [[(r["train_loss"], r["cmd_loss"]) for r in run["rounds"]] for run in runs] == [
        [(r["train_loss"], r["cmd_loss"]) for r in runs[0]["rounds"]]
    ] * 2
    assert runs[0]["final"]["test_acc"] == runs[1]["final"]["test_acc"]
    assert runs[0]["comm"]["per_tag"] == runs[1]["comm"]["per_tag"]
    # the actors kept for the next run on this cluster hold no runtime of this one
    idle = ray.get([host.memory.remote() for host in _IDLE_HOSTS])
    assert idle and all(m["clients"] == 0 and m["Pss"] > 0 for m in idle)


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
        assert protocol.clients == {}  # the halves (and their keys) live in the actors
        strategy.setup()
        for r in range(cfg.rounds):
            strategy.train_round(r)
    finally:
        executor.shutdown()
    recorded = sum(m.nbytes for m in protocol.transcript.messages if m.tag not in (EVAL_TAG, ORDER_TAG, IDS_TAG))
    assert recorded == protocol_bytes_crossing(executor.frames) > 0


def test_gcfl_on_actors_splits_as_in_process_with_the_same_bytes():
    """Gcfl on actors splits as in process with the same bytes.

    GCFL (plain, forced split at round 20) with the clients and their protocol halves on actors:
    the same losses, splits and bytes per tag (model, reports, similarity) as the local executor.
    """
    cfg = graph_config("gcfl", "plain")
    strategy, protocol, _ = build_graph_run(cfg, LocalExecutor())
    local = drive_graph_run(strategy), protocol.transcript.comm()["per_tag"]
    executor = RayExecutor()
    strategy, protocol, _ = build_graph_run(cfg, executor)
    try:
        remote = drive_graph_run(strategy), protocol.transcript.comm()["per_tag"]
    finally:
        executor.shutdown()
    assert [r["train_loss"] for r in remote[0][0]] == [r["train_loss"] for r in local[0][0]] and remote[0][1]["splits"]
    assert remote[1] == local[1]


def test_dp_noise_is_added_on_the_actors_and_accounted_as_local():
    """DP noise is added on the actors and accounted as local.

    DP on Ray: every contributor's runtime, on its actor, noises its own upload (privatize calls
    to the actors); the driver's accountant reports the local executor's privacy section.
    """
    dp = dict(rounds=1, dp_epsilon=4.0, dp_exchanges="fedgcn/neighbour_sums")
    local = run_experiment(small("fedgcn", "mask", **dp), progress=False)
    remote = run_experiment(small("fedgcn", "mask", executor="ray", **dp), progress=False)
    assert remote["privacy"] == local["privacy"] and remote["privacy"]["total_epsilon"] == pytest.approx(4.0, rel=1e-2)
    assert remote["runtime"]["stats"]["per_method"]["privatize:fedgcn/neighbour_sums"]["calls"] >= 1


def test_dpsgd_runs_on_the_actors_with_the_privacy_section_of_local():
    """DP-SGD runs on the actors with the privacy section of local.

    fedgcn-gap --dpsgd on Ray (one round a stage): each client's DP-SGD steps on its actor, the
    driver's accountant as with the local executor.
    """
    cfg = dict(rounds=1, dp_epsilon=4.0, options={"dpsgd": True})
    local = run_experiment(small("fedgcn-gap", "plain", **cfg), progress=False)
    remote = run_experiment(small("fedgcn-gap", "plain", executor="ray", **cfg), progress=False)
    assert remote["config"]["executor"] == "ray" and remote["privacy"] == local["privacy"]
    assert {r["tag"] for r in remote["privacy"]["releases"] if r.get("unit") == "sample"} == {
        "fedgcn-gap/encoder/dpsgd",
        "fedgcn-gap/dpsgd",
    }


def test_simulated_dropouts_on_ray_give_the_local_run():
    """Simulated dropouts on ray give the local run.

    --simulate-dropouts acts where an actor's runtime answers a stage: the same clients drop, the
    same survivors' sums (mask recovery), the same run as on the local executor.
    """
    cfg = dict(rounds=2, simulate_dropouts="2,@upload:r1")
    local = run_experiment(small("fedavg", "mask", executor="local", **cfg), progress=False)
    remote = run_experiment(small("fedavg", "mask", executor="ray", **cfg), progress=False)
    assert remote["runtime"]["simulated_dropouts"]["dropped"] == [
        {"round": 1, "stage": "masked_upload", "clients": [2]}
    ]
    assert remote["runtime"]["simulated_dropouts"] == local["runtime"]["simulated_dropouts"]
    assert [r["train_loss"] for r in remote["rounds"]] == [r["train_loss"] for r in local["rounds"]]
    assert remote["final"]["test_acc"] == local["final"]["test_acc"]


def test_a_refusing_client_does_not_cost_the_clients_sharing_its_actor_their_keys():
    """A refusing client does not cost the clients sharing its actor their keys.

    All three clients on one actor, client 0 first: the actor lets 1 and 2 read their bundles
    before it re-raises client 0's refusal (test_runtime.refusal_keeps_the_other_clients_keys).
    """
    refusal_keeps_the_other_clients_keys(RayExecutor(workers=1))


def test_clients_pinned_to_a_resource_run_on_actors_that_hold_it():
    from secure_fgl.config import ConfigError

    cfg = small(rounds=1, executor="ray", ray_client_resources="site_a:0,2").validate()
    fed = load_federation(cfg)
    executor = RayExecutor(workers=2, client_resources={0: "site_a", 2: "site_a"})
    strategy = make_strategy(cfg, fed, make_runtime_protocol(cfg, fed.num_clients, executor), {}, executor)
    try:
        placed = executor.resources()
        assert placed[0]["resources"].get("site_a") and placed[2]["resources"].get("site_a")
        assert "site_a" not in placed[1]["resources"] and executor.placement[0] == executor.placement[2]
        assert strategy.train_round(0)["clients_lost"] == 0
        assert executor.describe()["client_resources"] == {"0": "site_a", "2": "site_a"}
    finally:
        executor.shutdown()
    with pytest.raises(ConfigError, match="no node of the cluster declares site_b"):
        RayExecutor(client_resources={1: "site_b"})


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
    assert [r["clients_lost"] for r in rows] == [0, 1, 1]
    assert protocol.last_included == (0, 1)  # the survivors' sum, by mask recovery
    assert strategy.final_metrics()["executor"]["dead_actors"] == {"1": "actor 1 died (ActorDiedError)"}


def test_actor_killed_inside_a_ckks_exchange_leaves_the_survivors_sum():
    """Shared-key ckks: a client lost before its upload is not a contributor; the others' sum is delivered."""
    with pytest.warns(RuntimeWarning, match=r"client\(s\) \[2\] lost in half:upload"):
        strategy, protocol, rows = _run("ckks", KillingRayExecutor(victim=2, method="half:upload"))
    assert [r["clients_lost"] for r in rows] == [0, 1, 1] and protocol.last_included == (0, 1)


def test_silent_actors_time_out_instead_of_hanging():
    executor = RayExecutor(round_timeout=180)  # set-up alone; generous for a loaded machine
    cfg = small(rounds=1).validate()
    fed = load_federation(cfg)
    strategy = make_strategy(cfg, fed, make_runtime_protocol(cfg, fed.num_clients, executor), {}, executor)
    executor.round_timeout = 0.0  # ray.wait answers at once (within 1 ms, a warm actor answered)
    with pytest.warns(RuntimeWarning, match="no answer within --round-timeout"):
        strategy.ask("local_update", {k: FitIns(0) for k in range(3)})
    assert sorted(strategy.lost) == [0, 1, 2]
    executor.shutdown()
