"""FedGCN benchmark: what the secure pre-training exchange costs, measured from the transcript.

Two parts (``secure-fgl bench --suite fedgcn``; ``quick=True`` shrinks both for a smoke test):

1. **Cora, 1-hop, 10 clients** (Dirichlet beta 10000, seed 0).  For every backend --
   ``plain``, ``ckks`` (add-only chain, packed integer counts), ``mask``, and the reference
   ``ckks-default`` (the common N=8192 [60,40,40,60] context, one float per slot:
   ``make_protocol('ckks', K, params='default', packing=False)``) and ``ckks-mp`` (multiparty
   keys, :mod:`protocols.ckks_mp`) -- and both row layouts:
   pre-training bytes up/down per client and in total (transcript, tag
   ``fedgcn/neighbour_sums``; CKKS key set-up is the separate tag ``ckks/keys``), the float32
   message of the same rows (``rows x (d+1) x 4``), the upload ratio against it, the wall time
   of the whole pre-training (the strategy's ``setup()``: encode, encrypt, upload, server sum, download,
   decrypt, normalise) and the bytes of one model-averaging round (tag ``fedgcn/model``).
   The sparse layout runs twice: with the dataset's row numbering (``row_order='given'``) and
   with the signature numbering (``row_order='signature'``, layout label ``sparse-sig``; rows
   numbered by the set of clients touching them, blocks cut to minimise uploads -- see
   :mod:`secure_fgl.algorithms.fedgcn`, it reveals a histogram of those sets) and with the
   owner numbering (``row_order='owner'``, label ``sparse-own``; rows grouped by recipient,
   so no client decrypts another client's rows).
   Targets: packed CKKS upload <= 2.0x float32 (dense layout, where every client sends
   every row: the paper's "twice the raw data"; sparse-sig against the rows each client
   touches); packed CKKS pre-training >= 5x faster than the reference context on the same
   exchange.
2. **Scale**: synthetic SBM (binary features, 10 clients, mean degree 8) at 1e4, 1e5, 1e6
   nodes: time and peak memory of the secure (ckks, sparse) pre-training, each size in a
   fresh subprocess so its RSS high-water mark (``VmHWM``) is that size's own peak (graph
   generation included; the peak before the pre-training is reported too); ``tracemalloc`` the peak
   of Python/numpy allocations during ``setup()`` (TenSEAL's C++ memory is only in RSS).
   ``cost/(E*F)`` = seconds per (undirected edges x feature columns), comparable across sizes.

Writes ``OUT/fedgcn_bench.json`` and ``OUT/fedgcn_bench.md`` and prints the tables.
Run: ``python -m secure_fgl.bench.fedgcn --out runs/bench [--quick] [--data-root PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import resource
import time
import tracemalloc
from pathlib import Path

import torch

K = 10
TAG = "fedgcn/neighbour_sums"

BACKENDS = {
    "plain": ("plain", {}),
    "ckks": ("ckks", {}),
    "mask": ("mask", {}),
    "ckks-default": ("ckks", {"params": "default", "packing": False}),
    "ckks-mp": ("ckks-mp", {}),
}


def _fed_cora(data_root, quick: bool):
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import load_federation

    if quick:  # Cora-shaped but small: a smoke test must not need the real files
        return load_federation(RunConfig(dataset="sbm", clients=K, synthetic={"num_nodes": 600, "num_features": 128}))
    return load_federation(RunConfig(dataset="cora", clients=K, beta=10000.0, seed=0, data_root=data_root))


def _pretrain(
    fed, backend: str, layout: str, hops: int = 1, model_round: bool = True, row_order: str = "given"
) -> dict:
    """Run and measure FedGCN's pre-training on ``backend``/``layout`` over the client runtimes.

    One model round follows the pre-training.
    """
    from secure_fgl.config import RunConfig
    from secure_fgl.runtime.build import start_run

    mode, kw = BACKENDS[backend]
    options = {"hops": hops, "layout": layout, "row_order": row_order}
    cfg = RunConfig(algorithm="fedgcn", mode=mode, clients=K, rounds=1, local_epochs=1, options=options)
    run = start_run(cfg, fed, protocol_options=kw)
    strategy, proto = run.strategy, run.protocol
    t0 = time.perf_counter()
    strategy.setup()
    seconds = time.perf_counter() - t0
    m = strategy.final_metrics()
    rec = {
        "backend": backend,
        "layout": _label(layout, row_order),
        "row_order": row_order,
        "hops": hops,
        "exchange_rows": m.get("pretrain_exchange_rows"),
        "pretrain_s": seconds,
        "bytes_up": m["pretrain_bytes_up"],
        "bytes_down": m["pretrain_bytes_down"],
        "plain_f32_up": m["pretrain_plaintext_equiv_bytes_up"],
        "plain_f32_down": m["pretrain_plaintext_equiv_bytes_down"],
        "ratio_up": m["pretrain_upload_ratio"],
        "ratio_down": (
            m["pretrain_bytes_down"] / m["pretrain_plaintext_equiv_bytes_down"]
            if m["pretrain_plaintext_equiv_bytes_down"]
            else None
        ),
        "per_client_up": [p["bytes_up"] for p in m["pretrain_per_client"]],
        "per_client_down": [p["bytes_down"] for p in m["pretrain_per_client"]],
        "rows_up": m["pretrain_rows_up"],
        "rows_down": m["pretrain_rows_down"],
        "key_bytes": sum(x.nbytes for x in proto.transcript.messages if x.tag.endswith("/keys")),
    }
    plan = getattr(proto, "_last_plan", None)  # ckks: the encoding plan of the exchange
    if plan is not None:
        rec["ckks_plan"] = {
            "params": plan.describe(),
            "encoding": plan.encoding,
            "fields_per_slot": plan.layout.fields if plan.layout else 1,
            "field_bits": plan.layout.width if plan.layout else None,
            "scale_bits": plan.scale_bits,
        }
    if model_round:
        strategy.train_round(0)
        m = strategy.final_metrics()
        rec["model_bytes_up_round"] = m["model_bytes_up_per_round"]
        rec["model_bytes_down_round"] = m["model_bytes_down_per_round"]
        rec["model_f32_up_round"] = 4 * (sum(p.numel() for p in run.logic(0).model.parameters()) + 1) * K
    run.executor.shutdown()
    del run, strategy, proto
    gc.collect()
    return rec


#: (layout, row_order) runs of the Cora part
CORA_LAYOUTS = (("sparse", "given"), ("sparse", "signature"), ("sparse", "owner"), ("dense", "given"))


def _label(layout: str, row_order: str) -> str:
    return layout if row_order == "given" else f"{layout}-{row_order[:3]}"


def cora_part(data_root, quick: bool) -> list[dict]:
    """Part 1: the pre-training exchange on Cora for every backend and row layout, one record each."""
    fed = _fed_cora(data_root, quick)
    out = []
    for layout, row_order in CORA_LAYOUTS:
        for backend in ("plain", "ckks", "mask", "ckks-default", "ckks-mp"):
            try:
                rec = _pretrain(fed, backend, layout, row_order=row_order)
            except ImportError as e:  # a backend not built yet
                rec = {"backend": backend, "layout": _label(layout, row_order), "error": f"not importable: {e}"}
            rec["graph"] = {
                "nodes": fed.graph.num_nodes,
                "features": fed.num_features,
                "edges": int(fed.graph.edge_index.size(1)) // 2,
                "name": fed.name,
            }
            out.append(rec)
            print(_row_line(rec), flush=True)
    return out


def _peak_rss_mb() -> float:
    """This process's resident-set high-water mark in MiB.

    ``VmHWM`` (unlike ``ru_maxrss`` it is not inherited from the parent across fork+exec), falling back to
    ``ru_maxrss``.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _scale_point(args) -> dict:
    """One size, in its own process (clean peak RSS)."""
    n, feats, backend, layout, *graph = args  # graph: (dataset, generator settings), default the SBM
    dataset, extra = graph if graph else ("sbm", {"avg_degree": 8.0})
    torch.set_num_threads(1)
    from secure_fgl.data import make_federated

    t0 = time.perf_counter()
    fed = make_federated(dataset, num_clients=K, beta=10000.0, seed=0, num_nodes=n, num_features=feats, **extra)
    gen_s = time.perf_counter() - t0
    rss_before = _peak_rss_mb()
    tracemalloc.start()
    rec = _pretrain(fed, backend, layout, model_round=False)
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    edges = int(fed.graph.edge_index.size(1)) // 2
    rec.update(
        {
            "nodes": n,
            "features": feats,
            "edges": edges,
            "generate_s": gen_s,
            "dataset": dataset,
            "rss_peak_mb": _peak_rss_mb(),
            "rss_peak_before_pretrain_mb": rss_before,
            "py_peak_mb": py_peak / 2**20,
            "s_per_edge_feature": rec["pretrain_s"] / (edges * (feats + 1)),
        }
    )
    return rec


