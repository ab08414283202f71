"""Differential privacy of protocol exchanges: mechanism, placement, accounting, end to end.

DP noise comes from an OS-keyed CSPRNG (not from any seed), so the statistical tests draw
fresh noise on every run; their tolerances are chosen so that a correct implementation
fails with probability < 1e-6.  For n i.i.d. N(0, s^2) draws x_i, n * mean(x^2) / s^2 ~ chi^2_n exactly; we accept
iff it lies in [chi2.ppf(P/2, n), chi2.isf(P/2, n)] with P = 5e-8 (two-sided), i.e. a false
failure probability of 5e-8 per check (<= 5e-7 < 1e-6 for the 10 checks in this file, union bound).
Discrete-Gaussian draws with std >= 2 have the continuous Gaussian's second and fourth
moments to ~1e-8 relative, so the same interval (the chi^2 / CLT limit of mean(x^2)) applies.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

from protocols import ConfigurationError, DPRequest, PrivacyBudgetError, ValueSpec, make_protocol
from protocols.accountant import PrivacyAccountant, calibrate_noise_multiplier, epsilon_of, opacus_options
from protocols.dp import (
    DP_GRID_BITS,
    DPConfig,
    DPEngine,
    clip_l2,
    clip_rows,
    edge_level_sensitivity,
    grid_slack,
    node_level_sensitivity,
)

P_FAIL = 5e-8


def assert_std(samples: np.ndarray, std: float) -> None:
    """Chi-square test that zero-mean ``samples`` have standard deviation ``std``.

    False-failure probability P_FAIL, see module docstring.
    """
    x = np.asarray(samples, dtype=np.float64).ravel()
    n = x.size
    stat = float(np.sum(x * x)) / std**2
    lo, hi = chi2.ppf(P_FAIL / 2, n), chi2.isf(P_FAIL / 2, n)
    assert lo <= stat <= hi, (
        f"sample std {math.sqrt(stat / n) * std:.5g} vs stated {std:.5g}: "
        f"chi2 stat {stat:.1f} outside [{lo:.1f}, {hi:.1f}] (n={n})"
    )


def engine(epsilon=1.0, mode="plain", **cfg) -> DPEngine:
    return DPEngine(DPConfig(epsilon=epsilon, **cfg), num_clients=8, protocol_mode=mode)


# ----------------------------------------------------------------------------- noise scale
def test_gaussian_noise_has_stated_std():
    eng = engine(1.0)
    n = 200_000
    out = eng.privatize_vectors("t", 0, {0: np.zeros(n)}, DPRequest(clip=2.0))
    z = eng.noise_multiplier("t")
    assert z == pytest.approx(calibrate_noise_multiplier(1.0, 1e-5, 1, "rdp"))
    sigma = z * (2.0 + grid_slack(DP_GRID_BITS, 1, n))  # the clip (one client) and the grid's rounding
    assert eng.last_std == pytest.approx(sigma)  # local placement, one contributor
    assert_std(out[0], sigma)


def test_discrete_gaussian_noise_is_integer_with_stated_std():
    eng = engine(1.0)
    n = 200_000
    x = np.random.default_rng(0).integers(0, 5, n).astype(float)
    out = eng.privatize_vectors("t", 0, {0: x}, DPRequest(clip=math.inf, sensitivity=1.5, integer=True))
    noise = out[0] - x
    assert np.array_equal(out[0], np.round(out[0]))
    sigma = eng.noise_multiplier("t") * 1.5  # ~6: discrete moments = continuous ones
    assert_std(noise, sigma)


def test_distributed_noise_sums_to_sigma():
    K, n = 8, 100_000
    eng = engine(1.0, mode="mask", placement="distributed")
    flat = {k: np.zeros(n) for k in range(K)}
    out = eng.privatize_vectors("t", 0, flat, DPRequest(clip=1.0))
    sigma = eng.noise_multiplier("t") * (1.0 + grid_slack(DP_GRID_BITS, K, n))
    assert eng.last_std == pytest.approx(sigma)
    assert_std(out[3], sigma / math.sqrt(K))  # one client's share
    assert_std(sum(out.values()), sigma)  # the released sum


def test_distributed_row_noise_per_row_contributors():
    """Rows uploaded by different numbers of clients all carry std sigma in the sum."""
    eng = engine(1.0, mode="ckks", placement="distributed")
    N, d = 20_000, 5
    ids = {0: np.arange(N), 1: np.arange(N // 2), 2: np.arange(N // 4)}
    rows = {k: np.zeros((i.size, d)) for k, i in ids.items()}
    out = eng.privatize_rows("rows", 0, ids, rows, N, DPRequest(clip=1.0), "sparse")
    total = np.zeros((N, d))
    for k in ids:
        total[ids[k]] += out[k]
    sigma = eng.noise_multiplier("rows") * 1.0
    assert_std(total[: N // 4], sigma)  # 3 contributors
    assert_std(total[N // 2 :], sigma)  # 1 contributor


def test_distributed_with_plain_raises():
    with pytest.raises(ConfigurationError, match="ckks' or 'mask"):
        make_protocol("plain", 3, dp=DPConfig(epsilon=1.0, placement="distributed"))


# ----------------------------------------------------------------------------- accounting
def test_accountant_matches_opacus():
    """Accountant matches opacus.

    Same sigma and steps: our accountant's epsilon is Opacus' (called directly, with the
    options we pass it); for RDP, Opacus' default orders give an epsilon >= ours.
    """
    from opacus.accountants import PRVAccountant, RDPAccountant

    hist = [(8.0, 1.0, 10), (12.0, 1.0, 5)]
    for mech, cls in (("rdp", RDPAccountant), ("prv", PRVAccountant)):
        acc = PrivacyAccountant(mech, delta=1e-5)
        for _ in range(10):
            acc.step("a", 8.0)
        for _ in range(5):
            acc.step("b", 12.0, sensitivity=1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = cls()
            ref.history = hist
            total = ref.get_epsilon(delta=1e-5, **opacus_options(hist, 1e-5, mech))
            ref_a = cls()
            ref_a.history = hist[:1]
            eps_a = ref_a.get_epsilon(delta=1e-5, **opacus_options(hist[:1], 1e-5, mech))
            if mech == "rdp":
                assert acc.epsilon() <= ref.get_epsilon(delta=1e-5) + 1e-12
        assert acc.epsilon() == pytest.approx(total, rel=1e-9)
        assert acc.epsilon("a") == pytest.approx(eps_a, rel=1e-9)
        rep = acc.report()
        assert rep["accountant"] == mech and rep["per_tag"]["b"]["releases"] == 5
        assert rep["per_tag"]["b"]["noise_multiplier"] == 12.0 and rep["per_tag"]["b"]["sensitivity"] == 1.0
        assert rep["total_epsilon"] == pytest.approx(total, rel=1e-9)
        assert acc.epsilon("a") < rep["total_epsilon"] < acc.epsilon("a") + acc.epsilon("b")
    # RDP and PRV agree to their known slack (RDP conservative by < 10 %)
    e_rdp, e_prv = epsilon_of(hist, 1e-5, "rdp"), epsilon_of(hist, 1e-5, "prv")
    assert e_prv <= e_rdp <= 1.15 * e_prv


def test_small_epsilon_is_certifiable():
    """Opacus' default RDP orders stop at 63 and cannot certify eps < ~0.19 at delta=1e-5."""
    z = calibrate_noise_multiplier(0.05, 1e-5, 10, "rdp")
    assert 0.049 <= epsilon_of([(z, 1.0, 10)], 1e-5, "rdp") <= 0.05


