"""FedSpray (Fu et al., KDD 2024): proxy alignment, what the server sees, soft proxies, end to end."""

from __future__ import annotations

import copy
import functools
import itertools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.runs import fedspray_federation
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from protocols import SERVER, Transcript, make_protocol
from secure_fgl.algorithms.fedspray.ops import PROXY_SPEC, class_weights, classwise_weighted_mean, keep_absent
from secure_fgl.config import RunConfig
from secure_fgl.experiment import run_experiment
from secure_fgl.models.fedspray_encoder import node_proxies, soft_proxies, soft_proxy_weights

K = 4
SECURE = ("ckks", "mask")
PROXY_TAG = "fedspray/proxies"
#: one upload per client per round carrying the proxies (first) and the encoder update (protocols.batch)
BATCH_TAG = "fedspray/batch"
UNREADABLE = {"ciphertext", "masked", "share"}


@functools.cache
def _shared_protocol(mode: str):
    """One protocol per mode for the property test (key set-up once); rounds stay unique."""
    return make_protocol(mode, K, transcript=Transcript(keep_payloads="none"))


_rounds = itertools.count()


def align_proxies(protocol, tag, rnd, local, weights, previous):
    """Eq. 15 as one class-wise mean exchange.

    The clients' ``[w_k * S^(k), w_k]``. A class nobody holds keeps ``previous``.
    """
    mean, present = protocol.classwise_mean(tag, rnd, local, weights, spec=PROXY_SPEC)
    return keep_absent(mean, present, previous)


def _tolerance(mode: str) -> float:
    return {"plain": 1e-5, "mask": 1e-4, "ckks": 1e-3}[mode]


# --------------------------------------------------------------------------- eq. 15
@pytest.mark.parametrize("mode", ("plain",) + SECURE)
def test_proxy_alignment_equals_plaintext_ratio_weighted_mean(mode):
    protocol = _shared_protocol(mode)

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(C=st.integers(2, 5), d=st.integers(1, 6), data=st.data())
    def check(C, d, data):
        values = {k: data.draw(hnp.arrays(np.float64, (C, d), elements=st.floats(-3, 3, width=32))) for k in range(K)}
        counts = {k: np.array(data.draw(st.lists(st.integers(0, 40), min_size=C, max_size=C)), float) for k in range(K)}
        if not any(c.sum() for c in counts.values()):
            counts[0][0] = 1.0
        weights = {k: class_weights(counts[k], "ratio") for k in range(K)}
        previous = torch.randn(C, d)
        got = align_proxies(protocol, PROXY_TAG, next(_rounds), values, weights, previous)
        want = classwise_weighted_mean(values, weights, previous.numpy())
        np.testing.assert_allclose(got.numpy(), want, atol=_tolerance(mode), rtol=1e-4)

    check()


def test_class_weights_are_ratios():
    w = class_weights(np.array([3, 0, 1]), "ratio")
    np.testing.assert_allclose(w, [0.75, 0, 0.25])
    np.testing.assert_allclose(class_weights(np.array([3, 0, 1]), "count", graph_size=100), [0.03, 0, 0.01])


# --------------------------------------------------------------------------- server's view
def _two_presence_patterns(C=4, d=3):
    rng = np.random.default_rng(0)
    values = {k: rng.normal(size=(C, d)) for k in range(K)}
    full = {k: np.array([5.0, 3.0, 2.0, 1.0]) for k in range(K)}
    gappy = {k: v.copy() for k, v in full.items()}
    gappy[0][[1, 3]] = 0.0  # client 0 lacks classes 1 and 3
    gappy[2][0] = 0.0  # client 2 lacks class 0
    for k in values:  # what the algorithm sends for an absent class: a zero row
        values[k] = values[k] * (gappy[k] > 0)[:, None]
    return values, full, gappy


def _signature(transcript: Transcript):
    return [(m.tag, m.sender, m.receiver, m.kind, tuple(m.shape), m.nbytes) for m in transcript.view(SERVER)]


@pytest.mark.parametrize("mode", SECURE)
def test_secure_server_view_hides_ratios_and_absent_classes(mode):
    values, full, gappy = _two_presence_patterns()
    sigs = []
    for counts in (full, gappy):
        protocol = make_protocol(mode, K, transcript=Transcript(keep_payloads="all"))
        weights = {k: class_weights(c, "ratio") for k, c in counts.items()}
        align_proxies(protocol, PROXY_TAG, 0, values, weights, torch.zeros(4, 3))
        view = protocol.transcript.view(SERVER)
        # control messages (mask's share commitments and survivor-set MACs) hold no input
        uploads = [
            m for m in view if m.receiver == SERVER and m.tag == PROXY_TAG and m.kind not in ("public_key", "control")
        ]
        assert len(uploads) >= K
        assert all(m.kind in UNREADABLE for m in uploads), {m.kind for m in uploads}
        assert not [m for m in view if m.kind in ("plain", "metadata")], "server reads a plaintext message"
        sigs.append(_signature(protocol.transcript))
    assert sigs[0] == sigs[1], "message sizes/kinds depend on which classes a client holds"


