"""Distributed DP noise over-provisioned for dropouts and colluders.

Protocols.dp, placement 'distributed'. The noise left in a sum after d dropouts and after a coalition of c clients
subtracts its own shares is still at least the calibrated sigma; more dropouts are refused.

Statistical checks as in tests/protocols/test_dp.py: n * mean(x^2) / s^2 ~ chi^2_n, accepted inside the
two-sided 5e-8 interval (false failure < 1e-6 over this file).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2

from protocols import DPRequest, DropoutError, ValueSpec, make_protocol
from protocols.dp import DPConfig, DPEngine

P_FAIL = 5e-8


def assert_std(samples: np.ndarray, std: float) -> None:
    x = np.asarray(samples, dtype=np.float64).ravel()
    stat = x.size * np.mean(x**2) / std**2
    assert chi2.ppf(P_FAIL / 2, x.size) <= stat <= chi2.isf(P_FAIL / 2, x.size), (np.std(x), std)


def test_noise_left_after_dropouts_and_a_coalition_is_sigma():
    """Noise left after dropouts and a coalition is sigma.

    K = 8, over-provisioned for 2 dropouts and 1 colluder: each client adds sigma^2/5; the 5
    honest survivors' noise (2 dropped, the colluder's share subtracted) sums to exactly sigma.
    """
    K, n = 8, 100_000
    eng = DPEngine(
        DPConfig(epsilon=1.0, placement="distributed", dropouts=2, colluders=1), num_clients=K, protocol_mode="mask"
    )
    out = eng.privatize_vectors("t", 0, {k: np.zeros(n) for k in range(K)}, DPRequest(clip=1.0))
    sigma = eng.noise_multiplier("t") * 1.0
    assert_std(out[0], sigma / np.sqrt(5))
    survivors, coalition = [k for k in range(K) if k not in (6, 7)], [0]
    assert_std(sum(out[k] for k in survivors if k not in coalition), sigma)  # what the coalition faces


def test_rows_with_few_contributors_get_full_noise_from_each():
    """A row with n <= d + c contributors: each adds all of sigma (one honest survivor suffices)."""
    N, d = 20_000, 4
    eng = DPEngine(
        DPConfig(epsilon=1.0, placement="distributed", dropouts=1, colluders=1), num_clients=3, protocol_mode="ckks"
    )
    ids = {0: np.arange(N), 1: np.arange(N // 2), 2: np.arange(N // 4)}
    out = eng.privatize_rows(
        "rows", 0, ids, {k: np.zeros((i.size, d)) for k, i in ids.items()}, N, DPRequest(clip=1.0), "sparse"
    )
    sigma = eng.noise_multiplier("rows")
    assert_std(out[0][N // 2 :], sigma)  # 1 contributor
    assert_std(out[1][N // 4 :], sigma)  # 2 contributors <= d + c
    assert_std(out[2], sigma)  # 3 contributors: max(1, 3 - 2) = 1 share


def test_mask_recovers_provisioned_dropouts_and_refuses_more():
    K, n = 6, 40_000
    cfg = DPConfig(epsilon=1.0, placement="distributed", dropouts=1, colluders=0, tags=("a", "b"))
    proto = make_protocol("mask", K, dp=cfg, seed=3)
    vals = {k: np.full(n, 0.01 * k) for k in range(K)}
    proto.drop_clients({2}, stage="upload")
    got = proto.weighted_sum("a", 0, vals, spec=ValueSpec(max_abs=1.0, tolerance=1e-3), dp=DPRequest(clip=1e3))
    sigma = proto.dp.noise_multiplier("a") * 1e3
    assert_std(got - sum(v for k, v in vals.items() if k != 2), sigma)  # 5 survivors x sigma^2/5
    proto.drop_clients({2, 3}, stage="upload")
    with pytest.raises(DropoutError, match="provisioned for at most 1 dropout"):
        proto.weighted_sum("b", 0, vals, spec=ValueSpec(max_abs=1.0, tolerance=1e-3), dp=DPRequest(clip=1e3))


def test_secure_modes_default_to_distributed_noise_for_one_colluder():
    from secure_fgl.config import RunConfig
    from secure_fgl.privacy import dp_config

    dp = dp_config(RunConfig(algorithm="fedgcn-gap", mode="mask", dp_epsilon=1.0))
    assert (dp.placement, dp.colluders, dp.dropouts) == ("distributed", 1, 0)
    assert dp_config(RunConfig(algorithm="fedgcn-gap", mode="plain", dp_epsilon=1.0)).placement == "local"