def test_calibration_meets_budget_tightly():
    for mech in ("rdp", "prv"):
        z = calibrate_noise_multiplier(1.0, 1e-5, 3, mech)
        eps = epsilon_of([(z, 1.0, 3)], 1e-5, mech)
        assert 0.99 <= eps <= 1.0


def test_prv_sqrt_T_composition():
    """At q=1, T Gaussian releases with z equal one with z/sqrt(T): z_T = sqrt(T) z_1."""
    z1 = calibrate_noise_multiplier(1.0, 1e-5, 1, "prv")
    z100 = calibrate_noise_multiplier(1.0, 1e-5, 100, "prv")
    assert z100 == pytest.approx(10 * z1, rel=0.01)
    assert z1 == pytest.approx(3.7306, rel=0.01)  # exact analytic Gaussian (Balle-Wang)


# ----------------------------------------------------------------------------- clipping
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), st.floats(1e-3, 1e3))
def test_clip_bounds_l2_norm(values, bound):
    x = np.array(values)
    y = clip_l2(x, bound)
    assert np.linalg.norm(y) <= bound * (1 + 1e-9)
    if np.linalg.norm(x) <= bound:
        assert np.array_equal(x, y)
    rows = clip_rows(np.tile(x, (3, 1)) * np.array([[1.0], [0.01], [100.0]]), bound)
    assert (np.linalg.norm(rows, axis=1) <= bound * (1 + 1e-9)).all()
    xi = np.round(x)
    yi = clip_l2(xi, bound, integer=True)
    assert np.array_equal(yi, np.round(yi)) and np.linalg.norm(yi) <= bound * (1 + 1e-9)


