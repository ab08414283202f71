"""Time per local epoch of FedGCN and FedAvg with position-keyed dropout.

Time per local epoch of FedGCN (1-hop) and FedAvg on CiteSeer (10 clients, Dirichlet beta 1,
plain mode) with :func:`secure_fgl.models.node.dropout` (position-keyed masks, data-independent)
against the previous value-dependent draw (``torch.rand`` at the non-zeros only, reproduced
below as the reference), alternating epoch by epoch in one process so that load from other
processes hits both alike.

    nice -n 5 python examples/dropout_speed.py [--epochs 20] [--out runs/dropout_speed.json]

Prints the median seconds per epoch (all clients' local steps, no aggregation) and the ratio,
and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from secure_fgl.algorithms.fedgcn import ops as fedgcn
from secure_fgl.config import RunConfig
from secure_fgl.engine.device import seed_everything
from secure_fgl.experiment import load_federation
from secure_fgl.models import node
from secure_fgl.runtime.build import start_run


def value_dependent_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """The reference dropout, whose random draws depend on the data.

    The reference: one ``torch.rand`` per non-zero of a mostly-zero input (the draw count
    depends on the data), ``F.dropout`` otherwise.
    """
    if not training or p == 0.0 or x.dim() != 2:
        return F.dropout(x, p, training)
    if int(torch.count_nonzero(x)) > node.SPARSE_DROPOUT_DENSITY * x.numel():
        return F.dropout(x, p, True)
    rows, cols = x.nonzero(as_tuple=True)
    keep = torch.rand(rows.numel(), device=x.device) >= p
    rows, cols = rows[keep], cols[keep]
    out = torch.zeros_like(x)
    out[rows, cols] = x[rows, cols] / (1.0 - p)
    return out


def use(fn) -> None:
    node.dropout = fn
    fedgcn.dropout = fn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--out", default="runs/dropout_speed.json")
    args = ap.parse_args()
    root = os.environ.get("SECURE_FGL_DATA")
    fed = load_federation(RunConfig(dataset="citeseer", clients=10, beta=1.0, data_root=root))
    keyed = node.dropout
    result = {}
    for algorithm in ("fedgcn", "fedavg"):
        cfg = RunConfig(
            algorithm=algorithm,
            dataset="citeseer",
            clients=10,
            mode="plain",
            beta=1.0,
            data_root=root,
            options={"hops": 1} if algorithm == "fedgcn" else {},
        )
        seed_everything(cfg.seed)
        run = start_run(cfg, fed)  # the client runtimes (--executor local)
        run.strategy.setup()
        clients = [run.logic(k) for k in run.runtimes if run.logic(k).data.train_mask.any()]
        times = {"position-keyed": [], "value-dependent": []}
        for epoch in range(args.epochs + 1):
            for name, fn in (("position-keyed", keyed), ("value-dependent", value_dependent_dropout)):
                use(fn)
                t0 = time.perf_counter()
                for client in clients:
                    client.local_update({"round": 0})
                if epoch:  # epoch 0 warms up
                    times[name].append(time.perf_counter() - t0)
        use(keyed)
        run.executor.shutdown()
        med = {name: statistics.median(t) for name, t in times.items()}
        result[algorithm] = {**med, "ratio": med["position-keyed"] / med["value-dependent"]}
        print(
            f"{algorithm:7s} CiteSeer 10 clients, ms per epoch: position-keyed {1e3 * med['position-keyed']:.1f}, "
            f"value-dependent {1e3 * med['value-dependent']:.1f}, ratio {result[algorithm]['ratio']:.2f}",
            flush=True,
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
