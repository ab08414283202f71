"""What choosing a secure mode costs over plain, for whole runs (``secure-fgl bench --suite overhead``).

Workloads (``--quick``: fewer rounds, same records):

* ``cora-fedgcn``: FedGCN on Cora, 10 clients, Dirichlet beta 10000, 1-hop, 100 rounds x 3 local
  steps, SGD lr 0.5 (the released code's setting, preset ``fedgcn-table2``);
* ``cora-fedgcn-2hop``: the same with 2 hops and the dense pre-training layout (every client
  receives every row: the layout ``ckks-mp`` switches to one broadcast key);
* ``cora-fedomd``: FedOMD on Cora, 3 Louvain parties (preset ``fedomd-table4``), a short run;
* ``pubmed-fedspray``: FedSpray on PubMed, 7 Louvain parties (preset ``fedspray-table2``), a short run.

Modes: ``plain``, ``mask``, ``ckks``, ``ckks-mp``, ``ckks-fp20`` (CKKS with the opt-in packed fixed-point
codec, ``--fixed-point-bits 20 --update-bound 1``) and ``ckks-grid`` (the model mean on its public
grid, ``--grid-model-mean --update-bound 1``: CKKS's exact integer fields; ``plain-grid`` on request).  The parties run on the ``local`` executor
(:data:`EXECUTOR`).

Every (workload, mode) runs in its own subprocess (``python -m secure_fgl.bench.overhead --worker``)
one after the other, so its peak RSS (``VmHWM``) is that mode's own and the modes are measured side
by side in one invocation.  ``--repeats N`` runs the modes N times round-robin and adds, per mode,
the median of the per-repeat ratios to plain and their range (a whole-run ratio moves by a few
percent between invocations on a shared machine).  ``wall_s`` is the whole :func:`~secure_fgl.experiment.run_experiment`
(data, set-up exchanges, training, evaluation, a checkpoint per round as in a CLI run; not the
interpreter start); ``cpu_s`` its CPU time, the fairer measure on a shared machine (the load
average before each run is recorded).  Bytes are the data
exchanges' uploads (tags with a float32 baseline; key set-up and identity registration are listed
apart as ``bytes_up_keys``), and ``bytes_up_ratio_to_plain`` divides them by the one float32
baseline of :mod:`protocols.baseline` (the same number in every mode), per run and per tag.

Scale points (:func:`secure_fgl.bench.fedgcn.scale_part`, each in a fresh process): the secure
FedGCN pre-training (ckks, sparse layout, 10 clients) on synthetic graphs -- SBMs with binary
features (1e5 nodes x 64, 1e6 nodes / 4M edges x 16; ckks packed) and an ogbn-arxiv-sized
contextual SBM (169k nodes, 1.17M edges, 128 Gaussian features; ckks, its float sums on the public grid): time, bytes, peak
RSS, ns per (edge x feature).

Writes ``OUT/overhead.json``: a list of records ``{workload, mode, wall_s, wall_ratio_to_plain,
bytes_up, bytes_up_ratio_to_plain, peak_rss_mb, ...}`` (scale points have ``workload``
``scale-<nodes>`` and ``wall_ratio_to_plain`` ``None``), and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: workload -> (preset, overrides, overrides with --quick)
WORKLOADS = {
    "cora-fedgcn": ("fedgcn-table2", {"dataset": "cora", "rounds": 100}, {"rounds": 10}),
    "cora-fedgcn-2hop": (
        "fedgcn-table2",
        {"dataset": "cora", "rounds": 100, "options": {"hops": 2, "layout": "dense"}},
        {"rounds": 10},
    ),
    "cora-fedomd": ("fedomd-table4", {"dataset": "cora", "rounds": 30, "patience": None}, {"rounds": 5}),
    "pubmed-fedspray": ("fedspray-table2", {"dataset": "pubmed", "rounds": 10}, {"rounds": 2}),
}
MODES = ("plain", "mask", "ckks", "ckks-mp", "ckks-fp20", "ckks-grid")
#: benchmark modes that are a mode with options: ``ckks-fp20`` is CKKS with the packed
#: fixed-point codec (``--fixed-point-bits 20 --update-bound 1``, docs/performance.md), opt-in;
#: ``ckks-grid`` / ``plain-grid``: the model mean on its public grid (``--grid-model-mean
#: --update-bound 1``), which CKKS carries as exact integer fields: the same model as plain-grid, bit for bit
VARIANTS = {
    "ckks-fp20": ("ckks", {"fixed_point_bits": 20, "update_bound": 1.0}),
    "ckks-grid": ("ckks", {"grid_model_mean": True, "update_bound": 1.0}),
    "plain-grid": ("plain", {"grid_model_mean": True, "update_bound": 1.0}),
}
#: where the parties run unless ``--executor`` says otherwise: one client runtime per client (the
#: ``local`` executor: only signed bytes between the parties, each client's protocol half in its runtime)
EXECUTOR = "local"


def workload_config(
    name: str, mode: str, quick: bool, data_root=None, executor: str | None = None, device: str = "cpu"
) -> dict:
    """The run settings of one (workload, mode) as a flat dict.

    For ``RunConfig.from_dict``. ``executor``: ``None`` for :data:`EXECUTOR`; ``device``: where the clients train
    (``cuda`` on a GPU machine).
    """
    from secure_fgl.presets import load_preset

    preset, overrides, quick_overrides = WORKLOADS[name]
    mode, options = VARIANTS.get(mode, (mode, {}))
    values = {
        **load_preset(preset),
        **overrides,
        **(quick_overrides if quick else {}),
        **options,
        "mode": mode,
        "seed": 0,
        "device": device,
        "save_best_model": False,
        "data_root": data_root,
        "executor": executor or EXECUTOR,
    }
    return values


def _peak_rss_mb() -> float:
    from .fedgcn import _peak_rss_mb as peak

    return peak()


def run_worker(values: dict) -> dict:
    """In the worker process: run one configuration, return its measurements."""
    import torch

    torch.set_num_threads(1)
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment

    with tempfile.TemporaryDirectory(prefix="overhead-") as out:  # checkpoints as in a CLI run
        cfg = RunConfig.from_dict({**values, "out": out}).validate()
        t0, c0 = time.perf_counter(), time.process_time()
        result = run_experiment(cfg, progress=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    comm = result["comm"]
    per_tag = {
        tag: {k: v.get(k) for k in ("bytes_up", "bytes_down", "plaintext_bytes_up", "plaintext_bytes_down", "messages")}
        for tag, v in comm["per_tag"].items()
    }
    data = {t: v for t, v in per_tag.items() if v["plaintext_bytes_up"] is not None}
    up = sum(v["bytes_up"] for v in data.values())
    f32 = sum(v["plaintext_bytes_up"] for v in data.values())
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "time": result["time"],
        "bytes_up": up,
        "bytes_up_float32": f32,
        "bytes_up_ratio_to_plain": up / f32 if f32 else None,
        "bytes_up_keys": comm["bytes_up"] - up,
        "bytes_down": comm["bytes_down"],
        "per_tag": per_tag,
        "peak_rss_mb": _peak_rss_mb(),
        "test_acc": result["final"]["test_acc"],
        "rounds": cfg.rounds,
        "executor": cfg.executor,
        "device": result["device"],
    }


def _spawn(values: dict) -> dict:
    """Run :func:`run_worker` in a fresh interpreter (its own peak RSS), niced like every experiment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "secure_fgl.bench.overhead", "--worker", json.dumps(values)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"worker exited {proc.returncode}: {tail[0]}"}
    return json.loads(lines[-1])


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_workloads(
    workloads, modes, quick: bool, data_root=None, executor: str | None = None, repeats: int = 1, device: str = "cpu"
) -> list[dict]:
    """Run each workload's modes one after the other, ``repeats`` times round-robin.

    Each workload's modes one after the other, ``repeats`` times round-robin (plain, mask, ckks,
    plain, ...); every run's ratios divide by the plain run of its own repeat.  With several
    repeats, :func:`medians` adds one summary record per (workload, mode).
    """
    records = []
    for name in workloads:
        for rep in range(repeats):
            plain = None
            for mode in modes:
                load = _load_average()
                rec = {
                    "workload": name,
                    "mode": mode,
                    "repeat": rep,
                    "load_average_before": load,
                    **_spawn(workload_config(name, mode, quick, data_root, executor, device)),
                }
                if mode == "plain" and "error" not in rec:
                    plain = rec
                for what in ("wall", "cpu"):
                    rec[f"{what}_ratio_to_plain"] = (
                        rec[f"{what}_s"] / plain[f"{what}_s"] if plain and "error" not in rec else None
                    )
                records.append(rec)
                print(_line(rec), flush=True)
    return records + (medians(records) if repeats > 1 else [])


