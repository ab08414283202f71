"""The `secure-fgl` command.

    secure-fgl run [flags]            one experiment (no flags: the main job, secure FedGCN on the built-in graph)
    secure-fgl run --preset NAME      a paper's setting (flags override it)
    secure-fgl algorithms [NAME]      algorithms; one's paper, exchanges, options and presets
    secure-fgl attacks | modes        the attack suite; the secure modes
    secure-fgl datasets               every dataset, its task and whether its files are present
    secure-fgl compare DIR...         a table of finished runs
    secure-fgl plot RUN               one run's curves -> RUN/curves.png
    secure-fgl report [flags]         privacy/utility sweep -> report.md/.html, tables.tex, PNG/PDF/SVG figures
    secure-fgl bench --suite NAME     benchmarks that print measured ratios
    secure-fgl keys new --out DIR     a site's identity key (its fingerprint goes into the run manifest)
    secure-fgl manifest new|verify    the run manifest and the code sites compare before a run
    secure-fgl partition export       each client's part of a partitioned dataset, one file per client

Every setting is checked before any work starts; bad input prints one line naming the
problem and the fix and exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from ..config import ConfigError, RunConfig
from ..validation import describe, did_you_mean, field_type, flag_name
from .keys import add_key_parsers, key_command, manifest_command
from .layers import UsageError, config_from_args
from .partition import add_partition_parser, partition_command

#: ``run --help`` sections, in order (each RunConfig field names its group)
GROUPS = ("data", "federation", "model", "training", "privacy", "secure mode", "runtime", "output", "attacks")
#: RunConfig fields set only in config files (tables)
CONFIG_ONLY = ("synthetic", "options")


class Parser(argparse.ArgumentParser):
    """An argument parser that raises :class:`UsageError` instead of exiting."""

    def error(self, message: str):
        """Raise the usage error (``main`` prints it with the exit status of a usage error)."""
        raise UsageError(message)


def _help(text: str) -> str:
    return text.replace("%", "%%")


def _add_setting(group, cls, f: dataclasses.Field, dest: str) -> None:
    tp, _ = field_type(cls, f.name)
    kw = {"nargs": "?", "const": "true", "metavar": "BOOL"} if tp is bool else {"metavar": f.name.upper()}
    group.add_argument(flag_name(f.name), dest=dest, default=argparse.SUPPRESS, help=_help(describe(f)), **kw)


def _add_run_parser(sub) -> argparse.ArgumentParser:
    run = sub.add_parser(
        "run",
        help="run one experiment",
        allow_abbrev=False,
        description="Run one experiment. Settings come from --preset, then --config, then flags; "
        "each flag shows its default, unit, choices and range.",
    )
    from ..presets import preset_names

    run.add_argument(
        "--preset",
        metavar="NAME",
        help=f"a paper's setting shipped with the package {{{'|'.join(preset_names())}}} "
        "(described by secure-fgl algorithms NAME)",
    )
    run.add_argument("--config", metavar="FILE", help="TOML/YAML/JSON file whose keys mirror the flags")
    groups = {g: run.add_argument_group(g) for g in GROUPS}
    for f in dataclasses.fields(RunConfig):
        if f.name not in CONFIG_ONLY:
            _add_setting(groups[f.metadata.get("group", "training")], RunConfig, f, f.name)
    groups["output"].add_argument(
        "--overwrite", action="store_true", help="replace the finished run in --out (refused without it)"
    )
    groups["output"].add_argument("--quiet", action="store_true", help="no progress output")
    groups["output"].add_argument("--log-file", metavar="PATH", help="also append progress lines to this file")
    from ..algorithms import SPECS

    added: set[str] = set()
    for name, spec in SPECS.items():
        cls = spec.options
        group = run.add_argument_group(f"{name} options (--algorithm {name})")
        for f in dataclasses.fields(cls):
            if f.name not in added:
                added.add(f.name)
                _add_setting(group, cls, f, f"opt_{f.name}")
    run.epilog = (
        "Options of algorithms not listed above: secure-fgl algorithms NAME. Any --<option> of the "
        "chosen algorithm is accepted."
    )
    return run


def build_parser() -> argparse.ArgumentParser:
    """The ``secure-fgl`` parser: ``run`` with one flag per setting, and the other subcommands."""
    from ..provenance import package_version

    parser = Parser(
        prog="secure-fgl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--version", action="version", version=f"secure-fgl {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run_parser(sub)
    algos = sub.add_parser("algorithms", help="list algorithms, or describe one", allow_abbrev=False)
    algos.add_argument("name", nargs="?", help="an algorithm to describe (omit: list them all)")
    sub.add_parser("attacks", help="list the attacks", allow_abbrev=False)
    sub.add_parser("modes", help="list the secure modes", allow_abbrev=False)
    sub.add_parser(
        "datasets", help="list datasets and whether their files are present", allow_abbrev=False
    ).add_argument("--data-root", dest="data_root", default=None, help="dataset folder (as run --data-root)")
    compare = sub.add_parser("compare", help="table of finished runs", allow_abbrev=False)
    compare.add_argument("runs", nargs="+", metavar="DIR", help="run folders, or folders searched for them")
    compare.add_argument(
        "--include-unfinished",
        action="store_true",
        help="also show runs that did not finish (status other than complete)",
    )
    plot = sub.add_parser("plot", help="draw one run's curves", allow_abbrev=False)
    plot.add_argument("run", metavar="RUN", help="a run folder or its result.json")
    plot.add_argument("--out", default=None, help="PNG path (default RUN/curves.png)")
    sub.add_parser("report", help="privacy/utility sweep and report (secure-fgl report --help)", add_help=False)
    bench = sub.add_parser("bench", help="benchmarks (print measured ratios)", allow_abbrev=False)
    bench.add_argument("--suite", required=True, choices=["protocols", "fedgcn", "fuzz", "overhead", "runtime"])
    bench.add_argument("--cases", type=int, default=20000, help="fuzz suite: number of tampered messages")
    bench.add_argument("--out", default="runs/bench", help="folder the results are written to (default runs/bench)")
    bench.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    bench.add_argument("--data-root", dest="data_root", default=None, help="dataset folder (as run --data-root)")
    bench.add_argument("--device", default="cpu", help="overhead suite: where the workloads train (cpu | cuda | auto)")
    runtime = bench.add_argument_group("runtime suite (override the full grid)")
    runtime.add_argument("--clients", type=int, nargs="+", default=None, help="client counts K")
    runtime.add_argument("--features", type=int, default=None, help="features of the SBM graph")
    runtime.add_argument(
        "--modes",
        nargs="+",
        choices=["ckks", "mask", "ckks-mp"],
        default=["ckks", "mask"],
        help="secure modes (ckks-mp: the dropout column only)",
    )
    runtime.add_argument(
        "--executors", nargs="+", choices=["local", "ray"], default=["local", "ray"], help="executors to compare"
    )
    runtime.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs per cell (median reported); overhead suite: the modes round-robin (default 1)",
    )
    runtime.add_argument("--ray-cpus", dest="ray_cpus", type=int, default=None, help="CPUs of the local Ray cluster")
    runtime.add_argument(
        "--dropouts",
        action="store_true",
        help="the dropout column instead: a FedAvg round with 0, 1 and n-t clients dropped at upload "
        "(--simulate-dropouts; default 10 clients, local executor)",
    )
    runtime.add_argument(
        "--threshold",
        type=int,
        default=None,
        help="dropout column: ckks-mp's t of t-out-of-n key switching (default n: n-out-of-n, no dropouts)",
    )
    add_key_parsers(sub)
    add_partition_parser(sub, _add_setting)
    return parser


def _default_out(cfg: RunConfig) -> str:
    return f"runs/{cfg.algorithm}-{cfg.dataset}-{cfg.mode}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_command(args: argparse.Namespace, extra: list[str]) -> int:
    """``secure-fgl run``: check the settings, run the experiment and print its summary.

    Args:
        args: The parsed command line.
        extra: Unparsed ``--<option>`` flags (the algorithm's own options).

    Returns:
        The exit status.
    """
    from ..engine.progress import Phases
    from ..preflight import preflight
    from ..run_identity import check_run_folder, resolved_config

    cfg = config_from_args(args, extra)
    options = preflight(cfg)
    if cfg.out is None:
        cfg.out = _default_out(cfg)
    check_run_folder(cfg.out, resolved_config(cfg, options), resume=cfg.resume, overwrite=args.overwrite)
    phases = Phases(enabled=not args.quiet, log_file=args.log_file)
    from ..experiment import run_experiment
    from .summary import format_summary

    result = run_experiment(cfg, progress=not args.quiet, phases=phases)
    print(format_summary(result))
    print(f"result: {cfg.out}/result.json")
    return 0


def _dispatch(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    if argv and argv[0] == "report":  # the report command owns its flags (secure_fgl.report.cli)
        from ..report.cli import main as report_main

        return report_main(argv[1:])
    args, extra = parser.parse_known_args(argv)
    if args.command == "run":
        return run_command(args, extra)
    if extra:
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "algorithms":
        from .discover import algorithms_command

        return algorithms_command(args.name)
    if args.command == "attacks":
        from .discover import attacks_command

        return attacks_command()
    if args.command == "modes":
        from .discover import modes_command

        return modes_command()
    if args.command == "compare":
        from .discover import compare_command

        return compare_command(args.runs, args.include_unfinished)
    if args.command == "plot":
        from .discover import plot_command

        return plot_command(args.run, args.out)
    if args.command == "datasets":
        from .discover import datasets_command

        return datasets_command(args.data_root)
    if args.command == "bench":
        if args.suite == "protocols":
            from ..bench.protocols import run_protocol_bench

            run_protocol_bench(args.out, quick=args.quick)
        elif args.suite == "runtime" and not args.dropouts and ("ckks-mp" in args.modes or args.threshold):
            raise UsageError("--modes ckks-mp and --threshold belong to the dropout column: add --dropouts")
        elif args.suite == "runtime" and args.dropouts:
            from ..bench.runtime import run_dropout_bench

            run_dropout_bench(
                args.out,
                clients=tuple(args.clients or (10,)),
                modes=tuple(args.modes),
                executors=tuple(args.executors),
                repeats=args.repeats or 1,
                features=args.features,
                threshold=args.threshold,
            )
        elif args.suite == "runtime":
            from ..bench.runtime import run_runtime_bench

            run_runtime_bench(
                args.out,
                quick=args.quick,
                executors=tuple(args.executors),
                modes=tuple(args.modes),
                ray_cpus=args.ray_cpus,
                repeats=args.repeats,
                clients=args.clients,
                features=args.features,
            )
        elif args.suite == "overhead":
            from ..bench.overhead import run_overhead_bench

            run_overhead_bench(
                args.out, quick=args.quick, data_root=args.data_root, repeats=args.repeats or 1, device=args.device
            )
        elif args.suite == "fuzz":
            from ..bench.fuzz import run_fuzz_bench

            run_fuzz_bench(args.out, cases=args.cases)
        else:
            from ..bench.fedgcn import run_fedgcn_bench

            run_fedgcn_bench(args.out, quick=args.quick, data_root=args.data_root)
        return 0
    if args.command == "partition":
        return partition_command(args)
    if args.command in ("keys", "manifest"):
        return key_command(args) if args.command == "keys" else manifest_command(args)
    parser.print_help()
    return 2


def _user_errors() -> tuple[type[BaseException], ...]:
    errs: list[type[BaseException]] = [ConfigError, UsageError]
    if "protocols" in sys.modules or "torch" in sys.modules:
        from protocols.errors import ProtocolError

        from ..data.errors import DataError

        errs += [ProtocolError, DataError]
    return tuple(errs)


def _unknown_command(argv: list[str], parser) -> str | None:
    commands = list(parser._subparsers._group_actions[0].choices)
    if argv and not argv[0].startswith("-") and argv[0] not in commands:
        return f"unknown command {argv[0]!r}" + (
            did_you_mean(argv[0], commands) or f"; choose one of {', '.join(commands)}"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    """The ``secure-fgl`` entry point.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``; none means ``run``).

    Returns:
        The exit status; usage and configuration errors print their message instead of a traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv) or ["run"]
    parser = build_parser()
    try:
        message = _unknown_command(argv, parser)
        if message:
            raise UsageError(message)
        return _dispatch(parser, argv)
    except SystemExit as e:  # --help / --version
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        print(
            "secure-fgl: interrupted (rerun with the same --out and --resume to continue from the last checkpoint)",
            file=sys.stderr,
        )
        return 130
    except BrokenPipeError:  # the reader of stdout went away (e.g. `secure-fgl attacks | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 0
    except Exception as e:
        if not isinstance(e, _user_errors()):
            raise
        text = " ".join(str(e).split())
        if isinstance(e, UsageError) and text.startswith("unrecognized arguments"):
            text += did_you_mean(text.split()[-1], [a for act in parser._actions for a in act.option_strings])
        print(f"secure-fgl: error: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
