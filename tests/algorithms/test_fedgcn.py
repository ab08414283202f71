"""FedGCN: the pre-training exchange computes exactly the stated operator in every mode.

FedGCN (Yao et al. 2023): the pre-training exchange computes exactly the stated operator,
in every protocol mode; 0-hop is FedAvg; DP noise has the stated scale; short runs end to end.

Ground truth (``fed.graph``) is read only here, never by the algorithm.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch_geometric.nn import GCNConv
from torch_geometric.utils import add_remaining_self_loops, degree

import secure_fgl.algorithms.fedgcn.client as fedgcn_client
from protocols import BoundError
from secure_fgl.algorithms.fedgcn.ops import (
    TAG,
    FedGCNNet,
    FedGCNOptions,
    dp_row_clip,
    exchange_dp_request,
    exchange_spec,
    requested_rows,
)
from secure_fgl.config import RunConfig
from secure_fgl.data import make_federated
from secure_fgl.experiment import run_experiment
from secure_fgl.runtime.build import start_run

K = 5

#: FedGCN with edge/node-level DP runs with noise on its neighbour sums only (its model exchange is refused DP)
SUMS = "fedgcn/neighbour_sums"


@pytest.fixture(scope="module")
def fed():
    """Binary-feature SBM, K clients (Dirichlet label skew)."""
    return make_federated("sbm", num_clients=K, beta=100.0, seed=3, num_nodes=240, num_features=24, avg_degree=6.0)


@pytest.fixture(scope="module")
def fed_float():
    """Gaussian-feature contextual SBM (float encoding path)."""
    return make_federated("csbm", num_clients=K, beta=100.0, seed=4, num_nodes=200, num_features=8)


@pytest.fixture(scope="module")
def fed_counts(fed):
    """The binary SBM's graph and partition with word-count features (0..3): integers, not binary."""
    from secure_fgl.data.build import build_federated

    data = copy.copy(fed.graph)
    data.x = fed.graph.x * torch.randint(1, 4, fed.graph.x.shape, generator=torch.Generator().manual_seed(5))
    del data.binary_features
    return build_federated(data, fed.owner, seed=3)


def full_graph_operator(fed):
    """``(Ã X, d̃)`` from the ground-truth graph (Ã = A + I, self loops counted once)."""
    g = fed.graph
    ei, _ = add_remaining_self_loops(g.edge_index, num_nodes=g.num_nodes)
    deg = degree(ei[0], g.num_nodes, dtype=torch.float64)
    ax = torch.zeros(g.num_nodes, g.x.size(1), dtype=torch.float64).index_add_(0, ei[0], g.x.double()[ei[1]])
    return ax, deg


class FedGCNRun:
    """A FedGCN run over the client runtimes with what these tests read.

    A FedGCN run over the client runtimes (``--executor local``) with what these tests read:
    ``received[k]``, the totals ``[S_v[:d], d̃_v]`` client ``k`` decoded, in the order of
    :func:`requested_rows` (recorded as its logic reads them), and ``client_inputs(k)``.
    """

    def __init__(self, fed, cfg: RunConfig, readers: dict):
        self.fed, self.clients, self.cfg = fed, fed.clients, cfg
        self.run = start_run(cfg, fed)
        self.protocol, self.strategy = self.run.protocol, self.run.strategy
        self.opts = FedGCNOptions(**cfg.options)
        self.received: dict[int, torch.Tensor] = {}
        readers.update({id(rt.half): (self.received, k) for k, rt in self.run.runtimes.items()})

    def setup(self) -> None:
        self.strategy.setup()

    def client_inputs(self, k: int):
        return self.run.logic(k).inputs()

    def value_spec(self):
        """The exchange's public bounds (:func:`exchange_spec`), as the strategy plans them."""
        return exchange_spec(
            self.opts,
            bool(self.fed.binary_features),
            dp_row_clip(self.opts, self.cfg) if self.strategy.dp_on else None,
            counts=bool(self.fed.count_features),
        )

    def dp_request(self):
        return exchange_dp_request(self.opts, self.cfg, bool(self.fed.binary_features)) if self.strategy.dp_on else None

    def final_metrics(self) -> dict:
        return self.strategy.final_metrics()

    @property
    def exchange_rows(self) -> int:
        return self.strategy.exchange_rows

    @property
    def decrypted(self) -> dict:
        """Client -> (node id, total) of every row of the blocks it decoded (with ``--attacks``)."""
        return {k: rt.logic.decoded for k, rt in self.run.runtimes.items()}


