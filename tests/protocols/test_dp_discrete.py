"""The distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021).

Randomised rounding onto a public grid, discrete Gaussian noise, and the zCDP accounting of a sum of discrete
Gaussians.

Statistical checks use fresh OS-keyed noise; their bounds fail a correct implementation with
probability below 1e-7 each (6-sigma CLT intervals).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from protocols import DPRequest, ValueSpec, make_protocol
from protocols.accountant import epsilon_of
from protocols.csprng import SecureRandom
from protocols.dp import (
    DP_GRID_BITS,
    DPConfig,
    grid_noise,
    release_spec,
    sum_of_discrete_gaussians_epsilon,
    sum_of_discrete_gaussians_tau,
)


def test_randomised_rounding_is_unbiased_and_on_the_grid():
    """Randomised rounding is unbiased and on the grid.

    ``grid_noise`` returns multiples of 2^-f whose mean is the input (rounding up with
    probability the fractional part), with variance std^2 plus the rounding's p(1-p) steps^2.
    """
    bits, n = 4, 400_000
    x = np.full(n, 0.3 * 2.0**-bits + 1.0)  # fractional part 0.3 of a step
    std = 2.0 * 2.0**-bits  # 2 steps: the sampler's floor
    out = grid_noise(SecureRandom(), x, std, bits)
    steps = np.ldexp(out, bits)
    assert np.array_equal(steps, np.round(steps))  # on the grid
    var = std**2 + 0.3 * 0.7 * 4.0**-bits
    assert abs(out.mean() - x[0]) < 6 * math.sqrt(var / n)
    # sample variance of n draws: relative std sqrt(2/n) (fourth moment of a near-Gaussian)
    assert abs(out.var() / var - 1) < 6 * math.sqrt(2.0 / n)


def test_sum_of_discrete_gaussians_epsilon_against_the_continuous_bound():
    """KLS21 Thm 1: eps^2 = Delta^2/(n s^2) + tau d / 2.

    At s >= 2 steps tau is below 1e-16 per
    share and the bound equals the continuous Gaussian's Delta/(sqrt(n) s); at s = 0.5 the tau term
    is the closed form 10 exp(-pi^2/4) for two shares.
    """
    delta, n, d = 3.0, 8, 10_000
    assert sum_of_discrete_gaussians_tau(2.0, n) < 1e-15
    assert sum_of_discrete_gaussians_epsilon(delta, 2.0, n, d) == pytest.approx(delta / (math.sqrt(n) * 2.0), rel=1e-12)
    tau = 10 * math.exp(-2 * math.pi**2 * 0.25 * 1 / 2)
    assert sum_of_discrete_gaussians_tau(0.5, 2) == pytest.approx(tau, rel=1e-12)
    assert sum_of_discrete_gaussians_epsilon(1.0, 0.5, 2, 4) == pytest.approx(math.sqrt(1 / 0.5 + tau * 2), rel=1e-12)


@pytest.mark.parametrize("mode", ["mask", "ckks", pytest.param("ckks-mp", marks=pytest.mark.slow)])
def test_secure_sum_is_the_exact_grid_sum_and_composes_in_renyi_dp(mode):
    """Secure sum is the exact grid sum and composes in renyi DP.

    In distributed placement each client's noisy contribution is on the grid and the codec carries
    it exactly: the released sum is 2^-f times an integer (one discrete release, no per-client
    rounding after the noise); the run spends the asked epsilon, composed in Renyi DP (zCDP proof).
    """
    K, d = 4, 500
    p = make_protocol(mode, K, dp=DPConfig(epsilon=4.0, placement="distributed", accountant="exact"), seed=3)
    vals = {k: np.linspace(-0.01, 0.01, d) * (k + 1) for k in range(K)}
    total = p.weighted_sum("m", 0, vals, spec=ValueSpec(max_abs=1.0, tolerance=1e-3), dp=DPRequest(clip=1.0))
    steps = np.ldexp(np.asarray(total, dtype=np.float64), DP_GRID_BITS)
    assert np.array_equal(steps, np.round(steps))
    rep = p.privacy_report()
    assert rep["composition"] == "rdp" and rep["discrete_tags"] == ["m"]
    assert 3.96 <= rep["total_epsilon"] <= 4.0
    assert rep["total_epsilon"] == pytest.approx(epsilon_of(p.dp.accountant.history(), 1e-5, "rdp"))


def test_release_spec_puts_distributed_float_sums_on_the_grid():
    spec = ValueSpec(max_abs=2.0)
    grid = release_spec(spec, DPRequest(clip=1.0), "distributed")
    assert grid.grid_bits == DP_GRID_BITS and grid.tolerance <= 2.0 ** -(DP_GRID_BITS + 2)
    assert release_spec(spec, DPRequest(clip=1.0), "local") == spec  # each upload is its own release
    assert release_spec(spec, DPRequest(clip=1.0, integer=True), "distributed") == spec  # already integers
