r"""Secure minus plain: the same runs (same seeds) in plain, ckks, mask (and ckks-mp), and their differences.

Grid (the evidence of docs/secure_equals_plain.md): FedGCN 1-hop on Cora, CiteSeer and PubMed, 10 clients, Dirichlet
beta 1 and 10000, the released code's setting (``--optimizer sgd --lr 0.5 --rounds 100
--local-epochs 3``, as ``examples/fedgcn_table2.py``); FedSpray (GCN backbone) on PubMed with
``examples/fedspray_table2.py``'s setting (7 Louvain clients, its split); FedOMD on Cora with
``examples/fedomd_table4.py``'s setting (Louvain parties, its split; at most 1000 rounds with
patience 200 on the validation accuracy, as that script).  ``--algorithms fedspray fedomd`` puts those two
on the FedGCN grid instead: each in its own setting (FedSpray 7 clients, FedOMD 5 parties, their splits and
optimisers; ``--fedspray-rounds`` / ``--fedomd-rounds``), its clients drawn by the Dirichlet partition.

Each finished run is appended to ``OUT/runs.jsonl`` (a rerun skips what is there, so an interrupted
grid resumes at its next run), with the test accuracy at the best-validation round, the per-round test
accuracies and train losses, and its wall and CPU seconds.  The table (``OUT/table.md``, printed)
gives one row per (experiment, rounds) and one column per secure mode: the secure-minus-plain accuracy
in points over the seeds (mean and max |.|) at the best-validation round and at the last round, and
how many rounds' test accuracies and train losses equal plain's exactly; below it, every run's rounds
that differ.  A cell a mode did not run says so.  The command of every run is printed with it.

    python examples/secure_minus_plain.py --out runs/smp                      # full grid, 3 seeds
    python examples/secure_minus_plain.py --seeds 0 --pubmed-seeds 0 --fedspray-rounds 30 \
        --fedomd-rounds 50                                                     # reduced
    python examples/secure_minus_plain.py --algorithms fedavg --rounds 50 --betas 1 \
        --other-seeds                                                          # FedAvg grid, reduced
    python examples/secure_minus_plain.py --algorithms fedspray fedomd --fedspray-rounds 30 \
        --fedomd-rounds 30 --other-seeds                                       # FedSpray / FedOMD grid
    python examples/secure_minus_plain.py --modes plain ckks --fixed-point-bits 20 --update-bound 1 \
        --datasets cora citeseer --betas 1 --seeds 0                           # packed fixed point

At their defaults every mode averages the model (and FedGCN its float neighbour sums) on the same
public grid, so each secure mode should train plain's model bit for bit.  With ``--fixed-point-bits``
the ckks runs carry their float exchanges as packed fixed point instead (``--update-bound`` and
``--feature-bound`` are the public bounds it is planned from); they are recorded as mode
``ckks-fixedB``.  ``--grid-model-mean`` asks for the grid explicitly, sized by ``--update-bound``
(recorded as ``<mode>-grid``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch
from sweep import read_runs

from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.validation import current_names

MODES = ("plain", "ckks", "mask", "ckks-mp")
#: --algorithms: the experiment name of each on the --datasets x --betas grid
GRID_NAMES = {"fedgcn": "FedGCN 1-hop", "fedavg": "FedAvg", "fedspray": "FedSpray", "fedomd": "FedOMD"}


def fedgcn(dataset: str, beta: float, seed: int, mode: str, args, algorithm: str = "fedgcn") -> RunConfig:
    """FedGCN 1-hop, or (``algorithm='fedavg'``) FedAvg, in the released code's setting."""
    return RunConfig(
        algorithm=algorithm,
        dataset=dataset,
        clients=10,
        beta=beta,
        seed=seed,
        mode=mode,
        rounds=args.rounds,
        local_epochs=3,
        optimizer="sgd",
        lr=0.5,
        data_root=args.data_root,
        options={"hops": 1} if algorithm == "fedgcn" else {},
    )


def dirichlet(cfg: RunConfig, dataset: str, beta: float | None) -> RunConfig:
    """``cfg`` on ``dataset``; with ``beta``, its clients drawn by the Dirichlet partition of concentration ``beta``."""
    cfg.dataset = dataset
    if beta is not None:
        cfg.partition, cfg.beta, cfg.keep_largest = "dirichlet", beta, False
    return cfg


