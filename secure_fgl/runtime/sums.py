"""One dense sum ``sum_k u_k`` of the contributors' vectors, delivered to the recipients.

Every small exchange of FedOMD and FedSpray is, on the wire, the sum of one flat vector per
client (:meth:`protocols.base.Protocol._sum_vectors`): a weighted mean sends ``[w_k v_k, w_k]``,
a batch ``[w_k, w_k v_k^(1), ...]`` (:func:`protocols.batch.batch_vector`), a class-wise mean
``[w_k * S_k, w_k]``.  The client builds its vector and post-processes the total itself; the
strategy only moves the sum:

* client side: :func:`offer` (the vector kept for the client's protocol half, answering only its
  length) and :func:`summed` (the client's own decoded total);
* server side: :func:`sum_exchange` (plan the dense exchange from the public length, run the server
  half, tell the recipients).

DP (:mod:`.dp`): the strategy counts the release in the run's accountant and each contributor adds
its share of the noise to its kept vector before its half encodes.  A DP weighted mean
(``dp_mean``) has each client send ``[w~ clip(v), w~ C]`` (:func:`protocols.dp.weighted_mean_value`,
clipped in ``contribute``) and the recipients divide by ``max(total weight, noise std) / C``; any
other sum (FedSpray's class-wise mean) is clipped whole to ``C`` on the client in ``privatize``.

The planned blocking is that of ``_sum_vectors`` (:func:`~.exchange.plan_dense`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from protocols import DPRequest, DropoutError
from protocols.dp import weighted_mean_value

from .dp import privatize_dense
from .exchange import dense_result, plan_dense, run_server_half
from .messages import ContributeIns, ContributeRes, MessageError, ReceiveIns


def offer(logic, req: ContributeIns, vector: np.ndarray) -> ContributeRes:
    """Client side of ``contribute``: ``vector`` for the sum ``req.tag``."""
    vector = np.asarray(vector, dtype=np.float64)
    logic.keep(req.tag, vector)
    return ContributeRes(length=int(vector.size))


def summed(logic, req: ReceiveIns) -> np.ndarray:
    """Client side of ``receive``: the client's own decoded total of the sum ``req.tag``."""
    if req.length is None:
        raise MessageError(f"the result of {req.tag!r} delivered without its length")
    return dense_result(logic.rt.half.result(), int(req.length))


def mean_vector(values, weight: float) -> np.ndarray:
    """A weighted mean's upload ``[w v, w]`` (:meth:`protocols.base.Protocol.weighted_mean`)."""
    return np.concatenate([np.asarray(values, dtype=np.float64).ravel() * weight, [weight]])


def dp_mean_vector(values, weight: float, req: ContributeIns) -> np.ndarray:
    """A DP weighted mean's upload ``[w~ clip(v), w~ C]``.

    ``req``: the strategy's ``dp_clip`` and ``dp_weight_bound``; :func:`protocols.dp.weighted_mean_value`.
    """
    if req.dp_clip is None:
        raise MessageError(f"a DP weighted mean of {req.tag!r} asked without its dp_clip")
    dp = DPRequest(clip=float(req.dp_clip), weight_bound=req.dp_weight_bound)
    return weighted_mean_value(values, weight, dp, tag=req.tag, rnd=int(req.round))


def mean_of(total: np.ndarray, tag: str, req: ReceiveIns | None = None) -> np.ndarray:
    """The mean ``sum_k w_k v_k / sum_k w_k`` from the summed :func:`mean_vector`.

    ``sum_k w_k v_k / sum_k w_k`` from the summed :func:`mean_vector`; of a DP mean
    (:func:`dp_mean_vector`, ``req`` with ``dp_clip`` and the sum's noise std ``dp_std``), the noisy
    weight total floored at its noise std (post-processing, as :meth:`protocols.base.Protocol.weighted_mean`).
    """
    if req is not None and req.dp_clip is not None:
        if req.dp_std is None:
            raise MessageError(f"the DP mean {tag!r} delivered without the std of its noise (dp_std)")
        return total[:-1] / (max(total[-1], float(req.dp_std)) / float(req.dp_clip))
    if not total[-1] > 0:
        raise ValueError(f"the weights of {tag} sum to {total[-1]}; no contributor had a positive weight")
    return total[:-1] / total[-1]


def scoped(strategy, tag: str, req: DPRequest | None) -> DPRequest | None:
    """``req`` if the run has DP and ``tag`` is in its scope (``--dp-exchanges``), else ``None``."""
    dp = strategy.protocol.dp
    return req if req is not None and dp is not None and dp.config.in_scope(tag) else None


def sum_exchange(
    strategy,
    tag: str,
    rnd: int,
    contributors: Iterable[int],
    recipients: Iterable[int],
    spec,
    config: dict | None = None,
    *,
    dp: DPRequest | None = None,
    dp_mean: bool = False,
) -> int:
    """Sum the contributors' vectors of ``tag`` and deliver the total to the recipients.

    Ask ``contributors`` for their vectors of ``tag``, sum them through the protocol and have every
    live recipient receive the total (``config``, the algorithm's own settings, goes with both
    requests).  A client lost before the exchange is not a contributor; one lost during it is the
    backend's dropout.  ``dp``: the release's request (module docstring; ``dp_mean``: a weighted
    mean's ``[w~ clip(v), w~ C]``); the recipients get the std of the noise in the sum as
    ``dp_std``.  Returns the summed vector's length.
    """
    config, clip = dict(config or {}), {}
    if dp is not None and dp_mean:  # clipped by the clients; the sum's request (protocols.dp)
        clip = dict(dp_clip=float(dp.clip), dp_weight_bound=dp.weight_bound)
        dp, spec, _ = strategy.protocol.dp.mean_request(tag, rnd, dp, spec, weighted=True)
    ask = ContributeIns(tag, rnd, **clip, config=config)
    sent = strategy.ask("contribute", {k: ask for k in contributors})
    if not sent:
        raise DropoutError(f"every contributor of {tag} was lost: {sorted(strategy.lost)}", tag=tag, round=rnd)
    recipients = strategy.alive(recipients)
    protocol = strategy.protocol
    length = int(next(iter(sent.values())).length)  # the clients' halves run the exchange
    noisy, noise_std = sorted(sent), 0.0
    if dp is not None:  # counted here, noised by each contributor (.dp)
        noisy, noise_std, spec = privatize_dense(strategy, tag, rnd, noisy, length, dp, spec)
    run_server_half(protocol, plan_dense(protocol, tag, rnd, noisy, recipients, length, spec, dp_noise_std=noise_std))
    if hasattr(strategy, "note_broadcast"):  # a model broadcast: who missed it is out of sync (FedSpray)
        strategy.note_broadcast(tag, rnd)
    done = ReceiveIns(tag, rnd, length, dp_std=noise_std if dp is not None else None, **clip, config=config)
    strategy.tell("receive", {k: done for k in strategy.alive(recipients)})
    return length
