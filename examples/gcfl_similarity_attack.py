"""What GCFL's similarity matrix tells the server about which clients hold the same dataset.

Runs GCFL on the synthetic two-labeling federation (``synthetic-graphs``: even clients label
dense graphs 1, odd clients sparse ones), with criteria forced to fire at round 20 (eps1 = 0.5,
eps2 = 0), then lets the server read its view of the transcript (:mod:`attacks.gcfl`) and
scores "same labeling" over client pairs by rank AUC (chance 0.5).  Prints one JSON line per
(seed, mode).

    OMP_NUM_THREADS=1 nice -n 5 python examples/gcfl_similarity_attack.py --seeds 0 1 2 --modes plain ckks
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attacks.base import View  # noqa: E402
from attacks.gcfl import same_dataset_auc, server_similarity  # noqa: E402
from protocols import Transcript  # noqa: E402
from secure_fgl.config import RunConfig  # noqa: E402
from secure_fgl.engine.device import seed_everything  # noqa: E402
from secure_fgl.engine.trainer import train  # noqa: E402
from secure_fgl.runtime.build import start_run  # noqa: E402


def attack(seed: int, mode: str, clients: int) -> dict:
    cfg = RunConfig(
        algorithm="gcfl",
        dataset="synthetic-graphs",
        clients=clients,
        mode=mode,
        hidden=16,
        num_layers=3,
        lr=1e-2,
        rounds=21,
        seed=seed,
        options={"eps1": 0.5, "eps2": 0.0},
    )
    seed_everything(seed)
    run = start_run(cfg, transcript=Transcript())  # the client runtimes; the transcript keeps what the server read
    fed, algo, proto = run.fed, run.strategy, run.protocol
    train(algo, cfg, None, progress=False)
    members, sim = server_similarity(View.of(proto.transcript, "server"), run.logic(0).learner.shared_vector().numel())
    return {
        "seed": seed,
        "mode": mode,
        "clients": clients,
        "pairs": len(members) * (len(members) - 1) // 2,
        "same_dataset_auc": same_dataset_auc(members, sim, [c.dataset for c in fed.clients]),
        "chance": 0.5,
        "split": algo.splits[0]["into"] if algo.splits else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", default=["plain", "ckks"])
    p.add_argument("--clients", type=int, default=8)
    args = p.parse_args()
    for seed in args.seeds:
        for mode in args.modes:
            print(json.dumps(attack(seed, mode, args.clients)), flush=True)


if __name__ == "__main__":
    main()
