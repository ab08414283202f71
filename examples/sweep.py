"""The run loop shared by the reproduction scripts under ``examples/``.

Each job is one run directory and its :class:`~secure_fgl.config.RunConfig`.  :func:`run_sweep`
runs the jobs in order, in this process, and

* skips a job whose ``<dir>/result.json`` exists, and resumes one whose ``<dir>/checkpoint.pt``
  exists from that round (``--resume``: an interrupted sweep goes on where it stopped, also on
  another device; the checkpoint refuses other settings);
* prints the job's equivalent CLI line and appends it to ``log`` (when given) before running it;
* loads each federation once and reuses it while consecutive jobs share ``fed_key(cfg)`` (the
  same partition and splits for every method);
* writes ``meta`` (when not ``None``) to ``<dir>/meta.json`` and removes the checkpoint
  (``result.json`` is all the tables need);
* calls ``done(job, result, seconds)`` after each run (print a line, rewrite the tables).

A run that raises is reported and skipped when ``skip_errors`` (e.g. a secure backend not in this
build), so the rest of the sweep goes on; it has no ``result.json`` and runs again next time.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields
from pathlib import Path

from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, run_experiment


@dataclass
class Job:
    """One run: its directory, its settings and what ``meta.json`` records (``None``: no file)."""

    dir: Path
    cfg: RunConfig
    meta: dict | None = field(default=None)


def read_runs(path: Path, key: Callable[[dict], Hashable]) -> dict:
    """The records of a ``runs.jsonl`` file (one JSON object a line) by ``key(record)``; {} if absent."""
    if not path.exists():
        return {}
    return {key(r): r for r in map(json.loads, path.read_text().splitlines())}


def cli_command(cfg: RunConfig) -> str:
    """The ``secure_fgl.cli.main run`` line that makes the same run.

    Settings that differ from the defaults, then the algorithm options.
    """
    defaults = RunConfig()
    parts = ["python", "-m", "secure_fgl.cli.main", "run"]
    for f in fields(RunConfig):
        value = getattr(cfg, f.name)
        if f.name in ("options", "synthetic", "attacks", "out") or value == getattr(defaults, f.name) or value is None:
            continue
        parts += [f"--{f.name.replace('_', '-')}", str(value)]
    for key, value in cfg.options.items():
        parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(parts + ["--out", cfg.out or "runs/x"])


def run_sweep(
    jobs: list[Job],
    done: Callable[[Job, dict, float], None],
    *,
    fed_key: Callable[[RunConfig], Hashable] | None = lambda cfg: (cfg.dataset, cfg.seed),
    prepare: Callable[[RunConfig, object], None] | None = None,
    log: Path | None = None,
    command: Callable[[RunConfig], str] = cli_command,
    skip_errors: bool = True,
) -> None:
    """Run every job without a ``result.json`` (module docstring).

    ``fed_key=None``: each run
    loads its own federation.  ``prepare(cfg, fed)`` may complete ``cfg`` from the loaded
    federation before the run.
    """
    fed_cache: dict = {}
    for job in jobs:
        d, cfg = job.dir, job.cfg
        if (d / "result.json").exists():
            continue
        cfg.out, cfg.resume = str(d), (d / "checkpoint.pt").exists()
        if log is not None:
            print(command(cfg), flush=True)
            with log.open("a") as f:
                f.write(command(cfg) + "\n")
        fed = None
        if fed_key is not None:
            key = fed_key(cfg)
            if key not in fed_cache:
                fed_cache.clear()
                fed_cache[key] = load_federation(cfg)
            fed = fed_cache[key]
        if prepare is not None:
            prepare(cfg, fed)
        t0 = time.perf_counter()
        try:
            r = run_experiment(cfg, progress=False, fed=fed)
        except Exception as e:  # noqa: BLE001 -- e.g. a backend not in this build: note it, go on
            if not skip_errors:
                raise
            print(f"[skip] {d}: {type(e).__name__}: {e}", flush=True)
            continue
        if job.meta is not None:
            (d / "meta.json").write_text(json.dumps(job.meta))
        (d / "checkpoint.pt").unlink(missing_ok=True)
        done(job, r, time.perf_counter() - t0)
