"""Scalar reports through a backend's halves.

Each client sends the server one float64 (or one short vector of them: a batch of several report tags,
:func:`protocols.batch.report_parts`) in the clear, signed by its half (stage ``report``).

GCFL's decision rule needs values additive HE cannot hide from the decider (eq. 5's maximum,
GCFL+'s gradient-norm series, :mod:`protocols.similarity`): these are the documented leak.  With a
backend in halves (:mod:`protocols.party`) a report is one exchange of its own:

1. the server half queues each reporting client the exchange's plan (one block of one value);
2. stage ``report``: each client half asks its provider for its value, refuses a NaN or inf
   (:class:`~protocols.errors.NonFiniteError`, nothing is sent), and answers one signed ``plain``
   message holding it;
3. the server half verifies each message (signature, session, exchange, stage) and records it.

A client that does not answer is named in a :class:`~protocols.errors.DropoutError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np

from .errors import DropoutError, IntegrityError, NonFiniteError
from .exchange import ValueSpec
from .plan import ExchangePlan
from .transcript import SERVER, Message

if TYPE_CHECKING:
    from .halves import HalvesProtocol
    from .party import ClientHalf

__all__ = ["REPORT_STAGE", "collect_reports", "client_report", "report_plan"]

REPORT_STAGE = "report"


def report_plan(protocol: HalvesProtocol, tag: str, rnd: int, clients: Sequence[int], length: int = 1) -> ExchangePlan:
    """The public plan of a report exchange: ``length`` values from each of ``clients``, no recipient."""
    return ExchangePlan(
        tag, rnd, protocol.exchange, "dense", 1, int(length), tuple(sorted(int(k) for k in clients)), {}, ValueSpec()
    )


def collect_reports(
    protocol: HalvesProtocol, tag: str, rnd: int, clients: Sequence[int], length: int = 1
) -> dict[int, float | np.ndarray]:
    """Server side: run one report exchange over ``protocol.link``.

    Returns what the server got (a float per client, or with ``length > 1`` a float64 vector of that length).
    """
    protocol._begin_exchange(tag, rnd)
    protocol._ensure_registered(rnd)
    server = protocol.server
    plan = report_plan(protocol, tag, rnd, clients, length)
    server.begin(plan, protocol.link, "")
    got = server.call(protocol.link, REPORT_STAGE, {k: [] for k in plan.contributors})
    out: dict[int, float | np.ndarray] = {}
    for k in plan.contributors:
        msg = server.responses(got, k, REPORT_STAGE, kind="plain")
        if msg is None:
            raise DropoutError(f"client(s) {k} did not answer the '{REPORT_STAGE}' stage", **server.where(k))
        try:
            value = np.asarray(msg.payload, dtype=np.float64)
        except (TypeError, ValueError):
            value = None
        if value is None or value.size != length or value.ndim > 1 or not np.isfinite(value).all():
            raise IntegrityError(f"a report that is not {length} finite number(s)", **server.where(k))
        out[k] = float(value.ravel()[0]) if length == 1 else value.ravel()
    return out


def client_report(half: ClientHalf) -> tuple[Message, bytes]:
    """Client side: the provider's value as one signed ``plain`` message.

    Client side (:meth:`protocols.party.ClientHalf.handle` at stage ``report``): the provider's
    value(s), checked finite, as one signed ``plain`` message to the server.
    """
    values = np.asarray(half.contribution().values, dtype=np.float64).ravel()[: cast(ExchangePlan, half.plan).block_len]
    if not np.isfinite(values).all():
        raise NonFiniteError("reported scalar is NaN or inf", **half.where())
    payload = float(values[0]) if values.size == 1 else [float(v) for v in values]
    return half.seal(half.message(SERVER, "plain", (values.size,), payload, ""), REPORT_STAGE)
