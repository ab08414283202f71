"""Does a secure mode hand every client exactly plain's FedGCN neighbour sums?

The pre-training
exchange alone (no training), on a real graph, in plain and each secure mode: the largest
|secure - plain| over every received total, and the encoding each mode used.

    OMP_NUM_THREADS=1 nice -n 5 python examples/fedgcn_exchange_exactness.py --datasets cs \
        [--modes ckks,mask] [--hops 1] [--seed 0] [--float-path] [--out runs/exchange_exactness.jsonl]
    python examples/fedgcn_exchange_exactness.py --table-only --out FILE   # the markdown table of FILE

The settings of ``examples/fedgcn_amazon_coauthor.py`` (10 clients, Dirichlet beta 1, Shchur
split, ``--degree-cap`` = the graph's largest degree).  ``--float-path`` also runs each secure
mode with the features declared non-integer, i.e. the float encoding that count features (CS,
Physics) used before they travelled as exact integer fields, to show what that costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import torch
from torch_geometric.utils import degree

import secure_fgl.algorithms.fedgcn.client as fedgcn_client
from secure_fgl.algorithms.fedgcn.ops import FedGCNOptions, exchange_spec
from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation
from secure_fgl.runtime.build import start_run

CLIENTS = 10


def exchange(fed, mode: str, hops: int, cap: int, seed: int) -> tuple[dict, dict]:
    """The totals each client received (as its logic reads them from its protocol half), and the exchange's figures."""
    options = {"hops": hops, "degree_cap": cap}
    cfg = RunConfig(
        algorithm="fedgcn", dataset=fed.name, mode=mode, clients=CLIENTS, rounds=1, seed=seed, options=options
    )
    run = start_run(cfg, fed)
    owner = {id(rt.half): k for k, rt in run.runtimes.items()}
    received, read = {}, fedgcn_client.rows_result

    def recording(half, request_rows, rpb, dim):
        totals = read(half, request_rows, rpb, dim)
        received[owner[id(half)]] = torch.as_tensor(totals, dtype=torch.float64)
        return totals

    fedgcn_client.rows_result = recording
    spec = exchange_spec(FedGCNOptions(**options), bool(fed.binary_features), counts=bool(fed.count_features))
    t0 = time.perf_counter()
    try:
        run.strategy.setup()
    finally:
        fedgcn_client.rows_result = read
    fin = run.strategy.final_metrics()
    run.executor.shutdown()
    return received, {
        "integer_fields": bool(spec.integer),
        "seconds": time.perf_counter() - t0,
        "bytes_up": fin["pretrain_bytes_up"],
        "bytes_down": fin["pretrain_bytes_down"],
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| dataset | hops | seed | mode | encoding | max abs(secure - plain) | bit-identical | MB up | MB down | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        enc = "integer fields" if r["integer_fields"] else "float"
        lines.append(
            f"| {r['dataset']} | {r['hops']} | {r['seed']} | {r['mode']} | {enc} | {r['max_abs_diff']:.1e} | "
            f"{'yes' if r['bit_identical'] else 'no'} | {r['bytes_up'] / 1e6:,.0f} | "
            f"{r['bytes_down'] / 1e6:,.0f} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="cs")
    ap.add_argument("--modes", default="ckks,mask")
    ap.add_argument("--hops", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--float-path", action="store_true", help="also the float encoding, features declared non-integer")
    ap.add_argument("--out", default="runs/exchange_exactness.jsonl")
    ap.add_argument("--table-only", action="store_true", help="print the table of --out, run nothing")
    args = ap.parse_args()
    out = Path(args.out)
    if args.table_only:
        print(table([json.loads(line) for line in out.read_text().splitlines() if line.strip()]))
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    for ds in args.datasets.split(","):
        fed = load_federation(
            RunConfig(
                dataset=ds, clients=CLIENTS, beta=1.0, seed=args.seed, data_root=os.environ.get("SECURE_FGL_DATA")
            )
        )
        cap = max(int(degree(fed.graph.edge_index[0], fed.graph.num_nodes).max()), 254)
        plain, figures = exchange(fed, "plain", args.hops, cap, args.seed)
        runs = [(m, fed) for m in args.modes.split(",")]
        if args.float_path:
            as_float = dataclasses.replace(fed, count_features=False, binary_features=False)
            runs += [(m, as_float) for m in args.modes.split(",")]
        print(json.dumps({"dataset": ds, "mode": "plain", "count_features": fed.count_features, **figures}), flush=True)
        for mode, f in runs:
            got, figures = exchange(f, mode, args.hops, cap, args.seed)
            diff = max(float((got[k] - plain[k]).abs().max()) for k in plain)
            row = {
                "dataset": ds,
                "mode": mode,
                "hops": args.hops,
                "seed": args.seed,
                "degree_cap": cap,
                "count_features": f.count_features,
                "max_abs_diff": diff,
                "bit_identical": all(torch.equal(got[k], plain[k]) for k in plain),
                **figures,
            }
            del got
            print(json.dumps(row), flush=True)
            with out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
