"""Tests of ``examples/fgssl_whole_graph_eval.py``.

``examples/fgssl_whole_graph_eval.py``: the saved models re-scored on the clients' subgraphs give
the run's own test accuracy back; federated methods score one global model on the whole graph.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from fgssl_table1 import paper_accuracy  # noqa: E402
from fgssl_whole_graph_eval import evaluate_run, write_table  # noqa: E402
from sweep import Job, run_sweep  # noqa: E402

from secure_fgl.config import RunConfig  # noqa: E402


def test_paper_accuracy_per_number_of_clients():
    assert paper_accuracy("cora", "FGSSL", 5) == 88.34
    assert paper_accuracy("cora", "Local (GAT)", 10) == 32.42
    assert paper_accuracy("cora", "FGSSL", 3) == "–"
    assert paper_accuracy("pubmed", "FGSSL w/o FNSC", 5) == "–"


def test_whole_graph_eval_reproduces_the_runs_accuracy(tmp_path):
    base = dict(
        dataset="sbm",
        clients=3,
        partition="louvain",
        split="fgssl",
        model="gat",
        hidden=16,
        heads=1,
        optimizer="sgd",
        momentum=0.9,
        lr=0.05,
        rounds=3,
        local_epochs=1,
        seed=3,
    )
    jobs = [
        Job(
            tmp_path / "table" / "sbm" / f"{slug}-plain" / "seed3",
            RunConfig(algorithm=algorithm, **base),
            {"method": method, "options": {}},
        )
        for slug, algorithm, method in [("local_gat", "local", "Local (GAT)"), ("fedavg_gat", "fedavg", "FedAvg (GAT)")]
    ]
    results = {}
    run_sweep(jobs, lambda job, r, s: results.update({job.meta["method"]: r}))
    records = {job.meta["method"]: evaluate_run(job.dir, None) for job in jobs}
    for method, recs in records.items():
        assert len(recs) == 3
        weighted = sum(r["subgraph"] * r["test_nodes"] for r in recs) / sum(r["test_nodes"] for r in recs)
        assert weighted == pytest.approx(100 * results[method]["final"]["test_acc"], abs=1e-3)
    assert len({r["whole_graph"] for r in records["FedAvg (GAT)"]}) == 1  # one global model
    table = write_table([r for recs in records.values() for r in recs], tmp_path)
    assert "| sbm | 3 | Local (GAT) | 1 | 3 |" in table and "| sbm | 3 | FedAvg (GAT) | 1 | 3 |" in table
