"""Protocol objects: every client<->server exchange of secure_fgl goes through one.

>>> from protocols import make_protocol
>>> proto = make_protocol("ckks", num_clients=10)
>>> proto.weighted_mean("fedavg/model", 0, {k: w_k for k, w_k in ...}, weights=...)
"""

from __future__ import annotations

from typing import Any

from .base import Protocol
from .errors import (
    BoundError,
    ConfigurationError,
    DropoutError,
    IntegrityError,
    NonFiniteError,
    PackingOverflowError,
    PrivacyBudgetError,
    ProtocolError,
    ShapeError,
)
from .exchange import BlockTable, DPRequest, ExchangeContext, ValueSpec
from .plain import PlainProtocol
from .registry import backend_class, modes
from .transcript import SERVER, Message, Transcript, client_party, party_client

MODES = modes()


def make_protocol(mode: str, num_clients: int, **options: Any) -> Protocol:
    """Build the protocol object for ``mode`` (a registered backend, :mod:`protocols.registry`).

    Args:
        mode: A registered backend name (``plain``, ``mask``, ``ckks``, ``ckks-mp``, ...).
        num_clients: The number of clients of the run.
        **options (Any): Passed to the backend (``transcript``, ``dp``, ``seed`` and backend settings).

    Returns:
        The backend's :class:`~protocols.base.Protocol`.

    Raises:
        ConfigurationError: ``mode`` is not a registered backend.
    """
    return backend_class(mode)(num_clients, **options)


__all__ = [
    "make_protocol",
    "MODES",
    "Protocol",
    "PlainProtocol",
    "ValueSpec",
    "DPRequest",
    "BlockTable",
    "ExchangeContext",
    "Transcript",
    "Message",
    "SERVER",
    "client_party",
    "party_client",
    "ProtocolError",
    "ConfigurationError",
    "ShapeError",
    "NonFiniteError",
    "BoundError",
    "PackingOverflowError",
    "IntegrityError",
    "DropoutError",
    "PrivacyBudgetError",
]
