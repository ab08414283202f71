"""Runtime benchmark.

The same FedGCN run through the in-process engine, the :class:`~secure_fgl.runtime.executor.LocalExecutor` and the
:class:`~secure_fgl.runtime.ray_executor.RayExecutor`.

Workload: a synthetic SBM graph (``sbm``, binary features) partitioned over ``K`` clients
(Dirichlet beta 10000), FedGCN 1-hop with its secure pre-training exchange (sparse layout,
given row order), then ``rounds`` FedAvg rounds, in ``ckks`` and ``mask``.  Full settings:
1e5 nodes, 32 features, K in (10, 100), 10 rounds, 3 repeats; ``--quick``: 2e4 nodes, 16
features, 3 rounds, 1 repeat.

Per run (``runtime_bench.json``): wall seconds and the run's own phase times; executor calls,
messages and bytes; per-message overhead (a 1 KiB ping to every client through the executor,
seconds per message, measured on the warm executor after the run); peak RSS of the driver; peak
total PSS of the driver and everything it started (Ray actors, raylet, GCS: sampled every 0.5 s
from ``/proc/PID/smaps_rollup``), each process's PSS and its anonymous / shared-memory / file parts at
that peak (``pss_at_peak``) and, for Ray, each actor's at the end; the 1-minute load average before
and after.  The table gives the median over repeats and the speed-up of each executor against
``local`` (``local_s / executor_s``).  Ray runs on a local cluster of ``ray_cpus`` CPUs started
once; its actors are reused between runs (emptied of the last run's runtimes and their memory,
:meth:`~secure_fgl.runtime.ray_executor.ClientHost.empty`), so one warm-up run per client count on a 2000-node graph
(its seconds under ``ray_warmup_s``, not in the table) pays the actors' start.  local PSS is the driver's
alone; Ray's is the driver's plus every process it started (actors, raylet, GCS).

Model exchange bound: the runs plan the model exchange with ``|parameter| <= 10``
(:data:`BENCH_PARAM_BOUND` as the runs' ``update_bound``, a public bound each client checks) instead of the
default 100:
with 100, ckks refuses K = 100 clients (its error bound for sums up to 1e4 exceeds the float32
tolerance of :func:`~secure_fgl.algorithms.base.model_precision`).

Run: ``secure-fgl bench --suite runtime --out DIR [--quick]``; ``--clients``, ``--features``,
``--modes``, ``--executors``, ``--repeats``, ``--ray-cpus`` narrow the grid (e.g. ``--clients 100
--features 16 --modes mask --executors local ray --ray-cpus 2``).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import threading
import time
from pathlib import Path

from ..runtime.memory import PSS_FIELDS, process_pss


def _process_name(p) -> str:
    """A short name of process ``p``.

    ``driver`` for this process, Ray's process title for a worker (``ray::ClientHost``, ``ray::IDLE``), else the
    executable or Python script (``raylet``, ``gcs_server``, ``log_monitor.py``).
    """
    if p.pid == os.getpid():
        return "driver"
    try:
        cmd = p.cmdline() or [p.name()]
    except Exception:  # noqa: BLE001 - the process is gone
        return "?"
    first = cmd[0].split()[0]
    if first.startswith("ray::"):
        return first.split(".")[0]  # ray::ClientHost.call -> ray::ClientHost
    script = next((os.path.basename(c) for c in cmd[1:] if c.endswith(".py")), None)
    return script or os.path.basename(first)


def tree_pss(root_pid: int) -> dict[int, dict]:
    """PSS (:func:`process_pss`, plus ``name``) of ``root_pid`` and all its descendants, by pid."""
    import psutil

    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return {}
    per = {}
    for p in procs:
        pss = process_pss(p.pid)
        if pss is not None:
            per[p.pid] = {"name": _process_name(p), **pss}
    return per


class PeakPSS:
    """Samples the PSS of this process (``tree``: and all it started) every ``interval`` seconds.

    ``peak`` is the largest total (bytes) and ``at_peak`` each process's PSS breakdown at that moment
    (:func:`tree_pss`).
    """

    def __init__(self, interval: float = 0.5, tree: bool = True):
        self.interval, self.peak, self.at_peak, self._stop, self.tree = interval, 0, {}, threading.Event(), tree
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        """Take one PSS sample and keep it when its total is the largest so far."""
        per = tree_pss(os.getpid())
        if not self.tree:
            per = {pid: v for pid, v in per.items() if pid == os.getpid()}
        total = sum(v["Pss"] for v in per.values())
        if total > self.peak:
            self.peak, self.at_peak = total, per

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()

    def breakdown_mb(self) -> list[dict]:
        """``at_peak`` in MiB, largest process first."""
        rows = [
            {"pid": pid, "name": v["name"], **{k.lower() + "_mb": round(v[k] / 2**20, 1) for k in PSS_FIELDS if k in v}}
            for pid, v in self.at_peak.items()
        ]
        return sorted(rows, key=lambda r: -r["pss_mb"])


#: public bound on |parameter| of the benchmark's model exchange (module docstring)
BENCH_PARAM_BOUND = 10.0


def _settings(quick: bool) -> dict:
    if quick:
        return {"nodes": 20_000, "features": 16, "clients": (10, 100), "rounds": 3, "repeats": 1}
    return {"nodes": 100_000, "features": 32, "clients": (10, 100), "rounds": 10, "repeats": 3}


def _config(executor: str, mode: str, clients: int, s: dict, ray_cpus: int):
    from ..config import RunConfig

    return RunConfig(
        algorithm="fedgcn",
        dataset="sbm",
        clients=clients,
        rounds=s["rounds"],
        mode=mode,
        executor=executor,
        ray_num_cpus=ray_cpus,
        save_best_model=False,
        update_bound=BENCH_PARAM_BOUND,
        synthetic={"num_nodes": s["nodes"], "num_features": s["features"]},
    ).validate()


def _ping_overhead(executor, clients: int, calls: int = 5) -> float:
    """Seconds per message of a 1 KiB request/response round trip through ``executor``."""
    from ..runtime import wire

    frame = wire.pack({"pad": bytes(1024).hex()})
    t0 = time.perf_counter()
    for _ in range(calls):
        executor.call("ping", {k: frame for k in range(clients)})
    return (time.perf_counter() - t0) / (calls * clients * 2)


def one_run(executor: str, mode: str, clients: int, s: dict, fed, ray_cpus: int) -> dict:
    """One run; the executor is kept open after it for the ping and the actors' memory."""
    from .. import experiment

    kept = {}
    make = experiment.make_executor  # the name run_experiment calls

    def keep(cfg, device="cpu"):
        kept["ex"] = make(cfg, device)
        kept["ex"].shutdown, kept["close"] = (lambda: None), kept["ex"].shutdown
        return kept["ex"]

    experiment.make_executor = keep
    load0 = os.getloadavg()[0]
    try:
        with PeakPSS(tree=executor == "ray") as pss:  # local: one process (the idle Ray
            # cluster of other runs is not theirs)
            t0 = time.perf_counter()
            res = experiment.run_experiment(_config(executor, mode, clients, s, ray_cpus), progress=False, fed=fed)
            wall = time.perf_counter() - t0
    finally:
        experiment.make_executor = make
    rec = {
        "executor": executor,
        "mode": mode,
        "clients": clients,
        "wall_s": wall,
        "time": res["time"],
        "test_acc": res["final"]["test_acc"],
        "bytes_up": res["comm"]["bytes_up"],
        "bytes_down": res["comm"]["bytes_down"],
        "peak_total_pss_mb": pss.peak / 2**20,
        "pss_at_peak": pss.breakdown_mb(),
        "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_avg_1m": [load0, os.getloadavg()[0]],
    }
    ex = kept.get("ex")
    if ex is not None:
        rec["executor_stats"] = {k: v for k, v in res["runtime"]["stats"].items() if k != "per_method"}
        rec["per_message_overhead_s"] = _ping_overhead(ex, clients)
        if executor == "ray":
            rec["actors"] = [
                {
                    "pid": m["pid"],
                    "clients": m["clients"],
                    **{f.lower() + "_mb": m[f] / 2**20 for f in PSS_FIELDS if f in m},
                }
                for m in ex.memory()
            ]
        kept["close"]()
    return rec


