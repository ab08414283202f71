"""Batched small exchanges: several tags' values of one round in one upload per client.

A secure backend pays whole transport units (a CKKS ciphertext carries 2048-4096 slots) per
exchange, so four 65-value statistics exchanges cost four ciphertexts per client where one
would hold them all.  The algorithms batch over the client runtimes (:mod:`secure_fgl.runtime.sums`):
each client builds one vector holding every part, the server moves one sum under the batch tag,
and each recipient cuts the total into its parts.

Parts that share their weights (FedOMD's statistics of every hidden layer) send
:func:`batch_vector`,

    ``u_k = [w_k, w_k v_k^(1), ..., w_k v_k^(T)]``,

and :func:`batch_means` gives every part ``sum_k w_k v_k^(t) / sum_k w_k``: the same means as ``T``
separate :meth:`~protocols.base.Protocol.weighted_mean` calls (which each send ``[w_k v_k^(t), w_k]``),
with the weight sent once.  The server learns what it learns from one weighted mean.

Parts that do not share weights (FedSpray's class-wise proxy mean and encoder mean) concatenate their
whole upload vectors and each part post-processes its slice of the total as its own exchange would.
One encoding must hold every part: :func:`batch_spec` takes the widest bound and the finest tolerance
of the parts' specs and refuses parts it cannot merge without changing their values (integer parts,
different grids); callers then keep separate exchanges.

Clear-text reports (GCFL's norms) batch the same way: each client sends every report tag's value of
one stage in one signed message (:func:`protocols.report.collect_reports` with ``length = T``) and
:func:`report_parts` splits what the server got back into the part tags.

Byte attribution: the transcript records one message per client under the batch tag and the
batch's layout (:meth:`Transcript.attribute`); :meth:`Transcript.comm` divides every byte
count of the batch tag -- wire bytes and the float32 baseline -- among the part tags in
proportion to their entries (the shared weight entry and the remainder of the integer
division go to the last part), so ``comm()['per_tag']`` still lists every part tag and its
byte counts sum to the total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .errors import ConfigurationError
from .exchange import ValueSpec

if TYPE_CHECKING:
    from .base import Protocol


def report_parts(
    protocol: Protocol, tag: str, names: Sequence[str], got: Mapping[int, np.ndarray]
) -> dict[str, dict[int, float]]:
    """A batched report's vectors split back into its parts.

    A batched report's vectors (client -> ``[x^(1), ..., x^(T)]``) as part tag -> client -> value, the
    batch's bytes attributed to the part tags (one entry per client each).
    """
    protocol.transcript.attribute(tag, tuple((n, len(got)) for n in names))
    return {n: {int(k): float(np.asarray(v).ravel()[i]) for k, v in got.items()} for i, n in enumerate(names)}


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