def medians(records: list[dict]) -> list[dict]:
    """Median wall and CPU seconds and ratios to plain per (workload, mode).

    Per (workload, mode) over its repeats: the median wall and CPU seconds and the median and
    range of the per-repeat ratios to plain (``statistic: 'median'``; runs that failed are left out).
    """
    out = []
    for key in dict.fromkeys((r["workload"], r["mode"]) for r in records if "error" not in r):
        runs = [r for r in records if (r["workload"], r["mode"]) == key and "error" not in r]
        rec = {"workload": key[0], "mode": key[1], "statistic": "median", "repeats": len(runs)}
        for field in ("wall_s", "cpu_s", "wall_ratio_to_plain", "cpu_ratio_to_plain"):
            vals = sorted(r[field] for r in runs if r.get(field) is not None)
            rec[field] = statistics.median(vals) if vals else None
            if field.endswith("ratio_to_plain") and vals:
                rec[field + "_range"] = [vals[0], vals[-1]]
        out.append(rec)
        print(
            f"{key[0]:<17}{key[1]:<7}median of {len(runs)}: wall {_fmt(rec['wall_s'], '.1f')} s, "
            f"/plain {_fmt(rec['wall_ratio_to_plain'], '.3f')}x (range {_fmt(rec.get('wall_ratio_to_plain_range', [None])[0], '.3f')}"
            f"-{_fmt(rec.get('wall_ratio_to_plain_range', [None, None])[-1], '.3f')}), cpu /plain "
            f"{_fmt(rec['cpu_ratio_to_plain'], '.3f')}x",
            flush=True,
        )
    return out