def fedspray(seed: int, mode: str, args, dataset: str = "pubmed", beta: float | None = None) -> RunConfig:
    """FedSpray (GCN backbone, its split, 7 clients): its paper's Louvain communities, or ``dirichlet(beta)``."""
    cfg = RunConfig(
        algorithm="fedspray",
        clients=7,
        mode=mode,
        partition="louvain",
        keep_largest=True,
        split="fedspray",
        rounds=args.fedspray_rounds,
        seed=seed,
        data_root=args.data_root,
        options={"backbone": "gcn"},
    )
    return dirichlet(cfg, dataset, beta)


def fedomd(seed: int, mode: str, args, dataset: str = "cora", beta: float | None = None) -> RunConfig:
    """FedOMD (its model, optimiser and split, 5 parties): Louvain communities, or ``dirichlet(beta)``."""
    cfg = RunConfig(
        algorithm="fedomd",
        model="gcn",
        clients=5,
        mode=mode,
        partition="louvain",
        resolution=1.0,
        split="fedomd",
        hidden=64,
        num_layers=2,
        dropout=0.5,
        lr=0.01,
        weight_decay=1e-4,
        rounds=args.fedomd_rounds,
        local_epochs=1,
        patience=args.fedomd_patience,
        seed=seed,
        data_root=args.data_root,
    )
    return dirichlet(cfg, dataset, beta)


def packed(cfg: RunConfig, args) -> RunConfig:
    """``cfg`` with the packed fixed-point settings of ``args``.

    ``cfg`` with the packed fixed-point settings of ``args`` (ckks runs only) and, with
    ``--grid-model-mean``, the model mean on its public grid (every mode).
    """
    if args.grid_model_mean and cfg.algorithm != "fedomd":  # (FedOMD's mean is always on its grid)
        cfg.grid_model_mean, cfg.update_bound = True, args.update_bound
    if cfg.mode == "ckks" and args.fixed_point_bits:
        cfg.fixed_point_bits, cfg.update_bound = args.fixed_point_bits, args.update_bound
        if cfg.algorithm == "fedgcn" and args.feature_bound:
            cfg.options["feature_bound"] = args.feature_bound
    return cfg


def label(cfg: RunConfig) -> str:
    return (
        cfg.mode
        + (f"-fixed{cfg.fixed_point_bits}" if cfg.fixed_point_bits else "")
        + ("-grid" if cfg.grid_model_mean else "")
    )


def plan(args) -> list[tuple[str, int, RunConfig]]:
    """(experiment name, seed, config) for every run; plain first within each (experiment, seed)."""
    jobs = [(name, seed, packed(cfg, args)) for name, seed, cfg in _grid(args) if cfg.mode in args.modes]
    return jobs


def _grid(args) -> list[tuple[str, int, RunConfig]]:
    jobs = []
    for ds in args.datasets:
        seeds = args.pubmed_seeds if ds == "pubmed" else args.seeds
        for beta in args.betas:
            for seed in seeds:
                for algo in args.algorithms:
                    name = f"{GRID_NAMES[algo]} {ds} β={beta:g}"
                    if algo in ("fedgcn", "fedavg"):
                        jobs += [(name, seed, fedgcn(ds, beta, seed, m, args, algo)) for m in MODES]
                    elif algo == "fedspray":
                        jobs += [(name, seed, fedspray(seed, m, args, ds, beta)) for m in MODES]
                    else:
                        jobs += [(name, seed, fedomd(seed, m, args, ds, beta)) for m in MODES]
    for seed in args.other_seeds:
        if args.fedspray_rounds:
            jobs += [("FedSpray pubmed", seed, fedspray(seed, m, args)) for m in MODES]
        if args.fedomd_rounds:
            jobs += [("FedOMD cora", seed, fedomd(seed, m, args)) for m in MODES]
    return jobs


def command(cfg: RunConfig) -> str:
    """The CLI line equivalent to ``cfg`` (every setting that differs from the default)."""
    default = RunConfig().to_dict()
    d = cfg.to_dict()
    flags = {
        k: v
        for k, v in d.items()
        if k not in ("options", "synthetic", "attacks", "data_root") and (v != default[k] or k == "mode")
    }
    flags.update(d["options"])
    return "python -m secure_fgl.cli.main run " + " ".join(
        f"--{k.replace('_', '-')} {str(v).lower() if isinstance(v, bool) else v}" for k, v in flags.items()
    )