def test_plain_server_view_exposes_ratios_and_absent_classes():
    """The baseline leak the attack suite measures: the server reads ``[a*S, a]`` per client."""
    values, _, gappy = _two_presence_patterns()
    C, d = 4, 3
    protocol = make_protocol("plain", K, transcript=Transcript(keep_payloads="all"))
    weights = {k: class_weights(c, "ratio") for k, c in gappy.items()}
    align_proxies(protocol, PROXY_TAG, 0, values, weights, torch.zeros(C, d))
    uploads = {m.sender: m for m in protocol.transcript.view(SERVER) if m.receiver == SERVER}
    for k in range(K):
        msg = uploads[f"client{k}"]
        assert msg.kind == "plain"
        flat = np.asarray(msg.payload["values"], np.float64).ravel()
        np.testing.assert_allclose(flat[C * d : C * d + C], weights[k], rtol=1e-6)  # ratios visible
        np.testing.assert_allclose(flat[: C * d].reshape(C, d), weights[k][:, None] * values[k], atol=1e-5)
    absent = np.asarray(uploads["client0"].payload["values"], np.float64).ravel()[: C * d].reshape(C, d)
    assert (absent[[1, 3]] == 0).all()  # absent rows visible


@pytest.mark.parametrize("mode", ("plain",) + SECURE)
def test_algorithm_uploads(mode, run_small):
    """Algorithm uploads.

    One real round: what FedSpray puts on the wire, per mode (one batched upload per client whose
    first ``C (d + 1)`` entries are the proxy exchange's ``[a * S, a]``).
    """
    fed = fedspray_federation()
    counts = [torch.bincount(c.y[c.train_mask], minlength=fed.num_classes) for c in fed.clients]
    assert any((c == 0).any() for c in counts), "the fixture should have a client lacking a class"
    run = run_small(_small_cfg(mode), fed, transcript=Transcript(keep_payloads="all"))
    run.strategy.train_round(0)
    protocol = run.protocol
    view = protocol.transcript.view(SERVER)
    tags = {m.tag for m in view}
    assert BATCH_TAG in tags and {"fedspray/encoder", PROXY_TAG} <= set(protocol.transcript.comm()["per_tag"])
    ups = [m for m in view if m.receiver == SERVER and m.tag == BATCH_TAG and m.kind not in ("public_key", "control")]
    if mode == "plain":
        C, d = fed.num_classes, 8
        for m in ups:
            k = int(m.sender[6:])
            flat = np.asarray(m.payload["values"], np.float64).ravel()
            ratios = counts[k].double().numpy() / counts[k].sum().item()
            np.testing.assert_allclose(flat[C * d : C * d + C], ratios, rtol=1e-6)
            rows = flat[: C * d].reshape(C, d)
            assert (rows[counts[k].numpy() == 0] == 0).all()
    else:
        assert ups and all(m.kind in UNREADABLE for m in ups)
        proxy_sizes = {
            (tuple(m.shape), m.nbytes)
            for m in ups  # the data uploads (not unmasking shares)
            if m.kind in ("masked", "ciphertext")
        }
        assert len(proxy_sizes) == 1, "clients' proxy uploads differ in size"


# --------------------------------------------------------------------------- soft proxies
@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 20), C=st.integers(1, 6), d=st.integers(1, 8), seed=st.integers(0, 2**16), scale=st.floats(0.1, 50)
)
def test_soft_proxies_are_convex_combinations_of_S(n, C, d, seed, scale):
    g = torch.Generator().manual_seed(seed)
    q_logits = torch.randn(n, C, generator=g, dtype=torch.float64) * scale
    S = torch.randn(C, d, generator=g, dtype=torch.float64)
    w = soft_proxy_weights(q_logits)
    s = soft_proxies(q_logits, S)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(n, dtype=torch.float64))
    torch.testing.assert_close(s, w @ S)
    eps = 1e-9
    assert (s >= S.min(0).values - eps).all() and (s <= S.max(0).values + eps).all()
    # labelled nodes take their class proxy, the others the soft proxy
    y = torch.randint(0, C, (n,), generator=g)
    labelled = torch.rand(n, generator=g) < 0.5
    s_all = node_proxies(q_logits, S, y, labelled)
    torch.testing.assert_close(s_all[labelled], S[y[labelled]])
    torch.testing.assert_close(s_all[~labelled], s[~labelled])