def run_runtime_bench(
    out_dir,
    quick: bool = False,
    executors=("local", "ray"),
    modes=("ckks", "mask"),
    ray_cpus: int | None = None,
    repeats: int | None = None,
    clients=None,
    features: int | None = None,
) -> dict:
    """The grid of the module docstring.

    ``repeats``, ``clients`` (a tuple of K) and ``features`` override the settings' values.
    """
    from ..data import make_federated

    s = _settings(quick)
    for key, value in (("repeats", repeats), ("features", features)):
        if value is not None:
            s[key] = int(value)
    if clients is not None:
        s["clients"] = tuple(int(k) for k in clients)
    ray_cpus = ray_cpus or os.cpu_count()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = {"settings": s, "cpus": os.cpu_count(), "ray_cpus": ray_cpus, "records": []}
    if "ray" in executors:
        import ray

        t0 = time.perf_counter()
        ray.init(address="local", num_cpus=ray_cpus, include_dashboard=False, log_to_driver=False)
        res["ray_init_s"] = time.perf_counter() - t0
    try:
        for clients in s["clients"]:
            fed = make_federated(
                dataset="sbm",
                num_clients=clients,
                partition="dirichlet",
                beta=10000.0,
                seed=0,
                num_nodes=s["nodes"],
                num_features=s["features"],
            )
            for mode in modes:
                for executor in executors:
                    warm = executor == "ray" and not any(
                        r["executor"] == "ray" and r["clients"] == clients for r in res["records"]
                    )
                    if warm:  # start the actors on a small graph of the same K
                        small = dict(s, nodes=2000, rounds=1)
                        t0 = time.perf_counter()
                        one_run(
                            executor,
                            mode,
                            clients,
                            small,
                            make_federated(
                                dataset="sbm",
                                num_clients=clients,
                                partition="dirichlet",
                                beta=10000.0,
                                seed=0,
                                num_nodes=small["nodes"],
                                num_features=s["features"],
                            ),
                            ray_cpus,
                        )
                        res.setdefault("ray_warmup_s", {})[str(clients)] = time.perf_counter() - t0
                        print(
                            f"{clients:>4} ray warm-up (actors start, 2000-node graph): "
                            f"{res['ray_warmup_s'][str(clients)]:.1f} s",
                            flush=True,
                        )
                    for rep in range(s["repeats"]):
                        rec = one_run(executor, mode, clients, s, fed, ray_cpus)
                        rec["repeat"] = rep
                        res["records"].append(rec)
                        print(
                            f"{clients:>4} {mode:<5} {executor:<7} rep {rep}: {rec['wall_s']:.1f} s, "
                            f"peak PSS {rec['peak_total_pss_mb']:.0f} MB, load {rec['load_avg_1m'][0]:.1f}",
                            flush=True,
                        )
                        (out / "runtime_bench.json").write_text(json.dumps(res, indent=1, default=str))
    finally:
        if "ray" in executors:
            import ray

            ray.shutdown()
    res["table"] = summarise(res["records"])
    (out / "runtime_bench.json").write_text(json.dumps(res, indent=1, default=str))
    print_table(res["table"])
    return res


