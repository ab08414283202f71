"""Latency of one executor call over Flower: a SuperLink and one site on 127.0.0.1.

One site holding ``--clients`` clients behind one SuperNode (insecure transport, as in the tests;
TLS changes the handshake per connection, not the per-call path), then ``--calls`` trivial calls
(``hello``: no computation at the site), each timed from the driver's side.  Prints JSON: the
wall time of each call, their mean, the CPU seconds of every process started (the SuperLink, the
SuperNode, the site and the ClientApp processes) and the load average.  ``--flwr-clientapp``:
Flower's default isolation (a ``flwr-clientapp`` process per message) instead of the site process
running its ClientApp tasks; ``--node-poll S``: the SuperNode's idle poll capped at S seconds as in
the tests (default: the stock ``flower-supernode``, 3 s).  Needs ``pip install -e ".[flower]"``.

    python examples/flower_call_latency.py --clients 3 --calls 5
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test suite's federation on 127.0.0.1

from support.flower import Federation  # noqa: E402

from secure_fgl.runtime.flower_executor import FlowerExecutor  # noqa: E402


def adopt_descendants() -> None:
    """On Linux, reap orphaned descendants here (``PR_SET_CHILD_SUBREAPER``), so that their CPU is counted.

    Flower's executors start processes that outlive their parent's bookkeeping (the ClientApp
    processes of a killed SuperNode); without this their CPU would be missed.
    """
    try:
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def reap(timeout: float = 30.0) -> None:
    """Wait (at most ``timeout`` seconds) for every exited descendant, so that RUSAGE_CHILDREN holds their CPU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.1)


def main() -> None:
    """Start the federation, time the calls, print the JSON line, stop everything."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=3, help="clients held by the one site")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--flwr-clientapp", action="store_true", help="a flwr-clientapp process per message")
    p.add_argument("--node-poll", type=float, default=None, help="cap the SuperNode's idle poll (seconds)")
    args = p.parse_args()
    os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
    adopt_descendants()
    with tempfile.TemporaryDirectory(prefix="flower-latency-") as folder:
        federation = Federation(
            Path(folder), clients=args.clients, sites=1, resident=not args.flwr_clientapp, node_poll=args.node_poll
        )
        os.environ["FLWR_HOME"] = federation.env["FLWR_HOME"]
        try:
            executor = FlowerExecutor(round_timeout=120)
            try:
                clients = list(range(args.clients))
                executor.find_sites(clients)
                walls = []
                for _ in range(args.calls):
                    t0 = time.perf_counter()
                    answers, lost = executor.call("hello", {k: b"" for k in clients})
                    if lost or len(answers) != len(clients):
                        raise RuntimeError(f"clients lost: {lost}")
                    walls.append(round(time.perf_counter() - t0, 2))
            finally:
                executor.shutdown()
        finally:
            federation.close()
    load = [round(x, 1) for x in os.getloadavg()]
    reap()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "clients": args.clients,
                "isolation": "flwr-clientapp" if args.flwr_clientapp else "site process",
                "node_poll": args.node_poll,
                "call_s": walls,
                "mean_s": round(sum(walls) / len(walls), 2),
                "cpu_s_of_started_processes": round(used.ru_utime + used.ru_stime, 1),
                "load": load,
            }
        )
    )


if __name__ == "__main__":
    main()