def scale_part(sizes, feats, backend="ckks", layout="sparse", graph: tuple = ()) -> list[dict]:
    """``graph``: ``(dataset, generator settings)`` (default: the SBM with mean degree 8)."""
    out = []
    ctx = mp.get_context("spawn")
    for n in sizes:
        f = feats(n) if callable(feats) else feats
        with ctx.Pool(1) as pool:
            try:
                rec = pool.apply(_scale_point, ((n, f, backend, layout, *graph),))
            except Exception as e:  # noqa: BLE001 - report the failure of one size, keep the others
                rec = {"nodes": n, "features": f, "backend": backend, "error": f"{type(e).__name__}: {e}"}
        out.append(rec)
        print(_scale_line(rec), flush=True)
    return out


# ---------------------------------------------------------------------------- tables
def _mb(b) -> str:
    return "–" if b is None else f"{b / 1e6:.2f}"


def _row_line(r: dict) -> str:
    if "error" in r:
        return f"{r['backend']:<13}{r['layout']:<11}{r['error']}"
    return (
        f"{r['backend']:<13}{r['layout']:<11}{_mb(r['bytes_up']):>10}{_mb(r['plain_f32_up']):>10}"
        f"{r['ratio_up']:>8.2f}x{_mb(r['bytes_down']):>10}{_mb(r['plain_f32_down']):>10}"
        f"{r['pretrain_s']:>9.2f}"
    )


