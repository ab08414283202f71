"""A run's manifest, seen from the experiment driver (:mod:`protocols.manifest`).

The driver records in the manifest the hash of the public configuration that fixes the exchange
schedule (:func:`schedule_option`), and writes to ``result.json`` what each *client* accepted
(:func:`accepted_keys`): the fingerprints of the identity and channel keys in its own key
registry, and the manifest's comparison code.
"""
from __future__ import annotations

import json

from .config import RunConfig

#: settings that do not change what is exchanged (where the run executes and writes, what it evaluates)
LOCAL_SETTINGS = ("data_root", "device", "executor", "ray_address", "ray_num_cpus", "ray_workers",
                  "ray_client_resources", "round_timeout", "out", "resume", "save_best_model", "log", "attacks")


def public_schedule(cfg: RunConfig) -> dict:
    """The run settings that fix the public exchange schedule (tags, shapes, rounds, sampling)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in LOCAL_SETTINGS}


def schedule_option(cfg: RunConfig) -> dict:
    """``{"schedule": sha256 hex}`` for a backend split into halves (it builds a manifest), else ``{}``."""
    from protocols.manifest import schedule_digest
    from protocols.registry import backend_class
    from protocols.split import SplitProtocol
    if not issubclass(backend_class(cfg.mode), SplitProtocol):
        return {}
    return {"schedule": schedule_digest(json.loads(json.dumps(public_schedule(cfg), default=str)))}


def accepted_keys(protocol, executor=None, hosts=()) -> dict:
    """``result.json`` fields: ``manifest`` (comparison code, run id) and ``key_fingerprints``
    (client -> party -> {'signing', 'channel'} fingerprints that client accepted).  ``executor``:
    the client runtimes to ask, ``hosts`` their ids (the halves live there); ``None``: the
    in-process halves."""
    manifest = getattr(protocol, "manifest", None)
    if manifest is None:
        return {"key_fingerprints": protocol.identity_fingerprints()}
    if executor is None:
        accepted = protocol.accepted_fingerprints()
    else:
        from .runtime import wire
        responses, _ = executor.call("accepted_keys", {k: wire.pack({}) for k in hosts})
        accepted = {f"client{k}": wire.unpack(r)["fingerprints"] for k, r in sorted(responses.items())}
    return {"manifest": {"comparison_code": manifest.comparison_code, "run_id": manifest.run_id.hex()},
            "key_fingerprints": accepted}
