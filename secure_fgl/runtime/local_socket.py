"""Length-prefixed messages over a local (Unix domain) socket, standard library only.

The Flower deployment (:mod:`.flower_executor`) uses two local sockets: the driver and its
``ServerApp`` relay on the aggregator's machine, and each ``ClientApp`` process and its site's
long-lived client process (:mod:`.flower_site`) on the site's machine.  One message is::

    header length (4 bytes, big endian) | JSON header | payload length (8 bytes, big endian) | payload

The payload is carried as given (a runtime frame or a protocol bundle, unchanged); nothing is
unpickled.  The socket file lives in a folder only its owner may enter (0700), which is what
keeps other local users out.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

#: the largest header accepted (a header names methods, clients and sizes, never data)
MAX_HEADER = 1 << 20


class SocketClosed(ConnectionError):
    """The peer closed the socket (or sent a truncated message)."""


def send(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    """Write one message: ``header`` (JSON values) and ``payload`` (bytes)."""
    head = json.dumps(header, separators=(",", ":")).encode()
    sock.sendall(struct.pack(">I", len(head)) + head + struct.pack(">Q", len(payload)))
    if payload:
        sock.sendall(payload)


def _read(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise SocketClosed(f"the peer closed the socket after {got} of {n} bytes")
        got += k
    return bytes(buf)


def receive(sock: socket.socket) -> tuple[dict, bytes]:
    """Read one message written by :func:`send`; ``(header, payload)``."""
    (hlen,) = struct.unpack(">I", _read(sock, 4))
    if hlen > MAX_HEADER:
        raise SocketClosed(f"message header of {hlen} bytes refused (at most {MAX_HEADER})")
    header = json.loads(_read(sock, hlen))
    (plen,) = struct.unpack(">Q", _read(sock, 8))
    return header, _read(sock, plen) if plen else b""


def private_folder(path: Path) -> Path:
    """``path`` created if missing and made private to its owner (0700)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def listen(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` (its folder made private; a stale socket file replaced)."""
    private_folder(path.parent)
    if path.exists():
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(16)
    return server


def connect(path: str, timeout: float) -> socket.socket:
    """Connect to the Unix socket at ``path``.

    Retries for at most ``timeout`` seconds while it does not exist yet; reads and writes then time out after
    ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
