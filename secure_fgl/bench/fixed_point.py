"""Packed fixed-point benchmark: bytes of the ckks exchanges with and without ``fixed_point_bits``.

Two parts (10 clients; ratios against the one float32 baseline of :mod:`protocols.baseline`):

1. ``models`` -- the model-averaging exchange (``weighted_mean`` of ``[w v, w]``, weights
   ``n_k / n_train``, :func:`secure_fgl.algorithms.base.model_precision` with ``--update-bound``)
   at the parameter counts of FedGCN's 2-layer GCN (16 hidden units) on Cora, CiteSeer and
   PubMed, for ``plain``, ``ckks`` (float slots), ``ckks-fixed`` (``fixed_point_bits=20``) and
   ``mask``: upload bytes per client over float32, the largest error of the decoded mean, and
   the bound the plan states for it (:meth:`protocols.precision.MeanPrecision.error_bound`
   with the decoded total and mean).  Updates are drawn N(0, 0.05) clipped to the bound.
2. ``features`` -- FedGCN's pre-training exchange (1-hop, Dirichlet beta 1, seed 0, sparse
   layout with the given and the signature row numbering) on real datasets: upload over the
   float32 rows the exchange carries, seconds of ``setup()``, the plan.  Real-valued features
   (PubMed TF-IDF, public clip ``--feature-bound``): ``ckks`` (float slots) against
   ``ckks-fixed``.  Binary ones (Amazon, Coauthor) are exact packed integers under row
   normalisation (``ckks-real``: unsigned fields in real slots, the older encoding;
   ``ckks``, by default, and ``ckks-fixed``: exact signed fields in both halves of each slot) and real-valued under ``norm='sym'`` (``ckks-fixed`` only:
   float slots would cost >= 8x by construction).
   Degree cap: the graph's largest degree (at least 254), a public bound.

Run: ``python -m secure_fgl.bench.fixed_point --out runs/bench_fixed [--parts models features]
[--datasets pubmed amazon-photo coauthor-cs]``; writes ``OUT/fixed_point.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import numpy as np
import torch

K = 10
BACKENDS = {
    "plain": ("plain", {}),
    "ckks": ("ckks", {}),
    "ckks-fixed": ("ckks", {"fixed_point_bits": 20}),
    "mask": ("mask", {}),
    "ckks-real": ("ckks", {"exact_fields": False}),
}
#: parameters of FedGCN's GCN (16 hidden units): d*16 + 16 + 16*C + C
MODEL_SIZES = {
    "cora": 1433 * 16 + 16 + 16 * 7 + 7,
    "citeseer": 3703 * 16 + 16 + 16 * 6 + 6,
    "pubmed": 500 * 16 + 16 + 16 * 3 + 3,
}


def models_part(update_bound: float) -> list[dict]:
    """Part 1: the model-averaging exchange per model size and backend: bytes, largest error and its stated bound."""
    from protocols import make_protocol
    from secure_fgl.algorithms.base import model_precision

    rng = np.random.default_rng(0)
    out = []
    for name, n in MODEL_SIZES.items():
        counts = rng.integers(5, 40, K).astype(float)
        weights = {k: c / counts.sum() for k, c in enumerate(counts)}
        updates = {k: np.clip(rng.normal(0, 0.05, n), -update_bound, update_bound) for k in range(K)}
        exact = sum(weights[k] * updates[k] for k in range(K)) / sum(weights.values())
        plan = model_precision(K, K, update_bound)
        for backend, (mode, opts) in BACKENDS.items():
            proto = make_protocol(mode, K, **opts)
            t = time.perf_counter()
            got = proto.weighted_mean("bench/model", 0, updates, weights, spec=plan.spec())
            wall = time.perf_counter() - t
            comm = proto.transcript.comm()["per_tag"]["bench/model"]
            stats = getattr(proto, "last_stats", None) or {}
            rec = {
                "workload": f"model_{name}",
                "values": n + 1,
                "backend": backend,
                "upload_ratio": comm["bytes_up"] / comm["plaintext_bytes_up"],
                "max_abs_error": float(np.abs(got - exact).max()),
                "seconds": wall,
                "params": stats.get("params"),
            }
            if stats.get("encoding") == "fixed":
                rec["stated_bound"] = plan.error_bound(
                    stats["error_bound"], weight_total=1.0, mean_abs=float(np.abs(got).max())
                )
            out.append(rec)
            print(
                f"{rec['workload']:<15}{backend:<11}{rec['upload_ratio']:>7.2f}x  err {rec['max_abs_error']:.2e}"
                f"  bound {rec.get('stated_bound', float('nan')):.2e}  {wall:6.2f} s  {rec['params'] or ''}",
                flush=True,
            )
            del proto
    return out


def _pretrain(fed, backend: str, row_order: str, feature_bound: float, norm: str, degree_cap: int) -> dict:
    from secure_fgl.config import RunConfig
    from secure_fgl.runtime.build import start_run

    mode, kw = BACKENDS[backend]
    options = dict(
        hops=1, layout="sparse", row_order=row_order, feature_bound=feature_bound, norm=norm, degree_cap=degree_cap
    )
    run = start_run(
        RunConfig(algorithm="fedgcn", mode=mode, clients=K, rounds=1, options=options), fed, protocol_options=kw
    )
    t = time.perf_counter()
    run.strategy.setup()
    seconds = time.perf_counter() - t
    m = run.strategy.final_metrics()
    plan = getattr(run.protocol, "_last_plan", None)  # ckks: the encoding plan of the exchange
    rec = {
        "backend": backend,
        "row_order": row_order,
        "norm": norm,
        "pretrain_s": seconds,
        "bytes_up": m["pretrain_bytes_up"],
        "f32_up": m["pretrain_plaintext_equiv_bytes_up"],
        "upload_ratio": m["pretrain_upload_ratio"],
        "params": plan.describe() if plan is not None else None,
    }
    run.executor.shutdown()
    del run
    gc.collect()
    return rec


def features_part(
    datasets,
    data_root,
    feature_bound: float,
    row_orders=("given", "signature"),
    norms=("row", "sym"),
    backends=tuple(BACKENDS),
) -> list[dict]:
    """Part 2: FedGCN's pre-training exchange per dataset, row order and norm; float slots against fixed point."""
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import load_federation

    out = []
    for name in datasets:
        fed = load_federation(RunConfig(dataset=name, clients=K, beta=1.0, seed=0, data_root=data_root))
        # public degree cap: the graph's largest degree, at least FedGCN's default 254
        # (examples/fedgcn_amazon_coauthor.py)
        cap = max(254, int(torch.bincount(fed.graph.edge_index[0], minlength=fed.graph.num_nodes).max()))
        # real-valued features: float slots against fixed point; integer ones (binary, counts):
        # exact packed integers under row normalisation (real slots, ckks-real, against ckks's
        # default signed fields in complex slots), fixed point under sym
        runs = (
            [("row", ("ckks", "ckks-fixed"))]
            if not fed.count_features
            else [("row", ("ckks-real", "ckks", "ckks-fixed")), ("sym", ("ckks-fixed",))]
        )
        for norm, pair in [(n, b) for n, b in runs if n in norms]:
            for row_order in row_orders:
                for backend in [b for b in pair if b in backends]:
                    rec = _pretrain(fed, backend, row_order, feature_bound, norm, cap)
                    rec.update(
                        {
                            "dataset": name,
                            "binary_features": bool(fed.binary_features),
                            "count_features": bool(fed.count_features),
                            "feature_bound": feature_bound,
                            "degree_cap": cap,
                        }
                    )
                    out.append(rec)
                    print(
                        f"{name:<15}{norm:<5}{row_order:<10}{backend:<11}{rec['upload_ratio']:>7.2f}x "
                        f"{rec['bytes_up'] / 1e6:>9.1f} MB {rec['pretrain_s']:>7.1f} s  {rec['params']}",
                        flush=True,
                    )
        del fed
        gc.collect()
    return out


