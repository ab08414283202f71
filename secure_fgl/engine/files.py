"""Atomic writes: a reader never sees a half-written result or checkpoint.

Results and model weights get the permissions the umask gives a new file (group-readable
under the usual 022/002), so collaborators can read a run; checkpoints, which hold client
state, keep the private 0600 of the temporary file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if torch.is_tensor(obj):
        return obj.tolist()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def _public_mode(path) -> None:
    """Give a fresh file ``0666 & ~umask``, as ``open()`` would (mkstemp makes it 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write ``data`` as indented JSON by a rename, so a reader never sees a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(_jsonable(data), f, indent=2)
    _public_mode(tmp)
    os.replace(tmp, path)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """``data`` to ``path`` through a 0600 temporary file and a rename (a private checkpoint)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def save_torch_atomic(path: str | Path, obj: Any, *, private: bool = True) -> None:
    """``private``: keep 0600 (checkpoints); else the umask's mode (model weights)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    torch.save(obj, tmp)
    if not private:
        _public_mode(tmp)
    os.replace(tmp, path)
