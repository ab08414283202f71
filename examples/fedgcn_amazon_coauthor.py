"""FedGCN on Amazon (Photo, Computers) and Coauthor (CS, Physics).

Centralized GCN, 0-hop, 1-hop and 2-hop, plain and secure modes, on Shchur et al.'s split (20 training and 30
validation nodes per class, the rest test), 10 clients, Dirichlet beta 1.

    nice -n 5 python examples/fedgcn_amazon_coauthor.py [--datasets photo,computers,cs,physics]
        [--seeds 0,1,2] [--rounds 100] [--secure mask[,ckks]] [--no-plain] [--methods ...]
        [--row-order given] [--device auto] [--out runs/amazon_coauthor]
    python examples/fedgcn_amazon_coauthor.py --table-only        # the table of OUT/runs.jsonl

Every method runs with ``--center`` (each client centres its first-layer input by its own
mean, ``secure_fgl/algorithms/fedgcn/ops.py``; Centralized centres the whole graph's features) and
FedGCN with ``--degree-cap`` = the graph's largest degree.  ``--methods`` and ``--secure none``
shrink the grid where CPU is short; ``--no-plain`` runs only the secure modes, so that plain and
secure can run side by side in two processes.  Every finished run is appended to ``OUT/runs.jsonl``
(with its seconds, peak RSS and device; a rerun skips what is there), so the grid can be filled in
several invocations; the table (test accuracy at the best-validation round, mean +- std over
seeds, and secure - plain on the same seeds and device, one row per device) is printed and written
to ``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import numpy as np
from sweep import read_runs
from torch_geometric.utils import degree

from secure_fgl.config import RunConfig
from secure_fgl.engine.device import resolve_device
from secure_fgl.experiment import load_federation, run_experiment

METHODS = {"Centralized": ("centralized", None), "0-hop": ("fedgcn", 0), "1-hop": ("fedgcn", 1), "2-hop": ("fedgcn", 2)}


def command(cfg: RunConfig) -> str:
    opts = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in cfg.options.items())
    return (
        f"python -m secure_fgl.cli.main run --algorithm {cfg.algorithm} --dataset {cfg.dataset} "
        f"--clients {cfg.clients} --beta {cfg.beta} --mode {cfg.mode} --rounds {cfg.rounds} "
        f"--seed {cfg.seed} {opts} --device {cfg.device} --data-root $SECURE_FGL_DATA --quiet"
    ).replace("  ", " ")


def run_key(ds: str, method: str, mode: str, seed: int, rounds: int, row_order: str, device: str) -> str:
    return json.dumps([ds, method, mode, seed, rounds, row_order, device])


def device_kind(row: dict) -> str:
    """``cpu`` or ``cuda`` (rows written before the device was recorded ran on the CPU)."""
    return row.get("device", "cpu").split(":")[0]


def run_grid(args, path: Path, done: dict) -> None:
    root = os.environ.get("SECURE_FGL_DATA")
    modes = ([] if args.no_plain else ["plain"]) + [m for m in args.secure.split(",") if m != "none"]
    device = resolve_device(args.device).type
    for ds in args.datasets.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            fed = None
            for method in args.methods.split(","):
                algo, hops = METHODS[method]
                for mode in modes:
                    k = run_key(ds, method, mode, seed, args.rounds, args.row_order, device)
                    if (algo == "centralized" and mode != "plain") or k in done:
                        continue  # Centralized exchanges nothing
                    if fed is None:
                        fed = load_federation(RunConfig(dataset=ds, clients=10, beta=1.0, seed=seed, data_root=root))
                        cap = int(degree(fed.graph.edge_index[0], fed.graph.num_nodes).max())
                    opts = (
                        {"center": True}
                        if hops is None
                        else {"hops": hops, "center": True, "degree_cap": max(cap, 254), "row_order": args.row_order}
                    )
                    cfg = RunConfig(
                        algorithm=algo,
                        dataset=ds,
                        clients=10,
                        beta=1.0,
                        rounds=args.rounds,
                        seed=seed,
                        mode=mode,
                        device=device,
                        data_root=root,
                        options=opts,
                    )
                    print(command(cfg), flush=True)
                    t0 = time.perf_counter()
                    res = run_experiment(cfg, progress=False, fed=fed)
                    row = {
                        "dataset": ds,
                        "method": method,
                        "mode": mode,
                        "seed": seed,
                        "rounds": args.rounds,
                        "row_order": args.row_order,
                        "device": res["device"],
                        "test_acc": res["final"]["test_acc"],
                        "seconds": time.perf_counter() - t0,
                        "command": command(cfg),
                        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                    }
                    done[k] = row
                    with path.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(
                        f"  -> test {row['test_acc']:.4f} ({row['seconds']:.0f} s, peak RSS "
                        f"{row['peak_rss_gb']:.1f} GB)",
                        flush=True,
                    )


def table(runs: list[dict]) -> str:
    """Plain against each secure mode per (dataset, rounds, method, device).

    Per (dataset, rounds, method, device): plain and each secure mode (mean +- std, n) and
    secure - plain in points over the seeds both ran (mean, max |.|).
    """
    modes = sorted({r["mode"] for r in runs} - {"plain"})
    cells: dict[tuple, dict[str, dict[int, float]]] = {}
    secs: dict[tuple, list[float]] = {}
    for r in runs:
        g = (r["dataset"], r["rounds"], r["method"], device_kind(r))
        cells.setdefault(g, {}).setdefault(r["mode"], {})[r["seed"]] = r["test_acc"]
        if r["mode"] == "plain":
            secs.setdefault(g, []).append(r["seconds"])
    head = (
        "| "
        + " | ".join(
            [
                "dataset",
                "rounds",
                "method",
                "device",
                "plain",
                *(f"{m} | {m} − plain, points" for m in modes),
                "s per plain run",
            ]
        )
        + " |"
    )
    lines = [head, "|" + "---|" * (5 + 2 * len(modes) + 1)]
    order = {m: i for i, m in enumerate(METHODS)}
    for g in sorted(cells, key=lambda g: (g[0], g[1], order[g[2]], g[3])):
        by_mode = cells[g]
        row = [g[0], str(g[1]), g[2], g[3], _stat(by_mode.get("plain", {}))]
        for m in modes:
            sec, pl = by_mode.get(m, {}), by_mode.get("plain", {})
            d = [100 * (sec[s] - pl[s]) for s in sec if s in pl]
            row += [_stat(sec), f"{np.mean(d):+.2f} ({max(abs(x) for x in d):.2f})" if d else "–"]
        row.append(f"{np.mean(secs[g]):.0f}" if g in secs else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _stat(acc: dict[int, float]) -> str:
    if not acc:
        return "–"
    a = list(acc.values())
    return f"{np.mean(a):.3f} ± {np.std(a):.3f} (n={len(a)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="photo,computers,cs,physics")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--secure", default="mask", help="secure modes, comma-separated ('none': plain only)")
    ap.add_argument("--no-plain", action="store_true", help="run only the --secure modes (plain in another process)")
    ap.add_argument("--device", default="auto", help="where the clients train: auto (CUDA when present) | cpu | cuda")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument(
        "--row-order",
        default="given",
        choices=("given", "signature", "owner"),
        help="FedGCN --row-order (owner: no block mixes recipients, fewer blocks)",
    )
    ap.add_argument("--table-only", action="store_true", help="print the table of OUT/runs.jsonl, run nothing")
    ap.add_argument("--out", default="runs/amazon_coauthor")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.jsonl"
    done = read_runs(
        path,
        lambda r: run_key(r["dataset"], r["method"], r["mode"], r["seed"], r["rounds"], r["row_order"], device_kind(r)),
    )
    if not args.table_only:
        run_grid(args, path, done)
    text = table(list(done.values()))
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
