"""Protocol objects: every client<->server exchange of secure_fgl goes through one.

>>> from protocols import make_protocol
>>> proto = make_protocol("ckks", num_clients=10)
>>> proto.weighted_mean("fedavg/model", 0, {k: w_k for k, w_k in ...}, weights=...)
"""
from __future__ import annotations

from .base import BlockTable, DPRequest, ExchangeContext, Protocol, ValueSpec
from .errors import (BoundError, ConfigurationError, DropoutError, IntegrityError, NonFiniteError,
                     PackingOverflowError, PrivacyBudgetError, ProtocolError, ShapeError)
from .plain import PlainProtocol
from .transcript import SERVER, Message, Transcript, client_party, party_client

MODES = ("plain", "ckks", "mask", "ckks-mp")


def make_protocol(mode: str, num_clients: int, **options) -> Protocol:
    """Build the protocol object for ``mode`` ('plain' | 'ckks' | 'mask' | 'ckks-mp').

    ``options`` go to the backend (``transcript``, ``dp``, ``seed`` and backend settings).
    """
    mode = mode.lower()
    if mode == "plain":
        return PlainProtocol(num_clients, **options)
    if mode == "ckks":
        from .ckks import CKKSProtocol
        return CKKSProtocol(num_clients, **options)
    if mode == "mask":
        from .mask import MaskProtocol
        return MaskProtocol(num_clients, **options)
    if mode == "ckks-mp":
        from .ckks_mp import CKKSMPProtocol
        return CKKSMPProtocol(num_clients, **options)
    raise ConfigurationError(f"unknown protocol mode {mode!r}; choose one of {', '.join(MODES)}")


__all__ = ["make_protocol", "MODES", "Protocol", "PlainProtocol", "ValueSpec", "DPRequest", "BlockTable",
           "ExchangeContext", "Transcript", "Message", "SERVER", "client_party", "party_client",
           "ProtocolError", "ConfigurationError", "ShapeError", "NonFiniteError", "BoundError",
           "PackingOverflowError", "IntegrityError", "DropoutError", "PrivacyBudgetError"]
