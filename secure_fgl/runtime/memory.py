"""Memory of a process hosting client runtimes: measure it, and give freed memory back.

A process that hosts many clients (a Ray actor holds ``K/W`` of them) handles large transient
buffers: request and response frames of several MB per client and stage (ciphertexts, masked
vectors).  glibc's allocator keeps memory freed by Python in its heaps, and raises its mmap
threshold after the first large buffer is freed (up to 32 MB), so later frames come from the
heap too: a process's resident memory grows to its largest stage and never shrinks.
:func:`release_freed_memory` undoes this where glibc is the allocator (nothing happens elsewhere):
it returns the free pages of every heap (``malloc_trim(0)``) after each call, and runs Python's
collector first after a host's set-up and when it is emptied.  (Fixing the mmap threshold at
1 MiB instead made every MB-sized array a fresh zero-filled mapping: 3x slower mask pre-training
at 100 clients for no lower peak; docs/runtime.md.)

:func:`process_pss` reads a process's proportional set size from ``/proc/PID/smaps_rollup``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc

#: fields of /proc/PID/smaps_rollup a process's PSS is broken into (kB there, bytes here)
PSS_FIELDS = ("Pss", "Pss_Anon", "Pss_Shmem", "Pss_File")


@functools.lru_cache(maxsize=1)
def _glibc():
    """The C library if it is glibc (it has ``malloc_trim``), else ``None``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc's own function
    except (OSError, AttributeError):
        return None
    return libc


def release_freed_memory(collect: bool = True) -> None:
    """Hand the heaps' free pages back to the OS.

    Uses glibc's ``malloc_trim(0)``, after collecting Python's garbage (``collect``: a full collection, costly in a
    process holding torch: not after every call).
    """
    if collect:
        gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def process_pss(pid: int) -> dict[str, int] | None:
    """The proportional set size of process ``pid`` and its parts, in bytes.

    ``Pss`` of process ``pid`` and its anonymous (heap), shared-memory (Ray's object store is a
    shared mapping) and file-backed parts, in bytes; ``None`` when the process is gone or the
    system has no ``/proc/PID/smaps_rollup``.
    """
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in PSS_FIELDS:
            out[key] = int(value.split()[0]) * 1024
    return out
