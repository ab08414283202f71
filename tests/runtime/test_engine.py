"""Engine and baselines: FedAvg equivalences, resume, model forward/backward, result format."""

from __future__ import annotations

import json

import pytest
import torch

from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.experiment import run_experiment
from secure_fgl.models import MODELS, build_model

SMALL = {"num_nodes": 300, "num_features": 64, "num_classes": 3}


def cfg(**kw) -> RunConfig:
    base = dict(algorithm="fedavg", mode="plain", dataset="sbm", clients=3, rounds=5, synthetic=dict(SMALL), seed=0)
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.parametrize("name", sorted(set(MODELS) - {"gin"}))
def test_node_models_forward_backward(name):
    x = torch.randn(12, 5)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    model = build_model(name, 5, 8, 3, num_layers=2)
    out = model(x, edge_index)
    assert out.shape == (12, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_sgc_reuses_propagation_only_for_the_same_unmodified_input(dropout):
    torch.manual_seed(0)
    x, edge_index = torch.randn(12, 5), torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    model = build_model("sgc", 5, 8, 3, dropout=dropout).eval()

    def uncached(*inputs):  # a new model with the same weights holds nothing
        ref = build_model("sgc", 5, 8, 3, dropout=dropout).eval()
        ref.load_state_dict(model.state_dict())
        return ref(*inputs)

    for inputs in [(x, edge_index), (x, edge_index), (torch.randn(12, 5), edge_index)]:
        torch.testing.assert_close(model(*inputs), uncached(*inputs))
    model(x, edge_index)
    x.mul_(2.0)  # modified in place: the held propagation is stale
    torch.testing.assert_close(model(x, edge_index), uncached(x, edge_index))
    model.train()
    model(x, edge_index).sum().backward()
    assert model.conv.lin.weight.grad is not None


@pytest.mark.parametrize("dims", [(40, 8), (8, 40)])
def test_narrowing_sage_conv_equals_pyg_sage_conv(dims):
    from torch_geometric.nn import SAGEConv

    from secure_fgl.models.node import NarrowingSAGEConv

    torch.manual_seed(0)
    x = torch.randn(7, dims[0])
    edge_index = torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 0]])  # nodes 4-6 have no neighbours
    ours, ref = NarrowingSAGEConv(*dims), SAGEConv(*dims)
    torch.nn.init.normal_(ours.lin_l.bias)
    ref.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(x, edge_index), ref(x, edge_index))


@pytest.mark.parametrize("density", [0.01, 0.9])
def test_dropout_keeps_each_entry_with_probability_1_minus_p(density):
    from secure_fgl.models.node import dropout

    torch.manual_seed(0)
    x = (torch.rand(400, 300) < density) * torch.randn(400, 300)
    x.requires_grad_(True)
    out = dropout(x, 0.3, True)
    kept = out != 0
    assert not kept[x == 0].any()  # zeros stay zero
    torch.testing.assert_close(out[kept], x[kept] / 0.7)  # survivors rescaled
    n = int((x != 0).sum())
    rate = kept.sum().item() / n
    assert abs(rate - 0.7) < 5 * (0.21 / n) ** 0.5  # binomial, 5 sigma
    out.sum().backward()
    nz = x != 0
    assert torch.equal(x.grad[nz] != 0, kept[nz])  # gradient only through survivors
    assert dropout(x, 0.3, False) is x


def test_gin_forward_backward():
    x = torch.randn(7, 4)
    edge_index = torch.tensor([[0, 1, 2, 4, 5], [1, 2, 0, 5, 6]])
    batch = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    model = build_model("gin", 4, 8, 2, num_layers=3)
    out = model(x, edge_index, batch)
    assert out.shape == (2, 2)
    out.sum().backward()


@pytest.mark.parametrize("optimizer, lr", [("adam", 0.01), ("sgd", 0.5)])
def test_fedavg_with_one_client_equals_centralized(optimizer, lr):
    """Fedavg with one client equals centralized.

    With K=1 and one local epoch, FedAvg's averaged model is the client's model: the
    same trajectory as centralized training on the whole graph, with either optimiser.
    """
    opt = dict(clients=1, partition="iid", rounds=8, optimizer=optimizer, lr=lr)
    a = run_experiment(cfg(algorithm="fedavg", **opt), progress=False)
    b = run_experiment(cfg(algorithm="centralized", **opt), progress=False)
    ra = [r["test_acc"] for r in a["rounds"]]
    rb = [r["test_acc"] for r in b["rounds"]]
    assert ra == pytest.approx(rb, abs=1e-6)
    assert [r["train_loss"] for r in a["rounds"]] == pytest.approx([r["train_loss"] for r in b["rounds"]], rel=1e-4)


