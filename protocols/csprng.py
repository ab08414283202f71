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
  - geometric variables by inversion, ``G = floor(ln U / ln(1 - p))`` (P[G = k] = (1-p)^k p);
  - discrete Gaussians N_Z(0, sigma^2) by Canonne-Kamath-Steinke 2020 (Alg. 3): a discrete
    Laplace proposal ``Y = G1 - G2`` of scale ``t = floor(sigma) + 1``, accepted with
    probability ``exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2))``.  The samples are integers.

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
* *Timing*: the rejection loop of the discrete sampler is vectorised; in rejection
  sampling the number of trials is independent of the accepted value, so the running time
  reveals nothing about the noise added to an entry.  The acceptance test itself uses
  float ``exp`` (a bias of order 2^-53 in the acceptance probability; CKS20 §5 give an
  exact integer-arithmetic variant, not implemented here).
"""

from __future__ import annotations

import math
import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_CHUNK = 1 << 20  # entries per rejection round of the discrete sampler


class SecureRandom:
    """Uniform, Gaussian and discrete Gaussian samples from an OS-keyed AES-256-CTR keystream.

    Uniforms, Gaussians and discrete Gaussians from an AES-256-CTR keystream keyed by
    ``os.urandom(32)`` (see module docstring).  Not picklable and never persisted.
    """

    def __init__(self) -> None:
        self._encryptor = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(bytes(16))).encryptor()

    def __reduce__(self):
        raise TypeError("SecureRandom holds a secret key and is never serialised")

    def words(self, n: int) -> np.ndarray:
        """``n`` uniformly random uint64 words (the next 8n keystream bytes)."""
        return np.frombuffer(self._encryptor.update(bytes(8 * int(n))), dtype="<u8")

    def uniform(self, size) -> np.ndarray:
        """Uniform on the 53-bit grid of [0, 1)."""
        shape = _shape(size)
        return ((self.words(math.prod(shape)) >> np.uint64(11)) * 2.0**-53).reshape(shape)

    def uniform_open(self, size) -> np.ndarray:
        """Uniform on the 53-bit grid shifted by half a step: values in (0, 1), never 0 or 1."""
        shape = _shape(size)
        return (((self.words(math.prod(shape)) >> np.uint64(11)) + 0.5) * 2.0**-53).reshape(shape)

    def standard_normal(self, size) -> np.ndarray:
        """N(0, 1) samples by Box-Muller on 53-bit open uniforms."""
        shape = _shape(size)
        n = math.prod(shape)
        u1, u2 = self.uniform_open((n,)), self.uniform((n,))
        return (np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)).reshape(shape)

    def geometric(self, p: np.ndarray) -> np.ndarray:
        """Failures before the first success, P[G = k] = (1-p)^k p, per entry of ``p``."""
        p = np.asarray(p, dtype=np.float64)
        return np.floor(np.log(self.uniform_open(p.shape)) / np.log1p(-p))

    def discrete_gaussian(self, sigma, size) -> np.ndarray:
        """Integer-valued discrete Gaussian samples N_Z(0, sigma^2).

        Integer-valued N_Z(0, sigma^2) samples (float64 holding integers) by CKS20 Alg. 3;
        ``sigma`` broadcasts to ``size`` (per-entry std; entries with sigma <= 0 are 0).
        """
        shape = _shape(size)
        sig = np.broadcast_to(np.asarray(sigma, dtype=np.float64), shape).reshape(-1)
        out = np.zeros(sig.size)
        todo = np.flatnonzero(sig > 0)
        while todo.size:
            idx = todo[:_CHUNK]
            s = sig[idx]
            t = np.floor(s) + 1.0
            p = -np.expm1(-1.0 / t)  # 1 - exp(-1/t)
            y = self.geometric(p) - self.geometric(p)
            accept = self.uniform(idx.size) < np.exp(-((np.abs(y) - s * s / t) ** 2) / (2.0 * s * s))
            out[idx[accept]] = y[accept]
            todo = np.concatenate([idx[~accept], todo[_CHUNK:]])
        return out.reshape(shape)


def _shape(size) -> tuple[int, ...]:
    return tuple(int(d) for d in np.atleast_1d(size)) if not isinstance(size, tuple) else size
