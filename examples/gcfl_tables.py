r"""Reproduce GCFL's Tables 3 and 4 (Xie et al., NeurIPS 2021, sec. 6).

Self-train, FedAvg, FedProx, GCFL and GCFL+ on the same partitions.

Settings (eps1 / eps2 / seq_length from the authors' ``runnerfile``):

* Table 3, one dataset chunked across clients: NCI1 (30 clients), PROTEINS (10), IMDB-BINARY (10);
* Table 4, one dataset per client: molecules (7), biochem (10), mix (13; COLLAB must be unpacked
  into the writable cache first, see docs/gcfl.md).

Every method: the GCFL GIN (3 GIN layers, hidden 64, local input/post/classifier layers, only
the GIN layers shared), Adam lr 1e-3, weight decay 5e-4, batch 128, 1 local epoch a round,
``--rounds`` rounds (paper: 200), FedProx mu = 0.01.

Columns (per setting and method, over ``--seeds``):

* ``avg acc`` -- mean over clients of each client's test accuracy with its own model after the
  last round (the paper's protocol, without its best-over-cached-models selection), mean ± std
  over seeds;
* ``min gain`` / ``improved`` -- the paper's: the smallest per-client gain over self-train on the
  same seed, and the share of clients whose accuracy beats self-train (means over seeds);
* ``best cached`` -- GCFL/GCFL+ only: the reference code's number (per client, the maximum test
  accuracy over cached cluster models), reported for comparison, not as our result;
* ``s/run`` and ``MB/run`` (all exchanges) with the similarity-statistics exchange separately.

ckks rows (``--ckks``): GCFL/GCFL+ rerun in ckks on the listed settings; mask rows (``--mask``):
GCFL+ in mask (GCFL refuses mask); the table says whether the cluster assignments equal plain's on
the same seed, round by round.  ``--order file`` chunks the single-dataset settings in file order
as the reference ``_randChunk`` (rows ``<setting>-file-order``).  ``--methods ... GCFL-unw GCFL+-unw``
adds GCFL/GCFL+ whose eq. 4 reads the unweighted mean (``--mean-norm unweighted``, the reference
code's ``compute_mean_update_norm``; the paper weights by ``|G_i|/|G|``).  Two more sections: self-train
after 50 epochs (the reference's self-train length) and FedProx against FedAvg on the same seed.

Run (reduced, as reported in docs/gcfl.md)::

    OMP_NUM_THREADS=1 nice -n 10 python examples/gcfl_tables.py --data-root ../shared/datasets \
        --settings PROTEINS --seeds 0 1 2 --ckks PROTEINS --out runs/gcfl_tables

Each run writes ``<out>/<setting>/<method>-<mode>/seed<s>/result.json`` and is skipped when it
exists; a run stopped midway resumes from the ``checkpoint.pt`` it left (also with another
``--device``); ``<out>/tables.md`` is rewritten after every run, listing every command the results came
from (``--table-only`` only rewrites it).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sweep import Job, run_sweep  # noqa: E402

from secure_fgl.algorithms.clustering import cut_flip_bound  # noqa: E402
from secure_fgl.config import RunConfig  # noqa: E402

#: setting -> (dataset flag, clients, eps1, eps2, seq_length)  (authors' runnerfile)
SETTINGS = {
    "NCI1": ("NCI1", 30, 0.04, 0.08, 5),
    "PROTEINS": ("PROTEINS", 10, 0.03, 0.06, 10),
    "IMDB-BINARY": ("IMDB-BINARY", 10, 0.025, 0.045, 5),
    "molecules": ("molecules", 7, 0.07, 0.28, 5),
    "biochem": ("biochem", 10, 0.07, 0.35, 5),
    "mix": ("mix", 13, 0.08, 0.4, 5),
}
METHODS = {
    "self-train": "gc-selftrain",
    "FedAvg": "gc-fedavg",
    "FedProx": "gc-fedprox",
    "GCFL": "gcfl",
    "GCFL+": "gcflplus",
    "GCFL-unw": "gcfl",
    "GCFL+-unw": "gcflplus",
}
#: the paper's methods (the default); ``-unw``: eq. 4 on the unweighted mean, as the reference's
#: ``compute_mean_update_norm`` (``--mean-norm unweighted``), on request
PAPER_METHODS = ("self-train", "FedAvg", "FedProx", "GCFL", "GCFL+")
#: the paper's Tables 3-4: average accuracy, minimum gain over self-train, clients improved
PAPER = {
    "NCI1": {
        "self-train": (0.6468, None, None),
        "FedAvg": (0.6474, -0.1333, "14/30"),
        "FedProx": (0.6437, -0.2400, "16/30"),
        "GCFL": (0.7326, -0.0462, "26/30"),
        "GCFL+": (0.7422, -0.1143, "28/30"),
    },
    "PROTEINS": {
        "self-train": (0.7213, None, None),
        "FedAvg": (0.7490, -0.0615, "6/10"),
        "FedProx": (0.7556, -0.0923, "7/10"),
        "GCFL": (0.7739, -0.0545, "8/10"),
        "GCFL+": (0.7776, -0.0154, "9/10"),
    },
    "IMDB-BINARY": {
        "self-train": (0.7654, None, None),
        "FedAvg": (0.7596, -0.0800, "5/10"),
        "FedProx": (0.7746, -0.0600, "6/10"),
        "GCFL": (0.8256, 0.0182, "10/10"),
        "GCFL+": (0.8299, 0.0167, "10/10"),
    },
    "molecules": {
        "self-train": (0.7543, None, None),
        "FedAvg": (0.7524, -0.0132, "3/7"),
        "FedProx": (0.7668, -0.0054, "5/7"),
        "GCFL": (0.7661, 0.0010, "7/7"),
        "GCFL+": (0.7745, 0.0010, "7/7"),
    },
    "biochem": {
        "self-train": (0.7129, None, None),
        "FedAvg": (0.6944, -0.1467, "4/10"),
        "FedProx": (0.7053, -0.1000, "5/10"),
        "GCFL": (0.7172, -0.0700, "7/10"),
        "GCFL+": (0.7312, -0.0300, "8/10"),
    },
    "mix": {
        "self-train": (0.7001, None, None),
        "FedAvg": (0.6886, -0.1233, "5/13"),
        "FedProx": (0.6897, -0.1367, "5/13"),
        "GCFL": (0.7056, -0.1400, "10/13"),
        "GCFL+": (0.7121, -0.0233, "10/13"),
    },
}
SIMILARITY_TAGS = ("gcfl/similarity", "gcfl/similarity/keys")
#: chunk orders (``--order``): graphs shuffled by the seed before chunking, or the reference's file order
ORDERS = ("shuffled", "file")
MODES = ("plain", "ckks", "mask")
TABLE3 = ("NCI1", "PROTEINS", "IMDB-BINARY")


def config(setting: str, method: str, mode: str, seed: int, args, order: str = "shuffled") -> RunConfig:
    dataset, clients, eps1, eps2, seq = SETTINGS[setting]
    algorithm = METHODS[method]
    options = {}
    if algorithm in ("gcfl", "gcflplus"):
        options = {"eps1": eps1, "eps2": eps2, **({"mean_norm": "unweighted"} if method.endswith("-unw") else {})}
        if algorithm == "gcflplus":
            options["seq_length"] = seq
    elif algorithm == "gc-fedprox":
        options = {"mu": 0.01}
    return RunConfig(
        algorithm=algorithm,
        dataset=dataset,
        clients=clients,
        mode=mode,
        hidden=64,
        num_layers=3,
        dropout=0.5,
        lr=1e-3,
        weight_decay=5e-4,
        rounds=args.rounds,
        local_epochs=1,
        seed=seed,
        data_root=args.data_root,
        device=args.device,
        options=options,
        attacks=list(args.attacks),
        **({"partition": "file-order"} if order == "file" else {}),
    )


def command(cfg: RunConfig, out: Path) -> str:
    flags = [
        "python",
        "-m",
        "secure_fgl.cli.main",
        "run",
        "--algorithm",
        cfg.algorithm,
        "--dataset",
        cfg.dataset,
        "--clients",
        cfg.clients,
        "--mode",
        cfg.mode,
        "--hidden",
        64,
        "--num-layers",
        3,
        "--lr",
        cfg.lr,
        "--weight-decay",
        cfg.weight_decay,
        "--rounds",
        cfg.rounds,
        "--seed",
        cfg.seed,
        "--out",
        out,
        "--quiet",
    ]
    if cfg.device != "auto":
        flags += ["--device", cfg.device]
    if cfg.resume:
        flags += ["--resume", "true"]
    if cfg.partition == "file-order":
        flags += ["--partition", "file-order"]
    if cfg.attacks:
        flags += ["--attacks", ",".join(cfg.attacks)]
    for k, v in cfg.options.items():
        flags += [f"--{k.replace('_', '-')}", v]
    return shlex.join(map(str, flags))


def label(setting: str, order: str) -> str:
    """Table and folder name: ``PROTEINS`` (graphs shuffled, then chunked) or ``PROTEINS-file-order``."""
    return setting if order == "shuffled" else f"{setting}-file-order"


def run_dir(out: Path, setting: str, method: str, mode: str, seed: int, order: str = "shuffled") -> Path:
    variant = "-unweighted" if method.endswith("-unw") else ""
    return out / label(setting, order) / f"{METHODS[method]}{variant}-{mode}" / f"seed{seed}"


def load(out: Path, setting: str, method: str, mode: str, seed: int, order: str = "shuffled") -> dict | None:
    path = run_dir(out, setting, method, mode, seed, order) / "result.json"
    return json.loads(path.read_text()) if path.exists() else None


def mean_std(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def similarity_bytes(result: dict) -> int:
    per_tag = result["comm"]["per_tag"]
    return sum(
        per_tag[t]["bytes_up"] + per_tag[t]["bytes_down"] + per_tag[t]["bytes_p2p"]
        for t in per_tag
        if t.split("/")[1:2] == ["similarity"]
    )


def total_bytes(result: dict) -> int:
    return sum(v["bytes_up"] + v["bytes_down"] + v["bytes_p2p"] for v in result["comm"]["per_tag"].values())


def secure_vs_plain(out: Path, args) -> list[str]:
    """Same seed, ckks (or mask) against plain: every round's loss, accuracy and clustering.

    Same seed, ckks (or mask) vs plain: every round's loss and accuracy, the split rounds and
    partitions, the largest difference of the similarities each split cut, and the cut margins.
    """
    rows = []
    for setting, mode in ((s, m) for s in SETTINGS for m in MODES[1:]):
        for method in ("GCFL", "GCFL+", "GCFL-unw", "GCFL+-unw"):
            for seed in args.seeds:
                plain, ckks = (load(out, setting, method, m, seed) for m in ("plain", mode))
                if plain is None or ckks is None:
                    continue
                same_rounds = sum(
                    a["train_loss"] == b["train_loss"] and a["test_acc"] == b["test_acc"]
                    for a, b in zip(plain["rounds"], ckks["rounds"])
                )
                sp, sc = plain["final"]["splits"], ckks["final"]["splits"]
                pairs = [
                    (a, max(abs(x - y) for x, y in zip(a["similarity"], b["similarity"])))
                    for a, b in zip(sp, sc)
                    if a.get("similarity") and a["cluster"] == b["cluster"]
                ]
                diffs = [d for _, d in pairs]
                margins = [s["cut_margin"] for s in sp if s.get("cut_margin") is not None]
                proven = [
                    a["cut_margin"] > cut_flip_bound(len(a["cluster"]), d)
                    for a, d in pairs
                    if a.get("cut_margin") is not None
                ]
                rows.append(
                    "| "
                    + " | ".join(
                        [
                            setting,
                            method,
                            mode,
                            str(seed),
                            f"{same_rounds}/{len(plain['rounds'])}",
                            ", ".join(str(s["round"]) for s in sp) or "-",
                            ", ".join(str(s["round"]) for s in sc) or "-",
                            "yes" if [s["into"] for s in sp] == [s["into"] for s in sc] else "no",
                            "yes" if plain["final"]["clusters"] == ckks["final"]["clusters"] else "no",
                            f"{max(diffs):.1e}" if diffs else "-",
                            f"{min(margins):.1e}" if margins else "-",
                            f"{sum(proven)}/{len(proven)}" if proven else "-",
                        ]
                    )
                    + " |"
                )
    if not rows:
        return []
    return [
        "",
        "## secure mode vs plain on the same seed",
        "",
        "Rounds equal: rounds whose train loss and test accuracy are bit-identical. Similarity error: the "
        "largest |ckks - plain| over the similarities a split cut (GCFL+: none, its DTW input is plain). "
        "Smallest margin: the lightest cut's lead over the next one (plain; `-` above 16 members). Cut "
        "proven: splits whose margin exceeds m^2/2 times that split's similarity error, so no error of that "
        "size can change the cut (`secure_fgl.algorithms.clustering.cut_flip_bound`).",
        "",
        "| setting | method | mode | seed | rounds equal | plain splits at | secure splits at | same partitions "
        "| same final clusters | similarity error | smallest margin | cut proven |",
        "|" + "---|" * 12,
    ] + rows


def selftrain_at_50(out: Path, args) -> list[str]:
    """Self-train's client-mean test accuracy after 50 epochs.

    The reference trains self-train for 50 local epochs (``main_oneDS.py``), our run for ``--rounds`` one-epoch
    rounds.
    """
    rows = []
    for setting, order in ((s, o) for s in SETTINGS for o in ORDERS):
        rs = [r for r in (load(out, setting, "self-train", "plain", s, order) for s in args.seeds) if r]
        if rs and len(rs[0]["rounds"]) >= 50:
            rows.append(
                f"| {label(setting, order)} | {len(rs)} | "
                f"{mean_std([r['rounds'][49]['test_acc_client_mean'] for r in rs])} | "
                f"{mean_std([statistics.mean(r['final']['per_client_test_acc_last']) for r in rs])} | "
                f"{PAPER[setting]['self-train'][0]} |"
            )
    if not rows:
        return []
    return [
        "",
        "## self-train after 50 epochs (the reference's self-train length)",
        "",
        "| setting | seeds | after 50 epochs | after the last round | paper |",
        "|---|---|---|---|---|",
    ] + rows


def fedprox_vs_fedavg(out: Path, args) -> list[str]:
    """FedProx against FedAvg on the same seed.

    With one optimizer step a round (every client <= 128 training graphs, batch 128) the proximal term and its
    gradient are zero at that step, so the two runs should agree bit for bit.
    """
    rows = []
    for setting, order in ((s, o) for s in SETTINGS for o in ORDERS):
        for seed in args.seeds:
            avg, prox = (load(out, setting, m, "plain", seed, order) for m in ("FedAvg", "FedProx"))
            if avg and prox:
                same = sum(
                    a["train_loss"] == b["train_loss"] and a["test_acc"] == b["test_acc"]
                    for a, b in zip(avg["rounds"], prox["rounds"])
                )
                rows.append(
                    f"| {label(setting, order)} | {seed} | {same}/{len(avg['rounds'])} | "
                    f"{avg['final']['per_client_test_acc_last'] == prox['final']['per_client_test_acc_last']} |"
                )
    if not rows:
        return []
    return [
        "",
        "## FedProx (mu 0.01) vs FedAvg on the same seed",
        "",
        "| setting | seed | rounds with identical train loss and test accuracy | same per-client accuracy |",
        "|---|---|---|---|",
    ] + rows


def table(out: Path, args) -> str:
    lines = [
        "# GCFL Tables 3-4, reduced reproduction",
        "",
        f"Generated by `examples/gcfl_tables.py`; runs in `{out}`. Accuracy: last round, each client's own "
        "model, mean over clients; ± = std over seeds; [paper's Tables 3-4, mean of 5 repeats]. "
        "`-file-order`: graphs chunked in file order as the reference `_randChunk`.",
        "",
    ]
    header = (
        "| setting | method | mode | seeds | avg acc [paper] | min gain [paper] | improved [paper] | best cached (ref.) "
        "| clusters at end | s/run | MB/run | similarity MB/run |"
    )
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for setting, order in ((s, o) for s in SETTINGS for o in ORDERS):
        for method in METHODS:
            for mode in MODES:
                rs = {s: load(out, setting, method, mode, s, order) for s in args.seeds}
                rs = {s: r for s, r in rs.items() if r is not None}
                if not rs:
                    continue
                accs = [statistics.mean(r["final"]["per_client_test_acc_last"]) for r in rs.values()]
                gains, improved = [], []
                for s, r in rs.items():
                    base = load(out, setting, "self-train", "plain", s, order)
                    if base is None or method == "self-train":
                        continue
                    diff = [
                        a - b
                        for a, b in zip(
                            r["final"]["per_client_test_acc_last"], base["final"]["per_client_test_acc_last"]
                        )
                    ]
                    gains.append(min(diff))
                    improved.append(sum(d > 0 for d in diff) / len(diff))
                cached = [
                    r["final"]["test_acc_best_cached"] for r in rs.values() if "test_acc_best_cached" in r["final"]
                ]
                clusters = "; ".join(str(len(r["final"]["clusters"])) for r in rs.values())
                if mode != "plain":
                    same = [
                        r["final"]["clusters"]
                        == (load(out, setting, method, "plain", s, order) or {}).get("final", {}).get("clusters")
                        for s, r in rs.items()
                    ]
                    clusters += f" (= plain: {sum(same)}/{len(same)})"
                paper_avg, paper_gain, paper_ratio = PAPER[setting][method.removesuffix("-unw")]
                lines.append(
                    "| "
                    + " | ".join(
                        [
                            label(setting, order),
                            method,
                            mode,
                            str(len(rs)),
                            f"{mean_std(accs)} [{paper_avg:.3f}]",
                            (f"{statistics.mean(gains):+.3f}" if gains else "-")
                            + (f" [{paper_gain:+.3f}]" if paper_gain is not None else ""),
                            (f"{statistics.mean(improved):.2f}" if improved else "-")
                            + (f" [{paper_ratio}]" if paper_ratio else ""),
                            mean_std(cached) if cached else "-",
                            clusters,
                            f"{statistics.mean(r['time']['total'] for r in rs.values()):.0f}",
                            f"{statistics.mean(total_bytes(r) for r in rs.values()) / 1e6:.1f}",
                            f"{statistics.mean(similarity_bytes(r) for r in rs.values()) / 1e6:.1f}",
                        ]
                    )
                    + " |"
                )
    lines += selftrain_at_50(out, args)
    lines += fedprox_vs_fedavg(out, args)
    lines += secure_vs_plain(out, args)
    cmds = out / "commands.txt"
    if cmds.exists():
        lines += ["", "## Commands (one CLI line per run; the script ran them in-process)", "", "```"]
        done = [
            c
            for c in dict.fromkeys(cmds.read_text().splitlines())  # finished runs, once each
            if (Path(shlex.split(c)[shlex.split(c).index("--out") + 1]) / "result.json").exists()
        ]
        lines += done + ["```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(PAPER_METHODS),
        choices=list(METHODS),
        help="GCFL-unw / GCFL+-unw: eq. 4 on the unweighted mean (the reference code's)",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--ckks", nargs="*", default=[], help="settings whose GCFL/GCFL+ also run in ckks")
    p.add_argument(
        "--mask",
        nargs="*",
        default=[],
        help="settings whose GCFL+ also runs in mask (GCFL refuses mask: its similarities need ckks)",
    )
    p.add_argument(
        "--order",
        choices=ORDERS,
        default="shuffled",
        help="chunk order of the single-dataset settings (file: the reference's _randChunk)",
    )
    p.add_argument(
        "--attacks",
        nargs="*",
        default=[],
        help="attacks run at the end of every run (e.g. gcfl_same_dataset on molecules/biochem/mix)",
    )
    p.add_argument("--data-root", default=None)
    p.add_argument("--device", default="auto", help="where the clients train: auto (CUDA when present) | cpu | cuda")
    p.add_argument("--out", default="runs/gcfl_tables")
    p.add_argument("--table-only", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:

        def modes(setting: str, method: str) -> list[str]:
            base = method.removesuffix("-unw")
            return (
                ["plain"]
                + (["ckks"] if setting in args.ckks and base in ("GCFL", "GCFL+") else [])
                + (["mask"] if setting in args.mask and base == "GCFL+" else [])
            )

        def order(setting: str) -> str:
            return args.order if setting in TABLE3 else "shuffled"

        jobs = [
            Job(
                run_dir(out, setting, method, mode, seed, order(setting)),
                config(setting, method, mode, seed, args, order(setting)),
                {"setting": label(setting, order(setting)), "method": method},
            )
            for setting in args.settings
            for seed in args.seeds
            for method in args.methods
            for mode in modes(setting, method)
        ]

        def done(job: Job, r: dict, seconds: float) -> None:
            print(
                f"{job.meta['setting']} {job.meta['method']} {job.cfg.mode} seed {job.cfg.seed}: "
                f"{statistics.mean(r['final']['per_client_test_acc_last']):.3f} ({r['time']['total']:.0f} s)",
                flush=True,
            )
            (out / "tables.md").write_text(table(out, args))

        run_sweep(
            jobs,
            done,
            fed_key=None,
            log=out / "commands.txt",
            command=lambda cfg: command(cfg, Path(cfg.out)),
            skip_errors=False,
        )
    (out / "tables.md").write_text(table(out, args))
    print((out / "tables.md").read_text())


if __name__ == "__main__":
    main()
