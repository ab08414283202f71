"""``--center`` without a centred copy: ``(X - 1 mu^T) W = X W - 1 (mu^T W)`` (secure_fgl/models/centring.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from support.runs import small

from secure_fgl.algorithms.fedgcn.ops import FedGCNNet, PropGraph
from secure_fgl.config import ConfigError
from secure_fgl.models import build_model
from secure_fgl.models.centring import centre_first_layer, own_mean


def _sparse_features(n: int = 30, d: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.rand(n, d, generator=g) < 0.2).float()


def _graph(n: int) -> torch.Tensor:
    src = torch.arange(n)
    return torch.stack([torch.cat([src, (src + 1) % n]), torch.cat([(src + 1) % n, src])])


def _models(name: str, d: int):
    torch.manual_seed(0)
    if name == "fedgcn":
        n = 30
        ei = _graph(n)
        g = PropGraph(ei, torch.ones(ei.size(1)), n)
        return FedGCNNet(d, 8, 3, dropout=0.0), g
    return build_model(name, d, 8, 3, dropout=0.0), _graph(30)


@pytest.mark.parametrize("name", ["gcn", "mlp", "fedgcn"])
def test_centred_model_equals_the_model_on_the_centred_copy(name):
    """Centred model equals the model on the centred copy.

    Same logits and the same gradient of every parameter as the model fed ``X - 1 mu^T``;
    the input is not changed and the hook adds no parameter (nothing extra is averaged).
    """
    x = _sparse_features()
    mu = own_mean(x, 20)  # the mean of the "own" rows, as a client takes it
    hooked, graph = _models(name, x.size(1))
    plain = copy.deepcopy(hooked)
    keys = set(hooked.state_dict())
    centre_first_layer(hooked, mu)
    x_before = x.clone()
    out_hooked, out_copy = hooked(x, graph), plain(x - mu, graph)
    assert torch.allclose(out_hooked, out_copy, atol=1e-5)
    assert not torch.allclose(plain(x, graph), out_copy, atol=1e-3)  # centring changes the output
    out_hooked.square().sum().backward()
    out_copy.square().sum().backward()
    for (n, a), (_, b) in zip(hooked.named_parameters(), plain.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-4), n
    assert torch.equal(x, x_before) and set(hooked.state_dict()) == keys
    centre_first_layer(hooked, torch.zeros_like(mu))  # a second call replaces the first
    assert torch.allclose(hooked(x, graph), plain(x, graph), atol=1e-6)


@pytest.mark.parametrize("name", ["gcn", "fedgcn"])
def test_a_dense_input_is_dropped_out_as_the_centred_copy(name):
    """A dense input is dropped out as the centred copy.

    Above the sparse-dropout density the dropout acts on ``X - 1 mu^T`` exactly: the same training
    forward (same dropout key) as the model fed the centred copy.
    """
    from secure_fgl.engine import rng

    g = torch.Generator().manual_seed(1)
    x = (torch.rand(30, 12, generator=g) < 0.5).float()
    mu = own_mean(x, 20)
    hooked, graph = _models(name, x.size(1))
    hooked.dropout = 0.5
    plain = copy.deepcopy(hooked)
    centre_first_layer(hooked, mu)
    outs = []
    for model, inp in ((hooked, x), (plain, x - mu)):
        with rng.using(rng.client_generator(0, 1, 0, 0)):
            outs.append(model(inp, graph))
    assert torch.allclose(outs[0], outs[1], atol=1e-5)


def test_centring_refuses_a_model_without_a_linear_first_map():
    with pytest.raises(ConfigError, match="--center"):
        centre_first_layer(build_model("sage", 12, 8, 3), torch.zeros(1, 12))


@pytest.mark.parametrize("hops", [0, 1])
def test_centred_fedgcn_on_the_runtimes_is_the_golden_run(hops, request):
    from support.golden import assert_golden

    from secure_fgl.experiment import run_experiment

    b = run_experiment(small("fedgcn", "plain", options={"hops": hops, "center": True}), progress=False)
    assert_golden(
        "centring",
        request.node.name,
        {"train_loss": [r["train_loss"] for r in b["rounds"]], "test_acc": b["final"]["test_acc"]},
    )