def test_result_format_and_comm_from_transcript(tmp_path):
    res = run_experiment(cfg(out=str(tmp_path), grid_model_mean=False), progress=False)  # plain's float32 mean
    on_disk = json.loads((tmp_path / "result.json").read_text())
    for key in ("config", "final", "rounds", "comm", "time", "privacy", "attacks"):
        assert key in on_disk
    assert 0.0 <= on_disk["final"]["test_acc"] <= 1.0
    assert len(on_disk["final"]["per_client"]) == 3
    assert len(on_disk["rounds"]) == 5
    assert on_disk["privacy"] is None and on_disk["attacks"] == []
    tag = on_disk["comm"]["per_tag"]["fedavg/model"]
    n_params = sum(p.numel() for p in build_model("gcn", 64, 16, 3).parameters())
    # 3 clients x 5 rounds x ([update, weight] as float32), each in a signed envelope (< 600 B)
    assert tag["plaintext_bytes_up"] == 3 * 5 * (n_params + 1) * 4
    assert 0 < tag["bytes_up"] - tag["plaintext_bytes_up"] <= 3 * 5 * 600
    assert res["comm"]["bytes_up"] == on_disk["comm"]["bytes_up"]


def test_local_sends_nothing():
    """Local sends nothing.

    No model leaves a client; on the runtimes each client's evaluation counts are a recorded
    message to the server (``eval/counts``, docs/runtime.md), and nothing else is.
    """
    res = run_experiment(cfg(algorithm="local"), progress=False)
    sent = {tag: v["bytes_up"] for tag, v in res["comm"]["per_tag"].items()}
    assert sent == {"eval/counts": res["comm"]["bytes_up"]} and res["comm"]["bytes_up"] > 0


def test_sgd_and_adam_train_differently():
    sgd = run_experiment(cfg(optimizer="sgd", lr=0.5), progress=False)
    adam = run_experiment(cfg(), progress=False)
    assert [r["train_loss"] for r in sgd["rounds"]] != pytest.approx([r["train_loss"] for r in adam["rounds"]])


def test_seeded_runs_are_reproducible():
    a = run_experiment(cfg(), progress=False)
    b = run_experiment(cfg(), progress=False)
    assert [r["test_acc"] for r in a["rounds"]] == [r["test_acc"] for r in b["rounds"]]


def test_resume_equals_uninterrupted(tmp_path):
    full = run_experiment(cfg(rounds=6, out=str(tmp_path / "full")), progress=False)
    part = tmp_path / "part"
    run_experiment(cfg(rounds=3, out=str(part)), progress=False)
    resumed = run_experiment(cfg(rounds=6, out=str(part), resume=True), progress=False)
    assert [r["test_acc"] for r in resumed["rounds"]] == [r["test_acc"] for r in full["rounds"]]
    assert [r["train_loss"] for r in resumed["rounds"]] == pytest.approx([r["train_loss"] for r in full["rounds"]])
    assert resumed["final"]["test_acc"] == full["final"]["test_acc"]
    # the model exchange costs the same; the resumed session registers its clients' keys once more
    tags = full["comm"]["per_tag"]
    assert resumed["comm"]["per_tag"]["fedavg/model"] == tags["fedavg/model"]
    assert resumed["comm"]["per_tag"]["auth/keys"]["messages"] == 2 * tags["auth/keys"]["messages"]


def test_client_sampling_uses_a_fraction():
    res = run_experiment(cfg(clients=4, client_fraction=0.5, partition="iid"), progress=False)
    msgs = res["comm"]["per_tag"]["fedavg/model"]
    # 2 of 4 clients upload each round; all 4 receive the model (and, first, the exchange's plan)
    assert msgs["messages"] == 5 * (2 + 4 + 4)


def test_early_stopping_with_patience():
    res = run_experiment(cfg(rounds=60, patience=2), progress=False)
    assert res["final"]["stopped_early"]
    assert res["final"]["rounds_run"] < 60


@pytest.mark.parametrize(
    "kw, needle",
    [
        (dict(rounds=0), "--rounds"),
        (dict(beta=0.0), "--beta"),
        (dict(clients=0), "--clients"),
        (dict(mode="rot13"), "--mode"),
        (dict(algorithm="nope"), "--algorithm"),
        (dict(optimizer="lbfgs"), "--optimizer"),
    ],
)
def test_bad_config_names_the_setting(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        run_experiment(cfg(**kw), progress=False)


def test_dp_scope_leaves_out_of_scope_exchanges_exact():
    """--dp-exchanges names the tags that get noise; others stay exact and spend no budget."""
    exact = run_experiment(cfg(), progress=False)
    scoped = run_experiment(cfg(dp_epsilon=1.0, dp_exchanges="fedgcn/neighbour_sums"), progress=False)
    assert [r["test_acc"] for r in scoped["rounds"]] == [r["test_acc"] for r in exact["rounds"]]
    assert scoped["privacy"]["per_tag"] == {}
    noisy = run_experiment(cfg(dp_epsilon=1.0, dp_exchanges="fedavg/model"), progress=False)
    assert set(noisy["privacy"]["per_tag"]) == {"fedavg/model"}
    assert noisy["privacy"]["per_tag"]["fedavg/model"]["epsilon"] <= 1.0 + 1e-9
