"""Graph-classification algorithms as client runtimes.

Graph-classification algorithms (gc-*, GCFL, GCFL+) as client runtimes: the same
losses, accuracies, cluster splits and protocol bytes as the golden runs; a runtime
holds only its own graphs; a resumed strategy continues exactly.
"""

from __future__ import annotations

import pytest
from support.golden import assert_golden
from support.runs import ROUNDS, build_graph_run, drive_graph_run, graph_config, reachable_tensors

from protocols.ckks.similarity import SIMILARITY_TOLERANCE
from secure_fgl.runtime.executor import LocalExecutor


@pytest.mark.parametrize(
    "algorithm,mode",
    [
        ("gc-fedavg", "mask"),
        ("gc-fedprox", "plain"),
        ("gc-selftrain", "plain"),
        ("gcfl", "plain"),
        ("gcfl", "ckks"),
        ("gcflplus", "mask"),
    ],
)
def test_local_executor_gives_the_golden_run(algorithm, mode, request):
    cfg = graph_config(algorithm, mode)
    strategy, p_local, _ = build_graph_run(cfg, LocalExecutor())
    assert p_local.clients == {}  # the protocol's client halves live in the runtimes
    b, fb = drive_graph_run(strategy)
    keys = ("train_loss", "num_clusters", "test_acc", "val_acc", "train_acc", "test_acc_client_mean")
    observed = {
        "rounds": [{k: rb[k] for k in keys} for rb in b],
        "clusters": fb["clusters"],
        "per_client_test_acc_last": fb["per_client_test_acc_last"],
    }
    if "gcfl" in algorithm:
        assert fb["splits"], "the forced criteria must split"
        observed["splits"] = [[s["round"], s["into"], s["delta_mean"], s["delta_max"]] for s in fb["splits"]]
        observed["similarity"] = fb["splits"][0]["similarity"]
    # every protocol exchange (model, scalar reports, similarity) runs in the halves: the golden bytes
    # per tag (ckks similarity: fresh keys and ciphertexts vary in size, the same messages)
    tb = p_local.transcript.comm()["per_tag"]
    if mode == "ckks":
        similarity = tb.pop(f"{algorithm}/similarity")
        observed["similarity_messages"] = similarity["messages"]
    observed["per_tag"] = tb
    assert_golden(
        "runtime_graph",
        request.node.name,
        observed,
        tolerance={"similarity": SIMILARITY_TOLERANCE} if mode == "ckks" else {},
    )
    if "gcfl" in algorithm:
        assert {f"{algorithm}/update_norms", f"{algorithm}/mean_norm"} <= set(tb)


def test_a_graph_runtime_holds_only_its_own_graphs():
    cfg = graph_config("gcfl", "plain")
    executor = LocalExecutor()
    strategy, _, fed = build_graph_run(cfg, executor)
    strategy.train_round(0)
    held = {k: reachable_tensors(rt) for k, rt in executor.runtimes.items()}
    driver = {
        t.untyped_storage().data_ptr()
        for c in fed.clients
        for s in ("train", "val", "test")
        for g in getattr(c, s)
        for t in (g.x, g.edge_index, g.y)
    }
    for k, rt in executor.runtimes.items():
        assert len(rt.data.train) == len(fed.clients[k].train)
        assert rt.data.train[0].x.untyped_storage().data_ptr() in held[k]
        assert not set(held[k]) & driver, f"runtime {k} holds a tensor of the driver's partition"
        for j in held:
            if j != k:
                assert not set(held[k]) & set(held[j]), f"runtime {k} shares a tensor with runtime {j}"


def test_a_resumed_strategy_continues_every_client_and_the_clusters(tmp_path):
    """A resumed strategy continues every client and the clusters.

    Checkpoint after round 20 (each client writes its own file), rebuild everything, load, run
    round 21: the same as the uninterrupted run (GCFL+ sequences and clusters included).
    """
    cfg = graph_config("gcflplus", "mask", out=str(tmp_path))
    full, _, _ = build_graph_run(cfg, LocalExecutor())
    expect, _ = drive_graph_run(full)
    first, _, _ = build_graph_run(cfg, LocalExecutor())
    first.train_round(ROUNDS[0])
    first.evaluate()
    state = first.state_dict()
    assert list((tmp_path / "clients").glob("client4.*.pt"))
    resumed, _, _ = build_graph_run(cfg, LocalExecutor())
    resumed.load_state_dict(state)
    got, final = drive_graph_run(resumed, ROUNDS[1:])
    assert got[0]["train_loss"] == expect[1]["train_loss"] and got[0]["test_acc"] == expect[1]["test_acc"]
    assert final["clusters"] == full.clusters and final["splits"] == full.splits


def test_the_attack_suite_reads_a_graph_clients_model_from_its_runtime_golden(request):
    """The attack suite reads a graph clients model from its runtime golden.

    `victim_model` (K3) on the runtimes: the victim's GIN asked of its runtime is the golden run's
    model of that client (a runtime answers only in a run with --attacks).
    """
    from attacks.parties import party_access

    cfg = graph_config("gc-fedavg", "plain", attacks=["gin_gradient_inversion"])
    strategy, p_local, fed = build_graph_run(cfg, LocalExecutor())
    strategy.train_round(0)
    got = party_access(strategy).victim_model(3).state_dict()
    assert_golden(
        "runtime_graph",
        request.node.name,
        {
            name: {"shape": list(t.shape), "sum": float(t.double().sum()), "first": t.flatten()[:4].tolist()}
            for name, t in got.items()
        },
    )
