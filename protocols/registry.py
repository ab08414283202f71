"""The registry of protocol backends: every list of modes in the project derives from it.

A backend registers once (name, where its class lives, what it protects); the CLI choices,
``secure-fgl modes``, the DP-capable and secure modes, the transcript audit, the report's
ordering and colours, the algorithm catalog and ``make_protocol`` all read it.  The import
of a backend's module is deferred to :func:`backend_class` (TenSEAL loads only when asked).

>>> from protocols.registry import modes, backend
>>> modes()
('plain', 'ckks', 'mask', 'ckks-mp')
>>> backend("mask").upload_kind
'masked'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .base import Protocol


@dataclass(frozen=True)
class BackendInfo:
    """One backend.

    name:        the ``--mode`` value.
    loader:      ``"module:Class"`` of its :class:`~protocols.base.Protocol` subclass.
    summary:     one line for ``secure-fgl modes``.
    secure:      the server cannot read an individual contribution (the audit expects no
                 readable upload).
    upload_kind: the transcript kind of a client's upload.
    colour:      matplotlib colour of its curves in reports.
    similarity:  supports GCFL's similarity statistics (:mod:`protocols.similarity`).
    graph_level: runs the graph-classification algorithms (tested there).
    distributed_dp: DP noise may be split across the clients ('distributed' placement): the
                 server never sees a single client's partially-noised value.
    """

    name: str
    loader: str
    summary: str
    secure: bool
    upload_kind: str
    colour: str
    similarity: bool = False
    graph_level: bool = True
    distributed_dp: bool = True


_BACKENDS: dict[str, BackendInfo] = {}


def register_backend(info: BackendInfo) -> BackendInfo:
    """Add a backend (a second registration under the same name replaces the first)."""
    _BACKENDS[info.name] = info
    return info


def modes() -> tuple[str, ...]:
    """Every registered mode, in registration order."""
    return tuple(_BACKENDS)


def secure_modes() -> tuple[str, ...]:
    """Names of the registered modes that hide individual contributions from the server."""
    return tuple(n for n, b in _BACKENDS.items() if b.secure)


def distributed_dp_modes() -> tuple[str, ...]:
    """Names of the modes that support distributed DP noise."""
    return tuple(n for n, b in _BACKENDS.items() if b.distributed_dp)


def similarity_modes() -> tuple[str, ...]:
    """Names of the modes that support similarity exchanges."""
    return tuple(n for n, b in _BACKENDS.items() if b.similarity)


def graph_level_modes() -> tuple[str, ...]:
    """Names of the modes that support graph-level algorithms."""
    return tuple(n for n, b in _BACKENDS.items() if b.graph_level)


def colours() -> dict[str, str]:
    """Mode -> plot colour."""
    return {n: b.colour for n, b in _BACKENDS.items()}


def backend(name: str) -> BackendInfo:
    """The registered backend ``name`` (case-insensitive); ConfigurationError naming the choices."""
    info = _BACKENDS.get(str(name).lower())
    if info is None:
        raise ConfigurationError(f"unknown protocol mode {name!r}; choose one of {', '.join(_BACKENDS)}")
    return info


def backend_class(name: str) -> type[Protocol]:
    """Import and return the Protocol class of backend ``name``."""
    module, _, cls = backend(name).loader.partition(":")
    return cast("type[Protocol]", getattr(importlib.import_module(module), cls))


register_backend(
    BackendInfo(
        "plain",
        "protocols.plain:PlainProtocol",
        "no protection: the server reads every contribution (baseline and attack target)",
        secure=False,
        upload_kind="plain",
        colour="tab:red",
        similarity=True,
        distributed_dp=False,
    )
)
register_backend(
    BackendInfo(
        "ckks",
        "protocols.ckks:CKKSProtocol",
        "TenSEAL CKKS homomorphic encryption: clients make the keys, the server adds ciphertexts with a public "
        "context only and never decrypts",
        secure=True,
        upload_kind="ciphertext",
        colour="tab:blue",
        similarity=True,
    )
)
register_backend(
    BackendInfo(
        "mask",
        "protocols.mask:MaskProtocol",
        "pairwise-mask secure aggregation with Bonawitz double masking (X25519 + HKDF + AES-CTR, Shamir shares for "
        "dropouts): the server sees only masked vectors whose sum unmasks",
        secure=True,
        upload_kind="masked",
        colour="tab:green",
    )
)
register_backend(
    BackendInfo(
        "ckks-mp",
        "protocols.ckks_mp:CKKSMPProtocol",
        "multiparty CKKS (Mouchet et al. 2021): each client holds only a share of the secret key, decryption needs "
        "every client (any t with --threshold t) and is key-switched to each recipient; use --layout dense for FedGCN",
        secure=True,
        upload_kind="ciphertext",
        colour="tab:purple",
        graph_level=False,
    )
)
