"""Reproduce FGSSL's Tables 1 and 2 and compare its secure modes with plain.

Reproduce FGSSL's Table 1 (M = ``--clients`` Louvain clients) and Table 2 (ablation), choose lambda_C /
lambda_D on Cora's validation split, and compare FGSSL's secure modes with plain.

Huang et al., "Federated Graph Semantic and Structural Learning", IJCAI 2023, sec. 4.1: 2-layer
GAT with hidden 128 (one attention head per layer, as the released ``MYGAT``; dropout 0.5 as its
configs), SGD with momentum 0.9 and weight decay 5e-4, 200 rounds, 4 local epochs, Louvain
partition into M clients, 60/20/20 train/val/test split per client; accuracy on all clients' test
nodes (node-weighted) of the global model at the best-validation round.  The paper gives no
learning rate: ``--lr`` (default 0.05) is the same for every method.  FedAvg, FedProx and Local
run on the same partitions and splits with the same model and optimiser.

Lambda grid (writes ``<out>/grid.md``; FGSSL, Cora, the seeds given, choice = best mean
validation accuracy)::

    python examples/fgssl_table1.py --grid --data-root ../shared/datasets --out runs/fgssl

Tables (writes ``<out>/table1.md``)::

    python examples/fgssl_table1.py --data-root ../shared/datasets --out runs/fgssl

FGSSL and its ablations use the lambdas the grid under ``<out>/grid`` chose (``FGSSLOptions``
defaults when there is none); the released-code variant uses its own weight 3.

``--datasets``, ``--seeds``, ``--rounds``, ``--methods``, ``--secure-modes`` reduce the sweep;
every run's equivalent ``secure_fgl.cli.main run`` command is printed and collected in
``<out>/commands.txt``.  Every run writes ``<out>/table/<dataset>/<method>-<mode>/seed<s>/result.json``
and is skipped when that file exists (an interrupted sweep resumes); the tables are rewritten
from all results found after every run (``--table-only`` just rewrites them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import sys
from pathlib import Path

from sweep import Job, run_sweep

from secure_fgl.config import RunConfig
from secure_fgl.report.tables import fmt_stats

#: paper Table 1 / 2 (accuracy %) for M = 5, 7, 10 clients
PAPER = {
    ("cora", "FGSSL"): (88.34, 88.56, 88.01),
    ("cora", "FedAvg (GAT)"): (86.63, 86.21, 86.01),
    ("cora", "FedProx (GAT)"): (86.60, 86.27, 86.22),
    ("cora", "Local (GAT)"): (61.54, 45.32, 32.42),
    ("cora", "FGSSL w/o FNSC"): (86.86, 86.32, 86.51),
    ("cora", "FGSSL w/o FGSD"): (88.01, 88.23, 87.84),
    ("citeseer", "FGSSL"): (80.43, 80.21, 80.01),
    ("citeseer", "FedAvg (GAT)"): (76.37, 76.57, 75.92),
    ("citeseer", "FedProx (GAT)"): (77.15, 77.28, 76.87),
    ("citeseer", "Local (GAT)"): (73.85, 62.87, 48.91),
    ("citeseer", "FGSSL w/o FNSC"): (77.91, 77.53, 76.42),
    ("citeseer", "FGSSL w/o FGSD"): (79.89, 79.43, 79.12),
    ("pubmed", "FGSSL"): (88.25, 87.75, 87.60),
    ("pubmed", "FedAvg (GAT)"): (85.29, 84.27, 84.57),
    ("pubmed", "FedProx (GAT)"): (85.21, 84.01, 84.98),
    ("pubmed", "Local (GAT)"): (83.81, 72.34, 59.19),
}
PAPER_CLIENTS = (5, 7, 10)
#: method -> (algorithm, FGSSL options)
METHODS = {
    "FGSSL": ("fgssl", {}),
    "FGSSL (released code)": ("fgssl", {"variant": "released-code", "lambda_c": 3.0, "lambda_d": 0.0}),
    "FedAvg (GAT)": ("fedavg", None),
    "FedProx (GAT)": ("fedprox", None),
    "Local (GAT)": ("local", None),
    "FGSSL w/o FNSC": ("fgssl", {"lambda_c": 0.0}),
    "FGSSL w/o FGSD": ("fgssl", {"lambda_d": 0.0}),
}
ABLATION_DATASETS = ("cora", "citeseer")
SLUGS = {m: m.lower().replace(" (", "_").replace(")", "").replace(" ", "_").replace("/", "") for m in METHODS}
GRID_C, GRID_D = (0.5, 1.0, 3.0), (0.5, 1.0, 2.0)


def base_config(args, dataset: str, seed: int, mode: str = "plain") -> dict:
    return dict(
        dataset=dataset,
        clients=args.clients,
        mode=mode,
        partition="louvain",
        split="fgssl",
        model="gat",
        hidden=128,
        heads=1,
        dropout=0.5,
        optimizer="sgd",
        momentum=0.9,
        lr=args.lr,
        weight_decay=5e-4,
        local_epochs=4,
        rounds=args.rounds,
        seed=seed,
        data_root=args.data_root,
    )


def method_config(method: str, args, dataset: str, seed: int, mode: str = "plain", **options) -> RunConfig:
    """``options`` (e.g. the grid's lambdas) under the method's own (an ablation's zero wins)."""
    algorithm, opts = METHODS[method]
    return RunConfig(
        algorithm=algorithm,
        **base_config(args, dataset, seed, mode),
        options={**options, **(opts or {})} if algorithm == "fgssl" else {},
    )


def method_job(d: Path, method: str, cfg: RunConfig) -> Job:
    """The run of ``method`` in ``d``; ``meta.json`` records the method and its options."""
    return Job(d, cfg, {"method": method, "options": cfg.options})


def run_all(jobs: list[Job], out: Path, write) -> None:
    """Run the jobs, log each run's CLI line and rewrite the table after every run.

    Run the jobs (skipping finished ones, one federation per dataset and seed), log each run's
    CLI line to ``<out>/commands.txt`` and rewrite the table after every run.
    """

    def done(job: Job, r: dict, seconds: float) -> None:
        cfg = job.cfg
        print(
            f"  {cfg.dataset} {job.meta['method']} {cfg.mode} seed {cfg.seed}: test "
            f"{100 * r['final']['test_acc']:.2f} (val {100 * r['final']['val_acc']:.2f}, {seconds:.0f} s)",
            flush=True,
        )
        write()

    run_sweep(jobs, done, log=out / "commands.txt")


def collect(root: Path) -> list[dict]:
    rows = []
    for path in sorted(root.glob("**/seed*/result.json")):
        r = json.loads(path.read_text())
        meta = json.loads((path.parent / "meta.json").read_text())
        rows.append(
            {
                "dataset": r["config"]["dataset"],
                "clients": r["config"]["clients"],
                "method": meta["method"],
                "options": meta["options"],
                "mode": r["config"]["mode"],
                "seed": r["config"]["seed"],
                "rounds": r["config"]["rounds"],
                "test": 100 * r["final"]["test_acc"],
                "val": 100 * r["final"]["val_acc"],
                "last_test": 100 * r["final"]["last_test_acc"],
                "best_round": r["final"]["best_round"],
                "seconds": r["time"]["total"],
                "mb_up": r["comm"]["bytes_up"] / 2**20,
                "curve": {k: [100 * x[k] for x in r["rounds"]] for k in ("train_acc", "val_acc", "test_acc")},
            }
        )
    return rows


def paper_accuracy(dataset: str, method: str, clients: int) -> float | str:
    """The paper's accuracy for this dataset, method and number of clients ("–" if not reported)."""
    if (dataset, method) not in PAPER or clients not in PAPER_CLIENTS:
        return "–"
    return PAPER[dataset, method][PAPER_CLIENTS.index(clients)]


def _ms(values: list[float]) -> str:
    return fmt_stats(values, digits=2)


# --------------------------------------------------------------------------- lambda grid
def grid_choice(rows: list[dict]) -> tuple[float, float] | None:
    """(lambda_c, lambda_d) with the best mean validation accuracy."""
    by = {}
    for r in rows:
        by.setdefault((r["options"]["lambda_c"], r["options"]["lambda_d"]), []).append(r["val"])
    return max(by, key=lambda k: statistics.mean(by[k])) if by else None


def write_grid(out: Path) -> str:
    rows = collect(out / "grid")
    lines = [
        "# FGSSL lambda grid (Cora, validation split)",
        "",
        "Validation / test accuracy (%) at the best-validation round, mean ± std over seeds (n).",
        "",
        "| lambda_C | lambda_D | n | rounds | val | test |",
        "|---|---|---|---|---|---|",
    ]
    for lc, ld in sorted({(r["options"]["lambda_c"], r["options"]["lambda_d"]) for r in rows}):
        rs = [r for r in rows if (r["options"]["lambda_c"], r["options"]["lambda_d"]) == (lc, ld)]
        if rs:
            lines.append(
                f"| {lc} | {ld} | {len(rs)} | {rs[0]['rounds']} | {_ms([r['val'] for r in rs])} | "
                f"{_ms([r['test'] for r in rs])} |"
            )
    choice = grid_choice(rows)
    if choice:
        lines += ["", f"Choice (best mean validation accuracy): lambda_C = {choice[0]}, lambda_D = {choice[1]}."]
    text = "\n".join(lines) + "\n"
    (out / "grid.md").write_text(text)
    return text


# --------------------------------------------------------------------------- tables
def write_tables(out: Path) -> str:
    rows = collect(out / "table")
    clients = ", ".join(str(m) for m in sorted({r["clients"] for r in rows}))
    lines = [
        f"# FGSSL Table 1 / Table 2 reproduction (M = {clients} Louvain clients)",
        "",
        "Test accuracy (%) of the global model at the best-validation round (`last`: after the final "
        "round), node-weighted over clients, mean ± std over seeds (n). Commands: `commands.txt`.",
        "",
    ]
    for dataset in sorted({r["dataset"] for r in rows}):
        sel = [r for r in rows if r["dataset"] == dataset]
        lines += [
            f"## {dataset}",
            "",
            "| method | mode | n | rounds | test | last test | best round | paper | s / run | MiB up / run |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        order = list(METHODS)
        for method, mode in sorted(
            {(r["method"], r["mode"]) for r in sel}, key=lambda m: (order.index(m[0]), m[1] != "plain", m[1])
        ):
            rs = [r for r in sel if r["method"] == method and r["mode"] == mode]
            paper = paper_accuracy(dataset, method, rs[0]["clients"])
            lines.append(
                f"| {method} | {mode} | {len(rs)} | {rs[0]['rounds']} | {_ms([r['test'] for r in rs])} | "
                f"{_ms([r['last_test'] for r in rs])} | {statistics.mean(r['best_round'] for r in rs):.0f} | {paper} | "
                f"{statistics.mean(r['seconds'] for r in rs):.0f} | "
                f"{statistics.mean(r['mb_up'] for r in rs):.1f} |"
            )
        secure = [r for r in sel if r["method"] == "FGSSL" and r["mode"] != "plain"]
        plain = {r["seed"]: r for r in sel if r["method"] == "FGSSL" and r["mode"] == "plain"}
        pairs = [(r, plain[r["seed"]]) for r in secure if r["seed"] in plain]
        if pairs:
            lines += [
                "",
                "Secure minus plain, FGSSL, same seed (test accuracy points):",
                "",
                "| mode | seed | secure | plain | difference |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {s['mode']} | {s['seed']} | {s['test']:.2f} | {p['test']:.2f} | {s['test'] - p['test']:+.2f} |"
                for s, p in sorted(pairs, key=lambda sp: (sp[0]["mode"], sp[0]["seed"]))
            ]
        lines += paired_differences(sel) + learning_curves(sel)
        lines.append("")
    text = "\n".join(lines)
    (out / "table1.md").write_text(text)
    return text


def paired_differences(rows: list[dict], reference: str = "FedAvg (GAT)") -> list[str]:
    """Each plain method minus ``reference`` on the same seed (test and validation points)."""
    ref = {r["seed"]: r for r in rows if r["method"] == reference and r["mode"] == "plain"}
    lines = []
    for method in [m for m in METHODS if m != reference]:
        pairs = [
            (r, ref[r["seed"]]) for r in rows if r["method"] == method and r["mode"] == "plain" and r["seed"] in ref
        ]
        if pairs:
            seeds = sorted(r["seed"] for r, _ in pairs)
            lines.append(
                f"| {method} | {len(pairs)} | {', '.join(map(str, seeds))} | "
                f"{_ms([r['test'] - f['test'] for r, f in pairs])} | {_ms([r['val'] - f['val'] for r, f in pairs])} |"
            )
    return (
        (
            [
                "",
                f"Minus {reference}, same seed (points; best-validation round of each run):",
                "",
                "| method | n | seeds | test | val |",
                "|---|---|---|---|---|",
            ]
            + lines
        )
        if lines
        else []
    )


def learning_curves(rows: list[dict], windows: int = 4) -> list[str]:
    """Train, validation and test accuracy of the global model over windows of rounds.

    Train / validation / test accuracy of the global model averaged over windows of rounds
    (plain runs, then the mean over seeds).
    """
    methods = [m for m in METHODS if any(r["method"] == m and r["mode"] == "plain" for r in rows)]
    rounds = min(len(r["curve"]["val_acc"]) for r in rows if r["mode"] == "plain")
    size = rounds // windows
    if size == 0:
        return []
    bounds = [(w * size, (w + 1) * size) for w in range(windows)]
    lines = [
        "",
        "Mean accuracy over rounds (train / val / test %, plain runs, mean over seeds):",
        "",
        "| method | n | " + " | ".join(f"rounds {a + 1}-{b}" for a, b in bounds) + " |",
        "|---|---|" + "---|" * windows,
    ]
    for method in methods:
        rs = [r for r in rows if r["method"] == method and r["mode"] == "plain"]
        cells = [
            " / ".join(
                f"{statistics.mean(statistics.mean(r['curve'][k][a:b]) for r in rs):.1f}"
                for k in ("train_acc", "val_acc", "test_acc")
            )
            for a, b in bounds
        ]
        lines.append(f"| {method} | {len(rs)} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", nargs="+", default=["cora", "citeseer", "pubmed"])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--pubmed-seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument(
        "--secure-modes",
        nargs="*",
        default=["ckks", "mask"],
        choices=["ckks", "mask", "ckks-mp"],
        help="modes FGSSL also runs in on Cora (compared with plain, same seeds)",
    )
    ap.add_argument("--grid", action="store_true", help="run the lambda grid on Cora (validation) instead")
    ap.add_argument("--grid-lambda-c", nargs="+", type=float, default=list(GRID_C))
    ap.add_argument("--grid-lambda-d", nargs="+", type=float, default=list(GRID_D))
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default="runs/fgssl")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("command: python " + shlex.join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])))
    if args.grid:
        if not args.table_only:
            jobs = [
                method_job(
                    out / "grid" / f"c{lc}-d{ld}" / f"seed{s}",
                    "FGSSL",
                    method_config("FGSSL", args, "cora", s, lambda_c=lc, lambda_d=ld),
                )
                for s in args.seeds
                for lc, ld in itertools.product(args.grid_lambda_c, args.grid_lambda_d)
            ]
            run_all(jobs, out, lambda: write_grid(out))
        print(write_grid(out))
        return
    choice = grid_choice(collect(out / "grid"))
    lambdas = {"lambda_c": choice[0], "lambda_d": choice[1]} if choice else {}
    print(f"FGSSL lambdas: {lambdas or 'FGSSLOptions defaults (no grid results under ' + str(out / 'grid') + ')'}")
    if not args.table_only:
        jobs = []
        for dataset in args.datasets:
            for seed in args.pubmed_seeds if dataset == "pubmed" else args.seeds:
                for method in args.methods:
                    if "w/o" in method and dataset not in ABLATION_DATASETS:
                        continue
                    modes = ["plain"] + (list(args.secure_modes) if method == "FGSSL" and dataset == "cora" else [])
                    jobs += [
                        method_job(
                            out / "table" / dataset / f"{SLUGS[method]}-{mode}" / f"seed{seed}",
                            method,
                            method_config(method, args, dataset, seed, mode, **lambdas),
                        )
                        for mode in modes
                    ]
        run_all(jobs, out, lambda: write_tables(out))
    print(write_tables(out))


if __name__ == "__main__":
    main()