@pytest.fixture
def make_algo(monkeypatch):
    """``make_algo(fed, mode="plain", *, cfg=None, **options)``: a :class:`FedGCNRun` (executors shut down after)."""
    made, readers, real = [], {}, fedgcn_client.rows_result

    def recording(half, request_rows, rpb, dim):  # each client's decoded totals, as its logic reads them
        totals = real(half, request_rows, rpb, dim)
        received, k = readers[id(half)]
        received[k] = torch.as_tensor(totals, dtype=torch.float64)
        return totals

    monkeypatch.setattr(fedgcn_client, "rows_result", recording)

    def make(fed, mode="plain", *, cfg=None, **opts) -> FedGCNRun:
        base = cfg or RunConfig(mode=mode, rounds=2, clients=fed.num_clients)
        cfg = RunConfig(**{**base.to_dict(), "algorithm": "fedgcn", "clients": fed.num_clients, "options": opts})
        made.append(FedGCNRun(fed, cfg, readers))
        return made[-1]

    yield make
    for m in made:
        m.run.executor.shutdown()


# ----------------------------------------------------------------------------- operator
@pytest.mark.parametrize("hops", [1, 2])
def test_received_sums_equal_full_graph_neighbour_sums(fed, hops, make_algo):
    """Received sums equal full graph neighbour sums.

    Each client receives [(Ã X)_v, d̃_v] for its own nodes (1-hop) and also the remote
    endpoints of its cross edges (2-hop); the first-layer input is D̃^-1 Ã X on those rows.
    """
    ax, deg = full_graph_operator(fed)
    algo = make_algo(fed, hops=hops)
    algo.setup()
    for k, c in enumerate(algo.clients):
        rows = requested_rows(c, hops)
        expected_rows = c.num_nodes + (torch.unique(c.cross_edges[1]).numel() if hops == 2 else 0)
        assert rows.numel() == expected_rows
        got = algo.received[k]
        assert torch.equal(got[:, :-1], ax[rows]), f"client {k}: feature sums differ"
        assert torch.equal(got[:, -1], deg[rows]), f"client {k}: degrees differ"
        z, _ = algo.client_inputs(k)
        assert torch.equal(z, (ax[rows] / deg[rows, None]).float())


def test_two_hop_sym_equals_centralized_gcn(fed, make_algo):
    """Two hop sym equals centralized gcn.

    hops=2, norm='sym': with the same weights the FedGCN model's logits for each client's
    nodes are those of Kipf's GCN on the full graph (D̃^-1/2 Ã D̃^-1/2, both layers).
    """
    torch.manual_seed(0)
    g = fed.graph
    conv1, conv2 = GCNConv(g.x.size(1), 8), GCNConv(8, fed.num_classes)
    with torch.no_grad():
        conv1.bias.normal_()
        conv2.bias.normal_()
        ref = conv2(torch.relu(conv1(g.x, g.edge_index)), g.edge_index)
    algo = make_algo(fed, hops=2, norm="sym")
    algo.setup()
    net = FedGCNNet(g.x.size(1), 8, fed.num_classes, num_layers=2, dropout=0.5).eval()
    with torch.no_grad():
        net.lin.weight.copy_(conv1.lin.weight)
        net.lin.bias.copy_(conv1.bias)
        net.convs[0].lin.weight.copy_(conv2.lin.weight)
        net.convs[0].bias.copy_(conv2.bias)
        for k, c in enumerate(algo.clients):
            out = net(*algo.client_inputs(k))
            torch.testing.assert_close(out, ref[c.global_ids], rtol=1e-4, atol=1e-5)


def test_one_hop_second_layer_is_local(fed, make_algo):
    """1-hop propagates the second layer over the local subgraph only (own nodes)."""
    algo = make_algo(fed, hops=1)
    algo.setup()
    for k, c in enumerate(algo.clients):
        z, g = algo.client_inputs(k)
        assert z.size(0) == c.num_nodes == g.num_out
        assert int(g.edge_index.max()) < c.num_nodes


