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

import numpy as np

from protocols.batch import batched_weighted_mean


def batched_central_moments(protocol, tag: str, rnd: int, layers: list[dict[int, np.ndarray]], orders, *,
                            spec=None) -> list[tuple[np.ndarray, dict[int, np.ndarray]]]:
    """``layers[l]``: client -> ``[n_k, d_l]`` samples of hidden layer ``l + 1`` (the same nodes in
    every layer).  Returns per layer ``(mu [d_l], {j: E[(z - mu)^j] [d_l]})``."""
    first = layers[0]
    counts = {k: float(a.shape[0]) for k, a in first.items()}
    names = [f"{tag}/hidden{l + 1}" for l in range(len(layers))]

    means = {f"{n}/mean": {k: (a.mean(axis=0) if a.shape[0] else np.zeros(a.shape[1])) for k, a in s.items()}
             for n, s in zip(names, layers)}
    mu = batched_weighted_mean(protocol, f"{tag}/stats/mean", rnd, means, counts, spec=spec)
    moments = {}
    for n, s in zip(names, layers):
        m = mu[f"{n}/mean"]
        moments[f"{n}/moments"] = {k: np.stack([((a - m) ** j).mean(axis=0) if a.shape[0] else np.zeros(a.shape[1])
                                                for j in orders]) for k, a in s.items()}
    mom = batched_weighted_mean(protocol, f"{tag}/stats/moments", rnd, moments, counts, spec=spec)
    return [(mu[f"{n}/mean"], {j: mom[f"{n}/moments"][i] for i, j in enumerate(orders)}) for n in names]