def key(name: str, seed: int, mode: str, rounds: int) -> str:
    return json.dumps([name, seed, mode, rounds])


def run_all(args) -> list[dict]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.jsonl"
    done = read_runs(path, lambda r: key(r["experiment"], r["seed"], r["mode"], r["rounds"]))
    feds = {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    for name, seed, cfg in plan(args):
        k = key(name, seed, label(cfg), cfg.rounds)
        if k in done:
            continue
        fkey = (name, seed)
        if fkey not in feds:
            feds.clear()  # one federation in memory at a time
            feds[fkey] = load_federation(cfg)
        t0, c0 = time.perf_counter(), time.process_time()
        res = run_experiment(cfg, progress=False, fed=feds[fkey])
        row = {
            "experiment": name,
            "seed": seed,
            "mode": label(cfg),
            "rounds": cfg.rounds,
            "test_acc": res["final"]["test_acc"],
            "best_round": res["final"]["best_round"],
            "trajectory": [r["test_acc"] for r in res["rounds"]],
            "train_loss": [r["train_loss"] for r in res["rounds"]],
            "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - c0,
            "config": cfg.to_dict(),
            "commit": commit,
            "upload_ratio": {
                t: round(c["bytes_up"] / c["plaintext_bytes_up"], 3)
                for t, c in res["comm"]["per_tag"].items()
                if c.get("plaintext_bytes_up")
            },
        }
        done[k] = row
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"{name} seed {seed} {label(cfg)}: test {row['test_acc']:.4f} ({row['seconds']:.0f} s, "
            f"{row['cpu_seconds']:.0f} s CPU), upload / "
            f"float32: {row['upload_ratio']}",
            flush=True,
        )
    return list(done.values())


def mode_order(mode: str) -> tuple[int, str]:
    """Sort key: the modes in ``MODES`` order, their variants (``ckks-grid``, ...) after them."""
    return (MODES.index(mode) if mode in MODES else len(MODES), mode)