@pytest.mark.parametrize(
    "mode,hops,extra",
    [("mask", 1, {}), ("plain", 2, {}), ("ckks-mp", 1, {"threshold": 4})],
)
def test_a_dropout_in_the_pre_training_gives_the_sums_of_the_graph_without_its_nodes(fed, mode, hops, extra, make_algo):
    """A dropout in the pre-training gives the sums of the graph without its nodes.

    Client 4 drops at its upload: every other client's inputs are D̃'^-1 Ã' X of the subgraph induced by the nodes of
    clients 0-3 (its own nodes and, at 2 hops, the far ends it still touches), and client 4 sits out the run.
    """
    cfg = RunConfig(mode=mode, rounds=2, clients=K, simulate_dropouts="4,@upload:r0", **extra)
    algo = make_algo(fed, mode, cfg=cfg, hops=hops)
    with pytest.warns(RuntimeWarning, match=r"client\(s\) \[4\] lost"):
        algo.setup()
    kept = torch.nonzero(fed.owner != 4).ravel()
    sub = fed.graph.subgraph(kept)
    ax, deg = full_graph_operator(type("Fed", (), {"graph": sub}))
    index = torch.full((fed.graph.num_nodes,), -1, dtype=torch.long)
    index[kept] = torch.arange(kept.numel())
    for k, c in enumerate(algo.clients[:4]):
        far_kept = fed.owner[c.cross_edges[1]] != 4
        rows = requested_rows(type(c)(**{**vars(c), "cross_edges": c.cross_edges[:, far_kept]}), hops)
        z, graph = algo.client_inputs(k)
        assert torch.allclose(z.double(), ax[index[rows]] / deg[index[rows], None], atol=1e-6), f"client {k}"
        assert graph.edge_index.max() < rows.numel()
    assert algo.final_metrics()["pretrain_dropouts"] == {
        "left_out": [4],
        "without_inputs": [4],
        "graph": "induced by the nodes of clients [0, 1, 2, 3]",
    }
    assert list(algo.strategy.lost) == [4]


# ----------------------------------------------------------------------------- secure modes
@pytest.mark.parametrize("mode", ["ckks", "mask"])
@pytest.mark.parametrize("hops,layout", [(1, "sparse"), (2, "dense")])
def test_secure_totals_equal_plain_exactly(fed, mode, hops, layout, make_algo):
    """Binary features: packed integer sums come back exactly equal to the plaintext ones."""
    plain = make_algo(fed, "plain", hops=hops, layout=layout)
    plain.setup()
    sec = make_algo(fed, mode, hops=hops, layout=layout)
    assert sec.value_spec().integer
    sec.setup()
    for k in range(K):
        assert torch.equal(sec.received[k], plain.received[k]), f"client {k}"
    assert sec.final_metrics()["pretrain_bytes_up"] > 0
    ups = [m for m in sec.protocol.transcript.select(tag=TAG) if m.receiver == "server" and m.kind != "metadata"]
    assert ups and all(m.kind != "plain" for m in ups)


@pytest.mark.parametrize("mode", ["ckks", "mask"])
def test_count_features_travel_as_exact_integer_sums(fed_counts, mode, make_algo):
    """Count features travel as exact integer sums.

    Word counts (Coauthor CS / Physics hold them): exact integer fields sized by the degree cap
    and --feature-bound, so a secure mode returns plain's totals bit for bit; a count above the
    bound is refused by its owner; DP (which scales the terms) keeps the float encoding.
    """
    assert fed_counts.count_features and not fed_counts.binary_features
    plain = make_algo(fed_counts, "plain", hops=1)
    plain.setup()
    sec = make_algo(fed_counts, mode, hops=1, feature_bound=3.5)
    spec = sec.value_spec()
    assert spec.integer and spec.sum_max == (sec.opts.degree_cap + 1) * 3
    sec.setup()
    for k in range(K):
        assert torch.equal(sec.received[k], plain.received[k]), f"client {k}"
    with pytest.raises(BoundError, match="feature-bound"):
        make_algo(fed_counts, mode, hops=1, feature_bound=2.0).setup()
    cfg = RunConfig(mode=mode, rounds=2, clients=K, dp_epsilon=4.0, dp_clip=3.0, dp_exchanges=SUMS)
    assert not make_algo(fed_counts, cfg=cfg, hops=1).value_spec().integer
    assert not make_federated("csbm", num_clients=K, seed=4, num_nodes=60, num_features=4).count_features


