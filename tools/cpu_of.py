"""The CPU time of a command and of every process it starts, orphans included.

``python tools/cpu_of.py COMMAND [ARGS...]`` runs the command as a child of a *child subreaper*
(Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a descendant whose parent exits first (Flower's
SuperExec, ServerApp and ClientApp processes, a killed SuperNode's children) is re-parented here
instead of to init.  Once the command exits, every descendant is reaped (waiting at most
``--reap-timeout`` seconds for those still running), and ``RUSAGE_CHILDREN`` then holds the user
and system CPU time of all of them.  Prints one JSON line on stderr (``cpu_s``, ``user_s``,
``sys_s``, ``wall_s``, the load average before and after, and the descendants still running when
the wait ended, if any) and exits with the command's status.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
import time

#: ``prctl`` option number (``linux/prctl.h``)
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Make this process the reaper of its orphaned descendants (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap_all(timeout: float) -> list[str]:
    """Reap every descendant, waiting at most ``timeout`` seconds; the ``ps`` lines of those still running."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # none left
            return []
        if pid == 0:
            if time.monotonic() > deadline:
                ps = subprocess.run(
                    ["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True, check=False
                )
                return ps.stdout.strip().splitlines()
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    """Run ``argv`` (after an optional ``--reap-timeout S``), reap its descendants, print the JSON line."""
    timeout = 120.0
    if argv[:1] == ["--reap-timeout"]:
        timeout, argv = float(argv[1]), argv[2:]
    if not argv:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    become_subreaper()
    load, start = os.getloadavg()[0], time.monotonic()
    status = subprocess.call(argv)
    wall = time.monotonic() - start
    running = reap_all(timeout)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = {
        "cpu_s": round(used.ru_utime + used.ru_stime, 1),
        "user_s": round(used.ru_utime, 1),
        "sys_s": round(used.ru_stime, 1),
        "wall_s": round(wall, 1),
        "load_before_after": [round(load, 1), round(os.getloadavg()[0], 1)],
        "still_running": running,
        "status": status,
    }
    print(json.dumps(report), file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
