"""Central GAP (``--algorithm gap``): the reference every federated DP curve is drawn against.

The three modules of :mod:`secure_fgl.algorithms.gap` (encoder, aggregation, classifier) on **one
party holding the whole graph**: the same client logic, server strategy, exchanges and accountant
as ``fedgcn-gap``, with one client in plain mode.  With one party the hop sums are the exact
``Ã H`` plus the noise that party adds (local placement: all of sigma, which is what the
federated sum carries in the secure modes).
"""

from __future__ import annotations

from ...validation import ConfigError
from ..options import check_gap


def check_central(options, cfg) -> None:
    """ConfigError unless the run has one party (``--clients 1``): the central reference holds the whole graph."""
    check_gap(options, cfg)
    if cfg.clients != 1:
        raise ConfigError(
            f"gap is the central reference (one party holding the whole graph): use --clients 1, "
            f"or --algorithm fedgcn-gap for {cfg.clients} clients"
        )
