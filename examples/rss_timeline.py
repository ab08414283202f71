"""Resident memory of one FedGCN / Centralized run over time, and where the peak is.

    nice -n 10 python examples/rss_timeline.py DATASET ALGORITHM HOPS MODE ROUNDS [--out FILE.json]
    e.g.  nice -n 10 python examples/rss_timeline.py cs fedgcn 1 plain 3

The settings of ``examples/fedgcn_amazon_coauthor.py`` (10 clients, Dirichlet beta 1, seed 0,
``--center``, degree cap = the largest degree).  A thread samples the process's RSS
(``/proc/self/statm``) every 50 ms; it prints the RSS every ~2 s with the function the main
thread is in, the peak with the main thread's stack at that moment, and the run's phase times,
and writes them as JSON with ``--out``.  Used for the memory section of
``docs/fedgcn_amazon_coauthor.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

from torch_geometric.utils import degree

from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, run_experiment


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


class Sampler(threading.Thread):
    """RSS every ``period`` s; the main thread's stack whenever a new peak is reached."""

    def __init__(self, period: float = 0.05):
        super().__init__(daemon=True)
        self.main, self.period, self.t0 = threading.get_ident(), period, time.perf_counter()
        self.peak, self.peak_stack, self.timeline, self.stop = 0.0, "", [], False

    def run(self) -> None:
        while not self.stop:
            r, frame = rss_gb(), sys._current_frames()[self.main]
            if r > self.peak + 0.02:
                self.peak, self.peak_stack = r, "".join(traceback.format_stack(frame)[-8:])
            t = time.perf_counter() - self.t0
            if not self.timeline or t - self.timeline[-1][0] > 2:
                self.timeline.append((round(t, 1), round(r, 2), traceback.extract_stack(frame)[-1].name))
            time.sleep(self.period)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dataset")
    ap.add_argument("algorithm", choices=("fedgcn", "centralized"))
    ap.add_argument("hops", type=int)
    ap.add_argument("mode")
    ap.add_argument("rounds", type=int)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    root = os.environ.get("SECURE_FGL_DATA")
    sampler = Sampler()
    sampler.start()
    fed = load_federation(RunConfig(dataset=args.dataset, clients=10, beta=1.0, seed=0, data_root=root))
    loaded = rss_gb()
    cap = int(degree(fed.graph.edge_index[0], fed.graph.num_nodes).max())
    opts = (
        {"center": True}
        if args.algorithm == "centralized"
        else {"hops": args.hops, "center": True, "degree_cap": max(cap, 254)}
    )
    cfg = RunConfig(
        algorithm=args.algorithm,
        dataset=args.dataset,
        clients=10,
        beta=1.0,
        rounds=args.rounds,
        seed=0,
        mode=args.mode,
        data_root=root,
        options=opts,
    )
    res = run_experiment(cfg, progress=False, fed=fed)
    sampler.stop = True
    out = {
        "args": vars(args),
        "rss_after_loading_gb": round(loaded, 2),
        "peak_rss_gb": round(sampler.peak, 2),
        "end_rss_gb": round(rss_gb(), 2),
        "test_acc": res["final"]["test_acc"],
        "time": res.get("time", {}),
        "timeline": sampler.timeline,
        "peak_stack": sampler.peak_stack,
    }
    print(
        f"after loading {out['rss_after_loading_gb']} GB; peak {out['peak_rss_gb']} GB; end {out['end_rss_gb']} GB; "
        f"test acc {out['test_acc']:.4f}"
    )
    print("times:", json.dumps(out["time"]))
    print("timeline (s, GB, function):", out["timeline"])
    print("stack at the peak:\n" + out["peak_stack"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
