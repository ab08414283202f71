"""Messages as bytes: what crosses a :class:`~protocols.link.ClientLink`.

One signed message on the wire is (:mod:`protocols.message`)

    signature (64) || u32 header length || header || canonical body

so ``len(message_to_bytes(m)) == m.nbytes``: the transcript counts exactly these bytes.
A party answers a stage with several messages at once (e.g. a masked upload plus the
channel-encrypted shares for its peers), so one request or response is a *bundle*:

    u32 count || (u64 length || message bytes) * count

The bundle framing (4 + 8 per message bytes) is the transport's, like Ray's or gRPC's own
framing, and is not counted in the transcript.

Parsing is strict (:class:`~protocols.errors.MalformedMessageError`) but leaves the body
digest check to :func:`protocols.auth.verify`, so that a body changed in transit is reported as
a :class:`~protocols.errors.DigestError` by the receiver, as everywhere else; the parse hashes
the body bytes that arrived (``Message.received``), which the check compares with the signed
digest instead of re-encoding the payload.
"""

from __future__ import annotations

import hashlib
import struct
from typing import cast

from .errors import MalformedMessageError
from .message import SIGNATURE_BYTES, Envelope, decode_body, encode_body, split_message
from .transcript import Kind, Message

_U32, _U64 = struct.Struct(">I"), struct.Struct(">Q")
#: bytes a bundle adds around its messages: the count, then one length per message
BUNDLE_HEADER_BYTES, BUNDLE_ITEM_BYTES = 4, 8


def message_to_bytes(msg: Message) -> bytes:
    """The wire bytes of a sealed message (``msg.auth`` is ``signature || header``)."""
    auth = bytes(msg.auth or b"")
    signature, header = auth[:SIGNATURE_BYTES], auth[SIGNATURE_BYTES:]
    return signature + _U32.pack(len(header)) + header + encode_body(msg.payload)


def message_from_bytes(data: bytes | bytearray | memoryview) -> Message:
    """Strict parse of :func:`message_to_bytes`; ``nbytes`` is ``len(data)``."""
    signature, header, body = split_message(data)
    env = Envelope.from_header(header)
    payload = decode_body(body)
    return Message(
        env.round,
        env.tag,
        env.sender,
        env.recipient,
        cast(Kind, env.kind),  # any kind a signed header names; receivers check the one they expect
        env.shape,
        len(data),
        env.protocol,
        env.fingerprint,
        payload,
        auth=signature + header,
        received=(payload, hashlib.sha256(body).digest(), len(body)),
    )


def pack_bundle(messages: list[bytes]) -> bytes:
    """Several serialized messages as one transport payload."""
    parts = [_U32.pack(len(messages))]
    for m in messages:
        parts += (_U64.pack(len(m)), m)
    return b"".join(parts)


def unpack_bundle(data: bytes | bytearray | memoryview) -> list[memoryview]:
    """Inverse of :func:`pack_bundle`; strict.  The messages are views into ``data`` (no copy)."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < BUNDLE_HEADER_BYTES:
        raise MalformedMessageError("bundle truncated before its count")
    data = memoryview(bytes(data))
    (count,) = _U32.unpack_from(data, 0)
    pos, out = BUNDLE_HEADER_BYTES, []
    for _ in range(count):
        if pos + BUNDLE_ITEM_BYTES > len(data):
            raise MalformedMessageError("bundle truncated inside a length")
        (n,) = _U64.unpack_from(data, pos)
        pos += BUNDLE_ITEM_BYTES
        if pos + n > len(data):
            raise MalformedMessageError("bundle truncated inside a message")
        out.append(data[pos : pos + n])
        pos += n
    if pos != len(data):
        raise MalformedMessageError(f"{len(data) - pos} trailing bytes after the bundle")
    return out
