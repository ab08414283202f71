"""A run's manifest, seen from the experiment driver (:mod:`protocols.manifest`).

The driver records in the manifest the hash of the public configuration that fixes the exchange
schedule (:func:`schedule_option`), reads the manifest the sites built from their own keys
(:func:`site_keys`, ``--manifest``), and writes to ``result.json`` what each *client* accepted
(:func:`accepted_keys`): the fingerprints of the identity and channel keys in its own key
registry, and the manifest's comparison code.
"""

from __future__ import annotations

import json
from typing import cast

from .config import RunConfig

#: settings that do not change what is exchanged (where the run executes and writes, what it evaluates)
LOCAL_SETTINGS = (
    "data_root",
    "device",
    "executor",
    "ray_address",
    "ray_num_cpus",
    "ray_workers",
    "ray_client_resources",
    "round_timeout",
    "out",
    "resume",
    "save_best_model",
    "log",
    "attacks",
    "manifest",
    "identity_key",
)


def public_schedule(cfg: RunConfig) -> dict:
    """The run settings that fix the public exchange schedule (tags, shapes, rounds, sampling)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in LOCAL_SETTINGS}


def public_roles(cfg: RunConfig) -> dict[str, str]:
    """The exchange roles of the run's public schedule (:mod:`protocols.schedule`)."""
    from protocols.schedule import BROADCAST, RELEASE, STATISTIC

    from .algorithms import get_spec

    spec = get_spec(cfg.algorithm)
    return {
        **{tag: STATISTIC for tag in spec.statistics_of(cfg)},
        **{tag: RELEASE for tag in spec.releases_of(cfg)},
        **{tag: BROADCAST for tag in spec.broadcasts_of(cfg)},
    }


def public_groups(cfg: RunConfig) -> list[list[str]]:
    """The related-input groups of the run's public schedule (:mod:`protocols.schedule`)."""
    from .algorithms import get_spec

    return get_spec(cfg.algorithm).groups_of(cfg)


def public_exchanges(cfg: RunConfig) -> dict[str, tuple[int, int]]:
    """The run's exchanges, tag -> (first, last) round (the algorithm's ``AlgorithmSpec.schedule``)."""
    from .algorithms import get_spec

    return get_spec(cfg.algorithm).exchanges_of(cfg)


def schedule_option(cfg: RunConfig) -> dict:
    """The public schedule option of a backend in halves.

    For a backend in halves (it builds a manifest): the hash of the public schedule, the
    client fraction, the exchange roles and the listing of the run's exchanges every client half
    checks plans against; else ``{}``.
    """
    from protocols.halves import HalvesProtocol
    from protocols.manifest import schedule_digest
    from protocols.registry import backend_class

    if not issubclass(backend_class(cfg.mode), HalvesProtocol):
        return {}
    return {
        "schedule": schedule_digest(json.loads(json.dumps(public_schedule(cfg), default=str))),
        "client_fraction": float(cfg.client_fraction),
        "roles": public_roles(cfg),
        "exchanges": public_exchanges(cfg),
        "groups": public_groups(cfg),
    }


def site_keys(cfg: RunConfig) -> dict:
    """The run manifest and the server's identity key given on the command line.

    ``{"manifest": ..., "identity": ...}``: the run manifest of ``--manifest`` (built from the
    sites' own identity keys) and the server's key of ``--identity-key``; ``{}`` without them
    (the run draws every key itself).
    """
    if cfg.manifest is None:
        return {}
    from pathlib import Path

    from protocols.auth import SigningKey
    from protocols.halves import HalvesProtocol
    from protocols.manifest import Manifest
    from protocols.registry import backend_class

    from .config import ConfigError

    if not issubclass(backend_class(cfg.mode), HalvesProtocol):
        raise ConfigError(f"mode {cfg.mode} builds no run manifest: omit --manifest")
    for what, path in (("--manifest", cfg.manifest), ("--identity-key", cfg.identity_key)):
        if not Path(str(path)).is_file():
            raise ConfigError(f"{what} {path} does not exist")
    manifest = Manifest.from_bytes(Path(str(cfg.manifest)).read_bytes())
    return {"manifest": manifest, "identity": SigningKey.load(cast(str, cfg.identity_key))}  # a file (checked above)


