"""Where a result came from: package version, git commit, start time, library versions.

Stored at the top level of ``result.json`` (see :mod:`secure_fgl.results` for the schema).
"""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from importlib import metadata
from pathlib import Path

#: libraries whose versions change numbers or bytes
LIBRARIES = ("torch", "torch-geometric", "tenseal", "opacus", "cryptography", "numpy", "scipy")


def package_version() -> str:
    """The installed secure-fgl version, or ``unknown``."""
    try:
        return metadata.version("secure-fgl")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_commit() -> str | None:
    """The checkout's HEAD commit (with ``+dirty`` for uncommitted changes), or None outside git."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def library_versions() -> dict[str, str | None]:
    """Python's version and those of the main libraries (None when not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def now_utc() -> str:
    """Current UTC time in ISO 8601, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def provenance() -> dict:
    """Version, git commit, start time and library versions of a run."""
    return {
        "secure_fgl_version": package_version(),
        "git_commit": git_commit(),
        "started_at": now_utc(),
        "library_versions": library_versions(),
    }
