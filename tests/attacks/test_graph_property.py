"""Graph-property inference on graph-level clients.

Attacks.graph_property. A planted property (half of the clients hold only dense graphs) is separated above chance
from the plaintext updates, and a server that reads no update (mask) gets nothing.
"""

from __future__ import annotations

import pytest

from attacks.graph_property import dense_majority, edge_density
from secure_fgl.config import RunConfig
from secure_fgl.data.errors import DataError
from secure_fgl.data.synthetic_graphs import two_task_graphs
from secure_fgl.experiment import run_experiment

CLIENTS = 16
PLANTED = [1.0 if (k // 2) % 2 == 0 else 0.0 for k in range(CLIENTS)]


def attack_entry(mode: str) -> dict:
    cfg = RunConfig(
        algorithm="gc-fedavg",
        mode=mode,
        dataset="synthetic-graphs",
        clients=CLIENTS,
        rounds=1,
        hidden=16,
        num_layers=3,
        lr=1e-2,
        seed=0,
        synthetic={"dense_share": PLANTED},
        attacks=["graph_property"],
    )
    return next(e for e in run_experiment(cfg, progress=False)["attacks"] if e["name"] == "graph_property")


def test_the_planted_property_is_what_the_generator_made():
    fed = two_task_graphs(CLIENTS, seed=0, dense_share=PLANTED)
    assert [dense_majority(c.train, 0.3) for c in fed.clients] == [s > 0.5 for s in PLANTED]
    assert all(0.0 <= edge_density(g) <= 1.0 for g in fed.clients[0].train)
    with pytest.raises(DataError, match="dense_share"):
        two_task_graphs(4, dense_share=[0.5, 0.5])


def test_the_server_separates_the_planted_property_above_chance():
    e = attack_entry("plain")
    assert e["applicable"] and e["metric"] == "auc" and e["chance"] == 0.5 and e["samples"] == CLIENTS
    assert e["with_property"] == CLIENTS // 2
    assert e["ci"][0] > e["chance"] and not e["at_chance"]


def test_under_mask_the_server_reads_nothing_and_the_attack_is_at_chance():
    e = attack_entry("mask")
    assert not e["applicable"] and "reads no client update" in e["reason"]
    assert e["audit_passed"] and e["at_chance"]
