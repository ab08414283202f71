"""DP-SGD with Poisson sampling.

Each step trains on a secret Bernoulli(q) sample of the training nodes, and the accountant composes the steps as
subsampled Gaussians, as Opacus' RDP accountant does.
"""

from __future__ import annotations

import math

import pytest
import torch

from protocols.csprng import SecureRandom
from protocols.dp import DPConfig, DPEngine
from secure_fgl.config import RunConfig
from secure_fgl.dpsgd import DPSGD, stage_request


def test_poisson_sample_keeps_each_training_node_with_probability_q():
    """Poisson sample keeps each training node with probability q.

    The empirical rate over 40 steps of 500 training nodes is q within 4 binomial stds; nodes
    outside the training mask are never drawn; two steps draw different samples.
    """
    q, n, steps = 0.1, 500, 40
    mask = torch.zeros(2 * n, dtype=torch.bool)
    mask[::2] = True
    sgd, rng = DPSGD(1.0, q), SecureRandom()
    samples = [sgd.poisson_sample(mask, rng.uniform) for _ in range(steps)]
    assert all(not bool((s & ~mask).any()) for s in samples)
    rate = sum(int(s.sum()) for s in samples) / (n * steps)
    assert abs(rate - q) <= 4 * math.sqrt(q * (1 - q) / (n * steps))
    assert not torch.equal(samples[0], samples[1])


@pytest.mark.filterwarnings("ignore:divide by zero", "ignore:Optimal order is the largest alpha")
def test_subsampled_steps_spend_the_budget_as_opacus_counts_it():
    """Subsampled steps spend the budget as opacus counts it.

    A stage of 60 steps at q = 0.05 asked for epsilon 2: the engine's multiplier is Opacus'
    ``get_noise_multiplier`` for that target, and Opacus' RDP accountant given the steps reports
    the engine's epsilon, which is the asked one (within 1 %).
    """
    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    q, steps, eps = 0.05, 60, 2.0
    eng = DPEngine(DPConfig(epsilon=eps, accountant="exact"), num_clients=3, protocol_mode="plain")
    req = stage_request(1.0, steps, 1)
    for t in range(steps):
        eng.local_release("stage/dpsgd", t, req, sample_rate=q)
    report = eng.accountant.report()
    tag = report["per_tag"]["stage/dpsgd"]
    assert tag["sample_rate"] == q and tag["releases"] == steps and report["composition"] == "rdp"
    z = tag["noise_multiplier"]
    assert z == pytest.approx(
        get_noise_multiplier(target_epsilon=eps, target_delta=1e-5, sample_rate=q, steps=steps), rel=0.02
    )
    acc = RDPAccountant()
    acc.history = [(z, q, steps)]
    assert acc.get_epsilon(delta=1e-5) == pytest.approx(report["total_epsilon"], rel=0.01)
    assert 0.99 * eps <= report["total_epsilon"] <= eps
    # the same steps at q = 1 need several times the noise: the amplification
    full = DPEngine(DPConfig(epsilon=eps), num_clients=3, protocol_mode="plain")
    full.local_release("stage/dpsgd", 0, req)
    assert full.noise_multiplier("stage/dpsgd") > 3 * z


def test_gap_dpsgd_with_a_sample_rate_reports_it_and_stays_in_budget():
    from secure_fgl.experiment import run_experiment

    cfg = RunConfig(
        algorithm="fedgcn-gap",
        mode="plain",
        clients=3,
        rounds=2,
        local_epochs=1,
        dp_epsilon=4.0,
        options={"dpsgd": True, "dp_sample_rate": 0.3, "hops": 1},
        synthetic={"num_nodes": 120, "num_features": 12},
    )
    p = run_experiment(cfg, progress=False)["privacy"]
    sampled = {r["tag"]: r["sample_rate"] for r in p["releases"] if r.get("unit") == "sample"}
    assert sampled == {"fedgcn-gap/encoder/dpsgd": 0.3, "fedgcn-gap/dpsgd": 0.3}
    assert p["composition"] == "rdp" and p["total_epsilon"] <= 4.0 and p["claim_holds"]


def test_a_sample_rate_without_dpsgd_is_refused():
    from secure_fgl.preflight import preflight
    from secure_fgl.validation import ConfigError

    with pytest.raises(ConfigError, match="add --dpsgd"):
        preflight(RunConfig(algorithm="fedgcn-gap", dp_epsilon=4.0, options={"dp_sample_rate": 0.5}), check_data=False)


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_sampled_step_noise_is_still_split_over_the_clients_of_a_secure_mean():
    """Sampled step noise is still split over the clients of a secure mean.

    Distributed placement, 3 clients, one colluder: each adds sigma / sqrt(2) of the sampled
    step's noise (its multiplier calibrated at rate q), and the step counts once.
    """
    eng = DPEngine(DPConfig(epsilon=2.0, placement="distributed", colluders=1), num_clients=3, protocol_mode="mask")
    req = stage_request(1.0, 10, 1)
    stds = [eng.local_release("stage/dpsgd", 0, req, contributors=3, sample_rate=0.2) for _ in range(3)]
    z = eng.noise_multiplier("stage/dpsgd")
    assert stds == pytest.approx([z / math.sqrt(2)] * 3) and eng.accountant.releases("stage/dpsgd") == 1
    assert eng.accountant.history("stage/dpsgd") == [(z, 0.2, 1)]