def test_client_runtimes_send_count_features_as_exact_integer_sums(fed_counts):
    """Client runtimes send count features as exact integer sums.

    A whole run: the public facts carry the feature type, so the ckks exchange is the integer
    one and, with the model mean on the public grid in both modes, its rounds equal plain's.
    """
    from secure_fgl.runtime.facts import PublicFacts

    assert PublicFacts.of(fed_counts).count_features
    runs = {}
    for mode in ("plain", "ckks"):
        cfg = RunConfig(
            algorithm="fedgcn",
            mode=mode,
            clients=K,
            rounds=2,
            grid_model_mean=True,
            options={"hops": 1, "feature_bound": 3},
        )  # the same model mean in both modes
        runs[mode] = run_experiment(cfg, progress=False, fed=fed_counts)
    assert runs["ckks"]["final"]["pretrain_bytes_up"] > 0
    assert [r["train_loss"] for r in runs["ckks"]["rounds"]] == [r["train_loss"] for r in runs["plain"]["rounds"]]


@pytest.mark.parametrize("mode", ["ckks", "mask"])
def test_secure_float_features_close_to_plain(fed_float, mode, make_algo):
    """Float features (and norm='sym' on them) use the float encoding: within tolerance."""
    plain = make_algo(fed_float, "plain", hops=2, norm="sym")
    plain.setup()
    sec = make_algo(fed_float, mode, hops=2, norm="sym")
    assert not sec.value_spec().integer
    sec.setup()
    for k in range(K):
        np.testing.assert_allclose(sec.received[k].numpy(), plain.received[k].numpy(), atol=1e-3)


# ----------------------------------------------------------------------------- 0-hop = FedAvg
def test_zero_hop_equals_fedavg(fed, run_small):
    """hops=0 runs no exchange and trains exactly FedAvg's model (same rounds, same parameters)."""
    cfg = dict(mode="plain", rounds=3, clients=K, seed=7)
    a = run_small(RunConfig(algorithm="fedgcn", options={"hops": 0}, **cfg), fed)
    b = run_small(RunConfig(algorithm="fedavg", **cfg), fed)
    assert a.train() == b.train()
    assert a.protocol.transcript.select(tag=TAG) == []
    for k in range(K):
        assert torch.equal(a.logic(k).global_params, b.logic(k).global_params)
    assert a.strategy.evaluate()["test_acc"] == b.strategy.evaluate()["test_acc"]


# ----------------------------------------------------------------------------- bounds
@pytest.mark.parametrize("mode", ["mask"])
def test_degree_above_cap_is_refused_loudly_naming_the_maximum_over_all_clients(fed, mode, make_algo):
    algo = make_algo(fed, mode, hops=1, degree_cap=2)
    largest = max(fed_degrees(c) for c in algo.clients)
    with pytest.raises(BoundError, match=f"degree-cap.*largest {largest}.*at least {largest}"):
        algo.setup()
    assert algo.protocol.transcript.select(tag=TAG) == []  # refused before anything was sent
    raised = make_algo(fed, mode, hops=1, degree_cap=largest)  # following the message once is enough
    raised.setup()


def fed_degrees(c) -> int:
    """Largest degree of client c's own nodes (local plus cross edges, self loop not counted)."""
    from secure_fgl.algorithms.fedgcn.ops import local_degrees

    return int(local_degrees(c).max()) - 1


def test_plain_mode_runs_above_the_degree_cap_and_node_level_dp_does_not(fed, make_algo):
    """Plain mode runs above the degree cap and node level DP does not.

    The plaintext protocol sums floats: the cap protects no encoding there, so plain runs and
    gets the exact sums; node-level DP's sensitivity relies on the cap, so it is still enforced.
    """
    capped, free = make_algo(fed, hops=1, degree_cap=2), make_algo(fed, hops=1)
    capped.setup()
    free.setup()
    for k in capped.received:
        assert torch.equal(capped.received[k], free.received[k])
    cfg = RunConfig(mode="plain", rounds=2, clients=K, dp_epsilon=8.0, dp_unit="node", dp_exchanges=SUMS)
    with pytest.raises(BoundError, match="node-level DP"):
        make_algo(fed, cfg=cfg, hops=1, degree_cap=2).setup()


def test_option_validation(make_algo):
    from secure_fgl.config import ConfigError

    f = make_federated("sbm", num_clients=2, seed=0, num_nodes=40, num_features=8)
    for bad in ({"hops": 3}, {"layout": "x"}, {"norm": "x"}, {"degree_cap": 0}):
        with pytest.raises(ConfigError):
            make_algo(f, **bad)


