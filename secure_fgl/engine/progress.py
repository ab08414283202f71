"""Progress of the long phases of a run (data, key setup and pre-training exchange, attacks).

``phases = Phases(enabled=True, log_file=None)``; ``with phases("setup", "keys and the
pre-training exchange"):`` prints ``[setup] keys and the pre-training exchange ...`` when the
phase starts and ``[setup] done in 12.3 s`` when it ends, on stderr (stdout keeps the
summary) and, with ``log_file``, in that file too.  The rounds have their own bar.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path


class Phases:
    """Logs the start and duration of named phases (module docstring); ``seconds`` holds each phase's time."""

    def __init__(self, enabled: bool = True, log_file: str | Path | None = None):
        self.enabled = enabled
        self.log_file = Path(log_file) if log_file else None
        self.seconds: dict[str, float] = {}

    def log(self, message: str) -> None:
        """Print ``message`` on stderr (when enabled) and append it, time-stamped, to the log file."""
        if self.enabled:
            print(message, file=sys.stderr, flush=True)
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            with self.log_file.open("a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")

    @contextmanager
    def __call__(self, name: str, what: str):
        """Context manager that logs phase ``name`` (``what`` it does) on entry and its duration on exit."""
        self.log(f"[{name}] {what} ...")
        t0 = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - t0
        self.log(f"[{name}] done in {self.seconds[name]:.1f} s")
