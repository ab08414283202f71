"""The attack suite.

Planted data is recovered, metrics sit at chance on random inputs, scores fall as DP noise grows, the transcript
audit fails on a leaking protocol and passes on ckks/mask.

Tiny synthetic instances only (the whole file runs in well under a minute on one CPU core).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from attacks.audit import audit_protocol, audit_transcript
from attacks.base import Attack, GroundTruth, View, advantage, observer_parties, roc_auc, tpr_at_fpr, tv_distance
from attacks.fedgcn import ClientSubtraction, NeighbourSumInversion, NeighbourSumReadout
from attacks.gradient import GradientInversion, IsolatedGradientInversion, invert_update
from attacks.model import InfluenceLinkInference, MembershipInference, PosteriorLinkInference
from attacks.runner import ATTACKS, resolve_names
from attacks.statistics import MomentLabelDistribution, ProxyLabelDistribution
from protocols import Message, PlainProtocol, Transcript, ValueSpec, make_protocol
from protocols.transcript import SERVER


def _secure(mode: str, k: int):
    return make_protocol(mode, k)


# ----------------------------------------------------------------------------- fixtures
def small_fed(num_clients=4, num_nodes=240, num_features=60, seed=0):
    from secure_fgl.data import make_federated

    return make_federated(
        "sbm",
        num_clients=num_clients,
        partition="iid",
        seed=seed,
        num_nodes=num_nodes,
        num_features=num_features,
        avg_degree=4,
    )


def fedgcn_exchange(fed, proto, noise: float = 0.0, seed: int = 0, hops: int = 1):
    """FedGCN's real pre-training exchange, optionally with Gaussian noise.

    FedGCN's real pre-training exchange (its client-side functions), optionally with
    Gaussian noise of std ``noise`` added by every client to its rows (local-DP emulation).
    """
    from secure_fgl.algorithms.fedgcn.ops import TAG, neighbour_terms, partial_neighbour_sums, requested_rows

    rng = np.random.default_rng(seed)
    contributions, requests = {}, {}
    for k, c in enumerate(fed.clients):
        ids, rows = partial_neighbour_sums(c, neighbour_terms(c, "row"))
        rows = rows.numpy()
        if noise:
            rows = rows + rng.normal(0, noise, rows.shape)
        contributions[k] = (ids.numpy(), rows)
        requests[k] = requested_rows(c, hops).numpy()
    received = proto.row_sum(TAG, 0, contributions, requests, num_rows=fed.graph.num_nodes, layout="sparse")
    return received


def public(fed, **kw):
    return {
        "num_nodes": fed.graph.num_nodes,
        "num_features": fed.num_features,
        "num_classes": fed.num_classes,
        "num_clients": fed.num_clients,
        "binary_features": True,
        "row_width": fed.num_features + 1,
        "options": {"norm": "row"},
        **kw,
    }


def single_contributor_exposure(fed) -> float:
    """Graph algebra: node j is exposed iff some row i has j as the only term of some client."""
    truth = GroundTruth.from_fed(fed)
    a = truth.adjacency(self_loops=True)
    exposed = np.zeros(truth.num_nodes, bool)
    for k in range(fed.num_clients):
        cols = np.flatnonzero(truth.owner == k)
        b = a[:, cols].tocsr()
        one = np.flatnonzero(np.diff(b.indptr) == 1)
        exposed[cols[b.indices[b.indptr[one]]]] = True
    # an all-zero feature row is never a claim (nothing to read)
    exposed &= truth.x.sum(1) > 0
    return float(exposed.mean())


# ----------------------------------------------------------------------------- base
def test_observer_strings():
    assert observer_parties("server") == ["server"]
    assert observer_parties("client:3") == ["client3"]
    assert observer_parties("coalition:[0, 2]") == ["client0", "client2"]
    with pytest.raises(ValueError):
        observer_parties("nobody")


def test_view_reads_only_what_keys_allow():
    tr = Transcript()
    payload = {"block_ids": np.array([0], np.int32), "values": np.ones((1, 4), np.float32)}
    tr.record(Message(0, "x/model", "client0", SERVER, "ciphertext", (1, 4), 16, "ckks", "f", payload))
    tr.record(Message(0, "x/model", "client1", SERVER, "plain", (1, 4), 16, "plain", "f", payload))
    v = View.of(tr, "server")
    assert [v.readable(m) for m in v.messages] == [False, True]
    v2 = View.of(tr, "server", opener=lambda party, m: m.payload if party == SERVER else None)
    assert all(v2.readable(m) for m in v2.messages)
    assert View.of(tr, "client0").messages == [tr.messages[0]]


def test_attack_receives_only_declared_knowledge():
    seen = {}

    class Probe(Attack):
        name = "probe"
        knowledge = ("public",)

        def run(self, view, knowledge):
            seen.update(knowledge)
            return self.result(output=None)

        def score(self, res, truth):
            res.metric, res.value, res.chance = "m", 1.0, 0.0
            return res

    res = Probe()(View(("server",), []), {"public": {"a": 1}, "topology": "secret"}, truth=None)
    assert set(seen) == {"public"} and res.applicable
    assert not Probe()(View(("server",), []), {}).applicable  # missing knowledge -> not applicable


def test_metric_helpers():
    assert roc_auc([0.1, 0.9], [0, 1]) == 1.0
    assert roc_auc([1, 1, 1, 1], [0, 1, 0, 1]) == 0.5
    assert advantage([0.1, 0.9], [0, 1]) == 1.0
    assert tpr_at_fpr([0.1, 0.2, 0.9], [0, 0, 1], 0.01) == 1.0
    assert tv_distance([1, 0], [0, 1]) == 1.0 and tv_distance([2, 2], [1, 1]) == 0.0


# ----------------------------------------------------------------------------- FedGCN
def test_fedgcn_attacks_recover_planted_features():
    fed = small_fed()
    proto = PlainProtocol(fed.num_clients)
    fedgcn_exchange(fed, proto)
    truth = GroundTruth.from_fed(fed)
    pub = public(fed)
    r = NeighbourSumReadout()(View.of(proto.transcript, "server"), {"public": pub}, truth)
    # the count column makes the detector exact, and exposure equals the graph algebra
    assert r.applicable and r.metrics["precision"] == 1.0
    assert r.value == pytest.approx(single_contributor_exposure(fed), abs=1e-9)
    assert r.value > 0.5 and r.metrics["bit_auc"] == 1.0
    topo = {"edge_index": truth.edge_index, "owner": truth.owner}
    ls = NeighbourSumInversion()(View.of(proto.transcript, "server"), {"public": pub, "topology": topo}, truth)
    assert ls.metrics["operator"] == ["A+I"]
    assert ls.value >= ls.metrics["identifiable_fraction"] - 1e-9 and ls.value > 0.95
    results = []
    for c in fed.clients:
        obs = f"client:{c.client_id}"
        results.append(
            ClientSubtraction(observer=obs)(
                View.of(proto.transcript, obs), {"public": pub, "own_data": c, "received": None}, truth
            )
        )
    pooled = ClientSubtraction.pool(results, truth)
    assert all(x.metrics["precision"] == 1.0 for x in results if x.metrics["claims"])
    assert 0.05 < pooled["exposure_rate"] < r.value


def test_client_subtraction_from_decrypted_results_only():
    """Client subtraction from decrypted results only.

    Secure modes: the totals are ciphertext in the transcript; the client's own decrypted
    copy (what it legitimately receives) suffices.
    """
    fed = small_fed()
    proto = PlainProtocol(fed.num_clients)
    received = fedgcn_exchange(fed, proto)
    truth = GroundTruth.from_fed(fed)
    opaque = Transcript()
    for m in proto.transcript.messages:
        opaque.record(
            Message(
                m.round, m.tag, m.sender, m.receiver, "ciphertext", m.shape, m.nbytes, "ckks", m.fingerprint, b"\0" * 8
            )
        )
    c = fed.clients[1]
    view = View.of(opaque, "client:1")
    none = ClientSubtraction(observer="client:1")(view, {"public": public(fed), "own_data": c, "received": None})
    assert not none.applicable
    got = {"fedgcn/neighbour_sums": (c.global_ids.numpy(), received[1][: c.num_nodes])}
    r = ClientSubtraction(observer="client:1")(view, {"public": public(fed), "own_data": c, "received": got}, truth)
    assert r.applicable and r.value > 0 and r.metrics["precision"] == 1.0
    # ... and the server can do nothing with ciphertext
    s = NeighbourSumReadout()(View.of(opaque, "server"), {"public": public(fed)}, truth)
    assert not s.applicable and "ciphertext" in s.reason


def test_fedgcn_readout_at_chance_on_random_rows():
    fed = small_fed()
    truth = GroundTruth.from_fed(fed)
    rng = np.random.default_rng(1)
    proto = PlainProtocol(fed.num_clients)
    d, n = fed.num_features, fed.graph.num_nodes
    contributions = {
        k: (np.arange(n), np.concatenate([(rng.random((n, d)) < 0.05).astype(float), rng.integers(1, 4, (n, 1))], 1))
        for k in range(fed.num_clients)
    }
    proto.row_sum("fedgcn/neighbour_sums", 0, contributions, {k: np.arange(n) for k in contributions}, n)
    r = NeighbourSumReadout()(View.of(proto.transcript, "server"), {"public": public(fed)}, truth)
    assert r.value < 0.02  # chance: 0 exact recoveries
    assert abs(r.metrics["bit_auc"] - 0.5) < 0.05


def test_fedgcn_scores_fall_with_noise():
    fed = small_fed(num_nodes=200, num_features=40)
    truth = GroundTruth.from_fed(fed)
    pub = public(fed)
    topo = {"edge_index": truth.edge_index, "owner": truth.owner}
    means = {}
    for sigma in (0.0, 0.15, 0.3, 1.0):
        vals = []
        for seed in range(2):
            proto = PlainProtocol(fed.num_clients)
            fedgcn_exchange(fed, proto, noise=sigma, seed=seed)
            v = View.of(proto.transcript, "server")
            r = NeighbourSumReadout()(v, {"public": pub}, truth)
            ls = NeighbourSumInversion()(v, {"public": pub, "topology": topo}, truth)
            vals.append((r.value, r.metrics["bit_auc"], ls.value))
        means[sigma] = np.mean(vals, axis=0)
    seq = [means[s] for s in sorted(means)]
    for a, b in zip(seq, seq[1:]):
        assert (b <= a + 0.02).all(), means
    assert seq[-1][0] < 0.05 and seq[-1][1] < seq[0][1]


def test_fedgcn_dp_run_pushes_readout_toward_chance():
    """End to end with the real DP engine: exposure at small epsilon is far below no-DP."""
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment

    syn = dict(num_nodes=200, num_features=40, avg_degree=4)
    vals = {}
    for eps in (None, 8.0, 0.5):
        cfg = RunConfig(
            algorithm="fedgcn",
            dataset="sbm",
            clients=3,
            mode="plain",
            partition="iid",
            rounds=1,
            dp_epsilon=eps,
            dp_exchanges="fedgcn/neighbour_sums" if eps else "all",  # what the readout reads
            attacks=["fedgcn_readout"],
            synthetic=syn,
        )
        res = run_experiment(cfg, progress=False)
        entry = [a for a in res["attacks"] if a["name"] == "fedgcn_readout"][0]
        vals[eps] = entry["value"]
    assert vals[None] > 0.5
    assert vals[None] >= vals[8.0] >= vals[0.5]
    assert vals[0.5] < 0.05


# ----------------------------------------------------------------------------- gradients
def _planted_update(n=4, d=10, C=3, h=32, seed=0, lr=0.05):
    from secure_fgl.models import build_model

    torch.manual_seed(seed)
    r = np.random.default_rng(seed)
    clients = []
    for k in range(2):
        x = torch.tensor((r.random((n, d)) < 0.3).astype(np.float32))
        pairs = [(i, i + 1) for i in range(n - 1)]
        ei = torch.tensor(np.array(pairs + [(j, i) for i, j in pairs]).T, dtype=torch.long).reshape(2, -1)
        clients.append(
            SimpleNamespace(
                x=x,
                y=torch.tensor(r.integers(0, C, n)),
                edge_index=ei,
                train_mask=torch.ones(n, dtype=torch.bool),
                num_nodes=n,
            )
        )
    model = build_model("gcn", d, h, C, dropout=0.0)
    w0 = parameters_to_vector(model.parameters()).detach().clone()
    ups = {}
    for k, c in enumerate(clients):
        m = copy.deepcopy(model)
        loss = F.cross_entropy(m(c.x, c.edge_index), c.y)
        ups[k] = -lr * torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(m.parameters()))])
    return model, w0, clients, ups


def _grad_knowledge(model, w0, mean, clients, d, C, lr):
    rel = copy.deepcopy(model)
    vector_to_parameters(w0 + torch.as_tensor(mean, dtype=torch.float32), rel.parameters())
    return {
        "public": {
            "num_features": d,
            "num_classes": C,
            "num_clients": 2,
            "binary_features": True,
            "optimizer": "sgd",
            "lr": lr,
        },
        "architecture": lambda: copy.deepcopy(model),
        "released_model": rel,
        "own_contributions": None,
        "victim_topology": {
            "client": 0,
            "num_nodes": clients[0].num_nodes,
            "edge_index": clients[0].edge_index,
            "train_mask": clients[0].train_mask,
        },
    }


def test_gradient_inversion_recovers_planted_node_features():
    """The iDLG setting (one node per client): features and label recovered; two nodes: mostly."""
    d, C = 12, 3
    model, w0, clients, ups = _planted_update(n=1, d=d, C=C)
    proto = PlainProtocol(2)
    mean = proto.weighted_mean("fedavg/model", 0, ups, {0: 0.5, 1: 0.5}, recipients=[0, 1])
    truth = SimpleNamespace(clients=clients, binary=True, num_classes=C, x=None, y=None, train_mask=None)
    kn = _grad_knowledge(model, w0, mean, clients, d, C, 0.05)
    r = GradientInversion(iterations=300, restarts=2, update_rule="sgd")(View.of(proto.transcript, "server"), kn, truth)
    assert r.metric == "feature_auc" and r.value > 0.95, r.to_dict()
    assert r.metrics["label_acc"] == 1.0 and r.metrics["support_auc"] > 0.9
    aucs = []
    for seed in (0, 1):
        model2, w2, cl2, ups2 = _planted_update(n=2, d=d, C=C, seed=seed)
        x, _, _ = invert_update(
            copy.deepcopy(model2),
            w2,
            ups2[0],
            (2, d),
            cl2[0].edge_index,
            cl2[0].train_mask,
            C,
            binary=True,
            rule="sgd",
            iterations=300,
            restarts=2,
        )
        aucs.append(roc_auc(x.numpy().ravel(), cl2[0].x.numpy().ravel()))
    assert np.mean(aucs) > 0.8, aucs
    # K = 2: the other client isolates the victim's update exactly from the aggregate
    iso = IsolatedGradientInversion(observer="client:1", iterations=400, restarts=2, update_rule="sgd")
    view = View.of(proto.transcript, "client:1")
    iso._known = {}
    victim_vec, _ = iso.target_vector(view, "fedavg/model", 0, int(w0.numel()), kn["public"])
    direct = GradientInversion().target_vector(
        View.of(proto.transcript, "server"), "fedavg/model", 0, int(w0.numel()), kn["public"]
    )[0]
    assert np.allclose(victim_vec, direct, atol=1e-5)


def test_gradient_inversion_at_chance_on_random_update():
    d, C = 40, 3
    model, w0, clients, ups = _planted_update(n=6, d=d, C=C)
    rng = np.random.default_rng(3)
    fake = {0: torch.tensor(rng.normal(0, 1e-3, w0.numel()), dtype=torch.float32), 1: ups[1]}
    proto = PlainProtocol(2)
    mean = proto.weighted_mean("fedavg/model", 0, fake, {0: 0.5, 1: 0.5}, recipients=[0, 1])
    truth = SimpleNamespace(clients=clients, binary=True, num_classes=C, x=None, y=None, train_mask=None)
    r = GradientInversion(iterations=60, update_rule="sgd")(
        View.of(proto.transcript, "server"), _grad_knowledge(model, w0, mean, clients, d, C, 0.05), truth
    )
    assert abs(r.value - 0.5) < 0.15
    assert abs(r.metrics["support_auc"] - 0.5) < 0.3


def test_invert_update_loss_falls():
    d, C = 10, 3
    model, w0, clients, ups = _planted_update(d=d, C=C)
    c = clients[0]
    _, _, short = invert_update(
        copy.deepcopy(model),
        w0,
        ups[0],
        (c.num_nodes, d),
        c.edge_index,
        c.train_mask,
        C,
        binary=True,
        rule="sgd",
        iterations=5,
    )
    _, _, long = invert_update(
        copy.deepcopy(model),
        w0,
        ups[0],
        (c.num_nodes, d),
        c.edge_index,
        c.train_mask,
        C,
        binary=True,
        rule="sgd",
        iterations=200,
    )
    assert long < short


# ----------------------------------------------------------------------------- statistics
def _label_truth(dists, C, n=60, seed=0):
    rng = np.random.default_rng(seed)
    clients, ys = [], []
    for pi in dists:
        y = rng.choice(C, n, p=pi)
        ys.append(y)
        clients.append(SimpleNamespace(y=torch.tensor(y), train_mask=torch.ones(n, dtype=torch.bool), num_nodes=n))
    y_all = np.concatenate(ys)
    return SimpleNamespace(
        clients=clients,
        y=y_all,
        owner=np.repeat(np.arange(len(dists)), n),
        train_mask=np.ones(y_all.size, bool),
        num_classes=C,
    )


def test_fedspray_proxies_leak_label_distribution_exactly_in_plain():
    C, D = 4, 8
    truth = _label_truth([[0.7, 0.3, 0, 0], [0, 0.1, 0.4, 0.5], [0.25, 0.25, 0.25, 0.25]], C)
    rng = np.random.default_rng(0)
    values = {k: rng.normal(size=(C, D)) for k in range(3)}
    weights = {k: np.bincount(c.y.numpy(), minlength=C) / c.num_nodes for k, c in enumerate(truth.clients)}
    pub = {"num_classes": C, "options": {"proxy_dim": D}}
    proto = PlainProtocol(3)
    proto.classwise_mean("fedspray/proxies", 0, values, weights)
    r = ProxyLabelDistribution()(View.of(proto.transcript, "server"), {"public": pub}, truth)
    assert r.value < 1e-6 and r.metrics["exact_clients"] == 1.0 and r.metrics["absent_class_acc"] == 1.0
    assert r.chance > 0.1 and not r.higher_is_leakier
    # random weights: no better than the prior baseline
    proto = PlainProtocol(3)
    proto.classwise_mean("fedspray/proxies", 0, values, {k: rng.random(C) for k in range(3)})
    rr = ProxyLabelDistribution()(View.of(proto.transcript, "server"), {"public": pub}, truth)
    assert rr.value > 0.5 * rr.chance
    for mode in ("mask", "ckks"):
        sp = make_protocol(mode, 3)
        sp.classwise_mean("fedspray/proxies", 0, values, weights, spec=ValueSpec(max_abs=100.0))
        rs = ProxyLabelDistribution()(View.of(sp.transcript, "server"), {"public": pub}, truth)
        assert not rs.applicable


def test_fedomd_moments_unmix_label_distribution():
    C, h = 3, 6
    protos = np.eye(C, h) * 3.0
    dists = [[0.8, 0.1, 0.1], [0.1, 0.1, 0.8], [0.2, 0.6, 0.2]]
    truth = _label_truth(dists, C, n=80)
    rng = np.random.default_rng(1)
    samples = {k: protos[c.y.numpy()] + rng.normal(0, 0.3, (c.num_nodes, h)) for k, c in enumerate(truth.clients)}
    proto = PlainProtocol(3)
    proto.central_moments("fedomd/hidden1", 0, samples, orders=(2,))
    ya = rng.integers(0, C, 300)
    aux = {"x": torch.tensor(protos[ya] + rng.normal(0, 0.3, (300, h))), "edge_index": torch.zeros(2, 0), "y": ya}
    kn = {"public": {"num_classes": C}, "hidden_fn": lambda x, ei: x.numpy(), "aux_labelled": aux}
    r = MomentLabelDistribution()(View.of(proto.transcript, "server"), kn, truth)
    assert r.value < 0.1 < r.chance and r.metrics["client_size_exact"] == 1.0


# ----------------------------------------------------------------------------- released model
def _graph_truth(n=200, C=4, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    src = rng.integers(0, n, 600)
    same = [rng.choice(np.flatnonzero(y == y[s])) for s in src]
    ei = np.concatenate([np.stack([src, same]), np.stack([same, src])], 1)
    ei = ei[:, ei[0] != ei[1]]
    train = np.zeros(n, bool)
    train[rng.permutation(n)[: n // 2]] = True
    return SimpleNamespace(
        y=y,
        edge_index=ei,
        train_mask=train,
        owner=np.zeros(n, np.int64),
        x=rng.random((n, 8)),
        num_classes=C,
        num_nodes=n,
    ), rng


def test_membership_planted_and_random():
    truth, rng = _graph_truth()
    n, C = truth.num_nodes, truth.num_classes
    ids = np.arange(n)
    conf = np.where(truth.train_mask, 0.9, 0.5)
    P = np.full((n, C), 0.0)
    P[np.arange(n), truth.y] = conf
    P += (1 - P.sum(1, keepdims=True)) / C
    cand = {"ids": ids, "labels": truth.y}
    r = MembershipInference()(View(("client0",), []), {"posteriors": P, "candidates": cand}, truth)
    assert r.value == 1.0 and r.metrics["advantage"] == 1.0 and r.metrics["tpr_at_1fpr"] == 1.0
    Pr = rng.dirichlet(np.ones(C), n)
    rr = MembershipInference()(View(("client0",), []), {"posteriors": Pr, "candidates": cand}, truth)
    assert abs(rr.value - 0.5) < 0.1 and rr.metrics["tpr_at_1fpr"] < 0.1


def test_link_posterior_planted_and_random():
    truth, rng = _graph_truth()
    n, C = truth.num_nodes, truth.num_classes
    P = np.eye(C)[truth.y] * 0.9 + 0.1 / C + rng.normal(0, 0.01, (n, C))
    r = PosteriorLinkInference()(View(("client0",), []), {"posteriors": P}, truth)
    assert r.metrics["auc_random"] > 0.8
    rr = PosteriorLinkInference()(View(("client0",), []), {"posteriors": rng.dirichlet(np.ones(C), n)}, truth)
    assert abs(rr.value - 0.5) < 0.1 and abs(rr.metrics["auc_random"] - 0.5) < 0.1


def test_linkteller_finds_edges_of_a_gcn_api():
    from secure_fgl.models import build_model

    fed = small_fed(num_clients=2, num_nodes=120, num_features=30)
    c = fed.clients[0]
    model = build_model("gcn", fed.num_features, 16, fed.num_classes, dropout=0.0)
    model.eval()
    api = {
        "client": 0,
        "features": c.x,
        "global_ids": c.global_ids.numpy(),
        "query": lambda x: torch.log_softmax(model(x, c.edge_index), -1),
    }
    truth = GroundTruth.from_fed(fed)
    r = InfluenceLinkInference(targets=40)(View(("client1",), []), {"query_api": api}, truth)
    assert r.metrics["auc_random"] > 0.95 and r.value > 0.6
    # an API that ignores the graph (an MLP) leaks nothing: chance
    mlp = build_model("mlp", fed.num_features, 16, fed.num_classes, dropout=0.0)
    api2 = dict(api, query=lambda x: torch.log_softmax(mlp(x, c.edge_index), -1))
    rr = InfluenceLinkInference(targets=40)(View(("client1",), []), {"query_api": api2}, truth)
    assert abs(rr.metrics["auc_random"] - 0.5) < 0.1


# ----------------------------------------------------------------------------- audit
class LeakyProtocol(PlainProtocol):
    """A 'secure' backend that in fact uploads plaintext (kind 'plain')."""

    mode = "leaky"
    upload_kind = "ciphertext"


class SideFieldProtocol(PlainProtocol):
    """Labels uploads as ciphertext but ships the client weight in clear next to it."""

    mode = "sidefield"
    upload_kind = "ciphertext"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.intercept = self._side_field  # every upload crosses the server half's hook

    @staticmethod
    def _side_field(msg):
        if msg.receiver == SERVER and msg.kind == "plain":
            p = {
                "block_ids": msg.payload["block_ids"],
                "ct": b"\x00" * 32,
                "count": float(msg.payload["values"].ravel()[-1]),
            }
            msg = Message(
                msg.round,
                msg.tag,
                msg.sender,
                msg.receiver,
                "ciphertext",
                msg.shape,
                msg.nbytes,
                msg.protocol,
                msg.fingerprint,
                p,
                auth=msg.auth,
            )
        return msg


def _exchange(proto):
    rng = np.random.default_rng(0)
    proto.weighted_mean(
        "t/model",
        0,
        {k: rng.normal(size=6) for k in range(3)},
        {k: k + 1.0 for k in range(3)},
        spec=ValueSpec(max_abs=100.0),
    )


def test_audit_fails_on_leaking_protocols():
    proto = LeakyProtocol(3)
    _exchange(proto)
    rep = audit_protocol(proto)
    assert rep.secure and not rep.passed and any("readable by the server" in f for f in rep.failures)
    proto2 = SideFieldProtocol(3)
    with pytest.raises(Exception):
        _exchange(proto2)  # the plain server cannot aggregate the stub's messages...
    rep2 = audit_transcript(proto2.transcript.messages, mode="sidefield")
    assert not rep2.passed and any("side field count" in f for f in rep2.failures)
    # unequal sizes in a dense exchange fail too
    tr = [
        Message(0, "t/model", f"client{k}", SERVER, "ciphertext", (1,), 1000 + 100 * k, "x", "f", b"") for k in range(3)
    ]
    assert not audit_transcript(tr, mode="x").passed
    plain = PlainProtocol(3)
    _exchange(plain)
    assert not audit_protocol(plain).passed  # plain mode: the exposure is reported as such


@pytest.mark.parametrize("mode", ["mask", "ckks"])
def test_audit_passes_on_secure_backends(mode):
    proto = _secure(mode, 3)
    _exchange(proto)
    fed = small_fed(num_clients=3, num_nodes=90, num_features=20)
    from secure_fgl.algorithms.fedgcn.ops import neighbour_terms, partial_neighbour_sums, requested_rows

    contributions = {
        k: tuple(t.numpy() for t in partial_neighbour_sums(c, neighbour_terms(c, "row")))
        for k, c in enumerate(fed.clients)
    }
    requests = {k: requested_rows(c, 1).numpy() for k, c in enumerate(fed.clients)}
    proto.row_sum(
        "fedgcn/neighbour_sums",
        0,
        contributions,
        requests,
        num_rows=fed.graph.num_nodes,
        spec=ValueSpec(integer=True, max_abs=255, sum_max=255),
    )
    rep = audit_protocol(proto)
    assert rep.passed, rep.failures
    truth = GroundTruth.from_fed(fed)
    r = NeighbourSumReadout()(View.of(proto.transcript, "server"), {"public": public(fed)}, truth)
    assert not r.applicable


# ----------------------------------------------------------------------------- runner
def test_runner_registry_and_skips():
    assert set(resolve_names(["all"], "fedgcn")) >= {
        "fedgcn_readout",
        "fedgcn_ls",
        "fedgcn_client_subtraction",
        "membership",
    }
    assert "fedgcn_readout" not in resolve_names(["all"], "fedavg")
    with pytest.raises(ValueError):
        resolve_names(["nope"], "fedavg")
    assert all(issubclass(c, Attack) for c in ATTACKS.values())


def test_runner_on_a_secure_run_reports_at_chance_only_after_audit():
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment

    cfg = RunConfig(
        algorithm="fedgcn",
        dataset="sbm",
        clients=3,
        mode="mask",
        partition="iid",
        rounds=1,
        attacks=["all"],
        synthetic=dict(num_nodes=150, num_features=30, avg_degree=4),
    )
    res = run_experiment(cfg, progress=False)
    by = {a["name"]: a for a in res["attacks"]}
    assert by["transcript_audit"]["value"] == 1.0
    assert not by["fedgcn_readout"]["applicable"] and by["fedgcn_readout"]["at_chance"] is True
    sub = by["fedgcn_client_subtraction"]
    assert sub["applicable"] and sub["value"] > 0 and sub["source"] == "client's decrypted blocks"
    for a in res["attacks"]:
        assert {"name", "observer", "exchange", "metric", "value", "chance", "applicable"} <= set(a)
