"""A client's statistics of every hidden layer for FedOMD's batched stages (:mod:`protocols.batch`).

Eq. 10 needs the global mean before the central moments about it, so the floor is two
uploads per client per round; without batching each hidden layer pays both
(:meth:`protocols.Protocol.central_moments`, ``2 L`` uploads).  Here stage 1 (batch tag
``<tag>/stats/mean``) carries every layer's ``[n_k, n_k mu_k^(l)]`` and stage 2 (``<tag>/stats/moments``)
every layer's ``n_k m_j^(k,l)``, ``m_j^(k,l) = mean_i (z_i^l - mu^l)^j``: the same pooled statistics
as the per-layer exchanges, whose tags (``<tag>/hidden<l>/mean|moments``) keep their byte shares
in the transcript.  With ``raw_moments`` one stage (``<tag>/stats/raw``) carries every layer's raw moments
``n_k E_k[z^p]``, ``p = 1..J``, and the central ones follow by the binomial expansion (:func:`central_from_raw`).
"""

from __future__ import annotations

from math import comb

import numpy as np


def local_mean(a: np.ndarray) -> np.ndarray:
    """``E_k[z]`` over a client's ``[n_k, d]`` samples (zeros without samples)."""
    return a.mean(axis=0) if a.shape[0] else np.zeros(a.shape[1])


def local_central_moments(a: np.ndarray, mu: np.ndarray, orders) -> np.ndarray:
    """``[E_k[(z - mu)^j] for j in orders]`` about the pooled mean ``mu`` (``[J, d]``)."""
    return np.stack([local_mean((a - mu) ** j) for j in orders])


def local_raw_moments(a: np.ndarray, top: int) -> np.ndarray:
    """``[E_k[z^p] for p = 1..top]`` (``[top, d]``)."""
    return np.stack([local_mean(a**p) for p in range(1, top + 1)])


def central_from_raw(mu: np.ndarray, higher: np.ndarray, orders) -> dict[int, np.ndarray]:
    """Central moments from the pooled raw ones.

    ``higher`` holds ``E[z^2..J]``; ``E[(z - mu)^j] = sum_{i=0..j} C(j, i) E[z^i] (-mu)^(j-i)``,  ``mu = E[z]``.
    """
    raw = [np.ones_like(mu), mu, *higher]  # E[z^0..J]
    return {j: sum(comb(j, i) * raw[i] * (-mu) ** (j - i) for i in range(j + 1)) for j in orders}


def layer_names(tag: str, num_layers: int) -> list[str]:
    """``<tag>/hidden<l>`` for ``l = 1..num_layers``: the part tags of every batch."""
    return [f"{tag}/hidden{l + 1}" for l in range(num_layers)]
