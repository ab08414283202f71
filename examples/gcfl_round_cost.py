"""Per-round cost of GCFL's settings.

A few FedAvg rounds of each (the GCFL GIN, the reference hyper-parameters), to size a reproduction grid before
running it. Prints one line per setting with the result's phase times (data loading, training, evaluation) and
training seconds per round.

    OMP_NUM_THREADS=1 nice -n 5 python examples/gcfl_round_cost.py --data-root ../shared/datasets
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gcfl_tables  # noqa: E402

from secure_fgl.experiment import run_experiment  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=list(gcfl_tables.SETTINGS), choices=list(gcfl_tables.SETTINGS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data-root", default=None)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--out", default="runs/gcfl_round_cost")
    args = p.parse_args()
    args.attacks = []
    for setting in args.settings:
        cfg = gcfl_tables.config(setting, "FedAvg", "plain", 0, args)
        cfg.out = f"{args.out}/{setting}"
        t = run_experiment(cfg, progress=False)["time"]
        print(
            json.dumps(
                {
                    "setting": setting,
                    "rounds": args.rounds,
                    "train_s_per_round": t["train"] / args.rounds,
                    **{k: round(v, 2) for k, v in t.items()},
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
