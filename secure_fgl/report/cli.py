r"""`secure-fgl report`: run (or resume) a privacy/utility sweep, then write the report.

For example,

    secure-fgl report --algorithms fedgcn,fedavg --datasets sbm --modes plain,ckks,mask \
        --dp-epsilons inf,8,4,2,1 --seeds 3 --rounds 50 --out runs/report

`--seeds N` runs seeds 0..N-1 (or give a list, `--seeds 0,3,7`).  A finished run is
reused only when its settings (the fingerprint of its full resolved config) equal the asked ones,
so the same command after an interruption goes on where it stopped, and a sweep with other
settings into the same --out runs into new folders instead of mixing runs.  The plan (runs,
attacks, an estimate from past runs) is printed first; `--dry-run` prints it only.
`--no-run` only re-renders the report from the run files.  `--config FILE` reads the
sweep from a file: a run config's keys plus a `[grid]` table (example:
`secure_fgl/configs/dp-gap-tradeoff.toml`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _seeds(text: str) -> list[int]:
    parts = _csv(text)
    if len(parts) == 1 and "," not in text:
        n = int(parts[0])
        if n < 1:
            raise argparse.ArgumentTypeError(f"--seeds must be >= 1, got {n}")
        return list(range(n))
    return [int(p) for p in parts]


def build_parser() -> argparse.ArgumentParser:
    """The ``secure-fgl report`` parser."""
    p = argparse.ArgumentParser(
        prog="secure-fgl report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="sweep file: run-config keys + a [grid] table (replaces the grid flags below)",
    )
    p.add_argument("--algorithms", default=None, help="comma-separated algorithm names (default fedgcn)")
    p.add_argument("--datasets", default=None, help="comma-separated dataset names (default sbm)")
    p.add_argument("--modes", default=None, help="comma-separated protocol modes (default plain,ckks,mask)")
    p.add_argument("--dp-epsilons", default=None, help="comma-separated DP budgets; 'inf' = no DP (default inf)")
    p.add_argument("--seeds", default=None, help="number of seeds (0..N-1) or a comma-separated list (default 1)")
    p.add_argument("--rounds", type=int, default=None, help="training rounds per run")
    p.add_argument("--clients", type=int, default=None, help="number of clients")
    p.add_argument("--partition", default=None, help="how nodes are split over clients (as run --partition)")
    p.add_argument("--beta", type=float, default=None, help="Dirichlet concentration")
    p.add_argument("--dp-placement", default=None, help="auto | local | distributed (as run --dp-placement)")
    p.add_argument("--attacks", default=None, help="'all' (default), 'none' or a comma-separated list of attacks")
    p.add_argument("--data-root", default=None, help="dataset folder (as run --data-root)")
    p.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N | mps (as run --device)")
    p.add_argument("--synthetic", default=None, help="JSON kwargs of the synthetic generator")
    p.add_argument("--options", default=None, help='JSON per-algorithm options, e.g. \'{"fedgcn": {"hops": 1}}\'')
    p.add_argument("--out", default="runs/report", help="sweep folder (run folders + report)")
    p.add_argument("--title", default="secure_fgl privacy/utility report", help="the report's title")
    p.add_argument("--no-run", action="store_true", help="only render the report from existing runs")
    p.add_argument("--dry-run", action="store_true", help="print the plan (runs, attacks, estimated time) only")
    p.add_argument(
        "--figure-size",
        choices=("column", "page"),
        default="column",
        help="figure width: one column (3.5 in) or a page (7 in) of a two-column paper",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-best-model", action="store_true", help="do not keep each run's best_model.pt (kept by default)"
    )
    return p


GRID_FLAGS = {
    "algorithms": "fedgcn",
    "datasets": "sbm",
    "modes": "plain,ckks,mask",
    "dp_epsilons": "inf",
    "seeds": "1",
    "attacks": "all",
}


def spec_from_args(args: argparse.Namespace):
    """The :class:`.sweep.SweepSpec` of the command line (or of its ``--config`` file)."""
    from .sweep import SweepSpec, parse_epsilon, spec_from_file

    config = {}
    for key in ("rounds", "clients", "partition", "beta", "dp_placement", "data_root", "device"):
        v = getattr(args, key)
        if v is not None:
            config[key] = v
    if args.synthetic:
        config["synthetic"] = json.loads(args.synthetic)
    if args.no_best_model:
        config["save_best_model"] = False
    if args.config:
        given = [f"--{k.replace('_', '-')}" for k in GRID_FLAGS if getattr(args, k) is not None]
        if given or args.options:
            raise ValueError(
                f"--config sets the grid; drop {', '.join(given + ['--options'] * bool(args.options))} "
                "or put them in the file's [grid] table"
            )
        spec = spec_from_file(args.config)
        for s in [spec, *spec.references]:  # --rounds, --data-root ... apply to the reference sweeps too
            s.config = {**s.config, **config}
        return spec
    grid = {k: getattr(args, k) if getattr(args, k) is not None else d for k, d in GRID_FLAGS.items()}
    attacks = [] if grid["attacks"].strip().lower() == "none" else _csv(grid["attacks"])
    return SweepSpec(
        algorithms=_csv(grid["algorithms"]),
        datasets=_csv(grid["datasets"]),
        modes=_csv(grid["modes"]),
        epsilons=[parse_epsilon(e) for e in _csv(grid["dp_epsilons"])],
        seeds=_seeds(grid["seeds"]),
        attacks=attacks,
        config=config,
        options=json.loads(args.options) if args.options else {},
    )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def estimate(cells, out_dir) -> tuple[float | None, str]:
    """Seconds the runs to do will take, and how the estimate was made.

    Estimated from the finished runs under ``out_dir`` (same algorithm, dataset and mode; training time scaled by
    rounds, attack time added when attacks are asked); None when no past run matches.
    """
    from .sweep import load_runs

    past, _ = load_runs(out_dir)
    total, known, unknown = 0.0, 0, 0
    for cell in cells:
        if cell.action == "reuse":
            continue
        c = cell.config
        same = [r for r in past if all(r["config"].get(k) == c.get(k) for k in ("algorithm", "dataset", "mode"))]
        if not same:
            unknown += 1
            continue
        per_run = []
        for r in same:
            t = r.get("time") or {}
            train = t.get("total", 0.0) - t.get("attacks", 0.0)
            scale = c["rounds"] / max(1, r["config"].get("rounds") or 1)
            per_run.append(train * scale + (t.get("attacks", 0.0) if c.get("attacks") else 0.0))
        total += sorted(per_run)[len(per_run) // 2]
        known += 1
    if not known:
        return None, "no past run of these settings in --out: the progress bar's ETA follows the first runs"
    how = f"from {len(past)} past run(s) in --out (median per cell, scaled by rounds)"
    if unknown:
        how += f"; {unknown} run(s) with no past run to go by are not counted"
    return total, how


def print_plan(spec, cells, out_dir) -> None:
    """The plan: how many runs, which attacks, what is reused, and an estimate."""
    eps = sorted({c.cfg.dp_epsilon for c in cells if not c.reference}, key=lambda e: (e is None, e or 0))
    reuse = sum(c.action == "reuse" for c in cells)
    rerun = sum(c.action == "rerun" for c in cells)
    todo = len(cells) - reuse
    refs = sum(c.reference for c in cells)
    print(
        f"plan: {len(cells) - refs} run(s) = {len(spec.algorithms)} algorithm(s) x {len(spec.datasets)} dataset(s) x "
        f"{len(spec.modes)} mode(s) x {len(eps)} epsilon(s) x {len(spec.seeds)} seed(s); rounds "
        f"{', '.join(sorted({str(c.cfg.rounds) for c in cells if not c.reference}))}"
    )
    if refs:
        print(
            f"plan: + {refs} reference run(s) of {len(spec.references)} reference sweep(s), drawn as reference curves"
        )
    attacks = ", ".join(spec.attacks) or "none"
    print(
        f"plan: attacks {attacks}"
        + (
            " (each run attacked after training; often most of a run's time: --attacks none to skip)"
            if spec.attacks
            else ""
        )
    )
    print(
        f"plan: {reuse} finished run(s) reused (same settings), {todo} to run"
        + (f" ({rerun} unfinished, run again)" if rerun else "")
    )
    for c in cells:
        if c.note:
            print(f"plan: {c.note}")
    if not todo:
        print("plan: estimate 0 s (nothing to run; the report is rendered from the runs)")
        return
    seconds, how = estimate(cells, out_dir)
    print(f"plan: estimate {_minutes(seconds)} ({how})" if seconds is not None else f"plan: estimate unknown ({how})")


def _interrupted() -> int:
    print(
        "secure-fgl report: interrupted; run the same command again (same --out): finished runs are reused and "
        "the interrupted one starts again",
        file=sys.stderr,
    )
    return 130


def main(argv: list[str] | None = None) -> int:
    """``secure-fgl report``: plan, run (or resume) the sweep, then render the report.

    Returns:
        The exit status.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--"]:  # `secure-fgl report -- --flags` (argparse REMAINDER keeps the '--')
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    from ..validation import ConfigError

    try:
        spec = spec_from_args(args)
        from ..algorithms import get_spec

        for name in spec.algorithms:
            get_spec(name)  # an unknown name is a one-line error, not N failed runs
        if not args.no_run:
            from ..preflight import preflight
            from .sweep import plan_cells, run_sweep

            for _, cfg in spec.runs(args.out):  # every config, option, dataset and attack name checked
                preflight(dataclasses.replace(cfg, out=None))  # before the first run starts
            cells = plan_cells(spec, args.out)
            print_plan(spec, cells, args.out)
            if args.dry_run:
                return 0
            status = run_sweep(spec, args.out, progress=not args.quiet, cells=cells)
            done = sum(s["status"] == "done" for s in status)
            skipped = sum(s["status"] == "skipped" for s in status)
            failed = [s for s in status if s["status"] == "failed"]
            print(f"sweep: {done} run(s) done, {skipped} reused (finished, same settings), {len(failed)} failed")
            for s in failed[:10]:
                print(f"  failed {s['run_id']}: {s['error']}")
        from .render import render_report

        paths = render_report(args.out, title=args.title, figure_size=args.figure_size)
    except KeyboardInterrupt:
        return _interrupted()
    except (ValueError, ConfigError, json.JSONDecodeError) as e:
        print(f"secure-fgl report: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"report: {paths['md']}")
    print(f"report: {paths['html']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
