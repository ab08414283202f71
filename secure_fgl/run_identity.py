"""A run's identity: the fingerprint of its full resolved configuration.

Two runs are the same experiment when every setting that can change their numbers is equal:
the algorithm and its options (defaults filled in), data, split, partition, model, training,
rounds, mode, DP, seed and attacks.  Settings that only say where files go or how progress is
shown (``out``, ``resume``, ``log``, ``save_best_model``, ``data_root``) and where the work runs
(``device``, the Ray placement, ``round_timeout``) are not part of it.

    fingerprint = SHA-256(canonical JSON of identity(config) without the settings at their default)[:16]

A setting at its current default is left out of the hash, so adding a setting (whose default keeps the old
behaviour) changes no stored run's fingerprint; the fingerprint is always recomputed from the stored config.

The package version and git commit are recorded beside the fingerprint (``run.json`` in the run
folder, ``result.json``): a run made by other code keeps its identity -- a reader is warned, it is
not rerun.  ``secure-fgl report`` reuses a run folder only when its fingerprint equals the asked
one and the run finished; ``secure-fgl run --out`` refuses a finished folder without
``--overwrite`` and a ``--resume`` of a folder made with other settings.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from pathlib import Path

from .validation import RENAMED_SETTINGS, current_names

#: RunConfig fields that do not change a run's numbers (where files go, how it is shown, where it runs)
NOT_IDENTITY = (
    "out",
    "resume",
    "log",
    "save_best_model",
    "data_root",
    "device",
    "ray_address",
    "ray_num_cpus",
    "ray_workers",
    "ray_client_resources",
    "round_timeout",
    "manifest",
    "identity_key",
)
#: the identity file written into every run folder when the run starts
RUN_FILE = "run.json"


def _canonical(value):
    """Numbers as floats (``1`` and ``1.0`` are one setting), tuples as lists, keys sorted later."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return str(value)


def identity(config: dict) -> dict:
    """The settings of a resolved config that define the experiment.

    ``config`` is ``result.json``'s ``config``, options filled in; a renamed setting is read under its current name.
    """
    return _canonical({k: v for k, v in current_names(config).items() if k not in NOT_IDENTITY})


@functools.lru_cache(maxsize=1)
def _defaults() -> dict:
    """Every RunConfig setting's default, canonical (:func:`_canonical`)."""
    from .config import RunConfig

    out = {}
    for f in dataclasses.fields(RunConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = _canonical(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = _canonical(f.default_factory())
    return out


def fingerprint(config: dict) -> str:
    """16-hex-digit SHA-256 of the settings that define the experiment (:func:`identity`), defaults left out.

    A setting equal to its current default is not hashed (a config written before the setting existed hashes the
    same), and a renamed setting is hashed under the name it was introduced with: neither an added setting nor a
    rename changes a run's fingerprint.
    """
    first_names = {new: old for old, new in RENAMED_SETTINGS.items()}
    defaults = _defaults()
    hashed = {first_names.get(k, k): v for k, v in identity(config).items() if k not in defaults or v != defaults[k]}
    text = json.dumps(hashed, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def differences(stored: dict, asked: dict) -> list[str]:
    """``key: stored -> asked`` for every identity setting that differs (options as ``options.NAME``)."""
    a, b = identity(stored), identity(asked)
    a_opts, b_opts = a.pop("options", {}) or {}, b.pop("options", {}) or {}
    out = [f"{k}: {_show(a.get(k))} -> {_show(b.get(k))}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    out += [
        f"options.{k}: {_show(a_opts.get(k))} -> {_show(b_opts.get(k))}"
        for k in sorted(set(a_opts) | set(b_opts))
        if a_opts.get(k) != b_opts.get(k)
    ]
    return out


def _show(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return "unset" if v is None else str(v)


def resolved_config(cfg, options) -> dict:
    """``result.json``'s ``config``: the RunConfig with the algorithm's options filled in."""
    import dataclasses

    return {**cfg.to_dict(), "options": dataclasses.asdict(options)}


def write_run_file(out_dir: str | Path, config: dict, provenance: dict) -> None:
    """``run.json``: the fingerprint, the resolved config and the code that started the run."""
    from .engine.files import write_json_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        out / RUN_FILE,
        {
            "fingerprint": fingerprint(config),
            "config": config,
            "secure_fgl_version": provenance.get("secure_fgl_version"),
            "git_commit": provenance.get("git_commit"),
            "started_at": provenance.get("started_at"),
        },
    )


def stored_run(out_dir: str | Path) -> dict | None:
    """What a run folder holds.

    ``{"config", "fingerprint", "finished", "status"}`` from its ``result.json`` (else its ``run.json``), or None
    for a folder with neither.
    """
    out = Path(out_dir)
    for name in ("result.json", RUN_FILE):
        path = out / name
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            config = data.get("config") or {}
            status = data.get("status") if name == "result.json" else "started"
            return {
                "config": config,
                "fingerprint": fingerprint(config),
                "finished": is_finished(data) if name == "result.json" else False,
                "status": status,
                "secure_fgl_version": data.get("secure_fgl_version"),
                "git_commit": data.get("git_commit"),
            }
    return None


def is_finished(result: dict) -> bool:
    """A result whose run ended (``status: complete``; results written before the status key count as ended)."""
    return result.get("status", "complete") == "complete"


@functools.lru_cache(maxsize=1)
def _this_code() -> tuple[str, str | None]:
    from .provenance import git_commit, package_version

    return package_version(), git_commit()


def code_mismatch(result: dict) -> str | None:
    """``"version X / commit abc1234"`` when ``result`` was made by other code than this one, else None."""
    version, commit = result.get("secure_fgl_version"), result.get("git_commit")
    here_version, here_commit = _this_code()
    if version not in (None, here_version) or (commit and here_commit and commit != here_commit):
        return f"version {version or '?'} / commit {(commit or '?')[:12]}"
    return None


def check_run_folder(out_dir: str | Path, config: dict, *, resume: bool, overwrite: bool) -> None:
    """Refuse to replace a finished run or to resume one with other settings.

    Refuse to silently replace a finished run, or to resume a run made with other settings
    (``ConfigError`` naming the fix).
    """
    from .validation import ConfigError

    stored = stored_run(out_dir)
    if stored is None:
        return
    if resume and stored["fingerprint"] != fingerprint(config):
        diff = differences(stored["config"], config)
        raise ConfigError(
            f"--resume: {out_dir} holds a run with other settings ({'; '.join(diff[:4])}"
            f"{'; ...' if len(diff) > 4 else ''}); resume it with its own settings, or choose "
            "another --out"
        )
    if stored["finished"] and not resume and not overwrite:
        raise ConfigError(
            f"--out {out_dir} holds a finished run; add --overwrite to replace it, or choose another --out"
        )
