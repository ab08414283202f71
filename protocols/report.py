"""Scalar reports through a backend's halves: each client sends the server one float64 in the
clear, signed by its half (stage ``report``).

GCFL's decision rule needs values additive HE cannot hide from the decider (eq. 5's maximum,
GCFL+'s gradient-norm series, :mod:`protocols.pairwise`): these are the documented leak.  With a
backend split into halves (:mod:`protocols.party`) a report is one exchange of its own:

1. the server half queues each reporting client the exchange's plan (one block of one value);
2. stage ``report``: each client half asks its provider for its value, refuses a NaN or inf
   (:class:`~protocols.errors.NonFiniteError`, nothing is sent), and answers one signed ``plain``
   message holding it;
3. the server half verifies each message (signature, session, exchange, stage) and records it.

A client that does not answer is named in a :class:`~protocols.errors.DropoutError`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .base import ValueSpec
from .errors import DropoutError, IntegrityError, NonFiniteError
from .plan import ExchangePlan
from .transcript import SERVER

__all__ = ["REPORT_STAGE", "collect_reports", "client_report", "report_plan"]

REPORT_STAGE = "report"


def report_plan(protocol, tag: str, rnd: int, clients: Sequence[int]) -> ExchangePlan:
    """The public plan of a report exchange: one value from each of ``clients``, no recipient."""
    return ExchangePlan(tag, rnd, protocol.exchange, "dense", 1, 1, tuple(sorted(int(k) for k in clients)), {},
                        ValueSpec())


def collect_reports(protocol, tag: str, rnd: int, clients: Sequence[int]) -> dict[int, float]:
    """Server side: run one report exchange over ``protocol.link``; returns what the server got."""
    protocol._begin_exchange(tag, rnd)
    protocol._ensure_registered(rnd)
    server = protocol.server
    plan = report_plan(protocol, tag, rnd, clients)
    server.begin(plan, protocol.link, "")
    got = server.call(protocol.link, REPORT_STAGE, {k: [] for k in plan.contributors})
    out = {}
    for k in plan.contributors:
        msg = server.responses(got, k, REPORT_STAGE, kind="plain")
        if msg is None:
            raise DropoutError(f"client(s) {k} did not answer the '{REPORT_STAGE}' stage", **server.where(k))
        try:
            out[k] = float(msg.payload)
        except (TypeError, ValueError):
            raise IntegrityError("a report that is not one number", **server.where(k)) from None
    return out


def client_report(half) -> tuple:
    """Client side (:meth:`protocols.party.ClientHalf.handle` at stage ``report``): the provider's
    one value, checked finite, as one signed ``plain`` message to the server."""
    value = float(np.asarray(half.contribution().values).ravel()[0])
    if not np.isfinite(value):
        raise NonFiniteError("reported scalar is NaN or inf", **half.where())
    return half.seal(half.message(SERVER, "plain", (1,), value, ""), REPORT_STAGE)
