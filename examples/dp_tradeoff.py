"""Accuracy vs epsilon of edge-level DP FedGCN-GAP, next to the feature-only MLP and no DP.

Prints a markdown table (mean ± std over seeds; the DP noise is fresh in every run, so the
std includes its variance) and the equivalent ``secure-fgl run`` commands; writes
``<out>/tradeoff.json``.  Example (the reduced grid of docs/dp.md)::

    python examples/dp_tradeoff.py --datasets sbm,cora --seeds 0,1 --mode plain --local-epochs 5
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.report.headline import accuracy_vs_epsilon

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, math.inf)


def command(cfg: RunConfig) -> str:
    eps = "" if cfg.dp_epsilon is None else f" --dp-epsilon {cfg.dp_epsilon:g}"
    model = f" --model {cfg.model}" if cfg.algorithm == "fedavg" else ""
    return (f"secure-fgl run --algorithm {cfg.algorithm}{model} --dataset {cfg.dataset} --clients {cfg.clients} "
            f"--mode {cfg.mode} --rounds {cfg.rounds} --local-epochs {cfg.local_epochs} --seed {cfg.seed}{eps}"
            + (f" --dp-placement {cfg.dp_placement}" if cfg.dp_epsilon is not None else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="sbm,cora")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    ap.add_argument("--mode", default="plain")
    ap.add_argument("--placement", default="local")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--local-epochs", type=int, default=5)
    ap.add_argument("--out", default="runs/dp_tradeoff")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    epsilons = [float(e) for e in args.epsilons.split(",")]
    rows, commands, results = [], [], []
    for dataset in args.datasets.split(","):
        acc: dict[str, list[float]] = {}
        for seed in seeds:
            base = dict(dataset=dataset, clients=args.clients, mode=args.mode, rounds=args.rounds, seed=seed,
                        local_epochs=args.local_epochs)
            fed = load_federation(RunConfig(**base))
            settings = [("feature-only MLP (fedavg)", RunConfig(algorithm="fedavg", model="mlp", **base))]
            settings += [(f"fedgcn-gap eps={e:g}", RunConfig(algorithm="fedgcn-gap", **base,
                                                             dp_epsilon=None if math.isinf(e) else e,
                                                             dp_placement=args.placement))
                         for e in epsilons]
            for name, cfg in settings:
                res = run_experiment(cfg, progress=False, fed=fed)
                results.append({k: res[k] for k in ("config", "final", "privacy", "num_classes")})
                acc.setdefault(name, []).append(res["final"]["test_acc"])
                if cfg.algorithm == "fedgcn-gap" and cfg.dp_epsilon is None:    # the encoder is eps-independent
                    acc.setdefault("feature-only GAP encoder", []).append(res["final"]["encoder_test_acc"])
                spent = (res["privacy"] or {}).get("total_epsilon")
                commands.append(command(cfg))
                print(f"{dataset} seed {seed} {name}: test acc {res['final']['test_acc']:.4f}"
                      + (f", epsilon spent {spent:.4f}" if spent is not None else ""), flush=True)
        for name, vals in acc.items():
            rows.append({"dataset": dataset, "setting": name, "mean": statistics.mean(vals),
                         "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals), "accs": vals})
    print(f"\n| dataset | setting | test acc (mean ± std, n={len(seeds)} seeds) |\n|---|---|---|")
    for r in rows:
        print(f"| {r['dataset']} | {r['setting']} | {r['mean']:.4f} ± {r['std']:.4f} |")
    print("\ncommands:\n" + "\n".join(dict.fromkeys(commands)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tradeoff.json").write_text(json.dumps({"args": vars(args), "rows": rows, "results": results},
                                                  indent=1, default=str))
    for p in accuracy_vs_epsilon(results, out / "accuracy_vs_epsilon"):
        print(f"figure: {p}")


if __name__ == "__main__":
    main()
