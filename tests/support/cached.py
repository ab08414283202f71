"""One protocol per settings for the whole test session: CKKS key generation is slow.

A client contributes to a (round, tag) once, so every exchange on a cached protocol takes a fresh
round from :func:`fresh_round` (one counter for the session: tests in different files may share a
protocol).
"""

from __future__ import annotations

import itertools

from protocols import make_protocol

_MADE: dict[tuple, object] = {}
_ROUNDS = itertools.count()


def cached_protocol(mode: str, num_clients: int, **settings):
    """The session's protocol for ``(mode, num_clients, settings)``, made on first use."""
    key = (mode, num_clients, tuple(sorted(settings.items())))
    if key not in _MADE:
        _MADE[key] = make_protocol(mode, num_clients, **settings)
    return _MADE[key]


def fresh_round() -> int:
    """A round number no exchange of this session has used."""
    return next(_ROUNDS)
