"""CPU time of each exchange of the Cora FedGCN run.

The overhead bench's ``cora-fedgcn`` workload, on the local executor: the protocol halves in the client runtimes,
every exchange through :func:`secure_fgl.runtime.exchange.run_server_half`.

    python examples/profile_exchanges.py --mode mask --rounds 10 \
        [--profile model|pretrain --profile-out runs/prof/mask-model.prof]

Prints one JSON line: the whole run's process CPU seconds, the median and mean CPU milliseconds of
the model exchanges (``fedgcn/model``) and the CPU milliseconds of every other exchange (the
pre-training's ``fedgcn/neighbour_sums``).  Process CPU time, not wall time: on a shared machine it
is what the run itself spent.  ``--profile`` runs ``cProfile`` (with ``time.process_time``) over the
chosen exchanges only and prints the functions by own time and by cumulative time; the timings of a
profiled run include the profiler's own overhead (about 3x on Python-heavy code).  Modes: those of
``secure-fgl bench --suite overhead`` (``ckks-fp20``: CKKS with ``--fixed-point-bits 20
--update-bound 1``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time

import torch

import secure_fgl.runtime.exchange as exchange
from secure_fgl.bench.overhead import MODES, workload_config
from secure_fgl.config import RunConfig
from secure_fgl.experiment import run_experiment


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="mask", choices=list(MODES))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--profile", default=None, choices=["model", "pretrain"])
    ap.add_argument("--profile-out", default=None, help="where to write the cProfile stats (pstats file)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import torch_geometric  # noqa: F401  (imported before the clock starts, as in a CLI run)

    profiler = cProfile.Profile(time.process_time) if a.profile else None
    times: list[tuple[str, float]] = []
    run_server_half = exchange.run_server_half

    def timed(protocol, ctx):
        on = profiler is not None and ctx.tag.endswith("/model") == (a.profile == "model")
        c0 = time.process_time()
        if on:
            profiler.enable()
        try:
            return run_server_half(protocol, ctx)
        finally:
            if on:
                profiler.disable()
            times.append((ctx.tag, 1e3 * (time.process_time() - c0)))

    import secure_fgl.algorithms.fedgcn.server  # noqa: F401  (every runtime module that calls run_server_half is loaded)

    for module in [
        m for name, m in sys.modules.items() if name.startswith(("secure_fgl.runtime", "secure_fgl.algorithms"))
    ]:
        if getattr(module, "run_server_half", None) is run_server_half:
            module.run_server_half = timed  # wherever it was imported by name
    values = {**workload_config("cora-fedgcn", a.mode, False, None, "local"), "rounds": a.rounds}
    with tempfile.TemporaryDirectory(prefix="profile-") as out:
        cfg = RunConfig.from_dict({**values, "out": out}).validate()
        c0 = time.process_time()
        result = run_experiment(cfg, progress=False)
        cpu = time.process_time() - c0
    model = sorted(t for tag, t in times if tag.endswith("/model"))
    print(
        json.dumps(
            {
                "mode": a.mode,
                "rounds": a.rounds,
                "cpu_s": round(cpu, 2),
                "model_ms_median": round(model[len(model) // 2], 1) if model else None,
                "model_ms_mean": round(sum(model) / len(model), 1) if model else None,
                "other_ms": [(tag, round(t, 1)) for tag, t in times if not tag.endswith("/model")],
                "test_acc": result["final"]["test_acc"],
            }
        )
    )
    if profiler is not None:
        if a.profile_out:
            profiler.dump_stats(a.profile_out)
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(60)


if __name__ == "__main__":
    main()
