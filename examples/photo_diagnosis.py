"""Why FedGCN under-trains on Amazon Photo: short runs varying one thing at a time.

    nice -n 5 python examples/photo_diagnosis.py CASE [CASE ...]

CASE = ``algorithm:hops:features:lr:rounds`` with features ``raw`` (binary bag of words),
``rownorm`` (every row divided by its number of words, Kipf & Welling's preprocessing) or
``center`` (FedGCN ``--center``: each client subtracts its own mean from its first-layer
input).  Photo, FGSSL split (60/20/20 per client), 5 clients iid, seed 0, plain mode,
degree cap 1434.  Prints test accuracy at the best-validation round and the training accuracy.
"""

from __future__ import annotations

import copy
import os
import sys
import time

from secure_fgl.config import RunConfig
from secure_fgl.data import make_federated
from secure_fgl.experiment import run_experiment


def row_normalised(fed):
    fed = copy.deepcopy(fed)
    for holder in [fed.graph, *fed.clients]:
        holder.x = holder.x / holder.x.sum(1, keepdim=True).clamp_min(1)
    fed.binary_features = False
    return fed


def main() -> None:
    root = os.environ.get("SECURE_FGL_DATA")
    fed = make_federated("photo", num_clients=5, partition="iid", split="fgssl", seed=0, data_root=root)
    for case in sys.argv[1:]:
        algo, hops, feat, lr, rounds = case.split(":")
        opts = (
            {}
            if algo != "fedgcn"
            else {
                "hops": int(hops),
                "degree_cap": 1434,
                "center": feat == "center",
                **({"feature_bound": 1.0} if feat == "rownorm" else {}),
            }
        )
        cfg = RunConfig(
            algorithm=algo,
            dataset="photo",
            clients=5,
            partition="iid",
            split="fgssl",
            mode="plain",
            lr=float(lr),
            rounds=int(rounds),
            seed=0,
            options=opts,
            data_root=root,
        )
        t0 = time.perf_counter()
        r = run_experiment(cfg, progress=False, fed=row_normalised(fed) if feat == "rownorm" else fed)["final"]
        print(
            f"{case}: test {r['test_acc']:.3f} (best round {r['best_round']}, train {r['train_acc']:.3f}) "
            f"{time.perf_counter() - t0:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
