"""The ``secure-fgl`` command.

    secure-fgl run [flags]          one experiment (no flags: the main job, secure FedGCN on the built-in graph)
    secure-fgl datasets             every dataset, its task and whether its files are present
    secure-fgl report [flags]       privacy/utility sweep -> report.md, report.html, PNG figures
    secure-fgl bench --suite NAME   benchmarks that print measured ratios

Bad input prints one line naming the problem and the fix and exits with code 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import types
import typing

from ..config import ConfigError, RunConfig, load_config_file

#: run flags that are not plain RunConfig fields
_SKIP = {"options", "synthetic", "attacks"}


def _user_errors() -> tuple[type[BaseException], ...]:
    errs: list[type[BaseException]] = [ConfigError]
    from protocols.errors import ProtocolError
    errs.append(ProtocolError)
    try:
        from ..data.errors import DataError
        errs.append(DataError)
    except ImportError:
        pass
    return tuple(errs)


def _arg_type(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _arg_type(args[0])
    return {"int": int, "float": float, "str": str, "bool": bool}.get(getattr(tp, "__name__", str(tp)), str)


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        tp = _arg_type(hints[f.name])
        if tp is bool:
            parser.add_argument(flag, dest=f.name, type=_bool, nargs="?", const=True, default=None,
                                help=f"(default {f.default})")
        else:
            parser.add_argument(flag, dest=f.name, type=tp, default=None,
                                help=f"(default {f.default})" if f.default is not dataclasses.MISSING else None)


def _algorithm_option_classes():
    from ..algorithms import ALGORITHMS
    out = {}
    for name, spec in ALGORITHMS.items():
        module, cls = spec.split(":")
        try:
            mod = importlib.import_module(f"secure_fgl.algorithms.{module}")
        except ModuleNotFoundError:
            continue
        out[name] = getattr(mod, cls).Options
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="secure-fgl", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="run one experiment")
    run.add_argument("--config", help="TOML/YAML/JSON file whose keys mirror these flags")
    _add_dataclass_flags(run, RunConfig, skip=_SKIP)
    run.add_argument("--attacks", help="'all' or a comma-separated list of attack names")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    opts = run.add_argument_group("algorithm options (apply to the algorithm that has them)")
    for cls in _algorithm_option_classes().values():
        _add_option_flags(opts, cls)

    sub.add_parser("datasets", help="list datasets and whether their files are present").add_argument(
        "--data-root", dest="data_root", default=None)

    report = sub.add_parser("report", help="privacy/utility sweep and report")
    report.add_argument("rest", nargs=argparse.REMAINDER)

    bench = sub.add_parser("bench", help="benchmarks (print measured ratios)")
    bench.add_argument("--suite", required=True, choices=["protocols", "fedgcn", "fuzz"])
    bench.add_argument("--cases", type=int, default=20000, help="fuzz suite: number of cases")
    bench.add_argument("--out", default="runs/bench")
    bench.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    bench.add_argument("--data-root", dest="data_root", default=None)
    return parser


def _add_option_flags(group, cls) -> None:
    """``--<field>`` for each field of an algorithm's Options (shared names added once)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if any(flag in a.option_strings for a in group._actions):
            continue
        tp = _arg_type(hints[f.name])
        bool_kw = {"nargs": "?", "const": True} if tp is bool else {}
        group.add_argument(flag, dest=f"opt_{f.name}", type=_bool if tp is bool else tp, default=None, **bool_kw,
                           help=f"{cls.__doc__.strip().splitlines()[0] if cls.__doc__ else ''}")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    values: dict = {}
    if args.config:
        values.update(load_config_file(args.config))
    for f in dataclasses.fields(RunConfig):
        if f.name in _SKIP:
            continue
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    if args.attacks:
        values["attacks"] = [a.strip() for a in args.attacks.split(",") if a.strip()]
    elif isinstance(values.get("attacks"), str):
        values["attacks"] = [a.strip() for a in values["attacks"].split(",") if a.strip()]
    options = dict(values.get("options", {}))
    for key, v in vars(args).items():
        if key.startswith("opt_") and v is not None:
            options[key[4:]] = v
    # keep only the options the chosen algorithm knows; a flag it lacks is an error
    from ..algorithms import get_algorithm
    algo = get_algorithm(values.get("algorithm", RunConfig.algorithm))
    known = {f.name for f in dataclasses.fields(algo.Options)}
    stray = set(options) - known
    if stray:
        raise ConfigError(f"--{sorted(stray)[0].replace('_', '-')} does not apply to algorithm "
                          f"{algo.name!r}" + (f" (its options: {', '.join('--' + k.replace('_', '-') for k in sorted(known))})"
                                               if known else " (it has no options)"))
    values["options"] = options
    return RunConfig.from_dict(values).validate()


