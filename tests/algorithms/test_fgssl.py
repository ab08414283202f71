"""FGSSL (Huang et al., IJCAI 2023): FNSC (eq. 8), FGSD (eq. 9-11), augmentations, end to end."""

from __future__ import annotations

import math

import pytest
import torch

from secure_fgl.algorithms.fgssl.augment import AugmentRates, augment, view_generator
from secure_fgl.algorithms.fgssl.ops import class_contrast, fgsd_loss, fnsc_loss
from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.experiment import run_experiment
from secure_fgl.models import build_model


def _clustered(n=120, classes=4, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    centres = 3.0 * torch.randn(classes, dim, generator=g)
    noise = lambda: 0.5 * torch.randn(n, dim, generator=g)  # noqa: E731
    return centres[y] + noise(), centres[y] + noise(), y, g


# --------------------------------------------------------------------------- eq. 8
def test_fnsc_lower_for_class_clustered_embeddings_than_for_shuffled_labels():
    h_local, h_global, y, g = _clustered()
    clustered = fnsc_loss(h_local, h_global, y, tau=0.1)
    shuffled = torch.stack(
        [fnsc_loss(h_local, h_global, y[torch.randperm(len(y), generator=g)], tau=0.1) for _ in range(5)]
    )
    assert float(clustered) < float(shuffled.min())
    # the released code's InfoNCE form ranks them the same way
    assert float(class_contrast(h_local, h_global, y, 0.1, per_positive=False)) < float(
        class_contrast(h_local, h_global, y[torch.randperm(len(y), generator=g)], 0.1, per_positive=False)
    )


def test_fnsc_matches_eq8_written_out():
    h_local, h_global, y, _ = _clustered(n=12, classes=3, dim=5, seed=3)
    tau = 0.1
    cos = torch.nn.functional.cosine_similarity
    phi = lambda a, b: math.exp(float(cos(a, b, dim=0)) / tau)  # noqa: E731
    total = 0.0
    for i in range(len(y)):
        pos = [p for p in range(len(y)) if y[p] == y[i]]
        neg_sum = sum(phi(h_local[i], h_global[k]) for k in range(len(y)) if y[k] != y[i])
        total += -sum(
            math.log(phi(h_local[i], h_global[p]) / (phi(h_local[i], h_global[p]) + neg_sum)) for p in pos
        ) / len(pos)
    assert float(fnsc_loss(h_local, h_global, y, tau)) == pytest.approx(total / len(y), rel=1e-4)


def test_fnsc_gradient_reaches_only_the_local_embeddings():
    h_local, h_global, y, _ = _clustered(n=20)
    h_local.requires_grad_(True)
    h_global.requires_grad_(True)
    fnsc_loss(h_local, h_global, y, 0.1).backward()
    assert h_local.grad.abs().sum() > 0 and h_global.grad is None


# --------------------------------------------------------------------------- eq. 9-11
def _graph(n=40, d=12, e=160, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, n, (2, e), generator=g)


def test_fgsd_zero_for_identical_models_and_positive_when_they_differ():
    x, edge_index = _graph()
    torch.manual_seed(0)
    model = build_model("gat", x.size(1), 8, 4, heads=1, dropout=0.0).eval()
    z = model(x, edge_index).detach()
    assert float(fgsd_loss(z, z.clone(), edge_index, omega=5.0)) == pytest.approx(0.0, abs=1e-6)
    other = build_model("gat", x.size(1), 8, 4, heads=1, dropout=0.0).eval()  # different weights
    assert float(fgsd_loss(other(x, edge_index).detach(), z, edge_index, omega=5.0)) > 1e-4
    # scaling logits changes the neighbour-similarity distribution, not the nodes' ranking
    assert float(fgsd_loss(3.0 * z, z, edge_index, omega=5.0)) > 1e-4


def test_fgsd_is_kl_of_neighbour_softmaxes():
    x, edge_index = _graph(n=6, d=3, e=14, seed=2)
    z_g, z_m = torch.randn(6, 3), torch.randn(6, 3)
    omega, expected, nodes = 5.0, 0.0, 0
    for i in range(6):
        nbrs = [int(j) for j, t in zip(*edge_index) if int(t) == i]
        if not nbrs:
            continue
        sg = torch.softmax(torch.stack([z_g[i] @ z_g[j] for j in nbrs]) / omega, 0)
        sm = torch.softmax(torch.stack([z_m[i] @ z_m[j] for j in nbrs]) / omega, 0)
        expected += float((sg * (sg / sm).log()).sum())
        nodes += 1
    assert float(fgsd_loss(z_m, z_g, edge_index, omega)) == pytest.approx(expected / nodes, rel=1e-4)


# --------------------------------------------------------------------------- augmentations
@pytest.mark.parametrize("rates", [AugmentRates(0.3, 0.3), AugmentRates(0.8, 0.5)])
def test_augmentations_keep_shapes_and_drop_at_the_stated_rates(rates):
    n, d, e = 50, 4000, 20000
    x, edge_index = torch.rand(n, d) + 0.1, torch.randint(0, n, (2, e))
    xv, ev = augment(x, edge_index, rates, view_generator(0, 1, 2))
    assert xv.shape == x.shape and ev.size(0) == 2 and ev.dtype == edge_index.dtype
    dropped_cols = float((xv == 0).all(0).sum())
    assert abs(dropped_cols - d * rates.feature_mask) <= 5 * math.sqrt(
        d * rates.feature_mask * (1 - rates.feature_mask)
    )
    assert bool(((xv == 0) | (xv == x)).all())  # whole columns masked, the rest untouched
    dropped_edges = e - ev.size(1)
    assert abs(dropped_edges - e * rates.edge_drop) <= 5 * math.sqrt(e * rates.edge_drop * (1 - rates.edge_drop))


def test_augmentation_draws_do_not_depend_on_values():
    n, d, e = 30, 50, 200
    edge_index = torch.randint(0, n, (2, e))
    a, ea = augment(torch.rand(n, d) + 0.1, edge_index, AugmentRates(0.5, 0.5), view_generator(7, 3))
    b, eb = augment(100 * torch.rand(n, d) + 1, edge_index, AugmentRates(0.5, 0.5), view_generator(7, 3))
    assert torch.equal(a == 0, b == 0) and torch.equal(ea, eb)
    _, ec = augment(a, edge_index, AugmentRates(0.5, 0.5), view_generator(7, 4))
    assert not torch.equal(ea, ec)


# --------------------------------------------------------------------------- end to end
def _cfg(mode, **kw):
    base = dict(
        algorithm="fgssl",
        dataset="sbm",
        clients=3,
        mode=mode,
        partition="louvain",
        split="fgssl",
        model="gat",
        hidden=16,
        heads=1,
        optimizer="sgd",
        momentum=0.9,
        lr=0.05,
        local_epochs=2,
        rounds=3,
        seed=1,
        synthetic={"num_nodes": 300, "num_features": 64},
    )
    base.update(kw)
    return RunConfig(**base)


@pytest.fixture(scope="module")
def plain_result():
    return run_experiment(_cfg("plain"), progress=False)


@pytest.mark.parametrize("mode", ("plain", "ckks", "mask", "ckks-mp"))
def test_end_to_end_each_mode_matches_plain(mode, plain_result):
    result = plain_result if mode == "plain" else run_experiment(_cfg(mode), progress=False)
    assert [t for t in result["comm"]["per_tag"] if t.startswith("fgssl/")] == ["fgssl/model"]
    assert 0 <= result["final"]["test_acc"] <= 1
    assert result["final"]["test_acc"] == pytest.approx(plain_result["final"]["test_acc"], abs=0.02)
    assert result["rounds"][-1]["train_loss"] == pytest.approx(plain_result["rounds"][-1]["train_loss"], rel=0.02)


def test_released_code_variant_runs_and_differs_from_the_paper_objective(plain_result):
    result = run_experiment(_cfg("plain", options={"variant": "released-code"}), progress=False)
    assert result["rounds"][0]["train_loss"] != pytest.approx(plain_result["rounds"][0]["train_loss"])


def test_bad_options_name_the_fix():
    with pytest.raises(ConfigError, match="--variant"):
        run_experiment(_cfg("plain", options={"variant": "code"}), progress=False)
    with pytest.raises(ConfigError, match="--momentum"):
        _cfg("plain", optimizer="adam").validate()


def test_without_both_terms_fgssl_is_fedavg():
    """Table 2's first row: with lambda_C = lambda_D = 0 the client objective is FedAvg's."""
    fgssl = run_experiment(_cfg("plain", options={"lambda_c": 0.0, "lambda_d": 0.0}), progress=False)
    fedavg = run_experiment(_cfg("plain", algorithm="fedavg"), progress=False)
    assert [r["train_loss"] for r in fgssl["rounds"]] == [r["train_loss"] for r in fedavg["rounds"]]
    assert fgssl["final"]["test_acc"] == fedavg["final"]["test_acc"]