def test_engine_clips_before_noise():
    """A huge contribution is clipped: its release is the clipped vector plus the stated noise."""
    eng = engine(1.0)
    x = np.full(100_000, 50.0)
    out = eng.privatize_vectors("t", 0, {0: x}, DPRequest(clip=3.0))
    sigma = eng.noise_multiplier("t") * 3.0
    assert_std(out[0] - clip_l2(x, 3.0), sigma)


# ----------------------------------------------------------------------------- budget
def test_budget_overrun_raises():
    p = make_protocol("plain", 3, dp=DPConfig(epsilon=1.0), seed=1)
    vals = {k: np.ones(4) for k in range(3)}
    req = DPRequest(clip=1.0, releases=2)
    p.weighted_sum("t", 0, vals, dp=req)
    p.weighted_sum("t", 1, vals, dp=req)
    with pytest.raises(PrivacyBudgetError, match="declare more releases"):
        p.weighted_sum("t", 2, vals, dp=req)
    with pytest.raises(PrivacyBudgetError, match="Declare every DP tag"):
        p.weighted_sum("other", 0, vals, dp=req)
    rep = p.privacy_report()
    assert rep["per_tag"]["t"]["releases"] == 2 and rep["total_epsilon"] <= 1.0


def test_budget_shared_by_declared_tags():
    """Budget shared by declared tags.

    Tags share mu^2 of the run's one Gaussian; with every planned release made the run
    spends the whole epsilon (within 1 %), not the ~70 % an epsilon split left unspent.
    """
    eng = engine(2.0, tags=("a", "b"))
    assert eng.share("a") == eng.share("b") == pytest.approx(0.5)
    eng.privatize_vectors("a", 0, {0: np.zeros(3)}, DPRequest(clip=1.0, releases=4))
    eng.privatize_vectors("b", 0, {0: np.zeros(3)}, DPRequest(clip=1.0))
    mu = 1.0 / calibrate_noise_multiplier(2.0, 1e-5, 1)
    assert eng.noise_multiplier("a") == pytest.approx(2.0 / (mu * 0.5**0.5))
    with pytest.raises(ConfigurationError):
        eng.declare("c")  # allocation frozen at the first release
    eng2 = engine(2.0, budget_shares={"a": 3, "b": 1})
    assert eng2.share("a") == pytest.approx(0.75) and eng2.share("b") == pytest.approx(0.25)
    for _ in range(3):
        eng.privatize_vectors("a", 0, {0: np.zeros(3)}, DPRequest(clip=1.0, releases=4))
    rep = eng.report()
    assert 0.99 * 2.0 <= rep["total_epsilon"] <= 2.0 and rep["per_tag"]["a"]["epsilon"] < 2.0


def test_state_dict_round_trip_keeps_budget():
    eng = engine(1.0, tags=("a",))
    req = DPRequest(clip=1.0, releases=2)
    eng.privatize_vectors("a", 0, {0: np.zeros(3)}, req)
    resumed = engine(1.0, tags=("a",))
    resumed.load_state_dict(eng.state_dict())
    assert resumed.report() == eng.report()
    nxt = resumed.privatize_vectors("a", 1, {0: np.zeros(3)}, req)[0]
    assert not np.array_equal(nxt, eng.privatize_vectors("a", 1, {0: np.zeros(3)}, req)[0])  # fresh key
    with pytest.raises(PrivacyBudgetError):
        resumed.privatize_vectors("a", 2, {0: np.zeros(3)}, req)
    with pytest.raises(ConfigurationError, match="same"):
        engine(2.0, tags=("a",)).load_state_dict(eng.state_dict())


def test_row_sum_needs_stated_unit_for_per_row():
    p = make_protocol("plain", 2, dp=DPConfig(epsilon=1.0))
    contrib = {0: (np.array([0, 1]), np.ones((2, 3))), 1: (np.array([1]), np.ones((1, 3)))}
    with pytest.raises(ConfigurationError, match="sensitivity"):
        p.row_sum("rows", 0, contrib, {0: np.array([0, 1])}, 4, dp=DPRequest(clip=1.0, per_row=True))


def test_sensitivity_helpers():
    assert edge_level_sensitivity(2.0) == pytest.approx(2 * math.sqrt(2))
    assert node_level_sensitivity(2.0, 8) == pytest.approx(6.0)