def main(argv=None) -> None:
    """Command line of the fixed-point benchmark; writes ``OUT/fixed_point.json``."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_fixed", help="folder the results are written to")
    ap.add_argument("--parts", nargs="+", default=["models", "features"], choices=["models", "features"])
    ap.add_argument("--datasets", nargs="+", default=["pubmed", "amazon-photo", "coauthor-cs"])
    ap.add_argument("--row-orders", nargs="+", default=["given", "signature"], choices=["given", "signature"])
    ap.add_argument("--norms", nargs="+", default=["row", "sym"], choices=["row", "sym"])
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    ap.add_argument("--update-bound", type=float, default=1.0)
    ap.add_argument("--feature-bound", type=float, default=1.3, help="public clip of real-valued features")
    ap.add_argument("--data-root", default=None, help="dataset folder (default: $SECURE_FGL_DATA)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    res = {"update_bound": a.update_bound, "feature_bound": a.feature_bound}
    if "models" in a.parts:
        res["models"] = models_part(a.update_bound)
    if "features" in a.parts:
        res["features"] = features_part(a.datasets, a.data_root, a.feature_bound, a.row_orders, a.norms, a.backends)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fixed_point.json").write_text(json.dumps(res, indent=1))
    print(f"written: {out / 'fixed_point.json'}")


if __name__ == "__main__":
    main()
