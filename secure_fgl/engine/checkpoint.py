"""Checkpoints that carry no code: plain data under ``torch.load(weights_only=True)``.

A pickle can name any callable, so loading a crafted ``checkpoint.pt`` with an
unrestricted unpickler runs code.  Checkpoints here hold only tensors, dicts, lists, tuples,
numbers, strings, booleans and ``None``; numpy arrays travel as tensors wrapped in
``{"__ndarray__": tensor}``, bytes as ``{"__bytes__": uint8 tensor}`` and numpy scalars as
Python numbers.  Dataclasses (the train
state, transcript messages) are converted by their owners before saving.

``--resume`` also checks the checkpoint's *config fingerprint* — every setting that shapes
the run's data, protocol, privacy or models (everything in :class:`RunConfig` except
:data:`RESUMABLE_KEYS`) — and refuses a mismatch with one line naming the differing keys.
Files are written by :func:`~secure_fgl.engine.files.save_torch_atomic` through ``mkstemp``,
so they are created with mode 0600 (they hold the clients' models).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import ConfigError, RunConfig
from .files import save_torch_atomic

FORMAT = "secure_fgl-checkpoint/1"
#: settings that may change between a run and its resumption
RESUMABLE_KEYS = frozenset(
    {
        "rounds",
        "patience",
        "device",
        "data_root",
        "out",
        "resume",
        "attacks",
        "log",
        "save_best_model",
        "ray_address",
        "ray_num_cpus",
        "ray_workers",
        "round_timeout",
        "ray_client_resources",
        "manifest",
        "identity_key",
    }
)


def config_fingerprint(cfg: RunConfig) -> dict:
    """The settings a checkpoint is bound to (see module docstring)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE_KEYS}


def to_plain(obj: Any) -> Any:
    """``obj`` with numpy arrays/scalars replaced by weights-only types (see module docstring)."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"cannot checkpoint a numpy array of dtype {obj.dtype}")
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (bytes, bytearray)):  # weights_only refuses the bytes global
        data = torch.frombuffer(bytearray(obj), dtype=torch.uint8) if obj else torch.zeros(0, dtype=torch.uint8)
        return {"__bytes__": data}
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    raise TypeError(f"cannot checkpoint a {type(obj).__name__}: convert it to plain data first")


def from_plain(obj: Any) -> Any:
    """Inverse of :func:`to_plain`."""
    if isinstance(obj, dict):
        if obj.keys() == {"__ndarray__"}:
            return obj["__ndarray__"].numpy()
        if obj.keys() == {"__bytes__"}:
            return obj["__bytes__"].numpy().tobytes()
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_plain(v) for v in obj)
    return obj


def save_checkpoint(path: Path, cfg: RunConfig, content: dict) -> None:
    """Write ``content`` atomically as a weights-only checkpoint, with the format and the config fingerprint."""
    save_torch_atomic(path, {"format": FORMAT, "fingerprint": config_fingerprint(cfg), **to_plain(content)})


def load_checkpoint(path: Path, cfg: RunConfig) -> dict:
    """The content saved by :func:`save_checkpoint`.

    A corrupt or foreign file, or one made by a run with other settings, raises a one-line :class:`ConfigError`.
    """
    try:
        saved = torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"checkpoint {path} is corrupt or not a plain-data secure_fgl checkpoint ({reason[:160]}); "
            "delete it or run without --resume"
        ) from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ConfigError(f"checkpoint {path} is not a {FORMAT} checkpoint; delete it or run without --resume")
    mine, theirs = config_fingerprint(cfg), saved.get("fingerprint")
    if not isinstance(theirs, dict):
        raise ConfigError(f"checkpoint {path} has no config fingerprint; delete it or run without --resume")
    if theirs.get("executor") == "inline":  # the removed in-process executor kept one state for every party
        raise ConfigError(
            f"checkpoint {path} was written by --executor inline, which was removed: its state cannot be "
            "resumed; delete it or choose another --out and start the run again"
        )
    differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differ:
        shown = ", ".join(f"{k} (checkpoint {theirs.get(k)!r}, now {mine.get(k)!r})" for k in differ)
        raise ConfigError(
            f"--resume refused: the checkpoint in {path.parent} was made with other settings: {shown}; "
            "resume with the same settings or choose another --out"
        )
    return from_plain({k: v for k, v in saved.items() if k not in ("format", "fingerprint")})