#: ogbn-arxiv's shape (169,343 nodes, 1,166,243 edges, 128 float features, 40 classes) as a
#: contextual SBM with Gaussian features (ckks; its float sums travel on the public grid)
ARXIV_SHAPE = (169_343, 128, ("csbm", {"avg_degree": 2 * 1_166_243 / 169_343, "num_classes": 40}))


def run_scale(sizes, arxiv: bool) -> list[dict]:
    """Run the SBM sizes and the ogbn-arxiv-sized point, each in a fresh process.

    The SBM sizes (binary features: 64 up to 1e5 nodes, 16 above; ckks packed) and the
    ogbn-arxiv-sized point, each in a fresh process (:func:`secure_fgl.bench.fedgcn.scale_part`).
    """
    from .fedgcn import scale_part

    recs = scale_part(sizes, lambda n: 64 if n <= 100_000 else 16)
    if arxiv:
        n, feats, graph = ARXIV_SHAPE
        recs += scale_part([n], feats, graph=graph)
    out = []
    for rec in recs:
        name = "arxiv-sized" if rec.get("dataset") == "csbm" else f"scale-{rec['nodes']}"
        rec = {
            "workload": name,
            "mode": rec.get("backend", "ckks"),
            "wall_s": rec.get("pretrain_s"),
            "wall_ratio_to_plain": None,
            "bytes_up_ratio_to_plain": rec.get("ratio_up"),
            "peak_rss_mb": rec.get("rss_peak_mb"),
            "ns_per_edge_feature": (rec["s_per_edge_feature"] * 1e9 if "s_per_edge_feature" in rec else None),
            **{k: v for k, v in rec.items() if k not in ("per_client_up", "per_client_down")},
        }
        out.append(rec)
    return out


# ---------------------------------------------------------------------------- table
def _fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['workload']:<17}{r['mode']:<7}{r['error']}"
    return (
        f"{r['workload']:<17}{r['mode']:<7}{_fmt(r['wall_s'], '.1f'):>8}{_fmt(r['wall_ratio_to_plain'], '.2f'):>7}x"
        f"{_fmt(r['cpu_s'], '.1f'):>8}{_fmt(r['cpu_ratio_to_plain'], '.2f'):>7}x{_fmt(r['bytes_up'] / 1e6, '.2f'):>11}{_fmt(r['bytes_up_ratio_to_plain'], '.2f'):>8}x"
        f"{_fmt(r['peak_rss_mb'], '.0f'):>9}  {r.get('executor', ''):<7}{r.get('device', ''):<8}load {r.get('load_average_before')}"
    )


HEADER = f"{'workload':<17}{'mode':<7}{'wall s':>8}{'/plain':>8}{'cpu s':>8}{'/plain':>8}{'up MB':>11}{'up/f32':>9}{'RSS MB':>9}  executor device"


def tag_table(records: list[dict]) -> list[str]:
    """Bytes up per tag per mode (MB) and the ratio to the float32 baseline."""
    lines = []
    for name in dict.fromkeys(r["workload"] for r in records if "per_tag" in r):
        rows = [r for r in records if r["workload"] == name and "per_tag" in r and not r.get("repeat")]
        tags = sorted({t for r in rows for t, v in r["per_tag"].items() if v["plaintext_bytes_up"] is not None})
        lines.append(f"{name}: bytes up per tag, MB (x float32)")
        for t in tags:
            cells = []
            for r in rows:
                v = r["per_tag"].get(t)
                if v:
                    ratio = v["bytes_up"] / v["plaintext_bytes_up"] if v["plaintext_bytes_up"] else None
                    cells.append(f"{r['mode']} {v['bytes_up'] / 1e6:.3f} ({_fmt(ratio, '.1f')}x)")
            lines.append(f"  {t:<28}" + "  ".join(cells))
    return lines


