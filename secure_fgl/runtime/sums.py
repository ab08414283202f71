"""One dense sum ``sum_k u_k`` of the contributors' vectors, delivered to the recipients.

Every small exchange of FedOMD and FedSpray is, on the wire, the sum of one flat vector per
client (:meth:`protocols.base.Protocol._sum_vectors`): a weighted mean sends ``[w_k v_k, w_k]``,
a batch ``[w_k, w_k v_k^(1), ...]`` (:func:`protocols.batch.batch_vector`), a class-wise mean
``[w_k * S_k, w_k]``.  The client builds its vector and post-processes the total itself; the
strategy only moves the sum:

* client side: :func:`offer` (the vector kept for the client's protocol half, answering only its
  length; on the driver-side path, the vector itself) and :func:`summed` (the client's own decoded
  total, or the one delivered);
* server side: :func:`sum_exchange` (plan the dense exchange from the public length, run the server
  half, tell the recipients; on the driver-side path, :meth:`~protocols.base.Protocol.weighted_sum`).

The planned blocking is that of ``_sum_vectors`` (:func:`~.exchange.plan_dense`), so the
transcript counts the same bytes as the in-process algorithm's exchange.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from protocols import DropoutError

from .exchange import dense_result, plan_dense, run_split


def offer(logic, req: dict, vector: np.ndarray) -> dict:
    """Client side of ``contribute``: ``vector`` for the sum ``req['tag']``."""
    vector = np.asarray(vector, dtype=np.float64)
    if req.get("split"):
        logic.keep(req["tag"], vector)
        return {"length": int(vector.size)}
    return {"vector": vector}


def summed(logic, req: dict) -> np.ndarray:
    """Client side of ``receive``: the total of the sum ``req['tag']``."""
    if "total" in req:
        return np.asarray(req["total"], dtype=np.float64)
    return dense_result(logic.rt.half.result(), int(req["length"]))


def mean_vector(values, weight: float) -> np.ndarray:
    """A weighted mean's upload ``[w v, w]`` (:meth:`protocols.base.Protocol.weighted_mean`)."""
    return np.concatenate([np.asarray(values, dtype=np.float64).ravel() * weight, [weight]])


def mean_of(total: np.ndarray, tag: str) -> np.ndarray:
    """``sum_k w_k v_k / sum_k w_k`` from the summed :func:`mean_vector`."""
    if not total[-1] > 0:
        raise ValueError(f"the weights of {tag} sum to {total[-1]}; no contributor had a positive weight")
    return total[:-1] / total[-1]


def sum_exchange(strategy, tag: str, rnd: int, contributors: Iterable[int], recipients: Iterable[int], spec,
                 fields: dict | None = None) -> None:
    """Ask ``contributors`` for their vectors of ``tag``, sum them through the protocol and have every
    live recipient receive the total (``fields`` go with both requests).  A client lost before the
    exchange is not a contributor; one lost during it is the backend's dropout."""
    fields = dict(fields or {})
    ask = {"tag": tag, "round": rnd, "split": strategy.split, **fields}
    sent = strategy.ask("contribute", {k: ask for k in contributors})
    if not sent:
        raise DropoutError(f"every contributor of {tag} was lost: {sorted(strategy.lost)}", tag=tag, round=rnd)
    recipients = strategy.alive(recipients)
    protocol = strategy.protocol
    if strategy.split:                               # the clients' halves run the exchange
        length = int(next(iter(sent.values()))["length"])
        run_split(protocol, plan_dense(protocol, tag, rnd, sorted(sent), recipients, length, spec))
        result = {"length": length}
    else:
        result = {"total": protocol.weighted_sum(tag, rnd, {k: r["vector"] for k, r in sent.items()}, spec=spec,
                                                 recipients=recipients)}
    strategy.tell("receive", {k: {"tag": tag, "round": rnd, **fields, **result} for k in strategy.alive(recipients)})
