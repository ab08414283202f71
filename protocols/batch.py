"""Batched small exchanges: several tags' weighted means of one round in one upload per client.

A secure backend pays whole transport units (a CKKS ciphertext carries 2048-4096 slots) per
exchange, so four 65-value statistics exchanges cost four ciphertexts per client where one
would hold them all.  :func:`batched_weighted_mean` concatenates the contributions of several
tags that share their weights into one vector per client,

    ``u_k = [w_k, w_k v_k^(1), ..., w_k v_k^(T)]``,

sums it with one :meth:`~protocols.base.Protocol.weighted_sum` under the batch tag, and returns
``sum_k w_k v_k^(t) / sum_k w_k`` for every part ``t``: the same means as ``T`` separate
:meth:`~protocols.base.Protocol.weighted_mean` calls (which each send ``[w_k v_k^(t), w_k]``),
with the weight sent once.  The server learns what it learns from one weighted mean.

Byte attribution: the transcript records one message per client under the batch tag and the
batch's layout (:meth:`Transcript.attribute`); :func:`split_per_tag` divides every byte
count of the batch tag -- wire bytes and the float32 baseline -- among the part tags in
proportion to their entries (the shared weight entry and the remainder of the integer
division go to the last part), so ``comm()['per_tag']`` still lists every part tag and its
byte counts sum to the total.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from . import validate
from .errors import ConfigurationError, ShapeError

#: per-tag counters that are split among a batch's parts
SPLIT_KEYS = ("bytes_up", "bytes_down", "bytes_p2p", "plaintext_bytes_up", "plaintext_bytes_down")


def batched_weighted_mean(protocol, tag: str, rnd: int, parts: Mapping[str, Mapping[int, np.ndarray]],
                          weights: Mapping[int, float], *, spec=None,
                          recipients: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The weighted means of every part, from one upload per client (module doc).

    parts:   part tag -> client -> array (every part: the same clients; shapes may differ
             between parts, not between clients);
    weights: client -> ``w_k >= 0`` shared by every part.
    Returns part tag -> mean (the part's shape).  No DP: a DP exchange keeps one tag per
    release (its own clip and sensitivity); call :meth:`Protocol.weighted_mean` per part then.
    """
    if not parts:
        raise ConfigurationError("a batch needs at least one part", tag=tag, round=rnd)
    clients = None
    shapes, flat = {}, {}
    for name, values in parts.items():
        arrays = protocol._dense_inputs(name, rnd, values)
        if clients is None:
            clients = sorted(arrays)
        elif sorted(arrays) != clients:
            raise ShapeError(f"part {name!r} has contributions from clients {sorted(arrays)}, the batch's first "
                             f"part from {clients}", tag=tag, round=rnd)
        shapes[name] = next(iter(arrays.values())).shape
        flat[name] = arrays
    w = validate.weights(weights, {k: None for k in clients}, tag, rnd) or {k: 1.0 for k in clients}
    vectors = {k: batch_vector([flat[name][k] for name in parts], w[k]) for k in clients}
    protocol.transcript.attribute(tag, tuple(zip(parts, (int(np.prod(s)) for s in shapes.values()))))
    total = protocol.weighted_sum(tag, rnd, vectors, spec=spec, recipients=recipients)
    return dict(zip(parts, batch_means(total, list(shapes.values()), tag, rnd)))


def batch_vector(parts: Sequence[np.ndarray], weight: float) -> np.ndarray:
    """One client's upload of a batch: ``[w, w v^(1), ..., w v^(T)]`` (each part flattened)."""
    return np.concatenate([[weight]] + [np.asarray(p).ravel() * weight for p in parts])


def batch_means(total: np.ndarray, shapes: Sequence[tuple[int, ...]], tag: str, rnd: int) -> list[np.ndarray]:
    """Every part's weighted mean ``sum_k w_k v_k^(t) / sum_k w_k`` from the summed batch vector."""
    if not total[0] > 0:
        raise ConfigurationError("the weights sum to zero; give at least one client a positive weight",
                                 tag=tag, round=rnd)
    out, start = [], 1
    for shape in shapes:
        size = int(np.prod(shape))
        out.append((total[start:start + size] / total[0]).reshape(shape))
        start += size
    return out


def split_per_tag(per_tag: dict[str, dict], batches: Mapping[str, tuple[tuple[str, int], ...]]) -> None:
    """Replace each batch tag's counters in ``per_tag`` by its parts' shares (module doc), in place."""
    for batch, layout in batches.items():
        slot = per_tag.pop(batch, None)
        if slot is None:
            continue
        total_entries = sum(n for _, n in layout) or 1
        for i, (name, n) in enumerate(layout):
            part = per_tag.setdefault(name, {"bytes_up": 0, "bytes_down": 0, "bytes_p2p": 0, "messages": 0})
            part["messages"] = part.get("messages", 0) + slot.get("messages", 0)
            part["batched_in"] = batch
            for key in SPLIT_KEYS:
                if key not in slot:
                    continue
                value = slot[key]
                share = value - sum(value * m // total_entries for _, m in layout[:-1]) \
                    if i == len(layout) - 1 else value * n // total_entries
                part[key] = part.get(key, 0) + share
