r"""Client sampling every party recomputes.

The round's sample is a public pseudorandom function of the run manifest's sampling seed.

.. math::

    \mathrm{rank}_r(k) = \mathrm{HMAC\text{-}SHA256}(\mathrm{seed},\ \mathrm{domain} \,\|\, r \,\|\, k),
    \qquad S_r = \text{the } m \text{ clients of smallest rank}, \quad
    m = \max(1, \mathrm{round}(f K)) \ (K \text{ when } f \ge 1)

for round ``r``, ``K`` clients and sampling fraction ``f``.  The seed and ``f`` are public
(the run manifest's ``sample_seed`` and ``client_fraction``), so the sample is no secret: the
PRF only makes it a fixed function of the manifest that the server cannot choose.  The driver
samples with :func:`sample_clients`, and each client half recomputes it before contributing to an
exchange the public schedule marks as sampled (:mod:`protocols.schedule`): a contributor set that
is not within ``S_r`` (dropouts only remove clients) is refused.  Without the check a server that
deviates would pick, round after round, the contributor sets it likes best (e.g. sets that
differ by one client across rounds).
"""

from __future__ import annotations

import hashlib
import hmac

from .errors import ConfigurationError

#: domain separator of the sampling PRF
SAMPLE_DOMAIN = b"secure-fgl/client-sample/v1"


def sample_size(num_clients: int, fraction: float) -> int:
    """``m``: every client for ``fraction >= 1``, else ``max(1, round(fraction * K))``."""
    if not 0 < float(fraction):
        raise ConfigurationError(f"client_fraction must be > 0, got {fraction} (--client-fraction)")
    return num_clients if fraction >= 1 else max(1, int(round(float(fraction) * num_clients)))


def sample_clients(seed: int, rnd: int, num_clients: int, fraction: float) -> list[int]:
    """The sorted sample ``S_r`` of round ``rnd`` (module docstring)."""
    m = sample_size(num_clients, fraction)
    if m >= num_clients:
        return list(range(num_clients))
    key = int(seed).to_bytes(16, "big", signed=True)
    prefix = SAMPLE_DOMAIN + int(rnd).to_bytes(8, "big", signed=True)
    rank = {k: hmac.new(key, prefix + int(k).to_bytes(4, "big"), hashlib.sha256).digest() for k in range(num_clients)}
    return sorted(sorted(rank, key=rank.__getitem__)[:m])
