"""The exact discrete Gaussian sampler (CKS20 Alg. 1-3, all-integer Bernoulli(exp(-gamma))).

Checked against the exact laws it claims: the discrete Gaussian's pmf (chi-square and total
variation), its symmetry and moments, the discrete Laplace proposal, Bernoulli(exp(-gamma)) for
rational gamma, the 64-bit tie of Bernoulli(x) replayed on a scripted stream, and the variance
rounded up onto its rational grid.  Statistical tolerances are >= 6 standard errors (or a
chi-square tail of 1e-6).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy.stats import chi2

from protocols.csprng import VARIANCE_BITS, SecureRandom, exact_variance


class KeyedStream(SecureRandom):
    """The same AES-256-CTR keystream from a fixed key: reproducible draws, for tests only."""

    def __init__(self, key: bytes) -> None:
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()


class ScriptedWords(SecureRandom):
    """Hands out the given uint64 words first, then keystream words."""

    def __init__(self, words: list[int]) -> None:
        super().__init__()
        self._script = [np.uint64(w) for w in words]

    def words(self, n: int) -> np.ndarray:
        take = [self._script.pop(0) for _ in range(min(n, len(self._script)))]
        return np.concatenate([np.array(take, dtype=np.uint64), super().words(n - len(take))])


def discrete_gaussian_pmf(variance: float, support: np.ndarray) -> np.ndarray:
    wide = np.arange(-int(60 * math.sqrt(variance)) - 60, int(60 * math.sqrt(variance)) + 61)
    norm = np.exp(-(wide.astype(float) ** 2) / (2 * variance)).sum()
    return np.exp(-(support.astype(float) ** 2) / (2 * variance)) / norm


def chi_square_tail(samples: np.ndarray, pmf) -> tuple[float, float]:
    """Chi-square tail probability of ``samples`` against ``pmf`` (cells expecting >= 20, rest pooled)."""
    lo, hi = int(samples.min()), int(samples.max())
    support = np.arange(lo, hi + 1)
    expected = samples.size * pmf(support)
    observed = np.bincount(samples - lo, minlength=support.size).astype(float)
    big = expected >= 20
    e = np.append(expected[big], samples.size - expected[big].sum())
    o = np.append(observed[big], observed[~big].sum())
    stat = float(np.sum((o - e) ** 2 / np.maximum(e, 1e-12)))
    tv = 0.5 * float(np.abs(observed / samples.size - pmf(support)).sum())
    return float(chi2.sf(stat, big.sum())), tv


@pytest.mark.parametrize("sigma", [0.7, 1.5])
def test_samples_follow_the_exact_pmf(sigma):
    n = 200_000
    x = SecureRandom().discrete_gaussian(sigma, n).astype(np.int64)
    tail, tv = chi_square_tail(x, lambda k: discrete_gaussian_pmf(sigma**2, k))
    assert tail > 1e-6
    assert tv < 0.01  # ~ sqrt(cells / n): sampling error only


def test_samples_are_symmetric_with_the_stated_moments_at_grid_scale():
    """A grid-scale std (2^24 steps), as the exchanges use: mean 0, variance sigma^2, P[x > 0] = P[x < 0]."""
    sigma, n = 1.3 * 2.0**24, 100_000
    x = SecureRandom().discrete_gaussian(sigma, n)
    assert np.array_equal(x, np.round(x))
    assert abs(x.mean()) < 6 * sigma / math.sqrt(n)
    assert abs(np.mean(x * x) / sigma**2 - 1) < 6 * math.sqrt(2 / n)
    positive, negative = int((x > 0).sum()), int((x < 0).sum())
    assert abs(positive - negative) < 6 * math.sqrt(positive + negative)


def test_per_entry_sigmas_each_get_their_own_law():
    sigma = np.repeat([0.0, 2.0, 50.0], 60_000)
    x = SecureRandom().discrete_gaussian(sigma.reshape(-1, 3), (60_000, 3)).ravel()
    assert np.all(x[:60_000] == 0)
    for s, part in ((2.0, x[60_000:120_000]), (50.0, x[120_000:])):
        assert abs(np.mean(part * part) / s**2 - 1) < 6 * math.sqrt(2 / part.size)


def test_variance_is_rounded_up_onto_its_rational_grid():
    for sigma in (0.5, 2.0, 3.7, 1.3 * 2.0**24, math.pi):
        v = exact_variance(sigma)
        exact = Fraction(sigma) ** 2
        assert v.denominator <= 1 << VARIANCE_BITS
        assert exact <= v < exact + Fraction(1, 1 << VARIANCE_BITS)


def test_discrete_laplace_proposal_follows_its_law():
    t, n = 3, 200_000
    y = SecureRandom().discrete_laplace(t, n)
    norm = (1 + math.exp(-1 / t)) / (1 - math.exp(-1 / t))
    tail, _ = chi_square_tail(y, lambda k: np.exp(-np.abs(k) / t) / norm)
    assert tail > 1e-6


def test_bernoulli_exp_of_a_rational_gamma():
    n = 100_000
    rng = SecureRandom()
    for num, den in ((0, 1), (1, 3), (1, 1), (7, 2), (10**40 + 1, 10**40)):
        p = math.exp(-num / den)
        hits = rng.bernoulli_exp_ratio(np.full(n, num, dtype=object), den).mean()
        assert abs(hits - p) < 6 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_a_64_bit_tie_is_resolved_by_the_next_bits():
    """With x = 1/3 = 0.0101..., a word equal to floor(x 2^64) defers to the next word, which decides."""
    top = (1 << 64) // 3
    rest = [(1 << 64) - 3 * top]  # x 2^64 - top = 1/3 again, numerator over 3
    below, above = top - 1, top + 1
    for script, expected in (([top, below], True), ([top, above], False), ([below], True), ([above], False)):
        rng = ScriptedWords(script)
        out = rng.bernoulli_fraction(np.array([top], dtype=np.uint64), lambda tie: np.array(rest, dtype=object), 3)
        assert bool(out[0]) is expected


def test_draws_are_a_function_of_the_keystream_only():
    key = bytes(range(32))
    a, b = KeyedStream(key).discrete_gaussian(3.7, 5_000), KeyedStream(key).discrete_gaussian(3.7, 5_000)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, KeyedStream(bytes(32)).discrete_gaussian(3.7, 5_000))


def test_a_huge_gamma_costs_passes_per_draw_not_per_unit_of_gamma():
    """At sigma 1e-4 a proposal of 1 has gamma about 5e7: each entry stops at its first failed exp(-1) draw.

    P[Y != 0] is about ``2 exp(-1 / (2 sigma^2))``, so every sample is 0; with one pass per unit of
    ``floor(gamma)`` this call would make tens of millions of passes.
    """
    assert not SecureRandom().discrete_gaussian(1e-4, 20_000).any()
    accept = SecureRandom().bernoulli_exp_ratio(np.array([10**9, 0, 1], dtype=object), 10)  # gamma 1e8, 0, 0.1
    assert not accept[0] and accept[1]
