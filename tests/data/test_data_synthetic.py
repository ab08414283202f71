"""Synthetic generators: determinism, graph invariants, the advertised statistics."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_fgl.data import DataError, contextual_sbm, contextual_sbm_federated, load_node_dataset, sbm_binary


def check_graph(data) -> None:
    n = data.num_nodes
    ei = data.edge_index
    assert ei.dtype == torch.long and ei.size(0) == 2
    assert (ei[0] != ei[1]).all()  # no self loops
    key = ei[0] * n + ei[1]
    assert torch.equal(key, torch.unique(key))  # coalesced (sorted, unique)
    rev = torch.sort(ei[1] * n + ei[0]).values
    assert torch.equal(key, rev)  # undirected
    assert data.x.dtype == torch.float32 and data.y.dtype == torch.long
    tr, va, te = data.train_mask, data.val_mask, data.test_mask
    assert not (tr & va).any() and not (tr & te).any() and not (va & te).any()
    assert isinstance(data.num_classes, int) and isinstance(data.name, str)


def edge_homophily(data) -> float:
    return float((data.y[data.edge_index[0]] == data.y[data.edge_index[1]]).float().mean())


@pytest.mark.parametrize("gen", [sbm_binary, contextual_sbm, contextual_sbm_federated])
def test_deterministic_by_seed(gen):
    kw = (
        {"nodes_per_client": 60, "num_clients": 4}
        if gen is contextual_sbm_federated
        else {"num_nodes": 300, "num_features": 40}
    )
    a, b, c = gen(seed=5, **kw), gen(seed=5, **kw), gen(seed=6, **kw)
    for key in ("x", "y", "edge_index", "train_mask"):
        assert torch.equal(a[key], b[key])
    assert not torch.equal(a.x, c.x)
    check_graph(a)


def test_sbm_binary_statistics():
    d = sbm_binary(num_nodes=3000, seed=0)
    check_graph(d)
    assert d.x.shape == (3000, 500) and set(d.x.unique().tolist()) <= {0.0, 1.0}
    assert d.binary_features and d.num_classes == 5 and d.name == "sbm"
    assert abs(d.edge_index.size(1) / 3000 - 8) < 0.5  # avg degree
    assert abs(edge_homophily(d) - 0.8) < 0.03
    assert abs(float(d.x.mean()) - 0.02) < 0.003  # feature density
    assert torch.bincount(d.y).tolist() == [600] * 5  # equal classes
    assert abs(int(d.train_mask.sum()) - 1800) <= 1  # 60/20/20 masks


def test_sbm_binary_features_are_class_correlated():
    d = sbm_binary(num_nodes=2000, seed=1)
    tr, te = d.train_mask, d.test_mask
    # nearest class centroid on features alone: clearly above chance (0.2) but far from perfect
    cent = torch.stack([d.x[tr & (d.y == c)].mean(0) for c in range(5)])
    acc = float(((d.x[te] @ cent.t()).argmax(1) == d.y[te]).float().mean())
    assert 0.45 < acc < 0.9
    # each class has its own preferred words: the class centroids peak on different words
    assert len(set(cent.argmax(1).tolist())) == 5
    # without class signal the same classifier is at chance level
    z = sbm_binary(num_nodes=2000, seed=1, class_signal=0.0)
    cent0 = torch.stack([z.x[z.train_mask & (z.y == c)].mean(0) for c in range(5)])
    acc0 = float(((z.x[z.test_mask] @ cent0.t()).argmax(1) == z.y[z.test_mask]).float().mean())
    assert acc0 < 0.3


def test_contextual_sbm_mean_separation_and_homophily():
    d = contextual_sbm(num_nodes=4000, num_classes=2, num_features=16, mu=2.0, homophily=0.7, seed=0)
    check_graph(d)
    gap = (d.x[d.y == 0].mean(0) - d.x[d.y == 1].mean(0)).norm()
    assert abs(float(gap) - 2.0) < 0.25
    assert abs(edge_homophily(d) - 0.7) < 0.03
    assert not d.binary_features


def test_contextual_sbm_federated_follows_fedspray():
    p, frac = 0.85, 0.75
    d = contextual_sbm_federated(
        num_clients=4, majority_fraction=frac, nodes_per_client=400, majority_neighbor_prob=p, avg_degree=10, seed=0
    )
    check_graph(d)
    own, y, ei = d.owner, d.y, d.edge_index
    assert (own[ei[0]] == own[ei[1]]).all()  # no cross-client edges
    assert d.majority_class.tolist() == [0, 0, 1, 1]  # balanced globally
    maj = y == d.majority_class[own]
    for k in range(4):
        assert abs(float(maj[own == k].float().mean()) - frac) < 0.01
    # a neighbour of every node is from the majority class with probability p
    nb_maj = maj[ei[1]].float()
    for group in (maj, ~maj):
        sel = group[ei[0]]
        assert abs(float(nb_maj[sel].mean()) - p) < 0.04


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(homophily=1.5),
        dict(num_classes=1),
        dict(num_nodes=3, num_classes=5),
        dict(avg_degree=0),
        dict(feature_density=0.0),
        dict(class_signal=2.0),
        dict(num_features=3, num_classes=5),
    ],
)
def test_sbm_bad_inputs(kwargs):
    with pytest.raises(DataError):
        sbm_binary(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(majority_fraction=0.4),
        dict(majority_neighbor_prob=1.0),
        dict(nodes_per_client=[10, 10], num_clients=3),
        dict(nodes_per_client=2, majority_fraction=0.9),
    ],
)
def test_csbm_fed_bad_inputs(kwargs):
    with pytest.raises(DataError):
        contextual_sbm_federated(**kwargs)


def test_registry_passes_generator_options():
    d = load_node_dataset("SBM", num_nodes=200, num_features=30, seed=2)
    assert d.num_nodes == 200 and d.x.size(1) == 30
    with pytest.raises(DataError, match="sbm_binary"):
        load_node_dataset("sbm", bogus=1)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(10, 300),
    c=st.integers(2, 6),
    deg=st.floats(0.5, 10),
    h=st.floats(0, 1),
    seed=st.integers(0, 2**31 - 1),
)
def test_sbm_invariants_property(n, c, deg, h, seed):
    d = sbm_binary(num_nodes=max(n, c), num_classes=c, num_features=6 * c, avg_degree=deg, homophily=h, seed=seed)
    check_graph(d)
    assert int(d.y.max()) < c and (d.x.sum(1) >= 1).all()


def test_generation_is_fast():
    import time

    t = time.perf_counter()
    d = sbm_binary(num_nodes=100_000, num_features=100)
    assert d.num_nodes == 100_000
    assert time.perf_counter() - t < 20  # ~0.2 s on one core
