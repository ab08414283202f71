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

Exchanges that do not share weights (FedSpray's encoder mean and class-wise proxy mean) batch
their whole upload vectors: :func:`batched_sum` sums ``u_k = [u_k^(1), ..., u_k^(T)]`` once and
hands every part its slice of the total, which the part post-processes as its own exchange would
(a mean divides by its weight entry, a class-wise mean by its class totals).  One encoding must
hold every part: :func:`batch_spec` takes the widest bound and the finest tolerance of the parts'
specs and refuses parts it cannot merge without changing their values (integer parts, different
grids); callers then keep separate exchanges.

Clear-text reports (GCFL's norms) batch the same way: :func:`batched_report` sends every report
tag's value of one stage in one signed message per client (:func:`protocols.similarity.report_vectors`)
and attributes its bytes to the part tags, one entry each.

Byte attribution: the transcript records one message per client under the batch tag and the
batch's layout (:meth:`Transcript.attribute`); :meth:`Transcript.comm` divides every byte
count of the batch tag -- wire bytes and the float32 baseline -- among the part tags in
proportion to their entries (the shared weight entry and the remainder of the integer
division go to the last part), so ``comm()['per_tag']`` still lists every part tag and its
byte counts sum to the total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from . import validate
from .errors import ConfigurationError, ShapeError
from .exchange import ValueSpec
from .similarity import report_vectors

if TYPE_CHECKING:
    from .base import Protocol
    from .halves import HalvesProtocol


def batched_weighted_mean(
    protocol: Protocol,
    tag: str,
    rnd: int,
    parts: Mapping[str, Mapping[int, np.ndarray]],
    weights: Mapping[int, float],
    *,
    spec: ValueSpec | None = None,
    recipients: Sequence[int] | None = None,
) -> dict[str, np.ndarray]:
    """The weighted means of every part, from one upload per client (module doc).

    parts:   part tag -> client -> array (every part: the same clients; shapes may differ
             between parts, not between clients);
    weights: client -> ``w_k >= 0`` shared by every part.
    Returns part tag -> mean (the part's shape).  No DP: a DP exchange keeps one tag per
    release (its own clip and sensitivity); call :meth:`Protocol.weighted_mean` per part then.
    """
    clients, shapes, flat = checked_parts(protocol, tag, rnd, parts)
    w = validate.weights(weights, {k: None for k in clients}, tag, rnd) or {k: 1.0 for k in clients}
    vectors = {k: batch_vector([flat[name][k] for name in parts], w[k]) for k in clients}
    protocol.transcript.attribute(tag, tuple(zip(parts, (int(np.prod(s)) for s in shapes.values()))))
    total = protocol.weighted_sum(tag, rnd, vectors, spec=spec, recipients=recipients)
    return dict(zip(parts, batch_means(total, list(shapes.values()), tag, rnd)))


def checked_parts(
    protocol: Protocol, tag: str, rnd: int, parts: Mapping[str, Mapping[int, np.ndarray]]
) -> tuple[list[int], dict[str, tuple[int, ...]], dict[str, dict[int, np.ndarray]]]:
    """Every part's contributions, checked as in an exchange of its own.

    Every part's contributions checked by the client-side input checks of an exchange of its own
    (finite reals, one shape per part; :class:`~protocols.errors.NonFiniteError`,
    :class:`~protocols.errors.ShapeError` name the part) and the same clients in every part.
    Returns ``(clients, part -> shape, part -> client -> array)``.
    """
    if not parts:
        raise ConfigurationError("a batch needs at least one part", tag=tag, round=rnd)
    clients: list[int] | None = None
    shapes: dict[str, tuple[int, ...]] = {}
    flat: dict[str, dict[int, np.ndarray]] = {}
    for name, values in parts.items():
        arrays = protocol._dense_inputs(name, rnd, values)
        if clients is None:
            clients = sorted(arrays)
        elif sorted(arrays) != clients:
            raise ShapeError(
                f"part {name!r} has contributions from clients {sorted(arrays)}, the batch's first part from {clients}",
                tag=tag,
                round=rnd,
            )
        shapes[name] = next(iter(arrays.values())).shape
        flat[name] = arrays
    return cast(list[int], clients), shapes, flat  # parts is not empty


def batched_sum(
    protocol: Protocol,
    tag: str,
    rnd: int,
    parts: Mapping[str, Mapping[int, np.ndarray]],
    spec: ValueSpec,
    *,
    recipients: Sequence[int] | None = None,
) -> dict[str, np.ndarray]:
    """The sum of every part of a batch from one upload per client.

    ``sum_k u_k^(t)`` of every part ``t`` from one upload ``[u_k^(1), ..., u_k^(T)]`` per client
    (module doc), under the batch tag and ``spec`` (:func:`batch_spec` of the parts' specs).  No DP
    (see :func:`batched_weighted_mean`).  Returns part tag -> its total (the part's shape).
    """
    clients, shapes, flat = checked_parts(protocol, tag, rnd, parts)
    sizes = [int(np.prod(s)) for s in shapes.values()]
    protocol.transcript.attribute(tag, tuple(zip(parts, sizes)))
    vectors = {k: np.concatenate([flat[name][k].ravel() for name in parts]) for k in clients}
    total = protocol.weighted_sum(tag, rnd, vectors, spec=spec, recipients=recipients)
    return {name: piece.reshape(shape) for (name, shape), piece in zip(shapes.items(), split_total(total, sizes))}


def batched_report(
    protocol: HalvesProtocol, tag: str, rnd: int, parts: Mapping[str, Mapping[int, float]]
) -> dict[str, dict[int, float]]:
    """Every part's clear-text scalar from one report per client.

    Each client reports ``[x_k^(1), ..., x_k^(T)]`` (module doc). The same clients in every part
    (:class:`~protocols.errors.ShapeError`) and finite values (:class:`~protocols.errors.NonFiniteError`) are
    checked before anything is sent. Returns part tag -> client -> what the server got.
    """
    if not parts:
        raise ConfigurationError("a batch needs at least one part", tag=tag, round=rnd)
    names = list(parts)
    clients = sorted(int(k) for k in parts[names[0]])
    for name in names[1:]:
        if sorted(int(k) for k in parts[name]) != clients:
            raise ShapeError(
                f"part {name!r} has reports from clients {sorted(parts[name])}, the batch's first part from {clients}",
                tag=tag,
                round=rnd,
            )
    got = report_vectors(protocol, tag, rnd, {k: [parts[n][k] for n in names] for k in clients})
    return report_parts(protocol, tag, names, got)


def report_parts(
    protocol: Protocol, tag: str, names: Sequence[str], got: Mapping[int, np.ndarray]
) -> dict[str, dict[int, float]]:
    """A batched report's vectors split back into its parts.

    A batched report's vectors (client -> ``[x^(1), ..., x^(T)]``) as part tag -> client -> value, the
    batch's bytes attributed to the part tags (one entry per client each).
    """
    protocol.transcript.attribute(tag, tuple((n, len(got)) for n in names))
    return {n: {int(k): float(np.asarray(v).ravel()[i]) for k, v in got.items()} for i, n in enumerate(names)}


def split_total(total: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    """The summed batch vector cut into its parts' slices (``sizes``: entries per part, in order)."""
    if int(np.sum(sizes)) != np.asarray(total).size:
        raise ShapeError(f"a batch total of {np.asarray(total).size} entries cannot hold parts of {list(sizes)}")
    return np.split(np.asarray(total, dtype=np.float64).ravel(), np.cumsum(sizes)[:-1])


def batch_spec(specs: Sequence[ValueSpec]) -> ValueSpec | None:
    """One :class:`~protocols.base.ValueSpec` for a batch of parts.

    See the module doc. The largest ``max_abs``, the smallest ``tolerance``, a float64 plain wire if any part has one.
    ``None`` where a part is integer or the parts' grids differ (a part put on another part's grid would change its
    values), and where the specs are equal, that spec.
    """
    specs = list(specs)
    if all(s == specs[0] for s in specs):
        return specs[0]
    if any(s.integer for s in specs) or len({s.grid_bits for s in specs}) > 1:
        return None
    return ValueSpec(
        max_abs=max(s.max_abs for s in specs),
        tolerance=min(s.tolerance for s in specs),
        owner_checked_sum=all(s.owner_checked_sum for s in specs),
        float64_wire=any(s.float64_wire for s in specs),
        grid_bits=specs[0].grid_bits,
    )


def batch_vector(parts: Sequence[np.ndarray], weight: float) -> np.ndarray:
    """One client's upload of a batch: ``[w, w v^(1), ..., w v^(T)]`` (each part flattened)."""
    return np.concatenate([[weight]] + [np.asarray(p).ravel() * weight for p in parts])


def batch_means(total: np.ndarray, shapes: Sequence[tuple[int, ...]], tag: str, rnd: int) -> list[np.ndarray]:
    """Every part's weighted mean ``sum_k w_k v_k^(t) / sum_k w_k`` from the summed batch vector."""
    if not total[0] > 0:
        raise ConfigurationError(
            "the weights sum to zero; give at least one client a positive weight", tag=tag, round=rnd
        )
    out, start = [], 1
    for shape in shapes:
        size = int(np.prod(shape))
        out.append((total[start : start + size] / total[0]).reshape(shape))
        start += size
    return out
