"""Which Ray actor hosts which client, and where that actor may run (``--ray-client-resources``).

A Ray node can declare custom resources (``ray start --resources '{"site_a": 1}'``); an actor
that requires a little of one (:data:`PIN`) is placed only on a node that declares it.
``--ray-client-resources "site_a:0-4;site_b:5,6"`` pins clients 0-4 to nodes declaring
``site_a`` and clients 5 and 6 to nodes declaring ``site_b``; the other clients run anywhere.

Placement (:func:`actor_plan`): the clients are grouped by the resource they need (``None``:
anywhere); a group of ``n`` of the ``K`` clients gets ``max(1, min(n, W*n//K))`` of the
``--ray-workers`` ``W`` actors, and its ``i``-th client is on its ``i*a//n``-th actor.  Without pinning this is the executor's default: client ``k`` on actor
``k*W//K``.
"""

from __future__ import annotations

import re

from ..config import ConfigError

#: how much of its resource a pinned actor requires: any node declaring the resource (even at 1)
#: can host up to 1/PIN such actors
PIN = 0.001


def parse_client_resources(spec: str, num_clients: int) -> dict[int, str]:
    """``"RESOURCE:CLIENTS;..."`` (CLIENTS: comma-separated ids or ``a-b`` ranges) -> client -> resource."""
    pinned: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, sep, clients = part.partition(":")
        name = name.strip()
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", name) or name in ("CPU", "GPU", "memory"):
            raise ConfigError(
                f"--ray-client-resources: {part!r} is not RESOURCE:CLIENTS with a custom resource "
                "name (e.g. site_a:0-4;site_b:5,6)"
            )
        for token in filter(None, (t.strip() for t in clients.split(","))):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", token)
            if m is None:
                raise ConfigError(f"--ray-client-resources: {token!r} is not a client id or a range a-b")
            lo, hi = int(m[1]), int(m[2] or m[1])
            if lo > hi or hi >= num_clients:
                raise ConfigError(f"--ray-client-resources: clients {token} are not within 0..{num_clients - 1}")
            for k in range(lo, hi + 1):
                if pinned.get(k, name) != name:
                    raise ConfigError(f"--ray-client-resources: client {k} is pinned to both {pinned[k]} and {name}")
                pinned[k] = name
    return pinned


def client_resources(cfg) -> dict[int, str]:
    """``--ray-client-resources`` as client -> resource; only with ``--executor ray``."""
    if not cfg.ray_client_resources:
        return {}
    if cfg.executor != "ray":
        raise ConfigError("--ray-client-resources pins clients to Ray nodes: it needs --executor ray")
    return parse_client_resources(cfg.ray_client_resources, cfg.clients)


def actor_plan(clients: list[int], pinned: dict[int, str], workers: int) -> tuple[list[str | None], dict[int, int]]:
    """The resource each actor requires (``None``: none) and client -> actor index (module docstring)."""
    groups: dict[str | None, list[int]] = {}
    for k in sorted(clients):
        groups.setdefault(pinned.get(k), []).append(k)
    K = len(clients)
    actors: list[str | None] = []
    placement: dict[int, int] = {}
    for resource, members in sorted(groups.items(), key=lambda g: (g[0] is not None, g[0] or "")):
        n = len(members)
        a = max(1, min(n, workers * n // K))
        for i, k in enumerate(members):
            placement[k] = len(actors) + i * a // n
        actors += [resource] * a
    return actors, placement
