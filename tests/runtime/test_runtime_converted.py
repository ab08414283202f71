"""fgssl, centralized and fedgcn-gap on the client runtimes: the golden run."""

from __future__ import annotations

import pytest
from support.golden import assert_golden
from support.runs import reachable_tensors, small

from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor
from secure_fgl.runtime.strategy import EVAL_TAG

CASES = [
    ("fgssl", "plain", {}),
    ("fgssl", "mask", {"variant": "paper"}),
    ("centralized", "mask", {"center": True}),
    ("fedgcn-gap", "plain", {"layout": "dense", "hops": 1}),
    ("fedgcn-gap", "mask", {"encoder_rounds": 2}),
]
FINAL = ("train_acc", "val_acc", "test_acc", "test_acc_client_mean", "encoder_test_acc", "uses_head")


@pytest.mark.parametrize("algorithm,mode,options", CASES)
def test_local_executor_gives_the_golden_run(algorithm, mode, options, request):
    """Local executor gives the golden run.

    Same losses and accuracies (exact: plain, mask), same protocol bytes per tag as the golden run
    (recorded when the in-process algorithm and the runtimes were proven equal).
    """
    run = run_experiment(small(algorithm, mode, options=dict(options)), progress=False)
    assert_golden(
        "runtime_converted",
        request.node.name,
        {
            "train_loss": [r["train_loss"] for r in run["rounds"]],
            "final": {k: run["final"].get(k) for k in FINAL},
            "per_tag": run["comm"]["per_tag"],
        },
    )
    assert run["comm"]["per_tag"][EVAL_TAG]["bytes_up"] > 0


@pytest.mark.parametrize("algorithm,options", [("fgssl", {"variant": "paper"}), ("fedgcn-gap", {"hops": 1})])
def test_a_runtime_holds_no_other_clients_tensors(algorithm, options):
    cfg = small(algorithm, "plain", options=dict(options)).validate()
    fed = load_federation(cfg)
    executor = LocalExecutor()
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)  # the halves in the runtimes
    strategy = make_strategy(cfg, fed, protocol, dict(options), executor)
    strategy.setup()
    strategy.train_round(0)
    held = {k: set(reachable_tensors(rt)) for k, rt in executor.runtimes.items()}
    driver = {t.untyped_storage().data_ptr() for c in fed.clients for t in (c.x, c.y, c.edge_index)}
    driver |= {fed.graph.x.untyped_storage().data_ptr(), fed.graph.y.untyped_storage().data_ptr()}
    for k in held:
        assert not held[k] & driver
        assert all(not held[k] & held[j] for j in held if j != k)


def test_centralized_is_one_runtime_holding_the_whole_graph():
    """The non-federated reference: host 0 holds every node; accuracy is still broken down per client."""
    cfg = small("centralized", "plain").validate()
    fed = load_federation(cfg)
    executor = LocalExecutor()
    strategy = make_strategy(cfg, fed, make_runtime_protocol(cfg, fed.num_clients, executor), {}, executor)
    assert list(executor.runtimes) == [0] and executor.runtimes[0].data.num_nodes == fed.graph.num_nodes
    strategy.train_round(0)
    assert [r["client"] for r in strategy.evaluate()["per_client"]] == list(range(fed.num_clients))
