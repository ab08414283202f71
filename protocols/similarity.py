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
* Clear-text reports (:mod:`protocols.report`): each client sends one public scalar in the clear
  (GCFL's ``||dW_i||`` for eq. 5, the cluster mean's norm for eq. 4, GCFL+'s gradient norms): a
  maximum or a time series cannot be computed under additive HE, so these are the documented
  leak of the decision rule.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import validate
from .errors import ConfigurationError, ShapeError
from .exchange import ArrayLike
from .halves import HalvesProtocol
from .registry import similarity_modes
from .similarity_exchange import cosine_matrix, similarity_over_halves

__all__ = ["cosine_similarities", "SIMILARITY_MODES", "cosine_matrix"]

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
