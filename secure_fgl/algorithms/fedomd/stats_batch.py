"""FedOMD's statistics of every hidden layer in two batched stages (:mod:`protocols.batch`).

Eq. 10 needs the global mean before the central moments about it, so the floor is two
uploads per client per round; without batching each hidden layer pays both
(:meth:`protocols.Protocol.central_moments`, ``2 L`` uploads).  Here stage 1 (batch tag
``<tag>/stats/mean``) carries every layer's ``[n_k, n_k mu_k^(l)]`` and stage 2 (``<tag>/stats/moments``)
every layer's ``n_k m_j^(k,l)``, ``m_j^(k,l) = mean_i (z_i^l - mu^l)^j``: the same pooled statistics
as the per-layer exchanges, whose tags (``<tag>/hidden<l>/mean|moments``) keep their byte shares
in the transcript.
"""

from __future__ import annotations

from math import comb

import numpy as np

from protocols.batch import batched_weighted_mean


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

    ``higher`` holds ``E[z^2..J]``; the binomial expansion is that of :func:`one_stage_raw_moments`.
    """
    raw = [np.ones_like(mu), mu, *higher]  # E[z^0..J]
    return {j: sum(comb(j, i) * raw[i] * (-mu) ** (j - i) for i in range(j + 1)) for j in orders}


def layer_names(tag: str, num_layers: int) -> list[str]:
    """``<tag>/hidden<l>`` for ``l = 1..num_layers``: the part tags of every batch."""
    return [f"{tag}/hidden{l + 1}" for l in range(num_layers)]


def batched_central_moments(
    protocol, tag: str, rnd: int, layers: list[dict[int, np.ndarray]], orders, *, spec=None
) -> list[tuple[np.ndarray, dict[int, np.ndarray]]]:
    """``layers[l]``: client -> ``[n_k, d_l]`` samples of hidden layer ``l + 1`` (the same nodes in every layer).

    Returns per layer ``(mu [d_l], {j: E[(z - mu)^j] [d_l]})``.
    """
    counts = {k: float(a.shape[0]) for k, a in layers[0].items()}
    names = layer_names(tag, len(layers))
    means = {f"{n}/mean": {k: local_mean(a) for k, a in s.items()} for n, s in zip(names, layers)}
    mu = batched_weighted_mean(protocol, f"{tag}/stats/mean", rnd, means, counts, spec=spec)
    moments = {
        f"{n}/moments": {k: local_central_moments(a, mu[f"{n}/mean"], orders) for k, a in s.items()}
        for n, s in zip(names, layers)
    }
    mom = batched_weighted_mean(protocol, f"{tag}/stats/moments", rnd, moments, counts, spec=spec)
    return [(mu[f"{n}/mean"], {j: mom[f"{n}/moments"][i] for i, j in enumerate(orders)}) for n in names]


def one_stage_raw_moments(
    protocol, tag: str, rnd: int, layers: list[dict[int, np.ndarray]], orders, *, spec=None
) -> list[tuple[np.ndarray, dict[int, np.ndarray]]]:
    """The same statistics from one upload per client per round.

    The same statistics from ONE upload per client per round (``raw_moments`` option): every
    layer's raw moments ``n_k E_k[z^p]``, ``p = 1..J``, in one batch (tag ``<tag>/stats/raw``; the
    ``p = 1`` part is attributed to ``<tag>/hidden<l>/mean``, the rest to ``.../moments``), and the
    central moments from the binomial expansion

        ``E[(z - mu)^j] = sum_{i=0..j} C(j, i) E[z^i] (-mu)^(j-i)``,  ``mu = E[z]``.

    Precision trade (stated): each pooled raw moment carries the codec's error ``delta``; with
    ``|mu| <= m`` the expansion multiplies it by at most ``sum_i C(j, i) m^(j-i) = (1 + m)^j``
    (``2^j`` for activations in ``[0, 1]``: 32 ``delta`` at ``j = 5``), against ``delta`` for the
    two-stage exchange, and float64 cancellation adds ~``2^j * 2^-52``.
    """
    counts = {k: float(a.shape[0]) for k, a in layers[0].items()}
    names = layer_names(tag, len(layers))
    top = max(orders)
    parts = {}
    for n, s in zip(names, layers):
        raw = {k: local_raw_moments(a, top) for k, a in s.items()}
        parts[f"{n}/mean"] = {k: r[0] for k, r in raw.items()}
        parts[f"{n}/moments"] = {k: r[1:] for k, r in raw.items()}
    pooled = batched_weighted_mean(protocol, f"{tag}/stats/raw", rnd, parts, counts, spec=spec)
    return [(pooled[f"{n}/mean"], central_from_raw(pooled[f"{n}/mean"], pooled[f"{n}/moments"], orders)) for n in names]
