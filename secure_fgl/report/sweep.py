"""The privacy/utility grid: algorithms x datasets x modes x DP epsilons x seeds.

Every cell is one :func:`secure_fgl.experiment.run_experiment` call with ``attacks=['all']``,
written to ``DIR/<run-id>/result.json``.  A cell's folder is reused only when it holds a finished
run with the same identity (:mod:`secure_fgl.run_identity`: the fingerprint of the full resolved
config); a folder holding other settings is left alone and the cell runs into
``DIR/<run-id>-<fingerprint[:8]>``; an unfinished run with the same identity runs again.  A run
that fails writes ``error.json`` (config, error, traceback) and is retried by the next sweep.
``DIR/sweep.json`` records the grid and the folder and fingerprint of every cell: the report
reads those runs only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..config import RunConfig
from ..engine.files import write_json_atomic
from ..run_identity import differences, fingerprint, is_finished, resolved_config, stored_run

RESULT = "result.json"
ERROR = "error.json"


def parse_epsilon(text: str | float | None) -> float | None:
    """``'inf'``/``'none'``/``None`` -> ``None`` (no DP); otherwise a positive float."""
    if text is None:
        return None
    if isinstance(text, (int, float)):
        return None if math.isinf(text) else float(text)
    t = str(text).strip().lower()
    if t in ("inf", "none", "nodp", "no-dp", "∞", ""):
        return None
    v = float(t)
    if not v > 0:
        raise ValueError(f"DP epsilon must be > 0 or 'inf', got {text!r}")
    return None if math.isinf(v) else v


def eps_label(eps: float | None) -> str:
    """``inf`` for no DP, else epsilon in short form."""
    return "inf" if eps is None else f"{eps:g}"


def run_id(algorithm: str, dataset: str, mode: str, eps: float | None, seed: int) -> str:
    """The folder name of one run of a sweep: ``<algorithm>_<dataset>_<mode>_eps-<eps>_s<seed>``."""
    return f"{algorithm}_{dataset}_{mode}_eps-{eps_label(eps)}_s{seed}"


@dataclass
class SweepSpec:
    """The grid.

    ``config`` holds further :class:`RunConfig` fields common to every run (``clients``, ``partition``, ``rounds``,
    ``synthetic``, ``options`` ...).
    """

    algorithms: Sequence[str] = ("fedgcn",)
    datasets: Sequence[str] = ("sbm",)
    modes: Sequence[str] = ("plain", "ckks", "mask")
    epsilons: Sequence[float | None] = (None,)
    seeds: Sequence[int] = (0,)
    attacks: Sequence[str] = ("all",)
    config: dict[str, Any] = field(default_factory=dict)
    #: per-algorithm options, e.g. {"fedgcn": {"hops": 1}}
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: per-algorithm epsilon lists replacing ``epsilons``, e.g. {"fedavg": [None]} (a no-DP reference)
    algorithm_epsilons: dict[str, Sequence[float | None]] = field(default_factory=dict)
    #: reference sweeps (e.g. central GAP) run with this one and drawn as reference curves (:mod:`.references`)
    references: list[SweepSpec] = field(default_factory=list)

    def runs(self, out_dir: str | Path) -> list[tuple[str, RunConfig]]:
        """Every cell, seed by seed (an interrupted sweep has whole grids for its first seeds), then the references'."""
        plan = self.own_runs(out_dir)
        ids = {rid for rid, _ in plan}
        for ref in self.references:
            plan += [(rid, cfg) for rid, cfg in ref.runs(out_dir) if rid not in ids]
            ids |= {rid for rid, _ in plan}
        return plan

    def reference_ids(self, out_dir: str | Path) -> set[str]:
        """The run ids of the reference sweeps' cells (those not also in this grid)."""
        own = {rid for rid, _ in self.own_runs(out_dir)}
        return {rid for ref in self.references for rid, _ in ref.runs(out_dir)} - own

    def own_runs(self, out_dir: str | Path) -> list[tuple[str, RunConfig]]:
        """This grid's cells, without the reference sweeps'."""
        out = Path(out_dir)
        plan = []
        for seed in self.seeds:
            for algo in self.algorithms:
                for ds in self.datasets:
                    for mode in self.modes:
                        for eps in self.algorithm_epsilons.get(algo, self.epsilons):
                            rid = run_id(algo, ds, mode, eps, seed)
                            values = {
                                **self.config,
                                "algorithm": algo,
                                "dataset": ds,
                                "mode": mode,
                                "dp_epsilon": eps,
                                "seed": int(seed),
                                "attacks": list(self.attacks),
                                "out": str(out / rid),
                            }
                            if algo in self.options:
                                values["options"] = {**values.get("options", {}), **self.options[algo]}
                            plan.append((rid, RunConfig.from_dict(values).validate()))
        return plan

    def to_dict(self) -> dict:
        """The grid as plain data (epsilons as labels)."""
        d = asdict(self)
        d["epsilons"] = [eps_label(e) for e in self.epsilons]
        d["algorithm_epsilons"] = {a: [eps_label(e) for e in es] for a, es in self.algorithm_epsilons.items()}
        d["references"] = [ref.to_dict() for ref in self.references]
        return d