# ----------------------------------------------------------------------------- end to end
def test_plain_weighted_mean_end_to_end():
    K, d, C = 5, 40_000, 1.0
    p = make_protocol("plain", K, dp=DPConfig(epsilon=1.0), seed=11)
    rng = np.random.default_rng(3)
    vals = {k: rng.normal(size=d) * 0.01 * (k + 1) for k in range(K)}  # norms 2..10: all clipped
    got = p.weighted_mean("fedavg/model", 0, vals, dp=DPRequest(clip=C))
    exact = np.mean([clip_l2(v, C) for v in vals.values()], axis=0)
    sigma = p.dp.noise_multiplier("fedavg/model") * (C + grid_slack(DP_GRID_BITS, K, d))
    assert p.dp.last_std == pytest.approx(sigma * math.sqrt(K))  # local: K noises in the sum
    assert_std(got - exact, sigma * math.sqrt(K) / K)
    rep = p.privacy_report()
    assert 0.99 <= rep["total_epsilon"] <= 1.0
    assert rep["per_tag"]["fedavg/model"]["epsilon"] <= 1.0
    assert rep["per_tag"]["fedavg/model"]["clip"] == C
    # the noise is not a function of the seed: the same seed gives fresh noise
    p2 = make_protocol("plain", K, dp=DPConfig(epsilon=1.0), seed=11)
    assert_std(
        p2.weighted_mean("fedavg/model", 0, vals, dp=DPRequest(clip=C)) - got, math.sqrt(2) * sigma * math.sqrt(K) / K
    )


def test_weighted_mean_noises_weights_with_public_bound():
    K = 4
    vals = {k: np.full(8, float(k)) / 10 for k in range(K)}  # norms < clip: unclipped
    w = {k: 10.0 * (k + 1) for k in range(K)}
    p = make_protocol("plain", K, dp=DPConfig(epsilon=1.0))
    with pytest.raises(ConfigurationError, match="weight_bound"):
        p.weighted_mean("m", 0, vals, w, dp=DPRequest(clip=1.0))
    p = make_protocol("plain", K, dp=DPConfig(epsilon=5e4), seed=2)
    got = p.weighted_mean("m", 0, vals, w, dp=DPRequest(clip=1.0, weight_bound=40.0))
    exact = sum(w[k] * vals[k] for k in range(K)) / sum(w.values())
    assert p.privacy_report()["per_tag"]["m"]["sensitivity"] == pytest.approx(math.sqrt(2))
    sigma_sum = p.dp.last_std  # noise std of each entry of [sum w~v, C sum w~]
    assert np.abs(got - exact).max() < 12 * sigma_sum  # weight total here is 2.5 C, noise tiny


def test_integer_row_sum_stays_integer():
    p = make_protocol("plain", 3, dp=DPConfig(epsilon=2.0), seed=5)
    N, d = 50, 4
    contrib = {k: (np.arange(k, N, 3), np.ones((len(range(k, N, 3)), d))) for k in range(3)}
    req = DPRequest(clip=math.inf, per_row=True, sensitivity=edge_level_sensitivity(2.0))
    out = p.row_sum(
        "fedgcn/neighbour_sums", 0, contrib, {0: np.arange(N)}, N, spec=ValueSpec(integer=True, sum_max=20), dp=req
    )
    assert np.array_equal(out[0], np.round(out[0])) and not np.all(out[0] == 1)
    assert p.privacy_report()["per_tag"]["fedgcn/neighbour_sums"]["integer"] is True


@pytest.mark.parametrize("mode", ["ckks", "mask"])
def test_secure_mode_distributed_dp(mode):
    p = make_protocol(mode, 4, dp=DPConfig(epsilon=1.0, placement="distributed"), seed=9)
    d, C = 2_000, 1.0
    vals = {k: np.full(d, 0.001 * k) for k in range(4)}
    got = p.weighted_mean("fedavg/model", 0, vals, dp=DPRequest(clip=C), spec=ValueSpec(max_abs=1.0, tolerance=1e-3))
    sigma = p.dp.noise_multiplier("fedavg/model") * (C + grid_slack(DP_GRID_BITS, 4, d))
    assert p.dp.last_std == pytest.approx(sigma)  # distributed: sigma in total
    assert_std(got - np.mean(list(vals.values()), axis=0), sigma / 4)  # /K for the mean
    assert p.privacy_report()["total_epsilon"] <= 1.0
