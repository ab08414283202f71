"""DP-SGD: per-node clipping, CSPRNG noise and the secure mean of one step.

DP-SGD (secure_fgl.dpsgd): per-node clipping bounds every per-node gradient, the noise comes
from the run's CSPRNG (not the seed), steps of all clients count once (parallel composition),
and the run's one accountant composes them with the hop releases.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from protocols.dp import DPConfig, DPEngine
from secure_fgl.config import RunConfig
from secure_fgl.dpsgd import DPSGD, stage_request
from secure_fgl.experiment import run_experiment
from secure_fgl.models import build_model

TINY = {"num_nodes": 120, "num_features": 12}


def per_node_grads(model, x, y, mask):
    """Reference: one backward pass per training node."""
    out = []
    for i in mask.nonzero().flatten().tolist():
        model.zero_grad()
        F.cross_entropy(model(x, None)[i : i + 1], y[i : i + 1], reduction="sum").backward()
        out.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(out)


def test_per_node_clipping_bounds_every_gradient():
    torch.manual_seed(0)
    model = build_model("mlp", 6, 8, 3, num_layers=2, dropout=0.0)
    x, y = torch.randn(30, 6) * 5, torch.randint(0, 3, (30,))
    mask = torch.zeros(30, dtype=torch.bool)
    mask[::2] = True
    ref = per_node_grads(model, x, y, mask)
    clip = 0.5 * float(ref.norm(dim=1).median())  # about half the gradients are clipped
    sgd = DPSGD(clip)
    clipped, _ = sgd.clipped_sum(model, x, None, y, mask)
    got = torch.cat([g.flatten() for g in clipped])
    scale = (clip / ref.norm(dim=1)).clamp(max=1.0)
    assert (ref * scale[:, None]).norm(dim=1).max() <= clip * (1 + 1e-5)
    assert torch.allclose(got, (ref * scale[:, None]).sum(0), atol=1e-5)  # opacus' per-node grads
    assert (scale < 1).any() and (scale == 1).any()


def test_an_edge_free_model_gets_the_same_clipped_sum_from_its_training_rows_alone():
    """With no edges the per-node gradients are computed on the masked rows only, with the same result."""
    torch.manual_seed(1)
    model = build_model("mlp", 6, 8, 3, num_layers=2, dropout=0.0)
    x, y, mask = torch.randn(40, 6), torch.randint(0, 3, (40,)), torch.rand(40) < 0.3
    sgd = DPSGD(0.5)
    whole, loss_whole = sgd.clipped_sum(model, x, None, y, mask)
    rows, loss_rows = sgd.clipped_sum(model, x, torch.empty(2, 0, dtype=torch.long), y, mask)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, rows))
    assert torch.isclose(loss_whole, loss_rows)


def test_a_noise_free_step_is_one_sgd_step_on_the_mean_of_the_clipped_gradients():
    """Without noise: ``w <- w - lr sum_i clip(g_i) / |T|``, with the one-node-at-a-time reference gradients."""
    torch.manual_seed(2)
    model = build_model("mlp", 6, 8, 3, num_layers=2, dropout=0.0)
    x, y, mask = torch.randn(30, 6) * 5, torch.randint(0, 3, (30,)), torch.rand(30) < 0.5
    ref = per_node_grads(model, x, y, mask)
    clip, lr = 0.5 * float(ref.norm(dim=1).median()), 0.3
    expected = torch.cat([p.detach().flatten() for p in model.parameters()])
    expected -= lr * (ref * (clip / ref.norm(dim=1)).clamp(max=1.0)[:, None]).sum(0) / int(mask.sum())
    DPSGD(clip).step(model, torch.optim.SGD(model.parameters(), lr=lr), np.zeros, x, None, y, mask)
    assert torch.allclose(torch.cat([p.detach().flatten() for p in model.parameters()]), expected, atol=1e-6)


@pytest.mark.parametrize("sample_rate", [1.0, 0.25])
def test_a_steps_noise_is_sigma_over_the_expected_batch(sample_rate):
    """A step's gradient is ``(clipped sum + N(0, sigma^2 I)) / (q |T|)``: its noise has std ``sigma / (q |T|)``."""
    torch.manual_seed(3)
    model = build_model("mlp", 40, 64, 3, num_layers=2, dropout=0.0)
    x, y, mask = torch.randn(50, 40), torch.randint(0, 3, (50,)), torch.ones(50, dtype=torch.bool)
    sigma, gen, sgd = 3.0, np.random.default_rng(0), DPSGD(1.0, sample_rate)

    def gradient(noise) -> torch.Tensor:
        """The gradient one step sets (lr 0: the model stays); every node is drawn (u = 0), yet q |T| divides."""
        sgd.step(model, torch.optim.SGD(model.parameters(), lr=0.0), noise, x, None, y, mask, np.zeros)
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    noise = gradient(lambda size: gen.normal(0.0, sigma, size)) - gradient(np.zeros)
    assert float(noise.std()) == pytest.approx(sigma / (sample_rate * 50), rel=0.03)