#: keys of a sweep file's ``[grid]`` table (lists; seeds also a count) and their SweepSpec fields
GRID_KEYS = {
    "algorithms": "algorithms",
    "datasets": "datasets",
    "modes": "modes",
    "dp_epsilons": "epsilons",
    "seeds": "seeds",
    "attacks": "attacks",
}


def spec_from_file(path: str | Path) -> SweepSpec:
    """A sweep file.

    A run config's keys (TOML/YAML/JSON, as ``secure-fgl run --config``), applied to every run, plus a ``[grid]`` table
    (``algorithms``, ``datasets``, ``modes``, ``dp_epsilons`` ("inf" = no DP), ``seeds`` (a list or a count),
    ``attacks``) and optional ``[grid.<algorithm>]`` tables with that algorithm's ``dp_epsilons`` and ``options``.
    A top-level ``references`` list names other sweep files (relative to this one's folder, or a file of
    ``secure_fgl/configs``) whose runs are made with this sweep and drawn as reference curves.
    """
    from ..config import ConfigError, load_config_file

    raw = dict(load_config_file(path))
    refs = raw.pop("references", [])
    if isinstance(refs, str) or not all(isinstance(f, str) for f in refs):
        raise ConfigError(
            f'sweep file {path}: references must be a list of sweep files, e.g. ["dp-gap-central-cora.toml"]'
        )
    grid = raw.pop("grid", None)
    if not isinstance(grid, dict):
        raise ConfigError(
            f"sweep file {path} needs a [grid] table (algorithms, datasets, modes, dp_epsilons, "
            "seeds); without one it is a run config: use secure-fgl run --config"
        )
    spec = {}
    per_algo = {k: grid.pop(k) for k in list(grid) if isinstance(grid[k], dict)}
    for key, value in grid.items():
        if key not in GRID_KEYS:
            raise ConfigError(f"sweep file {path}: unknown [grid] key {key!r}; known: {', '.join(GRID_KEYS)}")
        spec[GRID_KEYS[key]] = value
    if isinstance(spec.get("seeds"), int):
        spec["seeds"] = list(range(spec["seeds"]))
    spec["epsilons"] = [parse_epsilon(e) for e in spec.get("epsilons", ["inf"])]
    if "options" in raw:
        raise ConfigError(
            f"sweep file {path}: put algorithm options in [grid.<algorithm>.options] tables "
            "(each algorithm has its own)"
        )
    algos = spec.get("algorithms", [raw.get("algorithm", "fedgcn")])
    raw.pop("algorithm", None)
    for key in ("dataset", "mode", "dp_epsilon", "seed", "attacks"):
        if key in raw:
            raise ConfigError(f"sweep file {path}: {key!r} is set by the [grid] table; remove it from the top level")
    return SweepSpec(
        **{**spec, "algorithms": algos},
        config=raw,
        options={a: dict(t["options"]) for a, t in per_algo.items() if t.get("options")},
        algorithm_epsilons={
            a: [parse_epsilon(e) for e in t["dp_epsilons"]] for a, t in per_algo.items() if "dp_epsilons" in t
        },
        references=[spec_from_file(_reference_file(path, f)) for f in refs],
    )


def _reference_file(sweep_file: str | Path, name: str) -> Path:
    """A reference sweep file: beside the sweep file, else one of the project's ``secure_fgl/configs``."""
    from ..config import ConfigError

    for candidate in (Path(sweep_file).parent / name, Path(__file__).resolve().parent.parent / "configs" / name):
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"sweep file {sweep_file}: reference sweep {name!r} not found beside it nor in secure_fgl/configs; "
        "give a path relative to the sweep file"
    )


@dataclass
class Cell:
    """One run of the plan.

    Its folder, resolved config and identity, and what the sweep does with it (``reuse`` a finished run with the same
    identity, ``run`` it, ``rerun`` an unfinished one).
    """

    run_id: str
    cfg: RunConfig
    config: dict
    fingerprint: str
    action: str
    note: str = ""
    reference: bool = False


def resolve(cfg: RunConfig) -> dict:
    """The resolved config of a planned run (``result.json``'s ``config``: options filled in)."""
    from ..preflight import preflight

    return resolved_config(cfg, preflight(cfg, check_data=False))


