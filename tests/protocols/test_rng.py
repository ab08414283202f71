"""Training randomness is data-independent.

Per-client, per-step generators and dropout masks that depend on the key and the position only
(secure_fgl/engine/rng.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secure_fgl.config import RunConfig
from secure_fgl.engine import rng
from secure_fgl.experiment import run_experiment
from secure_fgl.models.node import dropout


def lowbias32_reference(key: int, index: np.ndarray) -> np.ndarray:
    """Wellons' lowbias32 of ``key XOR i`` in numpy uint32 (wrapping arithmetic by definition)."""
    with np.errstate(over="ignore"):
        z = index.astype(np.uint32) ^ np.uint32(key % 2**32)
        z = (z ^ (z >> np.uint32(16))) * np.uint32(0x7FEB352D)
        z = (z ^ (z >> np.uint32(15))) * np.uint32(0x846CA68B)
        z = z ^ (z >> np.uint32(16))
    return (z >> np.uint32(8)).astype(np.float64) / 2.0**24


def test_uniform_at_is_lowbias32_and_uniform():
    index = np.arange(0, 3_000_000, 3)
    for key in (-(2**31), -12345, 0, 2**31 - 1):
        u = rng.uniform_at(key, torch.from_numpy(index)).double().numpy()
        np.testing.assert_array_equal(u, lowbias32_reference(key, index))
    assert 0.0 <= u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 5 * (1 / 12 / u.size) ** 0.5
    counts = np.histogram(u, bins=16, range=(0, 1))[0]
    assert np.abs(counts - u.size / 16).max() < 5 * (u.size / 16) ** 0.5  # each bin within 5 sigma
    pairs = rng.uniform_at(7, torch.arange(0, 2_000_000)).double().numpy().reshape(-1, 2)
    assert abs(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]) < 5 / pairs.shape[0] ** 0.5  # neighbours uncorrelated


def test_client_generator_streams():
    def draws(*a):
        return torch.rand(8, generator=rng.client_generator(*a))

    assert torch.equal(draws(0, 3, 1, 2), draws(0, 3, 1, 2))  # same seed -> same stream
    others = [(1, 3, 1, 2), (0, 4, 1, 2), (0, 3, 2, 2), (0, 3, 1, 3), (0, 2, 3, 1)]
    assert all(not torch.equal(draws(0, 3, 1, 2), draws(*o)) for o in others)


@pytest.mark.parametrize("perturb", ["values", "dense"])
def test_dropout_mask_and_stream_do_not_depend_on_the_values(perturb):
    """Dropout mask and stream do not depend on the values.

    Two inputs differing only in their values (same sparsity, or a 1e-7 perturbation of every
    zero making it dense, as a decrypted CKKS zero) get the same mask on their common non-zeros
    and leave the generator in the same state.
    """
    torch.manual_seed(0)
    x = (torch.rand(300, 500) < 0.02) * torch.rand(300, 500)
    if perturb == "values":
        y = x * 1.5
    else:
        y = x + 1e-7 * torch.rand_like(x)
    g1, g2 = rng.client_generator(0, 1, 2, 0), rng.client_generator(0, 1, 2, 0)
    with rng.using(g1):
        a = dropout(x, 0.5, True)
    with rng.using(g2):
        b = dropout(y, 0.5, True)
    nz = x != 0
    assert torch.equal(a[nz] != 0, b[nz] != 0)
    assert torch.equal(g1.get_state(), g2.get_state())  # same draws consumed
    with rng.using(rng.client_generator(0, 1, 2, 1)):  # another step: another mask
        c = dropout(x, 0.5, True)
    assert not torch.equal(a != 0, c != 0)


def test_dropout_outside_a_generator_draws_one_number_per_call():
    x = (torch.rand(50, 40) < 0.05).float()
    torch.manual_seed(3)
    dropout(x, 0.5, True)
    after_sparse = torch.get_rng_state()
    torch.manual_seed(3)
    dropout(torch.ones(50, 40), 0.5, True)
    assert torch.equal(after_sparse, torch.get_rng_state())


def test_fedgcn_run_is_reproducible_and_unmoved_by_tiny_input_changes(monkeypatch):
    """Fedgcn run is reproducible and unmoved by tiny input changes.

    Same seed -> same result; and a 1e-7 change of the received neighbour sums (what a secure
    mode's decoding error does) leaves every round's dropout masks, hence the loss trajectory, in
    step with the unperturbed run.
    """
    cfg = dict(
        algorithm="fedgcn",
        mode="plain",
        dataset="sbm",
        clients=3,
        rounds=6,
        seed=0,
        synthetic={"num_nodes": 300, "num_features": 64, "num_classes": 3},
    )
    a = run_experiment(RunConfig(**cfg), progress=False)
    b = run_experiment(RunConfig(**cfg), progress=False)
    assert [r["train_loss"] for r in a["rounds"]] == [r["train_loss"] for r in b["rounds"]]

    from secure_fgl.algorithms.fedgcn.client import FedGCNLogic

    original = FedGCNLogic._set_inputs

    def perturbed(self, z, graph):
        original(self, z + 1e-7 * (z == 0), graph)  # every zero becomes non-zero: dense input

    monkeypatch.setattr(FedGCNLogic, "_set_inputs", perturbed)
    c = run_experiment(RunConfig(**cfg), progress=False)
    perturbed_losses, losses = [r["train_loss"] for r in c["rounds"]], [r["train_loss"] for r in a["rounds"]]
    assert perturbed_losses != losses  # the perturbation reached the model
    assert perturbed_losses == pytest.approx(losses, rel=1e-4)