def test_noise_is_fresh_and_steps_of_all_clients_count_once():
    eng = DPEngine(DPConfig(epsilon=2.0), num_clients=3, protocol_mode="plain")
    tag, request = "stage/dpsgd", stage_request(1.0, rounds=2, local_epochs=2)
    a = [eng.local_noise(tag, step, 5, request) for step in (0, 0, 0, 1)]  # 3 clients at step 0
    assert eng.accountant.releases("stage/dpsgd") == 2
    assert not torch.equal(torch.as_tensor(a[0]), torch.as_tensor(a[1]))


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_gap_with_dpsgd_composes_sample_and_edge_releases():
    from opacus.accountants import RDPAccountant

    from protocols.accountant import opacus_options

    cfg = RunConfig(
        algorithm="fedgcn-gap",
        mode="plain",
        clients=3,
        rounds=2,
        local_epochs=2,
        dp_epsilon=4.0,
        options={"dpsgd": True},
        synthetic=dict(TINY),
    )
    p = run_experiment(cfg, progress=False)["privacy"]
    units = {r["tag"]: r.get("unit") for r in p["releases"] if r["dp"]}
    assert units == {
        "fedgcn-gap/hop/1": "edge",
        "fedgcn-gap/hop/2": "edge",
        "fedgcn-gap/encoder/dpsgd": "sample",
        "fedgcn-gap/dpsgd": "sample",
    }
    assert p["units"] == ["edge", "sample"] and p["claim_holds"]
    assert [r["releases"] for r in p["releases"] if r.get("unit") == "sample"] == [4, 4]  # rounds x epochs
    assert 0.99 * 4.0 <= p["total_epsilon"] <= 4.0
    # the hop sums are discrete releases: the run composes in Renyi DP, as Opacus' RDP accountant does
    assert p["composition"] == "rdp"
    acc = RDPAccountant()
    acc.history = [(r["noise_multiplier"], 1.0, r["releases"]) for r in p["releases"] if r["dp"]]
    assert acc.get_epsilon(delta=1e-5, **opacus_options(acc.history, 1e-5, "rdp")) == pytest.approx(
        p["total_epsilon"], rel=0.01
    )


