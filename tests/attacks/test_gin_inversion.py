"""Graph-level attacks.

The gradient inversion of a GIN update, the cut margin of GCFL's split, and graph-level runs in the ``--attacks``
runner.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector
from torch_geometric.loader import DataLoader

from attacks.gin_inversion import invert_gin_update
from attacks.runner import resolve_names, run_attacks
from secure_fgl.algorithms.clustering import bipartition, cut_margin
from secure_fgl.config import RunConfig
from secure_fgl.data.synthetic_graphs import two_task_graphs
from secure_fgl.models.gcfl_gin import GCFLGIN


def test_cut_margin_enumerates_the_stoer_wagner_cut():
    rng = np.random.default_rng(4)
    for m in (3, 6, 9):
        sim = rng.uniform(0, 2, (m, m))
        sim = (sim + sim.T) / 2
        a, b = bipartition(sim, list(range(m)))
        chosen = sim[np.ix_(a, b)].sum()
        margin = cut_margin(sim)
        assert margin >= 0
        # no other cut is lighter than Stoer-Wagner's, and the runner-up is exactly `margin` heavier
        for code in range(1, 2 ** (m - 1)):
            side = [i for i in range(m) if code >> i & 1]
            rest = [i for i in range(m) if not code >> i & 1]
            if sorted(side) in (a, b):
                continue
            assert sim[np.ix_(side, rest)].sum() >= chosen + margin - 1e-9
    assert cut_margin(np.ones((17, 17))) is None


def test_inversion_recovers_labels_of_a_matched_update():
    """Inversion recovers labels of a matched update.

    With the simulation matching the update (one full-batch gradient, no dropout), the
    labels come back well above chance: the attack code works where it can.
    """
    torch.manual_seed(0)
    client = two_task_graphs(2, graphs_per_client=30, seed=0).clients[0]
    model = GCFLGIN(client.num_features, 64, client.num_classes, 3, 0.5).eval()
    start = parameters_to_vector(model.convs.parameters()).detach().clone()
    batch = next(iter(DataLoader(client.train, batch_size=len(client.train))))
    loss = F.cross_entropy(model(batch.x, batch.edge_index, batch.batch), batch.y)
    grad = parameters_to_vector(torch.autograd.grad(loss, list(model.convs.parameters())))
    _, labels = invert_gin_update(
        model,
        start,
        -grad,
        [(g.edge_index, g.num_nodes) for g in client.train],
        client.num_features,
        client.num_classes,
        iterations=60,
    )
    y = np.array([int(g.y) for g in client.train])
    assert (labels.argmax(1) == y).mean() >= np.bincount(y).max() / y.size + 0.2


def _finished(run_small, mode: str, rounds: int = 2):
    fed = two_task_graphs(4, graphs_per_client=20, seed=0)
    cfg = RunConfig(
        algorithm="gcfl",
        dataset="synthetic-graphs",
        clients=4,
        mode=mode,
        hidden=16,
        num_layers=3,
        lr=1e-2,
        seed=0,
        rounds=rounds,
        attacks=["all"],  # the run keeps the payloads the attacks read
        options={"eps1": 0.5, "eps2": 0.0},
    )
    run = run_small(cfg, fed)
    run.train(rounds)
    return fed, cfg, run


@pytest.mark.parametrize("mode", ["plain", "ckks"])
def test_graph_runs_in_the_attack_runner(mode, run_small):
    names = resolve_names(["all"], "gcfl", graph_level=True)
    assert set(names) == {"gin_gradient_inversion", "gcfl_same_dataset", "graph_property"}  # node-level ones stay out
    fed, cfg, run = _finished(run_small, mode)
    entries = {
        e["name"]: e
        for e in run_attacks(
            ["all"],
            algo=run.strategy,
            protocol=run.protocol,
            fed=fed,
            cfg=cfg,
            options={"gin_gradient_inversion": {"iterations": 5}},
        )
    }
    inversion, same = entries["gin_gradient_inversion"], entries["gcfl_same_dataset"]
    if mode == "plain":
        assert inversion["applicable"] and inversion["metric"] == "label_acc" and inversion["round"] == 1
        assert 0 <= inversion["value"] <= 1 and 0.5 <= inversion["chance"] <= 1
        assert same["applicable"] and 0 <= same["value"] <= 1 and same["chance"] == 0.5
    else:  # ciphertext uploads, and no split yet: the server reads nothing
        assert not inversion["applicable"] and not same["applicable"]