def _print_summary(result: dict) -> None:
    cfg, final, comm, t = result["config"], result["final"], result["comm"], result["time"]
    lines = [
        f"algorithm {cfg['algorithm']}  dataset {cfg['dataset']}  clients {result['num_clients']}  "
        f"mode {cfg['mode']}  dp_epsilon {cfg['dp_epsilon']}  device {result['device']}",
        f"test accuracy   {final['test_acc']:.4f}  (val {final['val_acc']:.4f}, best round {final['best_round']})",
    ]
    for key in sorted(k for k in final if k.endswith("_acc") and k not in ("test_acc", "val_acc", "train_acc")):
        if isinstance(final[key], float):
            lines.append(f"{key:<15} {final[key]:.4f}")
    lines.append(f"{'exchange':<34}{'up (MB)':>12}{'down (MB)':>12}{'plain-equiv up (MB)':>22}")
    for tag, v in comm["per_tag"].items():
        plain = v.get("plaintext_bytes_up")
        plain_txt = f"{plain / 1e6:.3f}" if plain is not None else "-"
        lines.append(f"{tag:<34}{v['bytes_up'] / 1e6:>12.3f}{v['bytes_down'] / 1e6:>12.3f}{plain_txt:>22}")
    lines.append(f"{'total':<34}{comm['bytes_up'] / 1e6:>12.3f}{comm['bytes_down'] / 1e6:>12.3f}"
                 f"{comm.get('plaintext_bytes_up', 0) / 1e6:>22.3f}")
    lines.append("time (s): " + "  ".join(f"{k} {v:.2f}" for k, v in t.items()))
    if result.get("privacy"):
        lines.append(f"privacy: total epsilon {result['privacy'].get('total_epsilon')}")
    for a in result.get("attacks") or []:
        lines.append(f"attack {a.get('name')}: {a.get('metric')}={a.get('value')} (chance {a.get('chance')})")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv:
        argv = ["run"]
    if argv[0] == "report":
        # the report command owns its flags (secure_fgl.report.cli)
        args = argparse.Namespace(command="report", rest=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        if args.command == "run":
            from ..experiment import run_experiment
            cfg = config_from_args(args)
            result = run_experiment(cfg, progress=not args.quiet)
            _print_summary(result)
            if cfg.out:
                print(f"result: {cfg.out}/result.json")
            return 0
        if args.command == "datasets":
            from ..data import dataset_status
            rows = dataset_status(args.data_root)
            print(f"{'name':<14}{'task':<8}{'present':<9}path")
            for r in rows:
                print(f"{r['name']:<14}{r['task']:<8}{'yes' if r['present'] else 'no':<9}{r['path'] or '(built in)'}")
            return 0
        if args.command == "report":
            from ..report.cli import main as report_main
            return report_main(args.rest)
        if args.command == "bench":
            if args.suite == "protocols":
                from ..bench.protocols import run_protocol_bench
                run_protocol_bench(args.out, quick=args.quick)
            elif args.suite == "fuzz":
                from ..bench.fuzz import run_fuzz_bench
                run_fuzz_bench(args.out, cases=args.cases)
            else:
                from ..bench.fedgcn import run_fedgcn_bench
                run_fedgcn_bench(args.out, quick=args.quick, data_root=args.data_root)
            return 0
        parser.print_help()
        return 2
    except _user_errors() as e:
        print(f"secure-fgl: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("secure-fgl: interrupted (rerun with --resume to continue from the last checkpoint)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
