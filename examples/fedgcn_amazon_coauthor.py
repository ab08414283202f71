"""FedGCN on Amazon (Photo, Computers) and Coauthor (CS, Physics): Centralized GCN, 0-hop,
1-hop and 2-hop, plain and one secure mode, on Shchur et al.'s split (20 training and 30
validation nodes per class, the rest test), 10 clients, Dirichlet beta 1.

    nice -n 5 python examples/fedgcn_amazon_coauthor.py [--datasets photo,computers,cs,physics]
        [--seeds 0,1,2] [--rounds 100] [--secure mask] [--out runs/amazon_coauthor]

Every method runs with ``--center`` (each client centres its first-layer input by its own
mean, ``secure_fgl/algorithms/fedgcn.py``; Centralized centres the whole graph's features) and
FedGCN with ``--degree-cap`` = the graph's largest degree.  ``--methods`` and ``--secure none``
shrink the table where CPU is short.
Prints every run's command, then the table (test accuracy at the best-validation round,
mean +- std over seeds) and writes ``table.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from torch_geometric.utils import degree

from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, run_experiment

METHODS = {"Centralized": ("centralized", None), "0-hop": ("fedgcn", 0), "1-hop": ("fedgcn", 1),
           "2-hop": ("fedgcn", 2)}


def command(cfg: RunConfig) -> str:
    opts = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in cfg.options.items())
    return (f"python -m secure_fgl.cli.main run --algorithm {cfg.algorithm} --dataset {cfg.dataset} "
            f"--clients {cfg.clients} --beta {cfg.beta} --mode {cfg.mode} --rounds {cfg.rounds} "
            f"--seed {cfg.seed} {opts} --data-root $SECURE_FGL_DATA --quiet").replace("  ", " ")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default="photo,computers,cs,physics")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--secure", default="mask", help="secure mode of the second column ('none': plain only)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default="runs/amazon_coauthor")
    args = ap.parse_args()
    root = os.environ.get("SECURE_FGL_DATA")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table, seconds = {}, {}
    for ds in args.datasets.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            base = RunConfig(dataset=ds, clients=10, beta=1.0, rounds=args.rounds, seed=seed, data_root=root)
            fed = load_federation(base)
            cap = int(degree(fed.graph.edge_index[0], fed.graph.num_nodes).max())
            for method in args.methods.split(","):
                algo, hops = METHODS[method]
                for mode in ("plain", args.secure):
                    if (algo == "centralized" and mode != "plain") or mode == "none":
                        continue                        # nothing is exchanged
                    opts = {"center": True} if hops is None else {"hops": hops, "center": True,
                                                                   "degree_cap": max(cap, 254)}
                    cfg = RunConfig(algorithm=algo, dataset=ds, clients=10, beta=1.0, rounds=args.rounds,
                                    seed=seed, mode=mode, data_root=root, options=opts)
                    print(command(cfg), flush=True)
                    t0 = time.perf_counter()
                    res = run_experiment(cfg, progress=False, fed=fed)
                    key = f"{ds}|{method}|{mode}"
                    table.setdefault(key, []).append(res["final"]["test_acc"])
                    seconds.setdefault(key, []).append(time.perf_counter() - t0)
                    print(f"  -> test {res['final']['test_acc']:.4f} ({seconds[key][-1]:.0f} s)", flush=True)
                    (out / "table.json").write_text(json.dumps({"acc": table, "seconds": seconds}, indent=1))
    print(f"\n| dataset | method | plain | {args.secure} | seconds per run |\n|---|---|---|---|---|")
    for ds in args.datasets.split(","):
        for method in METHODS:
            cells = []
            for mode in ("plain", args.secure):
                a = table.get(f"{ds}|{method}|{mode}")
                cells.append("-" if not a else f"{np.mean(a):.3f} +- {np.std(a):.3f} (n={len(a)})")
            secs = seconds.get(f"{ds}|{method}|plain", [0.0])
            print(f"| {ds} | {method} | {cells[0]} | {cells[1]} | {np.mean(secs):.0f} |")


if __name__ == "__main__":
    main()
