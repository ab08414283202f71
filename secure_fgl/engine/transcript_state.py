"""The transcript's metadata in a checkpoint: appended to a side file, O(new messages) per round.

A checkpoint is written after every round and must let a resumed run report the same
communication, so it needs every message of the run so far (without payloads).  Writing them
all into every checkpoint made the checkpoint cost grow with the square of the rounds (a secure
Cora run records ~17,000 messages, 14 MB of text by its last round).  :class:`TranscriptState`
instead appends the JSON line of each message recorded since the last checkpoint to
``transcript.jsonl`` next to the checkpoint and puts only ``{"messages": n, "bytes": b,
"sha256": h}`` into the checkpoint, where ``h = SHA-256(first b bytes of the side file)`` is kept
as a running hash.  On ``--resume`` the side file's first ``b`` bytes are hashed and compared with
``h`` (a mismatch is a one-line :class:`~secure_fgl.config.ConfigError`), lines appended after the
checkpoint (a crash between the append and the checkpoint) are truncated away, and the ``n``
lines are parsed as JSON: nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from protocols.transcript import Message, Transcript
from secure_fgl.config import ConfigError

#: Message fields saved (the payload is never checkpointed)
FIELDS = tuple(f.name for f in dataclasses.fields(Message) if f.name not in ("payload", "received"))
#: the side file, next to the checkpoint
SIDE_FILE = "transcript.jsonl"


def encode_message(m: Message) -> str:
    """One message as a compact JSON line."""
    d = {name: getattr(m, name) for name in FIELDS}
    d["shape"] = [int(x) for x in m.shape]
    d["auth"] = bytes(m.auth).hex()
    return json.dumps(d, separators=(",", ":"), default=int)


def decode_message(line: str) -> Message:
    """The message of a line written by :func:`encode_message`."""
    d = json.loads(line)
    return Message(**{**d, "shape": tuple(d["shape"]), "auth": bytes.fromhex(d["auth"])})


class TranscriptState:
    """Checkpoint state of one transcript: its messages appended, one JSON line each, to ``path``."""

    def __init__(self, transcript: Transcript, path: str | Path):
        self.transcript = transcript
        self.path = Path(path)
        self._saved = 0  # messages written to the side file
        self._bytes = 0  # its length in bytes
        self._hash = hashlib.sha256()  # SHA-256 of those bytes
        self._fresh = True  # the next write starts a new file (a run not resumed)

    def encode(self) -> dict:
        """Append the new messages to the side file and return the checkpoint reference.

        Append the messages recorded since the last call to the side file (flushed to disk
        before returning, so a checkpoint never refers to bytes that are not there) and return the
        checkpoint's reference to it.
        """
        messages = self.transcript.messages
        if len(messages) < self._saved:
            raise RuntimeError("the transcript lost messages since the last checkpoint")
        data = "".join(encode_message(m) + "\n" for m in messages[self._saved :]).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "wb" if self._fresh else "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._fresh = False
        self._hash.update(data)
        self._saved, self._bytes = len(messages), self._bytes + len(data)
        return {"messages": self._saved, "bytes": self._bytes, "sha256": self._hash.hexdigest()}

    def restore(self, ref: dict) -> None:
        """Restore the transcript's messages from the side file.

        Replace the transcript's messages by the first ``ref["messages"]`` lines of the side
        file after checking their SHA-256; bytes after them are cut off.
        """

        def refuse(why: str):
            return ConfigError(f"--resume refused: {self.path} {why}; delete the run folder or run without --resume")

        if not (
            isinstance(ref, dict)
            and isinstance(ref.get("messages"), int)
            and isinstance(ref.get("bytes"), int)
            and isinstance(ref.get("sha256"), str)
        ):
            raise refuse("is referred to by a checkpoint of another format")
        try:
            with open(self.path, "rb") as f:
                data = f.read(ref["bytes"])
        except OSError as exc:
            raise refuse(f"cannot be read ({type(exc).__name__})") from None
        digest = hashlib.sha256(data)
        if len(data) != ref["bytes"] or digest.hexdigest() != ref["sha256"]:
            raise refuse("does not match the checkpoint's SHA-256 of the transcript (changed or truncated)")
        lines = data.decode().split("\n")[:-1] if data else []
        if len(lines) != ref["messages"]:
            raise refuse("holds another number of messages than the checkpoint")
        os.truncate(self.path, ref["bytes"])
        self.transcript.messages = [decode_message(line) for line in lines]
        self._saved, self._bytes, self._hash, self._fresh = len(lines), len(data), digest, False