def exchange_table(records: list[dict]) -> list[str]:
    """Per workload and exchange: each mode's bytes and CPU seconds over plain's.

    Per workload and exchange (tag): each mode's bytes up + down over plain's bytes of the same
    exchange (and, in brackets, over the float32 baseline of both directions), and the whole run's CPU
    seconds over plain's (the CPU of one exchange is not separable from the run; the set-up and
    training phases' wall seconds are in ``time``).
    """
    lines = []
    for name in dict.fromkeys(r["workload"] for r in records if "per_tag" in r):
        rows = [r for r in records if r["workload"] == name and "per_tag" in r and not r.get("repeat")]
        plain = next((r for r in rows if r["mode"] == "plain"), None)
        if plain is None:
            continue
        lines.append(f"{name}: bytes up+down per exchange and whole-run CPU, ratio to plain")
        tags = [t for t, v in plain["per_tag"].items() if v["plaintext_bytes_up"] is not None]
        for r in rows:
            cells = []
            for t in tags:
                v, p = r["per_tag"].get(t), plain["per_tag"][t]
                base = (p["bytes_up"] or 0) + (p["bytes_down"] or 0)
                if v and base:
                    both = (v["bytes_up"] or 0) + (v["bytes_down"] or 0)
                    f32 = (v["plaintext_bytes_up"] or 0) + (v.get("plaintext_bytes_down") or 0)
                    cells.append(f"{t} {both / base:.2f}x" + (f" ({both / f32:.2f}x f32)" if f32 else ""))
            lines.append(f"  {r['mode']:<10} cpu {_fmt(r.get('cpu_ratio_to_plain'), '.2f')}x  " + "  ".join(cells))
    return lines


def run_overhead_bench(
    out_dir,
    quick: bool = False,
    data_root=None,
    workloads=None,
    modes=MODES,
    sizes=None,
    arxiv: bool = True,
    executor: str | None = None,
    repeats: int = 1,
    device: str = "cpu",
) -> list[dict]:
    """Every workload in every mode, then the scale points; writes ``OUT/overhead.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(HEADER, flush=True)
    modes = ["plain", *(m for m in modes if m != "plain")]  # ratios divide by the plain run
    records = run_workloads(
        list(WORKLOADS) if workloads is None else workloads, modes, quick, data_root, executor, repeats, device
    )
    if sizes is None:
        sizes = [10_000] if quick else [100_000, 1_000_000]
    if sizes or arxiv:
        records += run_scale(sizes or [], arxiv=arxiv and not quick)
    for line in tag_table(records) + exchange_table(records):
        print(line)
    scale = [r for r in records if r["workload"].startswith(("scale-", "arxiv"))]
    if scale:
        print(f"{'scale point':<17}{'mode':<7}{'pre s':>8}{'up MB':>11}{'up/f32':>9}{'RSS MB':>9}{'ns/(E*F)':>10}")
        for r in scale:
            if "error" in r:
                print(f"{r['workload']:<17}{r['mode']:<7}{r['error']}")
                continue
            print(
                f"{r['workload']:<17}{r['mode']:<7}{r['wall_s']:>8.1f}{r['bytes_up'] / 1e6:>11.2f}"
                f"{_fmt(r['bytes_up_ratio_to_plain'], '.2f'):>8}x{r['peak_rss_mb']:>9.0f}"
                f"{r['ns_per_edge_feature']:>10.1f}"
            )
    (out / "overhead.json").write_text(json.dumps(records, indent=1, default=str))
    print(f"written: {out / 'overhead.json'} (load average now {_load_average()})")
    return records


def main(argv=None) -> None:
    """Command line of the overhead benchmark (``secure-fgl bench --suite overhead``)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="runs/bench", help="folder the results are written to")
    ap.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    ap.add_argument("--data-root", default=None, help="dataset folder (default: $SECURE_FGL_DATA)")
    ap.add_argument("--workloads", nargs="*", default=None, choices=list(WORKLOADS))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=["plain", "mask", "ckks", "ckks-mp", *VARIANTS])
    ap.add_argument("--sizes", nargs="*", type=int, default=None, help="scale points (nodes); none: skip")
    ap.add_argument("--no-arxiv", action="store_true", help="skip the ogbn-arxiv-sized point")
    ap.add_argument("--executor", default=None, choices=["local"], help=f"where the parties run (default {EXECUTOR})")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the modes this many times round-robin and add the medians (default 1)",
    )
    ap.add_argument("--device", default="cpu", help="where the workloads train: cpu (default) | cuda | auto")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error("--repeats must be >= 1")
    if a.worker is not None:
        print(json.dumps(run_worker(json.loads(a.worker)), default=str))
        return
    run_overhead_bench(
        a.out,
        quick=a.quick,
        data_root=a.data_root,
        workloads=a.workloads,
        modes=a.modes,
        sizes=a.sizes,
        arxiv=not a.no_arxiv,
        executor=a.executor,
        repeats=a.repeats,
        device=a.device,
    )


if __name__ == "__main__":
    main()