def accepted_keys(protocol, executor, hosts) -> dict:
    """The ``manifest`` and ``key_fingerprints`` fields of ``result.json``.

    ``result.json`` fields: ``manifest`` (comparison code, run id) and ``key_fingerprints``
    (client -> party -> {'signing', 'channel'} fingerprints that client accepted), asked of the
    client runtimes ``hosts`` on ``executor`` (the halves live there).
    """
    manifest = getattr(protocol, "manifest", None)
    if manifest is None:
        return {"key_fingerprints": protocol.identity_fingerprints()}
    from .runtime import wire  # torch: only once a run has its runtimes (the CLI reads this module)

    responses, _ = executor.call("accepted_keys", {k: wire.pack({}) for k in hosts})
    accepted = {f"client{k}": wire.unpack(r)["fingerprints"] for k, r in sorted(responses.items())}
    return {
        "manifest": {"comparison_code": manifest.comparison_code, "run_id": manifest.run_id.hex()},
        "key_fingerprints": accepted,
    }


#: what no mode protects (docs/security.md, "An actively malicious server")
NOT_PROTECTED = (
    "a malicious client's own input",
    "a server re-signing a wrong aggregate (no verifiable aggregation)",
    "a crafted model, the same for every client, that leaks one update through the sum (use DP)",
    "a client's constant inputs (its weight) differenced across rounds whose contributor sets differ by one client "
    "(a claimed or real dropout, client sampling): read by any recipient of both sums, so by the server with one "
    "colluding client (the server alone reads no sum in mask and ckks-mp)",
)
#: per mode: what holds against a server that deviates from the protocol with up to c clients
MODE_CLAIMS = {
    "plain": "nothing: the server reads every contribution",
    "mask": "individual inputs hidden from the server plus c clients (c < t, 2t > n + c, >= c + 2 contributors "
    "per sum, a signed consistency round before unmasking that also binds the models each contributor "
    "received under a broadcast tag, the released rows and the round's statistics); the aggregate is known to "
    "any one client",
    "ckks": "individual inputs hidden from the server alone; the server plus any one client reads every upload",
    "ckks-mp": "the secret key stays shared against the server plus up to n - 1 clients; inputs within the limits "
    "of docs/ckks_mp.md; a sum whose contributors received different models under a broadcast tag, different "
    "released rows or different statistics of the round is refused",
}


def threat_model(cfg: RunConfig, protocol) -> dict:
    """The ``threat_model`` field of ``result.json``.

    ``result.json``'s ``threat_model``: the adversary the run's mode is claimed secure against,
    the run's collusion bound and what is not protected (docs/security.md).
    """
    bound = getattr(protocol, "collusion", None)
    holds = MODE_CLAIMS.get(cfg.mode, "see docs/security.md")
    extra = {}
    if cfg.mode == "ckks-mp":  # t-out-of-n: any t clients hold the key together
        t = int(getattr(protocol, "threshold", None) or cfg.clients)
        extra["key_collusion_bound"] = t - 1
        if t < cfg.clients:
            holds = (
                f"the secret key stays shared against the server plus up to t - 1 = {t - 1} clients "
                f"(t-out-of-n, t = {t}); a sum covers at least the contributors minus n - t dropouts; "
                "inputs within the limits of docs/ckks_mp.md"
            )
    return {
        "adversary": "server deviating from the protocol, colluding with up to max_colluders clients",
        "mode": cfg.mode,
        "holds": holds,
        **extra,
        "max_colluders": None if bound is None else bound.max_colluders,
        "min_contributors": None if bound is None else bound.min_contributors,
        "not_protected": list(NOT_PROTECTED),
        "reference": "docs/security.md",
    }
