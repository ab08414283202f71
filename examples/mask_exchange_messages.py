"""Messages, signatures and bytes of one pairwise-mask exchange, per stage.

    python examples/mask_exchange_messages.py --clients 10 --values 23065

One weighted sum of ``--values`` floats over ``--clients`` clients (dense layout, the size of the
Cora FedGCN model exchange) after a first exchange that pays the once-per-run set-up (key
registration, the output-mask group seed, the mask keys and the first batch of self-mask shares);
prints one JSON line per stage of the second exchange:
messages recorded, signed messages (a copy the server forwards is not signed again), verifications
(every signed message is verified by each party it reaches) and bytes recorded.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from protocols import SERVER, ValueSpec
from protocols.mask import MaskProtocol
from protocols.message import SIGNATURE_BYTES, Envelope


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--values", type=int, default=23065)
    a = ap.parse_args(argv)
    proto = MaskProtocol(a.clients)
    rng = np.random.default_rng(0)
    spec = ValueSpec(max_abs=1.0, tolerance=1e-4)
    for rnd in range(2):
        start = len(proto.transcript.messages)
        proto.weighted_sum("x/model", rnd, {k: rng.uniform(-1, 1, a.values) for k in range(a.clients)}, spec=spec)
    per_stage = defaultdict(lambda: {"messages": 0, "signed": 0, "verified": 0, "bytes": 0})
    for m in proto.transcript.messages[start:]:
        stage = Envelope.from_header(m.auth[SIGNATURE_BYTES:]).stage
        row = per_stage[stage]
        row["messages"] += 1
        row["bytes"] += m.nbytes
        copy = m.relay == SERVER and Envelope.from_header(m.auth[SIGNATURE_BYTES:]).recipient == SERVER
        row["signed"] += 0 if copy else 1
        row["verified"] += 1  # each record is one delivery: to the server, or a relayed copy to its peer
    total = {k: sum(r[k] for r in per_stage.values()) for k in ("messages", "signed", "verified", "bytes")}
    for stage, row in per_stage.items():
        print(json.dumps({"stage": stage, **row}))
    print(json.dumps({"stage": "total", **total}))


if __name__ == "__main__":
    main()
