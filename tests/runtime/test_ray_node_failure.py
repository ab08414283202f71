"""A real multi-node Ray cluster losing a node.

A real multi-node Ray cluster (Ray's own test harness, ``ray.cluster_utils.Cluster``: a head and
two worker raylets on 127.0.0.1), clients pinned to the two worker nodes by resource
(``--ray-client-resources``), and one node killed mid-round (``Cluster.remove_node``):

* mask: the clients of the dead node become dropouts and the round completes with the survivors'
  sum (Shamir recovery: 3 of 5 survive, t = 3);
* t-out-of-n ckks-mp (``--threshold 3`` of 5): likewise, the dead node's clients are left out at upload
  and the three survivors form the active set of the key switch;
* ckks-mp (n-out-of-n): the run stops with a DropoutError naming the lost clients; once the node
  is back, ``--resume`` continues from the last checkpoint to the end of the run.

Every wait is bounded (``--round-timeout``, ``wait_for_nodes``) and the cluster is shut down in
teardown.
"""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[ray]'")

from protocols import DropoutError  # noqa: E402
from secure_fgl import experiment  # noqa: E402
from secure_fgl.config import RunConfig  # noqa: E402
from secure_fgl.experiment import load_federation, run_experiment  # noqa: E402
from secure_fgl.runtime import build, placement, ray_executor  # noqa: E402
from secure_fgl.runtime.ray_executor import RayExecutor  # noqa: E402

pytestmark = pytest.mark.slow
PINNED = "site_a:0-2;site_b:3,4"  # clients 0-2 on node A, 3-4 on node B
TIMEOUT = 120.0  # seconds a call may take before its silent clients are dropouts


@pytest.fixture
def nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    ray_executor._IDLE_HOSTS.clear()  # actors of an earlier module's cluster, gone with it
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the driver's node hosts no actor
    node_a = cluster.add_node(num_cpus=1, resources={"site_a": 1})
    node_b = cluster.add_node(num_cpus=1, resources={"site_b": 1})
    try:
        cluster.wait_for_nodes(timeout=TIMEOUT)
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster, node_a, node_b
    finally:
        ray.shutdown()
        cluster.shutdown()


def config(mode: str, cluster, **kw) -> RunConfig:
    return RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        clients=5,
        mode=mode,
        rounds=3,
        executor="ray",
        ray_address=cluster.address,
        ray_client_resources=PINNED,
        round_timeout=TIMEOUT,
        partition="iid",
        synthetic={"num_nodes": 200, "num_features": 16},
        **kw,
    ).validate()


class NodeKillingExecutor(RayExecutor):
    """Removes ``node`` from ``cluster`` just before the first ``method`` call of round ``at_round``."""

    def __init__(self, cluster, node, method: str, at_round: int, **kw):
        super().__init__(**kw)
        self.cluster, self.node, self.method, self.at_round, self.calls = cluster, node, method, at_round, 0

    def _call(self, method, requests):
        if method == self.method:
            self.calls += 1
            if self.calls == self.at_round + 1 and self.node is not None:
                self.remove_node()
        return super()._call(method, requests)

    def remove_node(self) -> None:
        """Kill the node's raylet and processes and wait until its actors are dead.

        Kill the node's raylet and processes; return once its actors are reported dead (their
        workers exit when they find their raylet gone, which takes a moment), within the timeout.
        """
        doomed = [a for a, r in zip(self.actors, self.actor_resources) if r == "site_b"]
        self.cluster.remove_node(self.node, allow_graceful=False)
        self.node = None
        deadline = time.monotonic() + self.round_timeout
        for actor in doomed:
            while True:
                try:
                    self.ray.get(actor.memory.remote(), timeout=5)
                except self.ray.exceptions.GetTimeoutError:
                    pass  # silent, not yet reported dead: ask again
                except self.ray.exceptions.RayError:
                    break
                assert time.monotonic() < deadline, "an actor of the removed node still answers"
                time.sleep(0.2)


def killing(cluster, node, method, at_round, made: list | None = None):
    """A ``make_executor`` whose executor removes ``node`` (each one made is appended to ``made``)."""

    def make(cfg, device="cpu"):
        executor = NodeKillingExecutor(
            cluster,
            node,
            method,
            at_round,
            address=cfg.ray_address,
            round_timeout=cfg.round_timeout,
            client_resources=placement.client_resources(cfg),
        )
        (made if made is not None else []).append(executor)
        return executor

    return make


def test_mask_finishes_the_round_without_the_dead_nodes_clients(nodes):
    cluster, _, node_b = nodes
    cfg = config("mask", cluster)
    fed = load_federation(cfg)
    executor = killing(cluster, node_b, "half:masked_upload", at_round=1)(cfg)
    protocol = build.make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = build.make_strategy(cfg, fed, protocol, {}, executor)
    try:
        on = executor.resources()
        assert {on[k]["node"] for k in (0, 1, 2)} != {on[k]["node"] for k in (3, 4)}  # two nodes
        strategy.train_round(0)
        assert protocol.last_included == (0, 1, 2, 3, 4)
        with pytest.warns(RuntimeWarning, match=r"client\(s\) \[3, 4\] lost in half:masked_upload of round 1"):
            strategy.train_round(1)
        assert protocol.last_included == (0, 1, 2)  # the survivors' sum, by Shamir recovery
        strategy.train_round(2)  # the next round runs without them
        assert protocol.last_included == (0, 1, 2) and sorted(strategy.lost) == [3, 4]
    finally:
        executor.shutdown()


def test_threshold_ckks_mp_finishes_the_round_without_the_dead_nodes_clients(nodes):
    cluster, _, node_b = nodes
    cfg = config("ckks-mp", cluster, threshold=3)
    fed = load_federation(cfg)
    executor = killing(cluster, node_b, "half:upload", at_round=1)(cfg)
    protocol = build.make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = build.make_strategy(cfg, fed, protocol, {}, executor)
    try:
        strategy.train_round(0)
        assert protocol.last_included == (0, 1, 2, 3, 4)
        with pytest.warns(RuntimeWarning, match=r"client\(s\) \[3, 4\] lost in half:upload of round 1"):
            strategy.train_round(1)
        assert protocol.last_included == (0, 1, 2)  # the survivors' uploads, key-switched by them (t = 3)
        strategy.train_round(2)
        assert protocol.last_included == (0, 1, 2) and sorted(strategy.lost) == [3, 4]
    finally:
        executor.shutdown()


def test_ckks_mp_stops_cleanly_and_resume_continues_from_the_checkpoint(nodes, tmp_path, monkeypatch):
    cluster, _, node_b = nodes
    out = str(tmp_path / "run")
    made: list = []
    monkeypatch.setattr(experiment, "make_executor", killing(cluster, node_b, "half:upload", at_round=1, made=made))
    with (
        pytest.warns(RuntimeWarning, match=r"client\(s\) \[3, 4\] lost"),
        pytest.raises(DropoutError, match=r"client\(s\) 3, 4 did not send"),
    ):
        run_experiment(config("ckks-mp", cluster, out=out), progress=False)
    monkeypatch.undo()
    made[0].shutdown()  # the driver process would have exited
    cluster.add_node(num_cpus=1, resources={"site_b": 1})  # the site's machine is back
    cluster.wait_for_nodes(timeout=TIMEOUT)
    resumed = run_experiment(config("ckks-mp", cluster, out=out, resume=True), progress=False)
    assert [r["round"] for r in resumed["rounds"]] == [0, 1, 2] and resumed["final"]["clients_lost"] == {}
