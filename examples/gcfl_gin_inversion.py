r"""What a plain-mode server recovers from one client's GIN update (GCFL and its baselines).

For every setting, trains ``--algorithm`` for ``--rounds`` rounds with the reference settings
(GCFL GIN, hidden 64, Adam lr 1e-3, batch 128, one local epoch), then runs the graph-level
attacks of the ``--attacks`` runner on the finished run for each ``--victims`` client:

* ``gin_gradient_inversion`` (:mod:`attacks.gin_inversion`): labels of the victim's training
  graphs (chance: its majority label share), their distribution (baseline: uniform guess) and
  node feature categories (chance: the majority category share);
* ``gcfl_same_dataset`` (:mod:`attacks.gcfl`): "same dataset / domain?" over client pairs from
  the cosine of their uploads (AUC, chance 0.5; only where the clients differ).

Writes one JSON line per (setting, rounds, victim) to ``--out`` and prints a markdown table.

    OMP_NUM_THREADS=1 nice -n 5 python examples/gcfl_gin_inversion.py --data-root ../shared/datasets \
        --settings synthetic-graphs PROTEINS --rounds 1 20 --victims 0 1 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attacks.runner import run_attacks  # noqa: E402
from protocols import Transcript  # noqa: E402
from secure_fgl.config import RunConfig  # noqa: E402
from secure_fgl.engine.device import seed_everything  # noqa: E402
from secure_fgl.engine.trainer import train  # noqa: E402
from secure_fgl.runtime.build import start_run  # noqa: E402

CLIENTS = {"synthetic-graphs": 8, "PROTEINS": 10, "IMDB-BINARY": 10, "NCI1": 30, "molecules": 7, "biochem": 10}


def attack(setting: str, rounds: int, victims: list[int], args) -> list[dict]:
    cfg = RunConfig(
        algorithm=args.algorithm,
        dataset=setting,
        clients=CLIENTS[setting],
        mode="plain",
        hidden=64,
        num_layers=3,
        dropout=0.5,
        lr=1e-3,
        weight_decay=5e-4,
        rounds=rounds,
        seed=args.seed,
        data_root=args.data_root,
    )
    seed_everything(cfg.seed)
    run = start_run(cfg, transcript=Transcript())  # the client runtimes; the transcript keeps what the server read
    fed, algo, proto = run.fed, run.strategy, run.protocol
    train(algo, cfg, None, progress=False)
    rows = []
    for v in victims:
        t0 = time.perf_counter()
        entries = {
            e["name"]: e
            for e in run_attacks(
                ["gin_gradient_inversion"] + (["gcfl_same_dataset"] if v == victims[0] else []),
                algo=algo,
                protocol=proto,
                fed=fed,
                cfg=cfg,
                options={"gin_gradient_inversion": {"victim": v, "iterations": args.iterations}},
            )
        }
        inv = entries["gin_gradient_inversion"]
        row = {
            "setting": setting,
            "algorithm": cfg.algorithm,
            "rounds": rounds,
            "seed": cfg.seed,
            "victim": v,
            "graphs": inv.get("num_graphs"),
            "nodes": inv.get("num_nodes"),
            "iterations": args.iterations,
            **{
                k: inv.get(k)
                for k in ("value", "chance", "label_tv", "label_tv_uniform", "feature_acc", "feature_chance")
            },
            "seconds": round(time.perf_counter() - t0, 1),
        }
        same = entries.get("gcfl_same_dataset")
        if same is not None:
            row["same_dataset_auc"] = same.get("value") if same.get("applicable") else None
        rows.append(row)
    return rows


def fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    lines = [
        "| setting | rounds | victim | graphs | label acc | chance | label TV | uniform TV | feature acc "
        "| chance | same-dataset AUC |",
        "|" + "---|" * 11,
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['rounds']} | {r['victim']} | {r['graphs']} | {fmt(r['value'])} | "
            f"{fmt(r['chance'])} | {fmt(r['label_tv'])} | {fmt(r['label_tv_uniform'])} | "
            f"{fmt(r['feature_acc'])} | {fmt(r['feature_chance'])} | {fmt(r.get('same_dataset_auc'))} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=["synthetic-graphs", "PROTEINS"], choices=list(CLIENTS))
    p.add_argument("--rounds", nargs="+", type=int, default=[1, 20])
    p.add_argument("--victims", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--algorithm", default="gc-fedavg")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-root", default=None)
    p.add_argument("--out", default="runs/gcfl_inversion.jsonl")
    args = p.parse_args()
    rows = []
    for setting in args.settings:
        for rounds in args.rounds:
            for row in attack(setting, rounds, args.victims, args):
                rows.append(row)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
