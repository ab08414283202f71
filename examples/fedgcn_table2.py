"""Reproduce Table 2 of FedGCN (Yao et al., NeurIPS 2023).

Test accuracy of Centralized GCN and FedGCN 0/1/2-hop on Cora and CiteSeer, 10 clients, Dirichlet label skew beta in
{1, 100, 10000}, mean +- std over seeds -- in plaintext and in the secure modes, secure compared with plain on the
same seeds.

Every run is one :func:`secure_fgl.experiment.run_experiment`; each finished run is appended
to ``OUT/runs.jsonl`` (rerunning skips what is there, so an interrupted sweep resumes), and
``OUT/table2.md`` is written from that file only -- no number is typed by hand.

Settings (paper sec. 6 and its released code, ``src/fedgcn_run.py``): 2-layer GCN, hidden 16,
dropout 0.5, weight decay 5e-4; FedAvg with ``--local-epochs`` local SGD steps per round (code: 3)
at ``--lr`` 0.5 (code: plain SGD, lr 0.5) for ``--rounds`` rounds (code: 100).  Centralized GCN
is Kipf & Welling's setting (Adam, lr 0.01, ``--central-epochs`` 200 full-batch epochs), which is
where the paper's 0.8069 comes from.  ``--optimizer adam --lr 0.01`` gives the Kipf optimiser to
the federated runs too (on Cora, 0-hop then lands 5-7 points lower).  The reported accuracy is at the round of best validation accuracy (engine rule).

    python examples/fedgcn_table2.py                       # full: 2 datasets x 3 betas x 10 seeds
    python examples/fedgcn_table2.py --seeds 0 1 2      # 3 seeds (docs/fedgcn.md)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, run_experiment

DATASET_NAMES = {"cora": "Cora", "citeseer": "CiteSeer"}
#: Table 2 of the paper (for the side-by-side column only; never used in computations)
PAPER = {
    ("cora", "Centralized GCN"): {b: "0.8069±0.0065" for b in (1, 100, 10000)},
    ("cora", "FedGCN(0-hop)"): {1: "0.6502±0.0127", 100: "0.5958±0.0176", 10000: "0.5992±0.0226"},
    ("cora", "FedGCN(1-hop)"): {1: "0.81±0.0066", 100: "0.8009±0.007", 10000: "0.8009±0.0077"},
    ("cora", "FedGCN(2-hop)"): {1: "0.8064±0.0043", 100: "0.8084±0.0051", 10000: "0.8087±0.0061"},
    ("citeseer", "Centralized GCN"): {b: "0.6914±0.0051" for b in (1, 100, 10000)},
    ("citeseer", "FedGCN(0-hop)"): {1: "0.617±0.0118", 100: "0.5841±0.0168", 10000: "0.5841±0.0138"},
    ("citeseer", "FedGCN(1-hop)"): {1: "0.7006±0.0071", 100: "0.6891±0.0067", 10000: "0.693±0.0069"},
    ("citeseer", "FedGCN(2-hop)"): {1: "0.6933±0.0067", 100: "0.6953±0.0069", 10000: "0.6948±0.0032"},
}


def method_name(algorithm: str, hops: int | None) -> str:
    return "Centralized GCN" if algorithm == "centralized" else f"FedGCN({hops}-hop)"


def run_key(d: dict) -> str:
    """Identity of a run: the sweep coordinates and the training settings."""
    return json.dumps(
        [
            d["dataset"],
            d["beta"],
            d["seed"],
            d["algorithm"],
            d["hops"],
            d["mode"],
            d["rounds"],
            d["local_epochs"],
            d["layout"],
            d["clients"],
            d["optimizer"],
            d["lr"],
        ]
    )


def load_runs(path: Path) -> dict[str, dict]:
    runs = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                runs[run_key(r)] = r
    return runs


def plan(args) -> list[dict]:
    """Every run of the sweep (Centralized does not depend on beta: one per seed, beta 10000)."""
    jobs = []
    fed_cfg = dict(
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        layout=args.layout,
        clients=args.clients,
        optimizer=args.optimizer,
        lr=args.lr,
    )
    central_cfg = dict(
        rounds=args.central_epochs, local_epochs=1, layout=None, clients=args.clients, optimizer="adam", lr=0.01
    )
    for ds in args.datasets:
        for seed in args.seeds:
            if "centralized" in args.methods and not args.secure_only:
                jobs.append(
                    dict(
                        dataset=ds,
                        beta=10000.0,
                        seed=seed,
                        algorithm="centralized",
                        hops=None,
                        mode="plain",
                        **central_cfg,
                    )
                )
            for beta in args.betas:
                for hops in [] if args.secure_only else args.hops:
                    jobs.append(
                        dict(
                            dataset=ds,
                            beta=float(beta),
                            seed=seed,
                            algorithm="fedgcn",
                            hops=hops,
                            mode="plain",
                            **fed_cfg,
                        )
                    )
                if beta in args.secure_betas:
                    for mode in args.secure_modes:
                        for hops in args.secure_hops:
                            jobs.append(
                                dict(
                                    dataset=ds,
                                    beta=float(beta),
                                    seed=seed,
                                    algorithm="fedgcn",
                                    hops=hops,
                                    mode=mode,
                                    **fed_cfg,
                                )
                            )
    return jobs


def run_one(job: dict, args, fed) -> dict:
    central = job["algorithm"] == "centralized"
    cfg = RunConfig(
        algorithm=job["algorithm"],
        dataset=job["dataset"],
        clients=job["clients"],
        mode=job["mode"],
        beta=job["beta"],
        seed=job["seed"],
        data_root=args.data_root,
        rounds=job["rounds"],
        local_epochs=job["local_epochs"],
        optimizer=job["optimizer"],
        lr=job["lr"],
        options={} if central else {"hops": job["hops"], "layout": job["layout"]},
    )
    t0 = time.perf_counter()
    res = run_experiment(cfg, progress=False, fed=fed)
    fin = res["final"]
    return {
        **job,
        "test_acc": fin["test_acc"],
        "val_acc": fin["val_acc"],
        "best_round": fin["best_round"],
        "pretrain_bytes_up": fin.get("pretrain_bytes_up"),
        "pretrain_plaintext_equiv_bytes_up": fin.get("pretrain_plaintext_equiv_bytes_up"),
        "model_bytes_up_per_round": fin.get("model_bytes_up_per_round"),
        "bytes_up": res["comm"]["bytes_up"],
        "seconds": time.perf_counter() - t0,
    }


def mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f}±{sd:.4f} (n={len(values)})"


def write_table(runs: list[dict], args, path: Path) -> str:
    """Markdown built from the runs file only."""
    lines = [
        "# FedGCN Table 2 reproduction",
        "",
        f"{args.clients} clients, Dirichlet beta per column, FedAvg {args.rounds} rounds x "
        f"{args.local_epochs} local {args.optimizer} steps (lr {args.lr:g}), Centralized "
        f"{args.central_epochs} Adam epochs (lr 0.01), layout "
        f"{args.layout}; test accuracy at the best-validation round, mean±std over seeds. "
        "Generated by `examples/fedgcn_table2.py` from `runs.jsonl`.",
        "",
    ]
    datasets = [d for d in args.datasets if any(r["dataset"] == d for r in runs)]
    betas = sorted({float(b) for b in args.betas})
    for ds in datasets:
        rows = [r for r in runs if r["dataset"] == ds]
        lines += [
            f"## {DATASET_NAMES.get(ds, ds)}",
            "",
            "| method | mode | "
            + " | ".join(f"β={b:g}" for b in betas)
            + " | paper (β="
            + "/".join(f"{b:g}" for b in betas)
            + ") |",
            "|---|---|" + "---|" * len(betas) + "---|",
        ]
        methods = sorted(
            {(r["algorithm"], r["hops"]) for r in rows},
            key=lambda m: (m[0] != "centralized", m[1] if m[1] is not None else -1),
        )
        for algo, hops in methods:
            name = method_name(algo, hops)
            for mode in sorted(
                {r["mode"] for r in rows if (r["algorithm"], r["hops"]) == (algo, hops)},
                key=lambda m: (m != "plain", m),
            ):
                cells = []
                for b in betas:
                    sel = [
                        r
                        for r in rows
                        if (r["algorithm"], r["hops"], r["mode"]) == (algo, hops, mode)
                        and (algo == "centralized" or float(r["beta"]) == b)
                    ]
                    cells.append(mean_std([r["test_acc"] for r in sel]))
                paper = PAPER.get((ds, name), {})
                ref = " / ".join(paper.get(int(b), "–") for b in betas) if mode == "plain" else ""
                lines.append(f"| {name} | {mode} | " + " | ".join(cells) + f" | {ref} |")
        lines.append("")
        # secure vs plain on the same seeds
        sec = [r for r in rows if r["mode"] != "plain"]
        if sec:
            lines += [
                "Secure vs plain on the same (β, seed): accuracy difference and pre-training upload "
                "(MB, all clients; plaintext-equivalent = float32 rows).",
                "",
                "| method | mode | β | seeds | Δacc mean (max abs) | pretrain up MB | "
                "plain-equiv MB | ratio | model up KB/round | time s (plain→secure) |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            plain = {(r["beta"], r["seed"], r["hops"]): r for r in rows if r["mode"] == "plain"}
            for mode, beta, hops in sorted({(r["mode"], r["beta"], r["hops"]) for r in sec}):
                pairs = [
                    (plain[(r["beta"], r["seed"], r["hops"])], r)
                    for r in sec
                    if (r["mode"], r["beta"], r["hops"]) == (mode, beta, hops)
                    and (r["beta"], r["seed"], r["hops"]) in plain
                ]
                if not pairs:
                    continue
                diffs = [s["test_acc"] - p["test_acc"] for p, s in pairs]
                up = statistics.mean(s["pretrain_bytes_up"] for _, s in pairs) / 1e6
                eq = statistics.mean(s["pretrain_plaintext_equiv_bytes_up"] for _, s in pairs) / 1e6
                mb = statistics.mean(s["model_bytes_up_per_round"] for _, s in pairs) / 1e3
                tp = statistics.mean(p["seconds"] for p, _ in pairs)
                ts = statistics.mean(s["seconds"] for _, s in pairs)
                lines.append(
                    f"| FedGCN({hops}-hop) | {mode} | {beta:g} | {len(pairs)} | "
                    f"{statistics.mean(diffs):+.4f} ({max(abs(d) for d in diffs):.4f}) | {up:.2f} | "
                    f"{eq:.2f} | {up / eq:.2f}x | {mb:.1f} | {tp:.1f}→{ts:.1f} |"
                )
            lines.append("")
    text = "\n".join(lines)
    path.write_text(text)
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=["cora", "citeseer"])
    ap.add_argument("--betas", nargs="+", type=float, default=[1.0, 100.0, 10000.0])
    ap.add_argument("--seeds", nargs="+", type=int, default=list(range(10)))
    ap.add_argument("--methods", nargs="+", default=["centralized", "fedgcn"], choices=["centralized", "fedgcn"])
    ap.add_argument("--hops", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--secure-modes", nargs="*", default=["ckks", "mask"])
    ap.add_argument("--secure-hops", nargs="+", type=int, default=[1])
    ap.add_argument("--secure-betas", nargs="*", type=float, default=[1.0, 100.0, 10000.0])
    ap.add_argument(
        "--secure-only",
        action="store_true",
        help="plan only the secure-mode runs (e.g. a second process beside a plain sweep)",
    )
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--local-epochs", type=int, default=3)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"], help="federated runs' optimiser")
    ap.add_argument("--lr", type=float, default=0.5, help="federated runs' learning rate")
    ap.add_argument("--central-epochs", type=int, default=200)
    ap.add_argument("--layout", default="sparse", choices=["sparse", "dense"])
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    ap.add_argument("--out", default="runs/fedgcn_table2")
    args = ap.parse_args(argv)
    if "fedgcn" not in args.methods:
        args.hops, args.secure_modes = [], []
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    done = load_runs(runs_path)
    jobs = plan(args)
    todo = [j for j in jobs if run_key(j) not in done]
    print(f"{len(jobs)} runs planned, {len(jobs) - len(todo)} already in {runs_path}, {len(todo)} to run")
    feds: dict = {}
    for i, job in enumerate(todo):
        key = (job["dataset"], job["beta"], job["seed"])
        if key not in feds:
            feds.clear()  # one federation in memory at a time
            feds[key] = load_federation(
                RunConfig(
                    dataset=job["dataset"],
                    clients=args.clients,
                    beta=job["beta"],
                    seed=job["seed"],
                    data_root=args.data_root,
                )
            )
        rec = run_one(job, args, feds[key])
        with runs_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(
            f"[{i + 1}/{len(todo)}] {job['dataset']} beta={job['beta']:g} seed={job['seed']} "
            f"{method_name(job['algorithm'], job['hops'])} {job['mode']}: acc {rec['test_acc']:.4f} "
            f"({rec['seconds']:.1f}s)",
            flush=True,
        )
    keys = {run_key(j) for j in jobs}
    runs = [r for k, r in load_runs(runs_path).items() if k in keys]
    print(write_table(runs, args, out / "table2.md"))
    print(f"\nwritten: {out / 'table2.md'}")


if __name__ == "__main__":
    main()