def spans(rounds: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``'3-5, 9'``."""
    out: list[str] = []
    for r in rounds:
        if out and r == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def differing_rounds(p: dict, s: dict, series: str) -> list[int] | None:
    """The rounds (0-based) whose ``series`` differs from plain's (a round only one run has counts).

    None where a run did not record ``series``.
    """
    if series not in p or series not in s:
        return None
    pt, st = p[series], s[series]
    return [i for i in range(max(len(pt), len(st))) if i >= min(len(pt), len(st)) or pt[i] != st[i]]


def table(runs: list[dict]) -> str:
    """One row per (experiment, rounds) in run order, one secure − plain column per mode; then the rounds that differ.

    A cell gives the secure − plain test accuracy in points at the best-validation round and at the
    last round, mean over the seeds (max abs); the seeds are named where a mode ran fewer than plain.
    """
    plain = {(r["experiment"], r["seed"], r["rounds"]): r for r in runs if r["mode"] == "plain"}
    modes = sorted({r["mode"] for r in runs if r["mode"] != "plain"}, key=mode_order)
    pairs: dict[tuple, list] = {}
    for r in runs:
        p = plain.get((r["experiment"], r["seed"], r["rounds"]))
        if r["mode"] != "plain" and p is not None:
            pairs.setdefault((r["experiment"], r["rounds"], r["mode"]), []).append((p, r))

    def points(group: list, acc) -> str:
        d = [100 * (acc(s) - acc(p)) for p, s in group]
        return f"{statistics.mean(d):+.2f} ({max(abs(x) for x in d):.2f})"

    lines = [
        "| experiment | rounds | seeds | plain acc: best val / last |"
        + "".join(f" {m} − plain: best val / last |" for m in modes)
        + f" rounds with test acc equal to plain's ({', '.join(modes)}) |"
        + f" rounds with train loss equal to plain's, bit for bit ({', '.join(modes)}) |",
        "|---|---|---|---|" + "---|" * (len(modes) + 2),
    ]
    notes = []
    for name, rounds in dict.fromkeys((k[0], k[2]) for k in plain):  # in the order they were first run
        ps = sorted((r for (e, _, n), r in plain.items() if (e, n) == (name, rounds)), key=lambda r: r["seed"])
        seeds = [r["seed"] for r in ps]
        cells: list[str] = []
        equal: dict[str, list[str]] = {"trajectory": [], "train_loss": []}
        for m in modes:
            group = sorted(pairs.get((name, rounds, m), []), key=lambda ps_: ps_[1]["seed"])
            if not group:
                cells.append("not run")
                for column in equal.values():
                    column.append("-")
                continue
            ran = [s["seed"] for _, s in group]
            cells.append(
                f"{points(group, lambda r: r['test_acc'])} / {points(group, lambda r: r['trajectory'][-1])}"
                + ("" if ran == seeds else f" (seed{'s' * (len(ran) > 1)} {','.join(map(str, ran))} only)")
            )
            for series, column in equal.items():
                off = [differing_rounds(p, s, series) for p, s in group]
                known = [
                    (len(o), max(len(p["trajectory"]), len(s["trajectory"])))
                    for (p, s), o in zip(group, off)
                    if o is not None
                ]
                n = sum(t for _, t in known)
                column.append(
                    "not recorded"
                    if not known
                    else f"{n - sum(d for d, _ in known)}/{n}"
                    + ("" if len(known) == len(group) else " (not recorded for all seeds)")
                )
                notes += [
                    f"- {name}, seed {s['seed']}, {m}, {series.replace('_', ' ')}: round{'s' * (len(o) > 1)} "
                    f"{spans(o)} (plain ran {len(p['trajectory'])} rounds, {m} {len(s['trajectory'])})"
                    for (p, s), o in zip(group, off)
                    if o
                ]
        plain_acc = statistics.mean(r["test_acc"] for r in ps)
        plain_last = statistics.mean(r["trajectory"][-1] for r in ps)
        lines.append(
            f"| {name} | {rounds} | {','.join(map(str, seeds))} | {plain_acc:.4f} / {plain_last:.4f} | "
            + " | ".join(cells)
            + "".join(f" | {', '.join(column)}" for column in equal.values())
            + " |"
        )
    lines += ["", "Rounds (0-based) whose test accuracy (trajectory) or train loss differs from plain's:", ""]
    lines += notes or ["- none"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The script's command line."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="*", default=["cora", "citeseer", "pubmed"])
    ap.add_argument("--betas", nargs="+", type=float, default=[1.0, 10000.0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--pubmed-seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=100, help="FedGCN / FedAvg rounds (released code: 100)")
    ap.add_argument(
        "--algorithms",
        nargs="+",
        default=["fedgcn"],
        choices=list(GRID_NAMES),
        help="on the --datasets x --betas grid (Dirichlet beta): FedGCN 1-hop and FedAvg in the released "
        "code's setting (10 clients, --rounds), FedSpray (7 clients, --fedspray-rounds) and FedOMD (5 parties, "
        "--fedomd-rounds) in their own",
    )
    ap.add_argument("--other-seeds", nargs="*", type=int, default=[0], help="FedSpray / FedOMD seeds")
    ap.add_argument("--fedspray-rounds", type=int, default=300, help="0: skip FedSpray")
    ap.add_argument("--fedomd-rounds", type=int, default=1000, help="0: skip FedOMD")
    ap.add_argument("--fedomd-patience", type=int, default=200, help="FedOMD early stopping (fedomd_table4.py: 200)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--fixed-point-bits", type=int, default=None, help="ckks runs: packed fixed point")
    ap.add_argument(
        "--update-bound",
        type=float,
        default=None,
        help="with --fixed-point-bits or --grid-model-mean: public update bound",
    )
    ap.add_argument(
        "--grid-model-mean",
        action="store_true",
        help="every mode: the model mean on its public grid, sized by --update-bound (the default "
        "grid without it); recorded as mode <mode>-grid",
    )
    ap.add_argument(
        "--feature-bound", type=float, default=None, help="with --fixed-point-bits: FedGCN's public feature bound"
    )
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--table-only", action="store_true", help="print the table of OUT/runs.jsonl, run nothing")
    ap.add_argument("--out", default="runs/secure_minus_plain")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    runs = (
        [json.loads(x) for x in (Path(args.out) / "runs.jsonl").read_text().splitlines()]
        if args.table_only
        else run_all(args)
    )
    text = table(runs)
    cmds = sorted({command(RunConfig.from_dict(current_names(r["config"]))) for r in runs} if runs else set())
    (Path(args.out) / "table.md").write_text(text + "\n\nRuns:\n\n" + "\n".join(f"    {c}" for c in cmds) + "\n")
    print(text)
    print("\nRuns:")
    for c in cmds:
        print("   ", c)


if __name__ == "__main__":
    main()