def _small_cfg(mode: str = "plain", **options) -> RunConfig:
    return RunConfig(
        algorithm="fedspray",
        mode=mode,
        clients=K,
        rounds=1,
        options={"phase_epochs": 1, "proxy_dim": 8, **options},
    )


def test_algorithm_soft_targets_use_convex_proxies(run_small):
    client = run_small(_small_cfg(), fedspray_federation()).logic(1)
    client.proxies = torch.randn_like(client.proxies)
    c = client.data
    p, q, s = client.part.soft_targets(client.part.encoder, client.proxies)
    unl = ~c.train_mask
    torch.testing.assert_close(s[unl], q[unl] @ client.proxies)
    torch.testing.assert_close(s[c.train_mask], client.proxies[c.y[c.train_mask]])
    torch.testing.assert_close(p.sum(-1), torch.ones(c.num_nodes))


def test_teacher_accuracy_is_the_global_encoders_soft_targets(run_small):
    run = run_small(_small_cfg(phase_epochs=2, gnn_hidden=8), fedspray_federation())
    run.strategy.train_round(0)  # local copies now differ from the global encoder
    ev = run.strategy.evaluate()
    correct = total = 0
    for k in run.runtimes:
        client = run.logic(k)
        teacher = copy.deepcopy(client.part.encoder)
        vector_to_parameters(client.global_encoder.clone(), teacher.parameters())
        p, _, _ = client.part.soft_targets(teacher, client.proxies)
        c = client.data
        correct += int((p[c.test_mask].argmax(-1) == c.y[c.test_mask]).sum())
        total += int(c.test_mask.sum())
        assert not torch.equal(parameters_to_vector(client.part.encoder.parameters()), client.global_encoder)
    assert total > 0 and ev["teacher_test_acc"] == correct / total


# --------------------------------------------------------------------------- end to end
def _cfg(mode, **kw):
    base = dict(
        algorithm="fedspray",
        dataset="csbm",
        clients=3,
        mode=mode,
        partition="louvain",
        keep_largest=True,
        split="fedspray",
        rounds=3,
        seed=1,
        synthetic={"num_nodes": 600},
        options={"phase_epochs": 2, "proxy_dim": 16, "gnn_hidden": 16},
    )
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.parametrize("mode", ("plain",) + SECURE)
def test_end_to_end(mode, tmp_path):
    result = run_experiment(_cfg(mode, out=str(tmp_path)), progress=False)
    final = result["final"]
    assert 0 <= final["test_acc"] <= 1 and 0 <= final["minority_acc"] <= 1
    best = result["rounds"][final["best_round"]]
    assert final["minority_acc"] == best["minority_acc"]  # same model state as test_acc
    assert final["test_acc"] == best["test_acc"]
    assert set(result["comm"]["per_tag"]) >= {"fedspray/encoder", PROXY_TAG}
    assert (tmp_path / "result.json").exists()


def test_ablation_exchanges_no_proxies():
    result = run_experiment(
        _cfg("plain", options={"phase_epochs": 1, "proxy_dim": 8, "gnn_hidden": 8, "ablate_proxy": True}, rounds=2),
        progress=False,
    )
    assert PROXY_TAG not in result["comm"]["per_tag"]
    assert "minority_acc" in result["final"]


def test_resume_continues_every_client_and_the_minority_tracker(tmp_path):
    """Resume continues every client and the minority tracker.

    A run stopped after round 1 and resumed ends as the uninterrupted one: each client's GNN,
    encoder and proxies, and the server's best-round minority accuracy, come back from the checkpoint.
    """
    opts = {"phase_epochs": 1, "proxy_dim": 8, "gnn_hidden": 8}
    full = run_experiment(_cfg("plain", rounds=2, options=opts, out=str(tmp_path / "a")), progress=False)
    run_experiment(_cfg("plain", rounds=1, options=opts, out=str(tmp_path / "b")), progress=False)
    resumed = run_experiment(
        _cfg("plain", rounds=2, options=opts, out=str(tmp_path / "b"), resume=True), progress=False
    )
    assert [r["test_acc"] for r in resumed["rounds"]] == [r["test_acc"] for r in full["rounds"]]
    assert [r["minority_acc"] for r in resumed["rounds"]] == [r["minority_acc"] for r in full["rounds"]]
    assert resumed["final"]["minority_acc"] == full["final"]["minority_acc"]


@pytest.mark.parametrize("mode", ("plain", "mask"))
def test_end_to_end_with_dp(mode):
    result = run_experiment(_cfg(mode, rounds=2, dp_epsilon=8.0, dp_clip=1.0), progress=False)
    per_tag = result["privacy"]["per_tag"]
    assert {"fedspray/encoder", PROXY_TAG} <= set(per_tag)
    assert result["privacy"]["total_epsilon"] <= 8.0 + 1e-6
    assert 0 <= result["final"]["minority_acc"] <= 1
