"""Client runtimes, strategies and the local executor (Ray: test_runtime_ray.py)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from support.golden import assert_golden
from support.runs import (
    FlakyExecutor,
    RecordingExecutor,
    protocol_bytes_crossing,
    reachable_tensors,
    refusal_keeps_the_other_clients_keys,
    run_with,
    small,
)

from secure_fgl.algorithms.fedgcn.ops import ORDER_TAG
from secure_fgl.config import ConfigError
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.runtime import wire
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor
from secure_fgl.runtime.strategy import EVAL_TAG


def test_wire_round_trip_and_refuses_malformed_frames():
    fields = {"a": np.arange(6, dtype=np.int64).reshape(2, 3), "t": torch.ones(4), "tag": "x/y", "round": 3}
    out = wire.unpack(wire.pack(fields))
    assert np.array_equal(out["a"], fields["a"]) and out["t"].dtype == np.float32 and out["tag"] == "x/y"
    frame = wire.pack(fields)
    for bad in (b"", b"pickle" + frame[6:], frame[:-3]):
        with pytest.raises(wire.WireError):
            wire.unpack(bad)
    with pytest.raises(wire.WireError):
        wire.pack({"o": np.array([object()])})


def test_a_client_runtime_holds_no_other_clients_tensors():
    cfg = small("fedgcn", options={"row_order": "signature"}).validate()
    fed = load_federation(cfg)
    executor = LocalExecutor()
    strategy = make_strategy(
        cfg, fed, make_runtime_protocol(cfg, fed.num_clients, executor), {"row_order": "signature"}, executor
    )
    strategy.setup()
    strategy.train_round(0)
    held = {k: reachable_tensors(rt) for k, rt in executor.runtimes.items()}
    for k, rt in executor.runtimes.items():
        assert rt.data.x.untyped_storage().data_ptr() in held[k]
        for j in held:
            if j != k:
                assert not set(held[k]) & set(held[j]), f"runtime {k} shares a tensor with runtime {j}"
        # nothing of the driver's partition (other clients' data, the global graph) is reachable
        driver = {t.untyped_storage().data_ptr() for c in fed.clients for t in (c.x, c.y, c.edge_index)}
        driver |= {fed.graph.x.untyped_storage().data_ptr(), fed.graph.y.untyped_storage().data_ptr()}
        assert not set(held[k]) & driver
        assert not any(type(o).__name__ == "FederatedGraph" for o in gc.get_referents(rt.logic))


@pytest.mark.parametrize(
    "algorithm,options",
    [("fedavg", {}), ("fedprox", {}), ("local", {}), ("fedgcn", {"row_order": "signature", "hops": 2})],
)
def test_local_executor_gives_the_golden_run(algorithm, options, request):
    """Local executor gives the golden run.

    Same models (exact, mask), same protocol bytes as the golden run (recorded when the in-process
    algorithm and the runtimes were proven equal); the runtime's own messages are counted.
    """
    b = run_experiment(small(algorithm, options=dict(options)), progress=False)
    assert_golden(
        "runtime",
        request.node.name,
        {
            "train_loss": [r["train_loss"] for r in b["rounds"]],
            "test_acc": b["final"]["test_acc"],
            "per_tag": b["comm"]["per_tag"],
        },
    )
    stats = b["runtime"]["stats"]["per_method"]
    assert b["comm"]["per_tag"][EVAL_TAG]["bytes_up"] == stats["evaluate"]["bytes_from_clients"]
    if algorithm == "fedgcn":
        assert b["comm"]["per_tag"][ORDER_TAG]["bytes_up"] == stats[f"contribute:{ORDER_TAG}"]["bytes_from_clients"]


def test_client_lost_inside_the_mask_exchange_of_its_runtime_half_is_recovered():
    """Client lost inside the mask exchange of its runtime half is recovered.

    The mask halves run in the runtimes; client 1 answers the key stages, then vanishes before its
    masked upload of round 1: the server half recovers the survivors' sum from the Shamir shares.
    """
    executor = FlakyExecutor(victim=1, method="half:masked_upload", nth=2)
    with pytest.warns(RuntimeWarning, match=r"client\(s\) \[1\] lost in half:masked_upload"):
        strategy, protocol, rows = run_with(small(mode="mask"), executor)
    assert protocol.clients == {}
    assert rows[1]["clients_lost"] == 1 and protocol.last_included == (0, 2)


def test_resume_continues_each_client_from_its_own_checkpoint(tmp_path):
    full = run_experiment(small(executor="local", rounds=4, out=str(tmp_path / "a")), progress=False)
    run_experiment(small(executor="local", rounds=2, out=str(tmp_path / "b")), progress=False)
    assert list((tmp_path / "b" / "clients").glob("client2.*.pt"))
    resumed = run_experiment(small(executor="local", rounds=4, out=str(tmp_path / "b"), resume=True), progress=False)
    assert [r["train_loss"] for r in resumed["rounds"]] == [r["train_loss"] for r in full["rounds"]]


def test_every_algorithm_names_a_client_logic_and_a_server_strategy():
    from secure_fgl.algorithms import SPECS
    from secure_fgl.runtime.logic import ClientLogic
    from secure_fgl.runtime.strategy import Strategy

    for spec in SPECS.values():
        assert issubclass(spec.logic_class(), ClientLogic) and issubclass(spec.strategy_class(), Strategy), spec.name


@pytest.mark.parametrize("algorithm", ["fedavg", "fedgcn"])
def test_backend_halves_live_in_the_runtimes_and_only_counted_bytes_cross(algorithm):
    """Backend halves live in the runtimes and only counted bytes cross.

    plain runs as client/server halves: the driver holds no client half, and the transcript's
    protocol bytes are exactly the messages handed to / returned from the runtimes.
    """
    cfg = small(algorithm, mode="plain", executor="local").validate()
    fed = load_federation(cfg)
    executor = RecordingExecutor()
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, {}, executor)
    assert protocol.clients == {}
    assert all(rt.half is not None for rt in executor.runtimes.values())
    strategy.setup()
    for r in range(2):
        strategy.train_round(r)
    recorded = sum(
        m.nbytes for m in protocol.transcript.messages if m.tag not in (EVAL_TAG, ORDER_TAG, "fedgcn/row_ids")
    )
    assert recorded == protocol_bytes_crossing(executor.frames) > 0


@pytest.mark.parametrize("fixed_point_bits", [None, 20])
def test_local_executor_keeps_the_secure_mode_settings_golden(fixed_point_bits, request):
    """Local executor keeps the secure mode settings golden.

    --update-bound and --fixed-point-bits reach the runtime's protocol: the model exchange takes
    the encoding (so the bytes) of the golden run.
    """
    run = run_experiment(
        small(mode="ckks", rounds=1, update_bound=1.0, fixed_point_bits=fixed_point_bits), progress=False
    )
    assert_golden("runtime", request.node.name, {"model_bytes": run["comm"]["per_tag"]["fedavg/model"]})
    assert run["comm"]["per_tag"]["fedavg/model"]["bytes_up"] > 0


def test_a_refusing_client_does_not_cost_the_others_their_keys():
    refusal_keeps_the_other_clients_keys(LocalExecutor())


def test_client_resources_parse_and_place_each_group_on_its_own_actors():
    from secure_fgl.runtime.placement import actor_plan, parse_client_resources

    pinned = parse_client_resources("site_a:0-2, 5; site_b:3", 8)
    assert pinned == {0: "site_a", 1: "site_a", 2: "site_a", 5: "site_a", 3: "site_b"}
    actors, placement = actor_plan(list(range(8)), pinned, workers=4)
    assert all(actors[placement[k]] == pinned.get(k) for k in range(8))  # each client on an actor of its resource
    assert actors.count("site_a") == 2 and actors.count("site_b") == 1 and actors.count(None) == 1
    assert actor_plan(list(range(10)), {}, 4)[1] == {k: k * 4 // 10 for k in range(10)}  # the default grouping
    for bad, why in [
        ("site_a", "RESOURCE:CLIENTS"),
        ("CPU:0", "custom resource"),
        ("a:9", r"within 0\.\.7"),
        ("a:x", "not a client id"),
        ("a:0;b:0", "both a and b"),
    ]:
        with pytest.raises(ConfigError, match=why):
            parse_client_resources(bad, 8)
    with pytest.raises(ConfigError, match="needs --executor ray"):
        run_experiment(small(executor="local", ray_client_resources="a:0"), progress=False)
