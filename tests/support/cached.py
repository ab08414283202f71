"""One protocol per settings for the whole test session: CKKS key generation is slow.

A client contributes to a (round, tag) once, so every exchange on a cached protocol takes a fresh
round from :func:`fresh_round` (one counter for the session: tests in different files may share a
protocol).
"""

from __future__ import annotations

import functools
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


def cache_sampled_gaussian_rdp():
    """Memoize Opacus' Renyi divergence of the sampled Gaussian, per ``(q, sigma, alpha)``.

    Calibrating a Poisson-sampled (``q < 1``) release searches sigma with Opacus' RDP accountant, whose
    ``_compute_rdp(q, sigma, alpha)`` sums a series per order; the search visits the same sigmas for the same
    target, so every later calibration of the session (another run, another tag, another test) is a look-up. A pure
    function of its arguments: the results are Opacus' own. Returns the function that restores the original.
    """
    from opacus.accountants.analysis import rdp

    original = rdp._compute_rdp
    rdp._compute_rdp = functools.lru_cache(maxsize=None)(original)

    def restore() -> None:
        rdp._compute_rdp = original

    return restore
