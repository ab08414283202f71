"""Partitioners, splits and the federated build: invariants and error messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secure_fgl.data import (
    DataError,
    apply_split,
    build_federated,
    dirichlet_partition,
    iid_partition,
    louvain_partition,
    make_federated,
    parse_split,
    partition_label_distribution,
    sbm_binary,
)
from secure_fgl.data.synthetic import coalesce_undirected


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------
def _edge_set(ei: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, ei.t().tolist()))


def check_federated(fg, data, owner) -> None:
    """The invariants every FederatedGraph must satisfy."""
    own = owner.numpy()
    n = data.num_nodes
    k = int(own.max()) + 1
    assert fg.num_clients == k
    # disjoint and complete (except dropped)
    all_ids = torch.cat([c.global_ids for c in fg.clients]).numpy()
    assert all_ids.size == np.unique(all_ids).size
    assert set(all_ids.tolist()) == set(np.flatnonzero(own >= 0).tolist())
    full = _edge_set(
        coalesce_undirected(data.edge_index[0].numpy(), data.edge_index[1].numpy(), n, remove_self_loops=False)
    )
    cut = {(u, v) for u, v in full if own[u] >= 0 and own[v] >= 0 and own[u] != own[v]}
    recorded = set()
    for c in fg.clients:
        g = c.global_ids
        assert (owner[g] == c.client_id).all()
        assert torch.equal(c.x, data.x[g]) and torch.equal(c.y, data.y[g])
        for local, glob in (
            (c.train_mask, fg.graph.train_mask),
            (c.val_mask, fg.graph.val_mask),
            (c.test_mask, fg.graph.test_mask),
        ):
            assert torch.equal(local, glob[g])
        # local edges are exactly the global edges inside the client
        inside = {(u, v) for u, v in full if own[u] == c.client_id and own[v] == c.client_id}
        assert {(int(g[a]), int(g[b])) for a, b in c.edge_index.t().tolist()} == inside
        # cross edges: own node in row 0, foreign (kept) node in row 1
        ce = c.cross_edges
        assert ce.dtype == torch.long and ce.size(0) == 2
        assert (owner[ce[0]] == c.client_id).all() and (owner[ce[1]] != c.client_id).all()
        assert (owner[ce[1]] >= 0).all()
        recorded |= _edge_set(ce)
    # every cut edge is recorded on both sides (both directions are in `cut`)
    assert recorded == cut
    # masks disjoint, dropped nodes unlabelled
    m = fg.graph
    assert not (m.train_mask & m.val_mask).any() and not (m.train_mask & m.test_mask).any()
    assert not (m.val_mask & m.test_mask).any()
    dropped = torch.from_numpy(own < 0)
    assert not ((m.train_mask | m.val_mask | m.test_mask) & dropped).any()


def mean_tv(y: torch.Tensor, owner: torch.Tensor) -> float:
    """Mean total-variation distance of client label distributions to the global one."""
    dist = partition_label_distribution(y, owner)
    glob = torch.bincount(y).double() / y.numel()
    return float(0.5 * (dist - glob).abs().sum(1).mean())


@pytest.fixture(scope="module")
def small_sbm():
    return sbm_binary(num_nodes=600, num_classes=5, num_features=50, seed=3)


# ---------------------------------------------------------------------------
# partitioners
# ---------------------------------------------------------------------------
def test_iid_partition_balanced_complete_deterministic():
    o = iid_partition(103, 10, seed=1)
    counts = torch.bincount(o)
    assert counts.numel() == 10 and counts.max() - counts.min() <= 1
    assert torch.equal(o, iid_partition(103, 10, seed=1))
    assert not torch.equal(o, iid_partition(103, 10, seed=2))


def test_dirichlet_complete_and_deterministic(small_sbm):
    o = dirichlet_partition(small_sbm.y, 6, beta=1.0, seed=0)
    assert o.shape == (600,) and o.dtype == torch.long
    assert int(o.min()) >= 0 and torch.bincount(o, minlength=6).min() >= 10
    assert torch.equal(o, dirichlet_partition(small_sbm.y, 6, beta=1.0, seed=0))
    assert not torch.equal(o, dirichlet_partition(small_sbm.y, 6, beta=1.0, seed=1))


def test_dirichlet_skew_grows_as_beta_shrinks():
    y = torch.arange(3000) % 5
    tv = {
        b: np.mean([mean_tv(y, dirichlet_partition(y, 10, b, seed=s)) for s in range(3)])
        for b in (10000.0, 10.0, 1.0, 0.1)
    }
    assert tv[10000.0] < 0.05  # ~ i.i.d.
    assert tv[10000.0] < tv[10.0] < tv[1.0] < tv[0.1]
    assert tv[1.0] > 0.3  # FedGCN's "highly skewed"


@pytest.mark.parametrize("beta", [0.0, -1.0])
def test_dirichlet_rejects_nonpositive_beta(beta):
    with pytest.raises(DataError, match="beta"):
        dirichlet_partition(torch.zeros(50, dtype=torch.long), 2, beta)


@pytest.mark.parametrize(
    "fn",
    [
        lambda: iid_partition(5, 6, 0),
        lambda: dirichlet_partition(torch.zeros(5, dtype=torch.long), 6, 1.0),
        lambda: louvain_partition(torch.empty(2, 0, dtype=torch.long), 5, 6),
    ],
)
def test_more_clients_than_nodes_is_a_data_error(fn):
    with pytest.raises(DataError, match="fewer clients"):
        fn()


def _cliques(sizes, bridge=True):
    """Disjoint cliques (optionally chained by one edge each): clear communities."""
    rows, cols, start = [], [], 0
    for s in sizes:
        idx = np.arange(start, start + s)
        r, c = np.meshgrid(idx, idx)
        rows.append(r.ravel())
        cols.append(c.ravel())
        if bridge and start > 0:
            rows.append(np.array([start - 1]))
            cols.append(np.array([start]))
        start += s
    return coalesce_undirected(np.concatenate(rows), np.concatenate(cols), start), start


def test_louvain_reproducible_and_balanced():
    ei, n = _cliques([30, 25, 20, 15, 10, 10, 8, 6])
    a = louvain_partition(ei, n, 3, seed=7)
    assert torch.equal(a, louvain_partition(ei, n, 3, seed=7))
    sizes = torch.bincount(a, minlength=3)
    assert int(a.min()) >= 0 and sizes.min() > 0
    assert int(sizes.max() - sizes.min()) <= 30  # greedy: within the largest community size


def test_louvain_keep_largest_drops_the_rest():
    ei, n = _cliques([30, 25, 20, 5, 4], bridge=False)
    o = louvain_partition(ei, n, 3, keep_largest=True)
    assert torch.bincount(o[o >= 0]).tolist() == [30, 25, 20]
    assert int((o == -1).sum()) == 9


def test_louvain_too_few_communities():
    ei, n = _cliques([10, 10], bridge=False)
    with pytest.raises(DataError, match=r"only 2 communities.*resolution"):
        louvain_partition(ei, n, 3)


# ---------------------------------------------------------------------------
# splits
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "split,ratios", [("fgssl", (0.6, 0.2, 0.2)), ("fedspray", (0.4, 0.3, 0.3)), ("random:50/25/25", (0.5, 0.25, 0.25))]
)
def test_per_client_split_ratios(small_sbm, split, ratios):
    owner = iid_partition(600, 4, 0)
    tr, va, te = apply_split(small_sbm, owner, split, seed=0)
    for k in range(4):
        mine = owner == k
        n = int(mine.sum())
        for mask, r in zip((tr, va, te), ratios):
            assert abs(int((mask & mine).sum()) - r * n) <= 1
    assert not (tr & va).any() and not (tr & te).any() and not (va & te).any()


def test_fedomd_split_label_rate(small_sbm):
    owner = iid_partition(600, 8, 0)
    tr, va, te = apply_split(small_sbm, owner, "fedomd", seed=0)
    per_client = torch.bincount(owner[tr], minlength=8)
    assert (per_client >= 1).all()  # every client has a label
    assert int(tr.sum()) <= 0.02 * 600 + 8
    assert abs(int(va.sum()) - 0.2 * 600) <= 8 and abs(int(te.sum()) - 0.2 * 600) <= 8


def test_split_parsing():
    assert parse_split("random:60/20/20") == pytest.approx(parse_split("random:0.6/0.2/0.2"))
    assert parse_split("public") is None
    for bad in ("random:0.7/0.3/0.3", "random:a/b/c", "random:0.5/0.5", "bogus"):
        with pytest.raises(DataError):
            parse_split(bad)


# ---------------------------------------------------------------------------
# build_federated
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("partition", ["dirichlet", "iid", "louvain"])
def test_build_invariants(small_sbm, partition):
    if partition == "dirichlet":
        owner = dirichlet_partition(small_sbm.y, 5, 1.0, 0)
    elif partition == "iid":
        owner = iid_partition(600, 5, 0)
    else:
        owner = louvain_partition(small_sbm.edge_index, 600, 5, resolution=1.0, seed=0)
    fg = build_federated(small_sbm, owner, split="public")
    check_federated(fg, small_sbm, owner)
    assert fg.num_classes == 5 and fg.name == "sbm" and fg.binary_features


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 60), k=st.integers(1, 6), e=st.integers(0, 150), drop=st.booleans(), seed=st.integers(0, 10_000)
)
def test_build_invariants_property(n, k, e, drop, seed):
    from torch_geometric.data import Data

    k = min(k, n)
    rng = np.random.default_rng(seed)
    ei = torch.from_numpy(rng.integers(0, n, size=(2, e)))  # directed, duplicates, self loops
    data = Data(
        x=torch.from_numpy(rng.random((n, 3), dtype=np.float32)),
        y=torch.from_numpy(rng.integers(0, 3, n)),
        edge_index=ei,
        num_nodes=n,
    )
    owner = torch.from_numpy(rng.permutation(np.arange(n) % k))
    if drop and n > k:
        owner[torch.from_numpy(rng.random(n) < 0.2) & (torch.arange(n) >= k)] = -1
        owner[torch.arange(k)] = torch.arange(k)  # keep every client non-empty
    fg = build_federated(data, owner, split="random:0.5/0.25/0.25", seed=seed)
    check_federated(fg, data, owner)


def test_build_rejects_bad_owner(small_sbm):
    with pytest.raises(DataError, match="entries"):
        build_federated(small_sbm, torch.zeros(5, dtype=torch.long))
    owner = torch.zeros(600, dtype=torch.long)
    owner[:10] = 2  # client 1 empty
    with pytest.raises(DataError, match="own no node"):
        build_federated(small_sbm, owner)


def test_make_federated_one_call():
    fg = make_federated("sbm", num_clients=4, partition="dirichlet", beta=1.0, seed=1, num_nodes=400, num_features=40)
    assert fg.num_clients == 4 and fg.graph.num_nodes == 400
    check_federated(fg, fg.graph, fg.owner)
    again = make_federated(
        "SBM", num_clients=4, partition="dirichlet", beta=1.0, seed=1, num_nodes=400, num_features=40
    )
    assert torch.equal(fg.owner, again.owner)


def test_make_federated_native_clients():
    fg = make_federated("csbm-fed", num_clients=4, split="fedspray", nodes_per_client=50)
    assert [c.num_nodes for c in fg.clients] == [50] * 4
    assert all(c.cross_edges.size(1) == 0 for c in fg.clients)  # FedSpray: separate graphs
    with pytest.raises(DataError, match="one per client"):
        make_federated("csbm-fed", num_clients=4, nodes_per_client=[50, 50, 50])
    with pytest.raises(DataError, match="defines no clients"):
        make_federated("sbm", num_clients=2, partition="native", num_nodes=100, num_features=20)


def test_make_federated_unknown_partition():
    with pytest.raises(DataError, match="partition"):
        make_federated("sbm", num_clients=2, partition="metis", num_nodes=100, num_features=20)


def test_shchur_split_is_the_default_without_public_masks():
    """Shchur split is the default without public masks.

    Shchur et al. (2018): 20 training and 30 validation nodes per class, the rest test; the
    default for graphs without a public split (Amazon, Coauthor).
    """
    from torch_geometric.data import Data

    from secure_fgl.data.splits import apply_split

    y = torch.cat([torch.zeros(100), torch.ones(60), torch.full((30,), 2)]).long()
    owner = torch.zeros(190, dtype=torch.long)
    owner[:5] = -1  # dropped nodes are in no split
    tr, va, te = apply_split(Data(y=y, num_nodes=190), owner, "public", seed=1)
    for cls, (n_tr, n_va, n_te) in enumerate([(20, 30, 45), (20, 30, 10), (20, 10, 0)]):
        assert (int((tr & (y == cls)).sum()), int((va & (y == cls)).sum()), int((te & (y == cls)).sum())) == (
            n_tr,
            n_va,
            n_te,
        )
    assert not (tr | va | te)[:5].any()
    again = apply_split(Data(y=y, num_nodes=190), owner, "shchur", seed=1)
    assert all(torch.equal(a, b) for a, b in zip((tr, va, te), again))
