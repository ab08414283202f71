"""Similarity statistics for clustering.

Exchange shape 4 of docs/design.md; GCFL, Xie et al., NeurIPS 2021, sec. 4. Whoever decides the clusters learns the
``m x m`` cosine-similarity matrix of the members' updates, and the scalars it is told, nothing more.

* :func:`cosine_similarities` -- ``S_ij = <u_i, u_j> / (||u_i|| ||u_j||)``, an exchange of the
  backend's halves (:mod:`protocols.similarity_exchange`; this function plays the members from
  the dict it is given, a client runtime plays its own).
  ``plain``: each member sends its update in the clear (the plain server reads updates anyway).
  ``ckks``: :mod:`protocols.ckks.similarity` -- members upload their normalised updates
  encrypted under a fresh key pair of a designated client, the server evaluates the inner
  products homomorphically, the designated client decrypts and returns only the values.
  ``mask``: refused -- additive masks hide each vector but give no inner products.
* :func:`report_scalars` -- clients send one public scalar each in the clear (GCFL's
  ``||dW_i||`` for eq. 5, the cluster mean's norm for eq. 4, GCFL+'s gradient norms): a
  maximum or a time series cannot be computed under additive HE, so these are the
  documented leak of the decision rule.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import validate
from .errors import ConfigurationError, NonFiniteError, ShapeError
from .exchange import ArrayLike
from .halves import HalvesProtocol
from .registry import similarity_modes
from .report import collect_reports
from .similarity_exchange import cosine_matrix, similarity_over_halves

__all__ = ["cosine_similarities", "report_scalars", "report_vectors", "SIMILARITY_MODES", "cosine_matrix"]

#: modes in which :func:`cosine_similarities` runs
SIMILARITY_MODES = similarity_modes()


def _validated(protocol: HalvesProtocol, tag: str, rnd: int, updates: Mapping[int, ArrayLike]) -> dict[int, np.ndarray]:
    if len(updates) < 2:
        raise ShapeError("similarity statistics need at least two clients", tag=tag, round=rnd)
    return protocol._dense_inputs(
        tag, rnd, {k: validate.real_array(v, tag, rnd, k, "update").ravel() for k, v in updates.items()}
    )


def cosine_similarities(
    protocol: HalvesProtocol, tag: str, rnd: int, updates: Mapping[int, ArrayLike], *, decider: int = 0
) -> np.ndarray:
    """The ``[m, m]`` cosine matrix of ``updates``.

    Rows are in the order of ``updates``. The matrix is known afterwards to the server (the party that decides the
    clusters).
    """
    if protocol.mode not in SIMILARITY_MODES:
        raise ConfigurationError(
            f"similarity statistics need inner products of updates, which --mode "
            f"{protocol.mode} cannot compute: use --mode ckks",
            tag=tag,
            round=rnd,
        )
    arrays = _validated(protocol, tag, rnd, updates)
    if not 0 <= decider < protocol.num_clients:
        raise ConfigurationError(f"decider {decider} is not a client of this run", tag=tag, round=rnd)
    members = [int(k) for k in arrays]
    for k in members:  # the facade plays each member: its half's provider returns its update
        protocol.clients[k].provider = lambda plan, v=arrays[k]: plan.dense_table(v)
    try:
        return similarity_over_halves(protocol, tag, rnd, members, decider, next(iter(arrays.values())).size)
    finally:
        for k in members:
            protocol.clients[k].provider = None


def report_scalars(protocol: HalvesProtocol, tag: str, rnd: int, values: Mapping[int, float]) -> dict[int, float]:
    """Each client sends one float64 to the server in the clear; returns what the server got.

    A backend in halves runs it as a report exchange of its halves (:mod:`protocols.report`).
    """
    got = report_vectors(protocol, tag, rnd, {k: [v] for k, v in values.items()})
    return {k: float(v[0]) for k, v in got.items()}


def report_vectors(
    protocol: HalvesProtocol, tag: str, rnd: int, values: Mapping[int, ArrayLike]
) -> dict[int, np.ndarray]:
    """Each client sends the server one float64 vector in the clear.

    Each client sends one float64 vector (the same length for all) to the server in the clear, in
    one message; returns what the server got.  Checked on the client first: a NaN or inf
    (:class:`~protocols.errors.NonFiniteError`) or a length unlike the others'
    (:class:`~protocols.errors.ShapeError`) and nothing is sent.
    """
    vectors = {int(k): np.asarray(v, dtype=np.float64).ravel() for k, v in values.items()}
    lengths = {v.size for v in vectors.values()}
    if len(lengths) > 1 or 0 in lengths:
        raise ShapeError(
            f"reports of {sorted(lengths)} values: every client reports the same number (> 0)", tag=tag, round=rnd
        )
    for k, v in vectors.items():
        if not np.isfinite(v).all():
            raise NonFiniteError("reported scalar is NaN or inf", tag=tag, round=rnd, client=k)
    if not protocol.clients:
        raise ConfigurationError(
            "the clients' reports are in this process but their halves are not: with a link, each "
            "client runtime reports its own values (protocols.report.client_report)",
            tag=tag,
            round=rnd,
        )
    return _report_through_halves(protocol, tag, rnd, vectors)


def _report_through_halves(
    protocol: HalvesProtocol, tag: str, rnd: int, values: Mapping[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """The facade plays each reporting client: its half's provider returns its values."""
    for k, v in values.items():
        protocol.clients[int(k)].provider = lambda plan, v=v: plan.dense_table(v)
        protocol.clients[int(k)].clear_tags.add(tag)  # the caller reports these values in the clear
    length = next(iter(values.values())).size
    try:
        got = collect_reports(protocol, tag, rnd, [int(k) for k in values], length)
        return {k: np.asarray(v, dtype=np.float64).ravel() for k, v in got.items()}
    finally:
        for k in values:
            protocol.clients[int(k)].provider = None
            protocol.clients[int(k)].clear_tags.discard(tag)
