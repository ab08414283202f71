"""The transcript's metadata in a checkpoint, encoded once per message.

A checkpoint is written after every round and carries every message of the run so far (without
payloads) so that a resumed run reports the same communication.  Converting the whole list to
plain data each round (a dict per message, its signed envelope as a uint8 tensor) made the
checkpoint cost grow with the square of the rounds and dominate secure runs, whose transcripts
hold many more messages than plain ones.  :class:`TranscriptState` keeps the JSON line of every
message already encoded and encodes only the messages recorded since the last checkpoint; the
checkpoint holds one string (``torch.load(weights_only=True)`` accepts it).
"""
from __future__ import annotations

import dataclasses
import json

from protocols.transcript import Message, Transcript

#: Message fields saved (the payload is never checkpointed)
FIELDS = tuple(f.name for f in dataclasses.fields(Message) if f.name != "payload")


def encode_message(m: Message) -> str:
    d = {name: getattr(m, name) for name in FIELDS}
    d["shape"] = [int(x) for x in m.shape]
    d["auth"] = bytes(m.auth).hex()
    return json.dumps(d, separators=(",", ":"), default=int)


def decode_message(line: str) -> Message:
    d = json.loads(line)
    return Message(**{**d, "shape": tuple(d["shape"]), "auth": bytes.fromhex(d["auth"])})


class TranscriptState:
    """Incremental checkpoint encoding of one transcript (one JSON line per message)."""

    def __init__(self, transcript: Transcript):
        self.transcript = transcript
        self._lines: list[str] = []

    def encode(self) -> str:
        """Every message's metadata, one JSON line each; only new messages are encoded.  Messages
        are only ever appended (the payload policy strips payloads, which are not saved)."""
        messages = self.transcript.messages
        if len(messages) < len(self._lines):        # replaced by a resume: start over
            self._lines = []
        self._lines.extend(encode_message(m) for m in messages[len(self._lines):])
        return "\n".join(self._lines)

    def restore(self, text: str) -> None:
        """Replace the transcript's messages by those of :meth:`encode`'s ``text``."""
        self._lines = text.split("\n") if text else []
        self.transcript.messages = [decode_message(line) for line in self._lines]