def plan_cells(spec: SweepSpec, out_dir: str | Path) -> list[Cell]:
    """Every run of the grid with the folder it goes to.

    ``<run-id>`` when that folder is free or holds the same identity, else ``<run-id>-<fingerprint[:8]>`` (the other run
    is never touched).
    """
    out = Path(out_dir)
    cells = []
    refs = spec.reference_ids(out)
    for rid, cfg in spec.runs(out):
        config = resolve(cfg)
        fp = fingerprint(config)
        note = ""
        for folder in (rid, f"{rid}-{fp[:8]}"):
            stored = stored_run(out / folder)
            if stored is None:
                action = "run"
            elif stored["fingerprint"] == fp:
                action = "reuse" if stored["finished"] else "rerun"
            else:
                diff = differences(stored["config"], config)
                note = f"{rid} holds other settings ({'; '.join(diff[:3])}{'; ...' if len(diff) > 3 else ''})"
                continue
            break
        if folder != rid:
            cfg = dataclasses.replace(cfg, out=str(out / folder))
            config = {**config, "out": cfg.out}
            note += f": this run goes to {folder}"
        cells.append(Cell(folder, cfg, config, fp, action, note, reference=rid in refs))
    return cells


def run_sweep(
    spec: SweepSpec,
    out_dir: str | Path,
    *,
    progress: bool = True,
    runner: Callable[[RunConfig], dict] | None = None,
    cells: list[Cell] | None = None,
) -> list[dict]:
    """Run every cell of the grid that has no finished run with the same identity.

    Args:
        spec: The sweep: base settings and grid.
        out_dir: The sweep folder; each run writes its own folder in it, ``sweep.json`` records the plan.
        progress: Print one line per run.
        runner: Runs one configuration (default: :func:`~secure_fgl.experiment.run_experiment`).
        cells: The planned runs (default: :func:`plan_cells` of ``spec``).

    Returns:
        One status row per run (``{"run_id", "status": done|skipped|failed, "seconds", "error"?}``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = plan_cells(spec, out) if cells is None else cells
    write_json_atomic(
        out / "sweep.json",
        {
            "spec": spec.to_dict(),
            "runs": [c.run_id for c in cells],
            "fingerprints": {c.run_id: c.fingerprint for c in cells},
            "references": [c.run_id for c in cells if c.reference],
        },
    )
    if runner is None:
        from ..experiment import run_experiment

        def runner(cfg: RunConfig) -> dict:
            return run_experiment(cfg, progress=False)

    status = [{"run_id": c.run_id, "status": "skipped", "seconds": 0.0} for c in cells if c.action == "reuse"]
    todo = [c for c in cells if c.action != "reuse"]
    bar = tqdm(todo, desc="sweep", unit="run", disable=not progress, dynamic_ncols=True)
    for cell in bar:
        rid, cfg = cell.run_id, cell.cfg
        bar.set_postfix_str(rid)
        run_dir = out / rid
        t0 = time.perf_counter()
        try:
            runner(cfg)
            if (run_dir / ERROR).exists():
                (run_dir / ERROR).unlink()
            ckpt = run_dir / "checkpoint.pt"  # the run is final: its checkpoint is no longer needed
            if (run_dir / RESULT).exists() and ckpt.exists():
                ckpt.unlink()
            status.append({"run_id": rid, "status": "done", "seconds": time.perf_counter() - t0})
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a failing cell is recorded, the sweep goes on
            write_json_atomic(
                run_dir / ERROR,
                {
                    "config": cfg.to_dict(),
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc(limit=8),
                },
            )
            status.append(
                {
                    "run_id": rid,
                    "status": "failed",
                    "seconds": time.perf_counter() - t0,
                    "error": f"{type(e).__name__}: {e}",
                }
            )
    bar.close()
    return status


def load_runs(
    out_dir: str | Path,
    *,
    run_ids: Sequence[str] | None = None,
    fingerprints: dict | None = None,
    include_unfinished: bool = False,
    left_out: dict | None = None,
) -> tuple[list[dict], list[dict]]:
    """``(results, errors)`` found under ``out_dir`` (one level of run folders).

    Only the folders ``run_ids`` when given, only those whose identity still equals ``fingerprints[folder]`` when given,
    only finished runs unless ``include_unfinished``.  ``left_out``, when given, receives the counts of what was left
    out (``unfinished``, ``not_in_sweep``, ``other_settings``).
    """
    out = Path(out_dir)
    results, errors = [], []
    counts = {"unfinished": 0, "not_in_sweep": 0, "other_settings": 0}
    wanted = None if run_ids is None else set(run_ids)
    for p in sorted(out.glob(f"*/{RESULT}")):
        if wanted is not None and p.parent.name not in wanted:
            counts["not_in_sweep"] += 1
            continue
        with open(p) as f:
            r = json.load(f)
        if not include_unfinished and not is_finished(r):
            counts["unfinished"] += 1
            continue
        expected = (fingerprints or {}).get(p.parent.name)
        if expected and fingerprint(r.get("config") or {}) != expected:
            counts["other_settings"] += 1
            continue
        r["_run_id"] = p.parent.name
        results.append(r)
    if left_out is not None:
        left_out.update(counts)
    for p in sorted(out.glob(f"*/{ERROR}")):
        if (p.parent / RESULT).exists() or (wanted is not None and p.parent.name not in wanted):
            continue
        with open(p) as f:
            e = json.load(f)
        e["_run_id"] = p.parent.name
        errors.append(e)
    return results, errors