def summarise(records: list[dict]) -> list[dict]:
    """Median over repeats per (clients, mode, executor), speed-up against ``local``."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["clients"], r["mode"], r["executor"]), []).append(r)
    rows = []
    for (clients, mode, executor), rs in groups.items():
        med = lambda key: statistics.median(key(r) for r in rs)  # noqa: E731
        row = {
            "clients": clients,
            "mode": mode,
            "executor": executor,
            "runs": len(rs),
            "wall_s": med(lambda r: r["wall_s"]),
            "setup_s": med(lambda r: r["time"].get("setup", 0.0)),
            "train_s": med(lambda r: r["time"].get("train", 0.0)),
            "peak_total_pss_mb": max(r["peak_total_pss_mb"] for r in rs),
            "per_message_overhead_us": med(lambda r: r.get("per_message_overhead_s", 0.0)) * 1e6,
            "load_avg_1m": med(lambda r: r["load_avg_1m"][0]),
        }
        peak = max(rs, key=lambda r: r["peak_total_pss_mb"]).get("pss_at_peak", [])
        row["pss_at_peak_mb"] = {
            "driver": sum(p["pss_mb"] for p in peak if p["name"] == "driver"),
            "actors": [p["pss_mb"] for p in peak if p["name"] == "ray::ClientHost"],
            "other": sum(p["pss_mb"] for p in peak if p["name"] not in ("driver", "ray::ClientHost")),
        }
        if executor == "ray":
            row["actor_pss_mb"] = [round(a["pss_mb"]) for a in rs[-1].get("actors", [])]
        rows.append(row)
    for row in rows:
        base = next(
            (
                r
                for r in rows
                if r["clients"] == row["clients"] and r["mode"] == row["mode"] and r["executor"] == "local"
            ),
            None,
        )
        row["speedup_vs_local"] = base["wall_s"] / row["wall_s"] if base else None
    return rows


def print_table(rows: list[dict]) -> None:
    """Print the runtime records and, for Ray, the PSS breakdown at the peak."""
    print(
        f"{'K':>4} {'mode':<5} {'executor':<8} {'runs':>4} {'wall s':>8} {'setup s':>8} {'train s':>8} "
        f"{'x local':>8} {'msg us':>8} {'PSS MB':>8} {'load':>6}"
    )
    for r in rows:
        us = f"{r['per_message_overhead_us']:.0f}" if r["per_message_overhead_us"] is not None else "-"
        speedup = f"{r['speedup_vs_local']:.2f}" if r["speedup_vs_local"] is not None else "-"
        print(
            f"{r['clients']:>4} {r['mode']:<5} {r['executor']:<8} {r['runs']:>4} {r['wall_s']:>8.1f} "
            f"{r['setup_s']:>8.1f} {r['train_s']:>8.1f} {speedup:>8} {us:>8} "
            f"{r['peak_total_pss_mb']:>8.0f} {r['load_avg_1m']:>6.1f}"
        )
        at = r["pss_at_peak_mb"]
        if at["actors"]:
            print(
                f"{'':>19}PSS at the peak: driver {at['driver']:.0f}, actors "
                f"{' + '.join(f'{a:.0f}' for a in at['actors'])}, Ray's other processes {at['other']:.0f} MB"
            )


# ---------------------------------------------------------------- the dropout column
def dropout_counts(clients: int, threshold: int | None = None) -> tuple[int, ...]:
    """0, 1 and ``n - t`` dropouts, the most a round survives.

    ``t`` is ``threshold`` (ckks-mp's t-out-of-n; ``t = n`` survives none) or mask's default
    ``n // 2 + 1``.
    """
    spare = clients - (clients // 2 + 1 if threshold is None else threshold)
    return tuple(sorted({0, min(1, spare), spare}))


def mode_label(mode: str, threshold: int | None = None) -> str:
    """The mode as the dropout column prints it: ``ckks-mp:t=7`` for t-out-of-n ckks-mp."""
    return f"{mode}:t={threshold}" if threshold is not None else mode


def dropout_round(
    mode: str,
    clients: int,
    dropped: int,
    executor: str = "local",
    features: int = 64,
    nodes: int = 2000,
    threshold: int | None = None,
) -> dict:
    """Seconds and bytes of one FedAvg round with ``dropped`` clients lost at their upload.

    Round 1 (round 0 paid registration and key set-up), in which the ``dropped`` highest client ids drop at their upload
    (``--simulate-dropouts dropped@upload:r1``); bytes are those of round 1's protocol messages.
    ``threshold``: ckks-mp's t of t-out-of-n (``--threshold``).  ``round_cpu_s`` is the driver
    process's CPU time of the round (the local executor runs every client in it).
    """
    from protocols import SERVER

    from ..config import RunConfig
    from ..experiment import load_federation
    from ..runtime.build import make_executor, make_runtime_protocol, make_strategy

    cfg = RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        clients=clients,
        rounds=2,
        mode=mode,
        executor=executor,
        hidden=64,
        threshold=threshold,
        simulate_dropouts=f"{dropped}@upload:r1" if dropped else None,
        synthetic={"num_nodes": nodes, "num_features": features},
    ).validate()
    fed = load_federation(cfg)
    ex = make_executor(cfg)
    protocol = make_runtime_protocol(cfg, fed.num_clients, ex)
    try:
        strategy = make_strategy(cfg, fed, protocol, {}, ex)
        strategy.train_round(0)
        t0, c0 = time.perf_counter(), time.process_time()
        strategy.train_round(1)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    finally:
        ex.shutdown()
    msgs = protocol.transcript.select(round=1)
    server = protocol.server  # its checks, sums and (mask) recovery of round 1's exchange
    server_s = (getattr(server, "last_timing", None) or getattr(server, "last_stats", None) or {}).get("server_s")
    return {
        "mode": mode_label(mode, threshold),
        "clients": clients,
        "dropped": dropped,
        "executor": executor,
        "round_s": seconds,
        "round_cpu_s": cpu_seconds,
        "server_s": server_s,
        "bytes_up": sum(m.nbytes for m in msgs if m.receiver == SERVER),
        "bytes_down": sum(m.nbytes for m in msgs if m.receiver != SERVER),
        "included": len(protocol.last_included),
        "model_parameters": strategy.model_size,
        "load_avg_1m": os.getloadavg()[0],
    }


def run_dropout_bench(
    out_dir,
    clients=(10,),
    modes=("ckks", "mask"),
    executors=("local",),
    repeats: int = 1,
    features: int | None = None,
    threshold: int | None = None,
) -> list[dict]:
    """The dropout column: :func:`dropout_round` for 0, 1 and ``n - t`` dropouts.

    Medians over ``repeats``, written to ``dropout_bench.json``.  ``threshold``: ckks-mp's t
    (default ``n``: n-out-of-n, measured without dropouts only).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    print(
        f"{'K':>4} {'mode':<12} {'executor':<8} {'dropped':>7} {'included':>8} {'round s':>8} {'cpu s':>8} "
        f"{'server s':>8} {'up kB':>9} {'down kB':>9} {'load':>5}"
    )
    for k in clients:
        for mode in modes:
            t = threshold if mode == "ckks-mp" else None
            limit = int(k) if mode == "ckks-mp" and t is None else t  # n-out-of-n survives no dropout
            for executor in executors:
                for dropped in dropout_counts(int(k), limit):
                    runs = [
                        dropout_round(mode, int(k), dropped, executor, features or 64, threshold=t)
                        for _ in range(repeats)
                    ]
                    row = dict(
                        runs[0],
                        round_s=statistics.median(r["round_s"] for r in runs),
                        round_cpu_s=statistics.median(r["round_cpu_s"] for r in runs),
                        server_s=statistics.median(r["server_s"] or 0.0 for r in runs),
                        runs=len(runs),
                    )
                    rows.append(row)
                    print(
                        f"{k:>4} {row['mode']:<12} {executor:<8} {dropped:>7} {row['included']:>8} "
                        f"{row['round_s']:>8.2f} {row['round_cpu_s']:>8.2f} {row['server_s']:>8.3f} "
                        f"{row['bytes_up'] / 1e3:>9.1f} {row['bytes_down'] / 1e3:>9.1f} {row['load_avg_1m']:>5.1f}",
                        flush=True,
                    )
                    (out / "dropout_bench.json").write_text(json.dumps(rows, indent=1))
    return rows
