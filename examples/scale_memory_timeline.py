"""RSS timeline of the secure FedGCN pre-training at scale (docs/performance.md).

``python examples/scale_memory_timeline.py NODES [FEATURES]``: the SBM scale point of
:func:`secure_fgl.bench.fedgcn._scale_point` (10 clients, ckks packed, sparse layout) without
tracemalloc; RSS is sampled every 10 ms and printed at the phase marks (graph generation,
partition, each client's neighbour sums, the row-sum exchange) with the highest RSS inside each
phase, then the pre-training's process CPU time and CPU ns per edge x feature.
"""

import gc
import sys
import threading
import time
from pathlib import Path

import torch

T0 = time.perf_counter()
PEAK = {"phase": "start", "max": 0.0}


def rss() -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def mark(name: str) -> None:
    cur, hwm = rss()
    print(
        f"{time.perf_counter() - T0:8.1f}s  {name:<30} rss {cur:7.0f}  hwm {hwm:7.0f}  "
        f"peak since last mark {PEAK['max']:7.0f}",
        flush=True,
    )
    PEAK["phase"], PEAK["max"] = name, cur


def sample() -> None:
    while True:
        PEAK["max"] = max(PEAK["max"], rss()[0])
        time.sleep(0.01)


def traced(owner, name: str) -> None:
    """Mark RSS around every call of ``owner.name``."""
    f = getattr(owner, name)

    def wrapper(*a, **k):
        mark(f"> {name}")
        out = f(*a, **k)
        mark(f"< {name}")
        return out

    setattr(owner, name, wrapper)


def main(nodes: int, features: int) -> None:
    torch.set_num_threads(1)
    threading.Thread(target=sample, daemon=True).start()
    mark("imports")
    import protocols.base as base
    import secure_fgl.algorithms.fedgcn.ops as fedgcn
    import secure_fgl.data.build as build
    from secure_fgl.bench.fedgcn import K, _pretrain
    from secure_fgl.data import make_federated

    traced(build, "load_node_dataset")
    traced(base.Protocol, "row_sum")
    traced(fedgcn, "partial_neighbour_sums")
    fed = make_federated(
        "sbm", num_clients=K, beta=10000.0, seed=0, num_nodes=nodes, num_features=features, avg_degree=8.0
    )
    gc.collect()
    mark("federation built")
    c0 = time.process_time()
    rec = _pretrain(fed, "ckks", "sparse", model_round=False)
    cpu = time.process_time() - c0
    mark("pre-training done")
    edges = int(fed.graph.edge_index.size(1)) // 2
    print(
        f"edges {edges}  pre-training wall {rec['pretrain_s']:.1f} s  CPU {cpu:.1f} s  "
        f"CPU ns per edge x feature {cpu / (edges * (features + 1)) * 1e9:.1f}  bytes up {rec['bytes_up']}  "
        f"up/float32 {rec['ratio_up']:.2f}x  peak RSS {rss()[1]:.0f} MB"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 16)