def _scale_line(r: dict) -> str:
    if "error" in r:
        return f"{r['nodes']:>9} {r.get('features', '')}: {r['error']}"
    return (
        f"{r['nodes']:>9}{r['edges']:>10}{r['features']:>6}{r['pretrain_s']:>10.2f}"
        f"{_mb(r['bytes_up']):>11}{r['rss_peak_mb']:>10.0f}{r['py_peak_mb']:>10.0f}"
        f"{r['s_per_edge_feature'] * 1e9:>12.1f}"
    )


def to_markdown(res: dict) -> str:
    """The benchmark's records as markdown tables."""
    L = ["# FedGCN pre-training benchmark", ""]
    cora = res["cora"]
    if cora:
        g = next((r["graph"] for r in cora if "graph" in r), {})
        L += [
            f"## {g.get('name', 'graph')} ({g.get('nodes')} nodes, {g.get('edges')} edges, {g.get('features')} "
            f"features), 1-hop, {K} clients",
            "",
            "Bytes are totals over the 10 clients (MB); `f32` = the float32 rows the exchange carries "
            "(sparse: the rows a client touches; dense: every row); time = the whole pre-training (`setup()`). "
            "`sparse-sig`: sparse layout with `row_order='signature'` (rows numbered by the set of "
            "clients touching them; reveals a histogram of those sets); `sparse-own`: `row_order='owner'` "
            "(blocks never mix recipients: a client decrypts only its own rows).",
            "",
            "| backend | layout | up MB | f32 up MB | up/f32 | down MB | f32 down MB | per-client up MB "
            "(min–max) | per-client down MB (min–max) | pretrain s | model round up MB (f32) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in cora:
            if "error" in r:
                L.append(f"| {r['backend']} | {r['layout']} | {r['error']} |" + " |" * 8)
                continue
            L.append(
                f"| {r['backend']} | {r['layout']} | {_mb(r['bytes_up'])} | {_mb(r['plain_f32_up'])} | "
                f"{r['ratio_up']:.2f}x | {_mb(r['bytes_down'])} | {_mb(r['plain_f32_down'])} | "
                f"{_mb(min(r['per_client_up']))}–{_mb(max(r['per_client_up']))} | "
                f"{_mb(min(r['per_client_down']))}–{_mb(max(r['per_client_down']))} | "
                f"{r['pretrain_s']:.2f} | {_mb(r.get('model_bytes_up_round'))} "
                f"({_mb(r.get('model_f32_up_round'))}) |"
            )
        L.append("")
        for k, v in res.get("summary", {}).items():
            L.append(f"* {k}: {v}")
        L.append("")
    if res.get("scale"):
        L += [
            "## Scale: synthetic SBM, binary features, 10 clients, ckks (packed), sparse layout",
            "",
            "| nodes | edges | features | pretrain s | up MB | peak RSS MB (before pretrain) | "
            "py peak MB (pretrain) | ns per (edge x feature) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in res["scale"]:
            if "error" in r:
                L.append(f"| {r['nodes']} | – | {r.get('features')} | {r['error']} | | | | |")
            else:
                L.append(
                    f"| {r['nodes']} | {r['edges']} | {r['features']} | {r['pretrain_s']:.2f} | "
                    f"{_mb(r['bytes_up'])} | {r['rss_peak_mb']:.0f} ({r['rss_peak_before_pretrain_mb']:.0f}) | "
                    f"{r['py_peak_mb']:.0f} | "
                    f"{r['s_per_edge_feature'] * 1e9:.1f} |"
                )
        L.append("")
    return "\n".join(L)


def _summary(cora: list[dict]) -> dict:
    def get(b, lay):
        return next((r for r in cora if r["backend"] == b and r["layout"] == lay and "error" not in r), None)

    out = {}
    for lay in ("dense", "sparse", "sparse-sig", "sparse-own"):
        ck, ref, pl = get("ckks", lay), get("ckks-default", lay), get("plain", lay)
        if ck:
            extra = ""
            if lay == "sparse-sig" and get("ckks", "sparse"):
                extra = f"; given numbering {get('ckks', 'sparse')['ratio_up']:.2f}x"
            out[f"ckks packed upload vs float32 rows ({lay})"] = f"{ck['ratio_up']:.2f}x (target <= 2.0x){extra}"
        if ck and pl:
            out[f"ckks packed upload vs the plain backend's upload ({lay})"] = f"{ck['bytes_up'] / pl['bytes_up']:.2f}x"
        if ck and ref:
            out[f"ckks packed pre-training speed-up vs ckks-default ({lay})"] = (
                f"{ref['pretrain_s'] / ck['pretrain_s']:.1f}x faster (target >= 5x); bytes "
                f"{ref['bytes_up'] / ck['bytes_up']:.1f}x smaller"
            )
    return out


def run_fedgcn_bench(out_dir, quick: bool = False, data_root=None, sizes=None, parts=("cora", "scale")) -> dict:
    """Both parts; returns the results and writes ``fedgcn_bench.json`` / ``.md`` to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    res = {"cora": [], "summary": {}, "scale": []}
    if "cora" in parts:
        print(
            f"{'backend':<13}{'layout':<11}{'up MB':>10}{'f32 up':>10}{'up/f32':>9}{'down MB':>10}"
            f"{'f32 down':>10}{'pre s':>9}"
        )
        res["cora"] = cora_part(data_root, quick)
        res["summary"] = _summary(res["cora"])
        for k, v in res["summary"].items():
            print(f"{k}: {v}")
    if "scale" in parts:
        if sizes is None:
            sizes = [1000, 10000] if quick else [10_000, 100_000, 1_000_000]
        print(
            f"{'nodes':>9}{'edges':>10}{'feat':>6}{'pre s':>10}{'up MB':>11}{'RSS MB':>10}{'py MB':>10}{'ns/(E*F)':>12}"
        )
        # 64 binary features up to 1e5 nodes, 16 at 1e6 (the rows alone would be ~3 GB of float64 at 64)
        res["scale"] = scale_part(sizes, lambda n: 64 if n <= 100_000 else 16)
    (out / "fedgcn_bench.json").write_text(json.dumps(res, indent=1, default=str))
    md = to_markdown(res)
    (out / "fedgcn_bench.md").write_text(md)
    print(f"written: {out / 'fedgcn_bench.md'}")
    return res


def main(argv=None) -> None:
    """Command line of the FedGCN benchmark (``python -m secure_fgl.bench.fedgcn``)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench", help="folder the results are written to")
    ap.add_argument("--quick", action="store_true", help="small workloads (smoke test)")
    ap.add_argument("--data-root", default=None, help="dataset folder (default: $SECURE_FGL_DATA)")
    ap.add_argument("--sizes", nargs="*", type=int, default=None, help="scale sizes (default 1e4 1e5 1e6)")
    ap.add_argument("--parts", nargs="+", default=["cora", "scale"], choices=["cora", "scale"])
    a = ap.parse_args(argv)
    run_fedgcn_bench(a.out, quick=a.quick, data_root=a.data_root, sizes=a.sizes, parts=a.parts)


if __name__ == "__main__":
    main()
