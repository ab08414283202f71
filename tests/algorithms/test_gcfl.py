"""GCFL / GCFL+: clustering decisions, DTW, per-cluster FedAvg and the similarity exchange.

GCFL / GCFL+: clustering decisions, DTW, per-cluster FedAvg, the similarity
statistics exchange in plain and ckks, and short end-to-end runs per mode.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from protocols import make_protocol
from protocols.errors import BoundError, ConfigurationError
from protocols.similarity import cosine_matrix, cosine_similarities
from secure_fgl.algorithms.clustering import bipartition, dtw_distances, should_split
from secure_fgl.algorithms.gcfl.ops import GCFLServer
from secure_fgl.algorithms.grid_mean import GRID_BITS, grid_weighted_mean
from secure_fgl.algorithms.options import GCFLOptions
from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.data.synthetic_graphs import client_groups, two_task_graphs
from secure_fgl.experiment import run_experiment

#: 30 graphs a client (the generator makes 60): the 22-round runs below stay cheap, the split still forced
FAST = dict(
    dataset="synthetic-graphs", clients=6, hidden=16, num_layers=3, lr=1e-2, seed=0, synthetic={"graphs_per_client": 30}
)


def test_stoer_wagner_recovers_planted_blocks():
    rng = np.random.default_rng(0)
    members = [3, 7, 8, 11, 12, 20, 21, 25]
    block = np.array([0, 1, 0, 1, 1, 0, 0, 1])
    sim = np.where(block[:, None] == block[None, :], 1.8, 0.2) + rng.uniform(0, 0.1, (8, 8))
    sim = (sim + sim.T) / 2
    a, b = bipartition(sim, members)
    assert {tuple(a), tuple(b)} == {
        tuple(m for m, g in zip(members, block) if g == 0),
        tuple(m for m, g in zip(members, block) if g == 1),
    }


def _dtw_brute_force(s, t):
    """The minimum over every monotone warping path of sqrt(sum of squared differences)."""
    best = np.inf
    n, m = len(s), len(t)

    # a path is a sequence of steps (1,0), (0,1), (1,1) from (0,0) to (n-1,m-1)
    def walk(i, j, acc):
        nonlocal best
        acc += (s[i] - t[j]) ** 2
        if (i, j) == (n - 1, m - 1):
            best = min(best, acc)
            return
        for di, dj in ((1, 0), (0, 1), (1, 1)):
            if i + di < n and j + dj < m:
                walk(i + di, j + dj, acc)

    walk(0, 0, 0.0)
    return np.sqrt(best)


def test_dtw_matches_brute_force():
    rng = np.random.default_rng(1)
    seqs = [rng.normal(size=int(rng.integers(2, 6))) for _ in range(5)]
    got = dtw_distances(seqs)
    for i, j in itertools.product(range(5), repeat=2):
        assert got[i, j] == pytest.approx(_dtw_brute_force(seqs[i], seqs[j]) if i != j else 0.0, abs=1e-9)


@pytest.mark.parametrize(
    "dm,dx,size,rnd", list(itertools.product([0.01, 0.05, 0.2], [0.05, 0.1, 0.5], [2, 3, 10], [19, 20, 50]))
)
def test_split_criteria_are_eq4_eq5(dm, dx, size, rnd):
    assert should_split(dm, dx, size, rnd, eps1=0.05, eps2=0.1) == (
        dm < 0.05 and dx > 0.1 and size > 2 and rnd + 1 > 20
    )


class PlainClusters(GCFLServer):
    """GCFL's server decisions over given updates, every exchange in the clear.

    The cluster mean is FedAvg's (weights ``num_train``), each client reports its ``||dW_i||`` and the norm of its
    cluster's mean, the similarity is ``1 + cos``. What the decisions do with these values is the code under test
    (:class:`~secure_fgl.algorithms.gcfl.ops.GCFLServer`).
    """

    def __init__(self, updates: dict[int, torch.Tensor], num_train, **options):
        self.opts = GCFLOptions(**options)
        self.cfg = RunConfig(clients=len(updates), mode="plain")
        self.updates = {k: u.double().numpy() for k, u in updates.items()}
        self.num_train = np.asarray(num_train, dtype=np.float64)
        self.anchors = {k: np.zeros_like(u) for k, u in self.updates.items()}
        self.init_clusters(len(updates))

    def exchange_mean(self, rnd, members):
        return _fedavg(self.updates, self.num_train, members)

    def exchange_unweighted_mean(self, rnd, members):
        return np.mean([self.updates[k] for k in members], axis=0)

    def apply_mean(self, members, mean):
        for k in members:
            self.anchors[k] = self.anchors[k] + mean

    def round_norms(self, rnd, clusters, means):
        mean_norm = {k: float(np.linalg.norm(m)) for c, m in zip(clusters, means) for k in c}
        return {"update_norms": {k: float(np.linalg.norm(u)) for k, u in self.updates.items()}, "mean_norm": mean_norm}

    def update_similarity(self, rnd, members):
        return cosine_matrix(np.stack([self.updates[k] for k in members]))


NUM_TRAIN = [20, 20, 20, 20, 20, 20]


def _updates(scale=0.01, num_clients=6, dim=64):
    gen = torch.Generator().manual_seed(3)
    return {k: scale * torch.randn(dim, generator=gen) for k in range(num_clients)}


def _fedavg(updates, weights, members):
    w = np.array([weights[k] for k in members])
    return sum(w_k * np.asarray(updates[k], np.float64) for w_k, k in zip(w, members)) / w.sum()


def test_criteria_fire_exactly_at_the_eq4_eq5_boundary():
    updates = _updates()
    members = list(range(6))
    delta_mean = float(np.linalg.norm(_fedavg({k: u.double().numpy() for k, u in updates.items()}, NUM_TRAIN, members)))
    delta_max = max(float(u.double().norm()) for u in updates.values())
    for eps1, eps2, fires in [
        (delta_mean * 1.001, delta_max * 0.999, True),
        (delta_mean * 0.999, delta_max * 0.999, False),
        (delta_mean * 1.001, delta_max * 1.001, False),
    ]:
        server = PlainClusters(updates, NUM_TRAIN, eps1=eps1, eps2=eps2)
        server.last_eval = [{"test_acc": 0.5}] * 6
        server.split_clusters(25, members)
        assert (len(server.clusters) == 2) == fires
        if fires:
            assert server.splits[0]["delta_mean"] == pytest.approx(delta_mean, rel=1e-6)
            assert server.splits[0]["delta_max"] == pytest.approx(delta_max, rel=1e-6)
    server = PlainClusters(updates, NUM_TRAIN, eps1=1e9, eps2=0.0)  # criteria hold, but round <= 20 or size <= 2
    server.split_clusters(19, members)
    server.clusters = [[0, 1], [2, 3], [4, 5]]
    server.split_clusters(20, members)
    assert server.clusters == [[0, 1], [2, 3], [4, 5]] and not server.splits


def test_fedavg_within_a_cluster_is_fedavg_on_the_cluster():
    num_train = [10, 50, 20, 80, 30, 40]
    server = PlainClusters(_updates(), num_train, eps1=0.0, eps2=1e9)  # never splits
    server.clusters = [[0, 2, 4], [1, 3, 5]]
    server.split_clusters(30, list(range(6)))
    for members in server.clusters:
        expect = _fedavg(server.updates, num_train, members)
        for k in members:
            np.testing.assert_allclose(server.anchors[k], expect, atol=1e-12)


def test_unweighted_mean_norm_reads_the_unweighted_mean_and_aggregates_fedavg():
    num_train = [10, 50, 20, 80, 30, 40]  # unequal |G_i|
    updates = _updates()
    weighted = PlainClusters(updates, num_train, eps1=0.0, eps2=1e9)
    unweighted = PlainClusters(updates, num_train, eps1=0.0, eps2=1e9, mean_norm="unweighted")
    members = list(range(6))
    for server in (weighted, unweighted):
        server.split_clusters(30, members)
    plain_mean = np.mean([weighted.updates[k] for k in members], axis=0)
    fedavg = _fedavg(weighted.updates, num_train, members)
    assert weighted.round_info["split_criteria"][0][0] == pytest.approx(np.linalg.norm(fedavg), rel=1e-6)
    assert unweighted.round_info["split_criteria"][0][0] == pytest.approx(np.linalg.norm(plain_mean), rel=1e-6)
    assert abs(np.linalg.norm(plain_mean) - np.linalg.norm(fedavg)) > 1e-4  # the sizes differ: so do the norms
    for k in members:  # the criterion's mean is read by eq. 4 only: the models stay FedAvg's
        np.testing.assert_array_equal(unweighted.anchors[k], weighted.anchors[k])


def test_unweighted_mean_norm_is_the_same_over_the_runtime_in_a_secure_mode():
    opts = {"eps1": 0.5, "eps2": 0.0, "seq_length": 2, "mean_norm": "unweighted"}
    runs = {
        m: run_experiment(RunConfig(algorithm="gcflplus", mode=m, rounds=21, **FAST, options=opts), progress=False)
        for m in ("plain", "mask")
    }
    crit = {k: [r.get("split_criteria") for r in v["rounds"]] for k, v in runs.items()}
    assert crit["plain"] == crit["mask"] and crit["plain"][0]
    assert runs["mask"]["final"]["clusters"] == runs["plain"]["final"]["clusters"]


@pytest.mark.parametrize("num_clients", [3, 12])
def test_grid_mean_is_bit_identical_in_every_mode(num_clients):
    rng = np.random.default_rng(num_clients)
    values = {k: rng.normal(size=5000) * 10 ** rng.uniform(-4, -1.5) for k in range(num_clients)}
    sizes = rng.integers(50, 3000, size=num_clients)
    weights = {k: sizes[k] / sizes.sum() for k in values}
    exact = sum(weights[k] * values[k] for k in values)
    got = {
        mode: grid_weighted_mean(make_protocol(mode, num_clients, seed=0), "t", 0, values, weights, recipients=[0, 2])
        for mode in ("plain", "ckks", "mask")
    }
    assert np.array_equal(got["plain"], got["ckks"]) and np.array_equal(got["plain"], got["mask"])
    bound = (
        4
        * num_clients
        * 2.0 ** -(GRID_BITS + 1)
        / sum(np.floor(w / 4 * 2**GRID_BITS) / 2**GRID_BITS * 4 for w in weights.values())
    )
    assert np.abs(got["plain"] - exact).max() <= bound
    with pytest.raises(BoundError, match="bound"):
        grid_weighted_mean(make_protocol("plain", 2), "t", 0, {0: np.full(3, 0.6), 1: np.zeros(3)}, {0: 0.5, 1: 0.5})


def test_secure_cosine_similarities_equal_plain_within_bound():
    from protocols.ckks.similarity import SIMILARITY_TOLERANCE

    rng = np.random.default_rng(5)
    base = rng.normal(size=9000)
    vectors = {k: (base if k % 2 else -base) * 0.01 + rng.normal(size=9000) * 0.005 for k in range(5)}
    vectors[4] = np.zeros(9000)  # a zero update has cosine 0 with everyone
    expect = cosine_matrix(np.stack(list(vectors.values())))
    plain = cosine_similarities(make_protocol("plain", 5), "t", 0, vectors)
    np.testing.assert_allclose(plain, expect, atol=1e-12)
    proto = make_protocol("ckks", 5, seed=0)
    got = cosine_similarities(proto, "t", 0, vectors, decider=1)
    assert np.abs(got - expect).max() <= SIMILARITY_TOLERANCE
    # the server got ciphertexts only from the members; the decider got only the pair results
    # (one message besides the plan) and sent the evaluation key and the values
    ups = [m for m in proto.transcript.select(tag="t") if m.receiver == "server" and m.sender != "client1"]
    assert {m.kind for m in ups} == {"ciphertext"} and len(ups) == 4
    to_decider = [m for m in proto.transcript.select(tag="t", receiver="client1") if m.kind != "control"]
    assert len(to_decider) == 1 and to_decider[0].shape == (10, 1)
    from_decider = proto.transcript.select(tag="t", sender="client1")
    assert sorted(m.kind for m in from_decider if m.receiver == "server") == ["ciphertext", "plain", "public_key"]
    assert all(h.similarity_secret is None for h in proto.clients.values())  # the decider dropped its key
    with pytest.raises(ConfigurationError, match="ckks"):
        cosine_similarities(make_protocol("mask", 5, seed=0), "t", 0, vectors)


@pytest.mark.parametrize("algorithm,mode", [("gcfl", "ckks"), ("gcflplus", "mask")])
def test_secure_mode_makes_the_plain_clusters(algorithm, mode):
    opts = {"eps1": 0.5, "eps2": 0.0, **({"seq_length": 2} if algorithm == "gcflplus" else {})}
    runs = {}
    for m in ("plain", mode):
        cfg = RunConfig(algorithm=algorithm, mode=m, rounds=22, **FAST, options=opts)
        runs[m] = run_experiment(cfg, progress=False)["final"]
    assert runs["plain"]["splits"], "the forced criteria must split"
    assert runs[mode]["clusters"] == runs["plain"]["clusters"]
    # the grid mean makes the model exchange bit-identical, so training and eq. 4-5 are too
    assert runs[mode]["per_client_test_acc_last"] == runs["plain"]["per_client_test_acc_last"]
    assert [(s["round"], s["into"], s["delta_mean"], s["delta_max"]) for s in runs[mode]["splits"]] == [
        (s["round"], s["into"], s["delta_mean"], s["delta_max"]) for s in runs["plain"]["splits"]
    ]
    assert 0 <= runs["plain"]["test_acc_best_cached"] <= 1
    assert len(runs[mode]["per_client_test_acc_last"]) == 6 and 0 <= runs[mode]["test_acc"] <= 1


# gcflplus in plain and mask (splits, one accuracy per client): test_secure_mode_makes_the_plain_clusters
@pytest.mark.parametrize(
    "algorithm,mode",
    [
        ("gc-fedprox", "plain"),
        ("gc-selftrain", "plain"),
        ("gc-fedavg", "ckks"),
    ],
)
def test_short_runs(algorithm, mode):
    r = run_experiment(RunConfig(algorithm=algorithm, mode=mode, rounds=3, **FAST), progress=False)
    assert len(r["final"]["per_client_test_acc_last"]) == 6
    assert 0 <= r["final"]["test_acc"] <= 1


def test_gcfl_refuses_mask_in_one_line_naming_ckks():
    with pytest.raises(ConfigError) as e:
        run_experiment(RunConfig(algorithm="gcfl", mode="mask", rounds=1, **FAST), progress=False)
    assert "ckks" in str(e.value) and "\n" not in str(e.value)


def test_synthetic_groups():
    fed = two_task_graphs(4, graphs_per_client=20, seed=2)
    assert [c.dataset[-1] for c in fed.clients] == [str(g) for g in client_groups(4)]
    assert all(len(c.train) + len(c.val) + len(c.test) == 20 for c in fed.clients)


def test_a_similarity_key_the_decider_did_not_sign_is_refused_before_anything_is_encrypted():
    """A similarity key the decider did not sign is refused before anything is encrypted.

    The server swaps the relayed encryption key for one of its own (whose secret it holds):
    every member refuses it (signature), no member uploads a ciphertext.
    """
    from protocols.ckks.similarity import make_key_pair
    from protocols.errors import IntegrityError

    proto = make_protocol("ckks", 4, seed=0)
    _, _, own = make_key_pair()

    def swap(msg):
        if msg.kind == "public_key" and msg.receiver.startswith("client") and msg.tag == "t":
            return dataclasses.replace(msg, payload=own)
        return msg

    proto.intercept = swap
    with pytest.raises(IntegrityError):
        cosine_similarities(proto, "t", 0, {k: np.full(10, 0.1 * (k + 1)) for k in range(4)}, decider=0)
    assert not [m for m in proto.transcript.select(tag="t") if m.kind == "ciphertext" and m.receiver == "server"]


def test_server_reads_similarity_and_infers_same_dataset_pairs():
    from attacks.base import View
    from attacks.gcfl import same_dataset_auc, server_similarity

    rng = np.random.default_rng(7)
    direction = rng.normal(size=3000)
    datasets = ["A", "B", "A", "B", "A"]
    vectors = {
        k: (direction if d == "A" else -direction) * 0.01 + rng.normal(size=3000) * 0.01 for k, d in enumerate(datasets)
    }
    expect = cosine_matrix(np.stack(list(vectors.values())))
    weights = {k: 0.1 * (k + 1) for k in vectors}
    plain = make_protocol("plain", 5)
    plain.weighted_mean("gcfl/model", 0, vectors, weights)
    clients, sim = server_similarity(View.of(plain.transcript, "server"), 3000)
    np.testing.assert_allclose(sim, expect, atol=1e-5)  # float32 uploads
    assert same_dataset_auc(clients, sim, datasets) == 1.0
    ckks = make_protocol("ckks", 5, seed=0)
    ckks.weighted_mean("gcfl/model", 0, vectors, weights)
    assert server_similarity(View.of(ckks.transcript, "server"), 3000) is None  # ciphertexts only
    cosine_similarities(ckks, "gcfl/similarity", 0, vectors, decider=2)
    clients, sim = server_similarity(View.of(ckks.transcript, "server"), 3000)
    assert clients == list(range(5)) and np.abs(sim - expect).max() < 1e-4
    assert same_dataset_auc(clients, sim, datasets) == 1.0


def test_a_cut_never_leaves_a_side_below_the_minimum():
    """A cut never leaves a side below the minimum.

    The Stoer-Wagner cut of 1 + cos often isolates one client; with ``min_side`` the lightest cut
    with both sides large enough is taken (a GCFL cluster below the run's minimum contributors would
    have its mean, beside the whole cluster's, reveal its members' updates).
    """
    sim = np.full((5, 5), 1.9)
    sim[4, :4] = sim[:4, 4] = 0.5  # client 4 far from the rest: the minimum cut isolates it
    sim[[0, 1], 2:4] = sim[2:4, [0, 1]] = 1.2
    assert bipartition(sim, list(range(5))) == ([0, 1, 2, 3], [4])
    assert bipartition(sim, list(range(5)), min_side=2) == ([0, 1], [2, 3, 4])
    assert bipartition(sim, list(range(5)), min_side=3) is None
