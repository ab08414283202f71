"""Cost and accuracy of GCFL's encrypted similarity exchange (protocols/ckks/similarity.py).

For each K: K random updates of the GCFL GIN's shared size (3 GIN layers, hidden 64: 24,960
values), one :func:`protocols.similarity.cosine_similarities` in ckks.  Prints and writes JSON: key
the exchange's seconds, its fresh key generation included (wall and this process's CPU: the
machine is shared), bytes per message kind, and the max |error| against the plaintext cosine
matrix.

    OMP_NUM_THREADS=1 nice -n 5 python examples/gcfl_similarity_cost.py --clients 10 30 --out runs/gcfl_similarity.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocols import make_protocol  # noqa: E402
from protocols.similarity import cosine_matrix, cosine_similarities  # noqa: E402

SHARED = 3 * 2 * (64 * 64 + 64)


def measure(k: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    updates = {i: rng.normal(size=SHARED) * 0.01 for i in range(k)}
    proto = make_protocol("ckks", k, seed=seed)
    cosine_similarities(proto, "warm", 0, {0: updates[0], 1: updates[1]})  # key registration and directory
    t0, c0 = time.perf_counter(), time.process_time()
    got = cosine_similarities(proto, "gcfl/similarity", 1, updates)  # fresh similarity keys included
    exchange_s, exchange_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    msgs = proto.transcript.select(tag="gcfl/similarity")
    ups = [m for m in msgs if m.kind == "ciphertext" and m.receiver == "server"]
    keys = [m for m in msgs if m.kind == "public_key"]
    return {
        "clients": k,
        "values_per_client": SHARED,
        "pairs": k * (k - 1) // 2,
        "exchange_with_keygen_s": exchange_s,
        "exchange_with_keygen_cpu_s": exchange_cpu_s,
        "max_abs_error": float(np.abs(got - cosine_matrix(np.stack(list(updates.values())))).max()),
        "upload_bytes_per_client": ups[0].nbytes,
        "to_decider_bytes": sum(m.nbytes for m in msgs if m.sender == "server" and m.kind == "ciphertext"),
        "decider_reply_bytes": sum(m.nbytes for m in msgs if m.kind == "plain"),
        "evaluation_key_bytes_to_server": sum(m.nbytes for m in keys if m.receiver == "server"),
        "public_key_bytes_per_client": next(m.nbytes for m in keys if m.receiver != "server"),
        "plan_bytes": sum(m.nbytes for m in msgs if m.kind == "control"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", nargs="+", type=int, default=[10])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rows = [measure(k) for k in args.clients]
    print(json.dumps(rows, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
