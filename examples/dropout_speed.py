"""Time per local epoch of FedGCN (1-hop) and FedAvg on CiteSeer, plain mode: the cost of
:func:`secure_fgl.models.node.dropout` on bag-of-words inputs and their neighbour sums.

    python examples/dropout_speed.py [--epochs 30] [--out runs/dropout_speed.json]

Run it with ``PYTHONPATH`` at two checkouts to compare them; prints the fastest epoch's
seconds (all 10 clients' local steps, no aggregation; the minimum is the least disturbed
by other processes on a shared machine) and writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, make_run_protocol
from secure_fgl.preflight import preflight
from secure_fgl.algorithms import get_algorithm
from secure_fgl.engine import resolve_device, seed_everything


def seconds_per_epoch(algorithm: str, epochs: int, fed) -> float:
    cfg = RunConfig(algorithm=algorithm, dataset="citeseer", clients=10, mode="plain", beta=1.0,
                    data_root=os.environ.get("SECURE_FGL_DATA"), options={"hops": 1} if algorithm == "fedgcn" else {})
    seed_everything(cfg.seed)
    algo_cls = get_algorithm(algorithm)
    algo = algo_cls(fed, make_run_protocol(cfg, fed.num_clients), cfg, resolve_device("cpu"),
                    preflight(cfg, check_data=False))
    algo.setup()
    clients = [k for k, c in enumerate(algo.clients) if c.train_mask.any()]
    for k in clients:                                   # warm-up
        algo.local_update(k)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for k in clients:
            algo.local_update(k)
        times.append(time.perf_counter() - t0)
    return min(times)          # the least-disturbed epoch on a shared machine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--out", default="runs/dropout_speed.json")
    args = ap.parse_args()
    fed = load_federation(RunConfig(dataset="citeseer", clients=10, beta=1.0,
                                    data_root=os.environ.get("SECURE_FGL_DATA")))
    result = {alg: seconds_per_epoch(alg, args.epochs, fed) for alg in ("fedgcn", "fedavg")}
    for alg, s in result.items():
        print(f"{alg:7s} CiteSeer 10 clients: {1000 * s:.1f} ms per epoch (all clients)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
