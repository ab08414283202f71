"""The GPU path: runs only where CUDA is available, skipped with a reason otherwise.

Training and the attacks' model fits run on ``--device auto``'s device; data move there once
(each client runtime's own data) and each client brings its own update to the host for the exchange.
"""

from __future__ import annotations

import pytest
import torch

from secure_fgl.config import RunConfig
from secure_fgl.experiment import run_experiment

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="no CUDA device (torch.cuda.is_available() is false): the gpu tests run on a machine with a GPU"
)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", ("plain", "ckks"))
def test_cuda_run_trains_on_the_device_and_matches_the_cpu_run(mode):
    base = dict(algorithm="fedavg", dataset="sbm", clients=3, rounds=3, mode=mode, seed=0, save_best_model=False)
    gpu = run_experiment(RunConfig(**base, device="cuda").validate(), progress=False)
    cpu = run_experiment(RunConfig(**base, device="cpu").validate(), progress=False)
    assert gpu["device"].startswith("cuda")
    assert abs(gpu["final"]["test_acc"] - cpu["final"]["test_acc"]) <= 0.02  # float kernels differ slightly
    assert gpu["comm"]["bytes_up"] == cpu["comm"]["bytes_up"]


@pytest.mark.gpu
@needs_cuda
def test_attacks_on_a_cuda_trained_model_give_the_cpu_numbers():
    """Attacks on a cuda trained model give the cpu numbers.

    The model attacks read a CUDA-trained model as they read a CPU-trained one: the values agree
    up to float nondeterminism and the 95 % intervals overlap.
    """
    names = ["membership", "link_posterior", "link_influence"]
    base = dict(
        algorithm="fedavg",
        dataset="sbm",
        clients=3,
        rounds=3,
        mode="plain",
        seed=0,
        save_best_model=False,
        attacks=names,
    )
    gpu, cpu = (
        {a["name"]: a for a in run_experiment(RunConfig(**base, device=dev).validate(), progress=False)["attacks"]}
        for dev in ("cuda", "cpu")
    )
    for name in names:
        g, c = gpu[name], cpu[name]
        assert g["applicable"] and c["applicable"], (g.get("reason"), c.get("reason"))
        assert abs(g["value"] - c["value"]) <= 0.05, name
        assert g["ci"][0] <= c["ci"][1] and c["ci"][0] <= g["ci"][1], name