# ----------------------------------------------------------------------------- DP
def test_dp_noise_has_the_stated_scale(make_algo):
    """DP noise has the stated scale.

    Noise on the released sums: std = z * Delta * sqrt(K) (local placement, dense layout,
    every client uploads every row), Delta = sqrt(2) C (edge) or sqrt(D+1) C (node).
    """
    f = make_federated("sbm", num_clients=K, beta=100.0, seed=5, num_nodes=400, num_features=40)
    ax, deg = full_graph_operator(f)
    stds = {}
    for level in ("edge", "node"):
        cfg = RunConfig(
            mode="plain", rounds=1, clients=K, dp_epsilon=4.0, dp_clip=1.0, dp_unit=level, dp_exchanges=SUMS
        )
        algo = make_algo(f, cfg=cfg, hops=1, layout="dense", degree_cap=30, dp_row_clip=3.0)
        proto = algo.protocol
        algo.setup()
        C = 3.0
        delta = math.sqrt(2) * C if level == "edge" else math.sqrt(31) * C
        assert algo.dp_request().sensitivity == pytest.approx(delta)
        z = proto.dp.noise_multiplier(TAG)
        expected = z * delta * math.sqrt(K)
        # the count column is exact + noise; features were subsampled to <= floor(C^2-1) ones
        resid = torch.cat([algo.received[k][:, -1] - deg[c.global_ids] for k, c in enumerate(algo.clients)])
        assert torch.allclose(resid, resid.round())  # discrete Gaussian: integers
        got = float(resid.std())
        assert got == pytest.approx(expected, rel=0.15), (level, got, expected)
        stds[level] = got
        # the subsampled features never exceed the exact sums by more than the noise allows
        assert algo.value_spec().integer
    assert stds["node"] / stds["edge"] == pytest.approx(math.sqrt(31 / 2), rel=0.2)


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("mode", ["plain", "ckks", "mask"])
def test_end_to_end_run(mode, tmp_path):
    cfg = RunConfig(
        algorithm="fedgcn",
        dataset="sbm",
        mode=mode,
        clients=K,
        rounds=2,
        local_epochs=2,
        synthetic={"num_nodes": 200, "num_features": 16},
        out=str(tmp_path),
        options={"hops": 1},
    )
    res = run_experiment(cfg, progress=False)
    fin = res["final"]
    assert 0.0 <= fin["test_acc"] <= 1.0
    assert fin["hops"] == 1 and fin["pretrain_bytes_up"] > 0
    assert fin["pretrain_plaintext_equiv_bytes_up"] == sum(
        p["plaintext_equiv_bytes_up"] for p in fin["pretrain_per_client"]
    )
    assert TAG in res["comm"]["per_tag"] and "fedgcn/model" in res["comm"]["per_tag"]
    assert res["comm"]["per_tag"][TAG]["bytes_up"] == fin["pretrain_bytes_up"]
    assert (tmp_path / "result.json").exists()


def test_resume_keeps_received_sums(fed, make_algo):
    """A client's checkpoint holds its received sums: a fresh client loads them without the exchange."""
    algo = make_algo(fed, hops=2)
    algo.setup()
    fresh = make_algo(fed, hops=2)
    for k in range(K):
        fresh.run.logic(k).load_state_dict(algo.run.logic(k).state_dict())
        za, ga = algo.client_inputs(k)
        zb, gb = fresh.client_inputs(k)
        assert torch.equal(za, zb) and torch.equal(ga.edge_index, gb.edge_index) and ga.num_out == gb.num_out


# ----------------------------------------------------------------------------- row numbering (sparse)
@pytest.fixture(scope="module")
def fed_wide():
    """More rows than one ckks block holds (rpb = 10240 // 65 = 157 < 900 nodes)."""
    return make_federated("sbm", num_clients=K, beta=10000.0, seed=5, num_nodes=900, num_features=64, avg_degree=6.0)


def _upload_bytes(algo) -> int:
    return sum(m.nbytes for m in algo.protocol.transcript.select(tag=TAG) if m.receiver == "server")


@pytest.mark.parametrize("mode", ["plain", "ckks", "mask"])
@pytest.mark.parametrize("hops", [1, 2])
def test_signature_row_order_keeps_sums_and_cuts_upload(fed_wide, mode, hops, make_algo):
    """Signature row order keeps sums and cuts upload.

    row_order='signature' permutes row ids on both sides: every client receives exactly
    the same totals, and uploads fewer bytes than with the given numbering.
    """
    given = make_algo(fed_wide, mode, hops=hops, layout="sparse")
    given.setup()
    sig = make_algo(fed_wide, mode, hops=hops, layout="sparse", row_order="signature")
    sig.setup()
    for k in range(K):
        assert torch.equal(sig.received[k], given.received[k]), f"client {k}"
    assert _upload_bytes(sig) < _upload_bytes(given)
    m = sig.final_metrics()
    assert m["pretrain_row_order"] == "signature" and m["pretrain_exchange_rows"] >= fed_wide.graph.num_nodes
    assert m["pretrain_upload_ratio"] < given.final_metrics()["pretrain_upload_ratio"]


