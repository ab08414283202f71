r"""Cryptographically secure randomness for DP noise: an AES-256-CTR keystream keyed by the OS.

DP noise must be unpredictable to everyone but the client that draws it: if the noise can
be regenerated (e.g. from the run's public ``--seed``), the server subtracts it and the
reported epsilon protects nothing.  :class:`SecureRandom` therefore

* draws its 256-bit key from ``os.urandom(32)`` when it is built and keeps it only inside
  the ``cryptography`` cipher object: the key is never stored in an attribute, a
  checkpoint or ``result.json``, so a resumed run continues with a *fresh* key;
* expands the key with AES-256 in counter mode (``cryptography``/OpenSSL; zero IV is safe
  because the key is used for exactly one stream) — numpy's PCG64 is *not* used, not even
  OS-seeded, because its state can be recovered from its outputs;
* turns keystream words into numbers in numpy:

  - uniforms ``U = (w >> 11) * 2^-53`` on the 53-bit grid of [0, 1) (every double in the
    grid equally likely; :meth:`uniform_open` shifts by half a step onto (0, 1));
  - standard normals by Box-Muller, ``Z = sqrt(-2 ln U1) cos(2 pi U2)``;
  - discrete Gaussians N_Z(0, sigma^2), exactly, by Canonne, Kamath & Steinke 2020 (CKS20,
    "The Discrete Gaussian for Differential Privacy", Alg. 1-3 with the all-integer
    Bernoulli(exp(-gamma)) of section 5): a discrete Laplace proposal ``Y`` of scale
    ``t = floor(sigma) + 1`` (Alg. 2), accepted with probability
    ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))`` (Alg. 3).  Every step compares integers: uniform
    integers below a bound by rejection on masked keystream words, Bernoulli(a/b) as ``U < a``,
    Bernoulli(exp(-gamma)) for rational ``gamma`` by Alg. 1, whose Bernoulli(x) for a rational
    ``x`` in [0, 1) compares keystream words with ``x``'s binary expansion, 64 bits at a time
    (Python integers for the expansion).  The variance is the rational
    :func:`exact_variance`: ``sigma^2`` rounded *up* onto ``2^-VARIANCE_BITS``, so the drawn
    noise is never below the calibrated one and the privacy guarantee only improves.  The samples
    are integers and their law is exactly N_Z(0, exact_variance(sigma)): no floating point enters.

Floating-point and timing attacks (Jin, Ge, Zhu, Zhu, Nissim, Vadhan; "Are We There Yet?
Timing and Floating-Point Attacks on Differential Privacy Systems", IEEE S&P 2022) and
what we do about them:

* *Porous float outputs*: ``x + N`` with a float-sampled N does not reach every double;
  which ones it reaches depends on x, so an exact output can rule candidates in or out.
  Integer exchanges (packed encodings, the mask ring) use the discrete Gaussian, whose
  output ``x + Y`` is an integer: no low-order bits to fingerprint.  Continuous exchanges
  are rounded at random onto a public grid ``2^-f`` first and get discrete noise in grid
  steps (:func:`protocols.dp.grid_noise`), so every exchange upload, ``float64`` plain wire
  included, is ``2^-f`` times an integer.  *Residual risk*: the continuous Gaussian
  (Box-Muller on 53-bit uniforms, not an exact sampler) is still used for DP-SGD's noise on
  float gradients.
* *Timing*: the sampler is vectorised over a whole noise vector: its running time is a
  function of the vector's draws as a whole (the total number of trials, the longest one), never
  of the data the noise is added to, and not of which entry took which value.  It is not
  constant-time: an observer of one client's timing learns a little about that client's noise
  vector as a whole (e.g. how many proposals were rejected), which the DP analysis does not count.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from fractions import Fraction
from typing import NoReturn

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_CHUNK = 1 << 20  # entries per rejection round of the discrete sampler
#: the exact sampler draws N_Z(0, s^2) with s^2 rounded up onto 2^-VARIANCE_BITS (:func:`exact_variance`)
VARIANCE_BITS = 48
_WORD = (1 << 64) - 1
#: a sample count or shape
Size = int | tuple[int, ...]


class SecureRandom:
    """Uniform, Gaussian and discrete Gaussian samples from an OS-keyed AES-256-CTR keystream.

    Uniforms, Gaussians and discrete Gaussians from an AES-256-CTR keystream keyed by
    ``os.urandom(32)`` (see module docstring).  Not picklable and never persisted.
    """

    def __init__(self) -> None:
        self._encryptor = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(bytes(16))).encryptor()

    def __reduce__(self) -> NoReturn:
        raise TypeError("SecureRandom holds a secret key and is never serialised")

    def words(self, n: int) -> np.ndarray:
        """``n`` uniformly random uint64 words (the next 8n keystream bytes)."""
        words: np.ndarray = np.frombuffer(self._encryptor.update(bytes(8 * int(n))), dtype="<u8")
        return words

    def uniform(self, size: Size) -> np.ndarray:
        """Uniform on the 53-bit grid of [0, 1)."""
        shape = _shape(size)
        grid: np.ndarray = (self.words(math.prod(shape)) >> np.uint64(11)) * 2.0**-53
        return grid.reshape(shape)

    def uniform_open(self, size: Size) -> np.ndarray:
        """Uniform on the 53-bit grid shifted by half a step: values in (0, 1), never 0 or 1."""
        shape = _shape(size)
        grid: np.ndarray = ((self.words(math.prod(shape)) >> np.uint64(11)) + 0.5) * 2.0**-53
        return grid.reshape(shape)

    def standard_normal(self, size: Size) -> np.ndarray:
        """N(0, 1) samples by Box-Muller on 53-bit open uniforms."""
        shape = _shape(size)
        n = math.prod(shape)
        u1, u2 = self.uniform_open((n,)), self.uniform((n,))
        normal: np.ndarray = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        return normal.reshape(shape)

    def discrete_gaussian(self, sigma: float | np.ndarray, size: Size) -> np.ndarray:
        """Integer-valued discrete Gaussian samples N_Z(0, sigma^2), exact.

        Integer-valued N_Z(0, sigma^2) samples (float64 holding integers) by CKS20 Alg. 3 with
        the all-integer Bernoulli(exp(-gamma)) of section 5; ``sigma`` broadcasts to ``size``
        (per-entry std; entries with sigma <= 0 are 0).  Each distinct ``sigma`` is drawn with the
        variance :func:`exact_variance` (``sigma^2`` rounded up onto ``2^-VARIANCE_BITS``).
        """
        shape = _shape(size)
        sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), shape).reshape(-1)
        out = np.zeros(sig.size, dtype=np.int64)
        positive = sig > 0
        values = np.unique(sig[positive])
        if values.size == 1 and positive.all():
            out[:] = self.discrete_gaussian_exact(exact_variance(float(values[0])), out.size)
        else:
            for value in values:
                idx = np.flatnonzero(sig == value)
                out[idx] = self.discrete_gaussian_exact(exact_variance(float(value)), idx.size)
        return out.astype(np.float64).reshape(shape)

    def discrete_gaussian_exact(self, variance: Fraction, n: int) -> np.ndarray:
        """``n`` samples of N_Z(0, variance) for a rational variance ``p/q`` (CKS20 Alg. 3).

        Proposal ``Y`` ~ discrete Laplace of scale ``t = floor(sigma) + 1``, accepted with
        probability ``exp(-gamma)``, ``gamma = (|Y| - sigma^2/t)^2 / (2 sigma^2) = (|Y| q t - p)^2 / (2 p q t^2)``,
        a ratio of integers; int64 entries.
        """
        p, q = variance.numerator, variance.denominator
        if p <= 0:
            raise ValueError("the variance of a discrete Gaussian must be positive")
        t = math.isqrt(p // q) + 1  # floor(sigma) + 1
        denominator = 2 * p * q * t * t
        out = np.zeros(int(n), dtype=np.int64)
        todo = np.arange(int(n))
        while todo.size:
            idx = todo[:_CHUNK]
            y = self.discrete_laplace(t, idx.size)
            a = np.abs(y).astype(object) * (q * t) - p
            accept = self.bernoulli_exp_ratio(a * a, denominator)
            out[idx[accept]] = y[accept]
            todo = np.concatenate([idx[~accept], todo[_CHUNK:]])
        return out

    def discrete_laplace(self, t: int, n: int) -> np.ndarray:
        """``n`` samples of the discrete Laplace law P[Y = y] ~ exp(-|y|/t), integer ``t >= 1`` (CKS20 Alg. 2).

        ``U`` uniform on {0, ..., t-1} kept with probability ``exp(-U/t)``, ``V`` the number of
        Bernoulli(exp(-1)) successes before the first failure, ``X = U + t V``, a fair sign, and
        ``-0`` rejected.
        """
        out = np.zeros(int(n), dtype=np.int64)
        todo = np.arange(int(n))
        while todo.size:
            drawn = self.integers_below(t, todo.size)

            def below_drawn(i: np.ndarray, k: int, u: np.ndarray = drawn) -> np.ndarray:  # Bernoulli(U / (t k))
                below: np.ndarray = self.integers_below(t * k, i.size) < u[i]
                return below

            keep = self._bernoulli_exp_unit(below_drawn, todo.size)
            u, idx = drawn[keep], todo[keep]
            v = np.zeros(idx.size, dtype=np.int64)
            going = np.arange(idx.size)
            while going.size:
                going = going[self.bernoulli_exp_minus_one(going.size)]
                v[going] += 1
            x = u + t * v
            negative = self.integers_below(2, idx.size) == 1
            valid = ~(negative & (x == 0))
            out[idx[valid]] = np.where(negative, -x, x)[valid]
            done = np.zeros(todo.size, dtype=bool)
            done[np.flatnonzero(keep)[valid]] = True
            todo = todo[~done]
        return out

    def bernoulli_exp_minus_one(self, n: int) -> np.ndarray:
        """``n`` Bernoulli(exp(-1)) draws (CKS20 Alg. 1 at gamma = 1)."""
        return self._bernoulli_exp_unit(lambda i, k: self.integers_below(k, i.size) == 0, n)

    def bernoulli_exp_ratio(self, numerators: np.ndarray, denominator: int) -> np.ndarray:
        """Bernoulli(exp(-gamma)) per entry for ``gamma = numerators / denominator`` (Python ints, CKS20 Alg. 1).

        ``exp(-gamma) = exp(-1)^floor(gamma) exp(-x)``, ``x = gamma - floor(gamma)``: one
        Bernoulli(exp(-1)) per unit of ``floor(gamma)``, then Alg. 1 on ``x`` in [0, 1), whose
        Bernoulli(x/K) is Bernoulli(1/K) and Bernoulli(x) (:meth:`bernoulli_fraction`).
        """
        scaled = (numerators << 64) // denominator  # floor(gamma 2^64): floor(gamma) and x's first 64 bits
        whole = (scaled >> 64).astype(np.int64)
        top = (scaled & _WORD).astype(np.uint64)
        alive = np.ones(whole.size, dtype=bool)
        units, left = 0, np.flatnonzero(whole > 0)
        while left.size:  # each entry stops at its first failure: about log(n) passes, whatever floor(gamma)
            alive[left] = self.bernoulli_exp_minus_one(left.size)
            units += 1
            left = left[alive[left] & (whole[left] > units)]
        live = np.flatnonzero(alive)

        def next_bits(rows: np.ndarray) -> np.ndarray:  # x 2^64 - top = (num 2^64 - scaled den) / den
            return np.asarray(numerators[rows] * (1 << 64) - scaled[rows] * denominator, dtype=object)

        def over_k(i: np.ndarray, k: int) -> np.ndarray:
            hit: np.ndarray = self.integers_below(k, i.size) == 0
            rows = live[i[hit]]
            hit[hit] = self.bernoulli_fraction(top[rows], lambda tie: next_bits(rows[tie]), denominator)
            return hit

        alive[live] = self._bernoulli_exp_unit(over_k, live.size)
        return alive

    def bernoulli_fraction(
        self, top: np.ndarray, rest: Callable[[np.ndarray], np.ndarray], denominator: int
    ) -> np.ndarray:
        """Bernoulli(x) per entry for ``x`` in [0, 1) given by its first 64 bits and the rest, exact.

        A uniform ``U`` in [0, 1) is compared with ``x`` 64 bits at a time: a keystream word ``w``
        against ``top = floor(x 2^64)``; ``U < x`` is decided unless they are equal (probability
        ``2^-64``), and then the next 64 bits: ``x' = x 2^64 - top = rest / denominator``
        (``rest(tie)``: those numerators, Python ints, for the tied entries).
        """
        w = self.words(top.size)
        out = w < top
        tie = np.flatnonzero(w == top)
        if tie.size:
            remainder = np.asarray(rest(tie), dtype=object)
            shifted = remainder << 64
            head = shifted // denominator
            out[tie] = self.bernoulli_fraction(
                head.astype(np.uint64), lambda t: shifted[t] - head[t] * denominator, denominator
            )
        return out

    def integers_below(self, bound: int, n: int) -> np.ndarray:
        """``n`` uniform integers on {0, ..., bound - 1} (``1 <= bound <= 2^63``), by rejection on masked words."""
        mask = (1 << (int(bound) - 1).bit_length()) - 1
        out = self.words(n) & np.uint64(mask)
        bad = np.flatnonzero(out >= np.uint64(bound))
        while bad.size:
            out[bad] = self.words(bad.size) & np.uint64(mask)
            bad = bad[out[bad] >= np.uint64(bound)]
        integers: np.ndarray = out.astype(np.int64)
        return integers

    @staticmethod
    def _bernoulli_exp_unit(bernoulli_over_k: Callable[[np.ndarray, int], np.ndarray], n: int) -> np.ndarray:
        """Bernoulli(exp(-gamma)) for gamma in [0, 1] (CKS20 Alg. 1), vectorised.

        ``bernoulli_over_k(i, K)`` draws Bernoulli(gamma_i / K) for the entries ``i``; each entry
        stops at its first failure, at ``K``, and the result is ``K`` odd.
        """
        out = np.zeros(int(n), dtype=bool)
        active = np.arange(int(n))
        k = 1
        while active.size:
            hit = bernoulli_over_k(active, k)
            out[active[~hit]] = k % 2 == 1
            active = active[hit]
            k += 1
        return out


def exact_variance(sigma: float) -> Fraction:
    """``sigma^2`` rounded up onto the grid ``2^-VARIANCE_BITS``: the variance the exact sampler draws.

    The float ``sigma`` is squared exactly (as a rational) and rounded up, so the drawn noise is never
    below the calibrated one and the privacy guarantee only improves (by a relative ``< 2^-46 / sigma^2``).
    """
    scaled = Fraction(float(sigma)) ** 2 * (1 << VARIANCE_BITS)
    return Fraction(math.ceil(scaled), 1 << VARIANCE_BITS)


def _shape(size: Size) -> tuple[int, ...]:
    return tuple(int(d) for d in np.atleast_1d(size)) if not isinstance(size, tuple) else size
