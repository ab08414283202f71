"""Bytes of ``ckks-mp``'s t-out-of-n key set-up, and what the server holds of them at once.

``python -m secure_fgl.bench.threshold_setup --clients 10 20`` runs the key set-up alone (every client in
this process, :class:`~protocols.link.InProcessLink`) and prints one JSON row per client count: the
``n (n - 1)`` relayed Shamir shares (count and bytes), one client's bytes sent, the most bytes of
relayed messages the server held at once (its relay counter,
:attr:`protocols.ckks_mp.server.CKKSMPServer.relay_peak`) and the set-up's CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import time

from protocols.ckks_mp.backend import CKKSMPProtocol
from protocols.ckks_mp.client import THRESHOLD_TAG
from protocols.ckks_mp.server import CKKSMPServer
from protocols.transcript import SERVER


def setup_row(clients: int, threshold: int | None = None) -> dict:
    """One key set-up of ``clients`` clients with threshold ``t``.

    The default ``t`` is ``max(floor(n / 2) + 1, floor(0.7 n))``.
    """
    t = threshold or max(clients // 2 + 1, int(0.7 * clients))
    p = CKKSMPProtocol(clients, threshold=t)
    server = p.server
    assert isinstance(server, CKKSMPServer)
    cpu = time.process_time()
    server.ensure_keys(p.link, 0)
    cpu = time.process_time() - cpu
    shares = [m for m in p.transcript.messages if m.tag == THRESHOLD_TAG and m.receiver != SERVER]
    total = sum(m.nbytes for m in shares)
    return {
        "clients": clients,
        "threshold": t,
        "shares": len(shares),
        "share_bytes": total,
        "per_client_sent_bytes": total // clients,
        "server_peak_held_bytes": server.relay_peak,
        "setup_cpu_s": round(cpu, 2),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 20])
    parser.add_argument("--threshold", type=int, default=None, help="t (default max(floor(n / 2) + 1, floor(0.7 n)))")
    args = parser.parse_args(argv)
    for n in args.clients:
        print(json.dumps(setup_row(n, args.threshold)), flush=True)


if __name__ == "__main__":
    main()
