"""Costs of ``ckks-mp``'s t-out-of-n mode: the streamed key set-up and a re-plan of the active set.

``python -m secure_fgl.bench.threshold --setup 10 20`` runs the key set-up alone (every client in this process,
:class:`~protocols.link.InProcessLink`) and prints one JSON row per client count: the ``n (n - 1)`` relayed Shamir
shares (count and bytes), one client's bytes sent, the most bytes of relayed messages the server held at once (its
relay counter, :attr:`protocols.ckks_mp.server.CKKSMPServer.relay_peak`) and the set-up's CPU seconds.

``--setup 10 --setup-lost 1 3 0,`` adds set-up rows with clients silent from the set-up's first call (``WHO`` as in
``--simulate-dropouts``: a count of the highest ids, or ids with commas; ``0,`` is the broadcast key's dealer): the
set-up then finishes with the others (the clients that finished it, and its calls, in the row).

``python -m secure_fgl.bench.threshold --replan 10 --lost 0 1 3`` runs one dense sum after the set-up with ``lost``
members of the active set disconnecting right after the liveness probe
(:class:`~secure_fgl.runtime.dropouts.LostAfter`), so that the server re-plans, and prints its bytes up (all, and of
the key switch) and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from protocols import ValueSpec
from protocols.ckks_mp.backend import CKKSMPProtocol
from protocols.ckks_mp.client import THRESHOLD_TAG
from protocols.ckks_mp.server import CKKSMPServer
from protocols.link import ClientLink
from protocols.transcript import SERVER

from ..runtime.dropouts import DropoutSchedule, DroppingLink, LostAfter, parse_dropouts
from ..runtime.exchange import plan_dense, run_split


def default_threshold(clients: int) -> int:
    """``max(floor(n / 2) + 1, floor(0.7 n))``: above the ``2t > n`` the mode requires."""
    return max(clients // 2 + 1, int(0.7 * clients))


def _protocol(clients: int, threshold: int | None) -> tuple[CKKSMPProtocol, CKKSMPServer]:
    p = CKKSMPProtocol(clients, threshold=threshold or default_threshold(clients))
    server = p.server
    assert isinstance(server, CKKSMPServer)
    return p, server


def setup_row(clients: int, threshold: int | None = None, lost: str | None = None) -> dict:
    """One key set-up of ``clients`` clients: the shares relayed and what the server held of them at once.

    ``lost``: the clients silent from the set-up's first call (``WHO`` of ``--simulate-dropouts``).
    """
    p, server = _protocol(clients, threshold)
    calls = CountingLink(p.link)
    p.link = calls
    if lost:
        p.link = DroppingLink(calls, DropoutSchedule(parse_dropouts(f"{lost}@key_setup", clients, "ckks-mp")))
    cpu = time.process_time()
    server.ensure_keys(p.link, 0)
    cpu = time.process_time() - cpu
    shares = [m for m in p.transcript.messages if m.tag == THRESHOLD_TAG and m.receiver != SERVER]
    total = sum(m.nbytes for m in shares)
    return {
        "clients": clients,
        "threshold": p.threshold,
        "shares": len(shares),
        "share_bytes": total,
        "per_client_sent_bytes": total // len({m.sender for m in shares}),
        "server_peak_held_bytes": server.relay_peak,
        "setup_cpu_s": round(cpu, 2),
        **({"lost": sorted(server.unfinished), "calls": calls.calls} if lost else {"calls": calls.calls}),
    }


class CountingLink(ClientLink):
    """A :class:`~protocols.link.ClientLink` that counts its calls (the set-up's round trips)."""

    def __init__(self, link: ClientLink):
        self.link, self.calls = link, 0
        self.sequential = getattr(link, "sequential", False)

    def call(self, stage, requests):
        """The wrapped link's call, counted."""
        self.calls += 1
        return self.link.call(stage, requests)


def replan_row(clients: int, lost: int, threshold: int | None = None, length: int = 33157) -> dict:
    """One dense sum of ``length`` values after the set-up.

    The last ``lost`` members of the active set disconnect after the probe.
    """
    p, server = _protocol(clients, threshold)
    server.ensure_keys(p.link, 0)
    active = list(range(p.threshold))  # every client answers the probe: the first t form the active set
    p.link = LostAfter(p.link, active[len(active) - lost :])
    values = np.random.default_rng(0).uniform(-1, 1, (clients, length))
    for k, half in p.clients.items():
        half.provider = lambda plan, v=values[k]: plan.dense_table(v)
    spec = ValueSpec(max_abs=1.0)
    ctx = plan_dense(p, "bench/replan", 0, range(clients), range(clients), length, spec)
    cpu = time.process_time()
    run_split(p, ctx)
    cpu = time.process_time() - cpu
    switch = [m for m in p.transcript.messages if m.tag == ctx.tag and m.receiver == SERVER and m.kind == "share"]
    return {
        "clients": clients,
        "threshold": p.threshold,
        "lost_after_probe": lost,
        "replans": server.last_stats["replans"],
        "active": list(server.last_stats["active"]),
        "bytes_up": p.transcript.comm()["per_tag"][ctx.tag]["bytes_up"],
        "keyswitch_bytes_up": sum(m.nbytes for m in switch),
        "cpu_s": round(cpu, 2),
    }


def main(argv=None) -> None:
    """Print the rows the command line asks for (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", type=int, nargs="*", default=[], metavar="N", help="client counts of set-up rows")
    parser.add_argument(
        "--setup-lost",
        nargs="*",
        default=[],
        metavar="WHO",
        help="clients silent at set-up (count, or ids with commas)",
    )
    parser.add_argument("--replan", type=int, default=None, metavar="N", help="client count of the re-plan rows")
    parser.add_argument("--lost", type=int, nargs="+", default=[0, 1], help="members of A lost after the probe")
    parser.add_argument("--threshold", type=int, default=None, help="t (default max(floor(n / 2) + 1, floor(0.7 n)))")
    args = parser.parse_args(argv)
    for n in args.setup:
        print(json.dumps(setup_row(n, args.threshold)), flush=True)
        for who in args.setup_lost:
            print(json.dumps(setup_row(n, args.threshold, who)), flush=True)
    for lost in args.lost if args.replan else []:
        print(json.dumps(replan_row(args.replan, lost, args.threshold)), flush=True)


if __name__ == "__main__":
    main()