def test_touch_signatures_are_the_contributing_clients(fed_wide):
    """The owner-side signature S(v) equals the set of clients whose contribution has row v."""
    from secure_fgl.algorithms.fedgcn.ops import neighbour_terms, partial_neighbour_sums, touch_signatures

    masks = touch_signatures(fed_wide.clients, fed_wide.owner, fed_wide.graph.num_nodes)
    expected = np.zeros(fed_wide.graph.num_nodes, dtype=np.int64)
    for k, c in enumerate(fed_wide.clients):
        ids, _ = partial_neighbour_sums(c, neighbour_terms(c))
        expected[ids.numpy()] |= 1 << k
    assert np.array_equal(masks, expected)


def test_segment_blocks_is_optimal_on_small_sequences():
    """The DP's cut equals the brute-force minimum of sum_blocks popcount(OR of the block)."""
    from secure_fgl.algorithms.fedgcn.ops import segment_blocks

    rng = np.random.default_rng(0)

    def best(m, rpb):
        if not m:
            return 0
        return min(
            int(np.bitwise_or.reduce(m[:j])).bit_count() + best(m[j:], rpb) for j in range(1, min(rpb, len(m)) + 1)
        )

    for _ in range(40):
        n, rpb = int(rng.integers(1, 10)), int(rng.integers(2, 5))
        masks = rng.integers(1, 16, size=n).astype(np.int64)
        pos = segment_blocks(masks, rpb)
        assert (np.diff(pos) > 0).all()
        blocks = pos // rpb
        cost = sum(int(np.bitwise_or.reduce(masks[blocks == b])).bit_count() for b in np.unique(blocks))
        assert cost == best(list(masks), rpb)


def test_row_order_validation(fed, make_algo):
    from secure_fgl.config import ConfigError

    with pytest.raises(ConfigError, match="row-order"):
        make_algo(fed, layout="dense", row_order="signature")
    with pytest.raises(ConfigError, match="row-order"):
        make_algo(fed, row_order="random")


# ----------------------------------------------------------------------------- what a recipient decrypts
@pytest.mark.parametrize("hops", [1, 2])
def test_owner_row_order_blocks_never_mix_recipients(fed, hops, make_algo):
    """Owner row order blocks never mix recipients.

    A recipient decrypts whole blocks: with the given numbering it reads totals of rows other
    clients asked for; with ``row_order='owner'`` exactly its own requested rows (plus padding),
    and the totals it asked for are unchanged.
    """
    cfg = RunConfig(mode="plain", rounds=2, clients=K, attacks="fedgcn_client_subtraction")  # keeps what it read
    given, owner = make_algo(fed, cfg=cfg, hops=hops), make_algo(fed, cfg=cfg, hops=hops, row_order="owner")
    given.setup()
    owner.setup()
    foreign_read = 0
    for k, c in enumerate(given.clients):
        asked = set(requested_rows(c, hops).tolist())
        nodes_given = given.decrypted[k][0]
        foreign_read += len(set(nodes_given.tolist()) - asked)
        nodes_owner = owner.decrypted[k][0]
        assert set(nodes_owner[nodes_owner >= 0].tolist()) == asked
        assert torch.equal(owner.received[k], given.received[k])
    assert foreign_read > 0  # the leak the owner order removes
    assert owner.exchange_rows >= fed.graph.num_nodes


def test_client_subtraction_reads_every_decrypted_row(fed, make_algo):
    """The client-side attack scores every row of the blocks a client decrypted, not only its own."""
    from attacks.runner import run_attacks

    cfg = RunConfig(mode="plain", rounds=1, clients=K, attacks="fedgcn_client_subtraction")
    out = {}
    for order in ("given", "owner"):
        algo = make_algo(fed, cfg=cfg, hops=1, row_order=order)
        algo.setup()
        res = [
            r
            for r in run_attacks(cfg.attacks, algo=algo.strategy, protocol=algo.protocol, fed=fed, cfg=algo.cfg)
            if r.get("name") == "fedgcn_client_subtraction"
        ]
        out[order] = res[0]["value"]
    assert out["given"] > out["owner"] > 0  # foreign rows in the blocks add exposures