def test_secure_mean_of_one_sgd_step_is_one_central_dpsgd_step():
    """Secure mean of one sgd step is one central DP-SGD step.

    noise_contributors' equation: the FedAvg mean (weights n_k/N) of one plain SGD step per
    client equals one DP-SGD step on the union of the clients' nodes whose noise is the sum of
    the clients' shares.
    """
    torch.manual_seed(1)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    owner = torch.arange(40) % 3
    base = build_model("mlp", 6, 8, 3, num_layers=2, dropout=0.0)
    size = sum(p.numel() for p in base.parameters())
    shares = [torch.randn(size, dtype=torch.float64) for _ in range(3)]
    sgd, lr = DPSGD(clip=0.3), 0.7

    def stepped(mask, noise):
        model = build_model("mlp", 6, 8, 3, num_layers=2, dropout=0.0)
        model.load_state_dict(base.state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        sgd.step(model, opt, lambda n: noise.numpy(), x, None, y, mask)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    masks = [owner == k for k in range(3)]
    n = [int(m.sum()) for m in masks]
    mean = sum(stepped(m, s) * (nk / 40) for m, s, nk in zip(masks, shares, n))
    central = stepped(torch.ones(40, dtype=torch.bool), sum(shares))
    assert torch.allclose(mean, central, atol=1e-5)


def test_noise_shares_only_for_one_sgd_step_in_a_secure_mean():
    from secure_fgl.dpsgd import noise_contributors

    ok = RunConfig(algorithm="fedgcn-gap", mode="mask", local_epochs=1, optimizer="sgd")
    assert noise_contributors(ok, "distributed", 10, False) == 10
    assert noise_contributors(ok, "local", 10, False) == 1  # plain: the server sees each
    assert noise_contributors(ok, "distributed", 10, True) == 1  # the mean is DP-FedAvg's
    for change in ({"local_epochs": 2}, {"optimizer": "adam"}, {"momentum": 0.9}, {"client_fraction": 0.5}):
        assert noise_contributors(replace(ok, **change), "distributed", 10, False) == 1, change


def test_distributed_step_noise_is_split_and_counted_once():
    eng = DPEngine(DPConfig(epsilon=2.0, placement="distributed", colluders=1), num_clients=10, protocol_mode="mask")
    tag, request = "stage/dpsgd", stage_request(1.0, rounds=2, local_epochs=1)
    sigma = eng.local_release(tag, 0, request)
    share = eng.local_release(tag, 0, request, contributors=10)
    assert share == pytest.approx(sigma / 3.0)  # sqrt(10 - 0 dropouts - 1)
    assert eng.accountant.releases("stage/dpsgd") == 1
    assert eng.report()["per_tag"]["stage/dpsgd"]["noise_shares"] == 10


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_gap_dpsgd_in_mask_mode_splits_each_step_over_the_clients():
    cfg = RunConfig(
        algorithm="fedgcn-gap",
        mode="mask",
        clients=3,
        rounds=2,
        local_epochs=1,
        optimizer="sgd",
        lr=1.0,
        dp_epsilon=4.0,
        options={"dpsgd": True},
        synthetic=dict(TINY),
    )
    p = run_experiment(cfg, progress=False)["privacy"]
    sample = [r for r in p["releases"] if r.get("unit") == "sample"]
    assert [r["noise_shares"] for r in sample] == [3, 3] and not p["warnings"]
    assert p["coalition"]["total_epsilon"] == pytest.approx(p["total_epsilon"], rel=1e-6)
    weak = run_experiment(replace(cfg, dp_colluders=0), progress=False)["privacy"]
    assert weak["coalition"]["total_epsilon"] > weak["total_epsilon"]  # calibrated for no colluder


def test_per_graph_clipping_sums_each_graphs_nodes():
    """Per graph clipping sums each graphs nodes.

    clipped_sum_graphs: a graph's gradient (every layer, before and after the readout) equals
    one backward pass on that graph alone, and every clipped one has norm <= C.
    """
    from torch_geometric.data import Batch, Data

    from secure_fgl.models.gcfl_gin import GCFLGIN

    torch.manual_seed(2)
    graphs = []
    for n in (3, 5, 1, 4):
        edges = torch.combinations(torch.arange(n), 2).T if n > 1 else torch.empty(2, 0, dtype=torch.long)
        graphs.append(
            Data(x=torch.randn(n, 4), edge_index=torch.cat([edges, edges.flip(0)], 1), y=torch.randint(0, 2, (1,)))
        )
    model = GCFLGIN(4, 8, 2, num_layers=2, dropout=0.0)
    ref = []
    for g in graphs:
        model.zero_grad()
        b = Batch.from_data_list([g])
        F.cross_entropy(model(b.x, b.edge_index, b.batch), b.y, reduction="sum").backward()
        ref.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    ref = torch.stack(ref)
    clip = 0.5 * float(ref.norm(dim=1).median())
    got, _ = DPSGD(clip).clipped_sum_graphs(model, Batch.from_data_list(graphs))
    scale = (clip / ref.norm(dim=1)).clamp(max=1.0)
    assert torch.allclose(torch.cat([g.flatten() for g in got]), (ref * scale[:, None]).sum(0), atol=1e-5)
    assert (ref * scale[:, None]).norm(dim=1).max() <= clip * (1 + 1e-5) and (scale < 1).any()


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_graph_classification_dpsgd_is_sample_level():
    from opacus.accountants import PRVAccountant

    cfg = RunConfig(
        algorithm="gcfl",
        dataset="synthetic-graphs",
        clients=4,
        rounds=2,
        local_epochs=2,
        hidden=16,
        dp_epsilon=4.0,
        options={"dpsgd": True},
    )
    r = run_experiment(cfg, progress=False)
    p = r["privacy"]
    assert p["unit"] == "sample" and p["claim_holds"] and not p["uncovered"]
    sgd = [x for x in p["releases"] if x.get("unit") == "sample"]
    assert [x["tag"] for x in sgd] == ["gcfl/dpsgd"] and sgd[0]["releases"] == 4  # rounds x epochs
    assert 0.99 * 4.0 <= p["total_epsilon"] <= 4.0
    acc = PRVAccountant()
    acc.history = [(sgd[0]["noise_multiplier"], 1.0, 4)]
    assert acc.get_epsilon(delta=1e-5, eps_error=1e-3) == pytest.approx(p["total_epsilon"], rel=0.01)
    assert all(c["train_acc"] == 0.0 for c in r["final"]["per_client"])  # not read outside DP-SGD


def test_graph_classification_dp_needs_dpsgd():
    from secure_fgl.config import ConfigError

    with pytest.raises(ConfigError, match="add --dpsgd"):
        run_experiment(
            RunConfig(algorithm="gc-fedavg", dataset="synthetic-graphs", clients=4, rounds=1, dp_epsilon=4.0),
            progress=False,
        )
    with pytest.raises(ConfigError, match="needs --dp-epsilon"):
        run_experiment(
            RunConfig(algorithm="gc-fedavg", dataset="synthetic-graphs", clients=4, rounds=1, options={"dpsgd": True}),
            progress=False,
        )


@pytest.mark.parametrize("unit", [None, "sample", "node"])
def test_dpsgd_steps_are_plain_sgd_at_the_dpsgd_lr_at_every_unit(unit):
    """Whatever ``--optimizer``/``--lr`` say (Adam at 0.01 by default), DP-SGD steps are plain SGD at ``--dpsgd-lr``.

    So a secure run with one local epoch splits each step's noise over its clients (Adam would make every client add
    all of it), and the clipped mean moves at the DP-SGD rate, not the run's.
    """
    from secure_fgl.algorithms.options import DPSGD_LR, GAPOptions
    from secure_fgl.dpsgd import noise_contributors

    cfg = RunConfig(algorithm="fedgcn-gap", mode="mask", local_epochs=1, dp_unit=unit)
    step = GAPOptions(dpsgd=True).dpsgd_settings(cfg)
    assert (step.optimizer, step.lr, step.momentum) == ("sgd", DPSGD_LR, 0.0) and cfg.optimizer == "adam"
    assert noise_contributors(step, "distributed", 10, False) == 10
    assert GAPOptions(dpsgd=True, dpsgd_lr=0.5).dpsgd_settings(cfg).lr == 0.5
    assert GAPOptions().dpsgd_settings(cfg) is cfg
