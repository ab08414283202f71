"""The signed message envelope every backend sends, and its canonical byte encoding.

One message on the wire is ``signature (64) || header || body`` where

    header = MAGIC || field_1 || ... || field_n        (each field: u32 length || bytes)
    fields = run id, session nonce, protocol, context fingerprint, exchange number, round,
             tag, stage, part, sender, recipient, kind, shape, body digest = SHA-256(body),
             body length

and ``signature = Ed25519(sender's signing key, header)`` (:mod:`protocols.auth`).  The
header binds the body through its digest, so signing costs the same for any body size;
the digest is the only O(body) step.  Encoding is canonical (one byte string per
envelope) and parsing is strict: a truncated message, trailing bytes, a wrong magic, a
bad length, a non-UTF-8 string or an integer out of range raise
:class:`~protocols.errors.MalformedMessageError`.

The body is the canonical encoding (:func:`encode_body`) of the Python payload the
backends exchange (bytes, str, int, float, None, numpy arrays of numeric dtype, lists,
dicts): one type byte, then length-prefixed content; dict items sorted by their encoded
key, tuples encoded as lists.  :func:`body_digest` hashes that stream without building it.

The stage names of each backend (the exchange steps of Bonawitz et al. CCS 2017 §4 for
``mask``) are :data:`STAGES`; ``part`` numbers the pieces of a streamed stage (CKKS chunks).
The **session nonce** is fresh per protocol object (os.urandom): a resumed run re-sends a
round under a new session, which is not a replay; the **exchange number** counts the
exchanges of a session, so a message of an earlier exchange is a replay even when tag and
round are reused.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from .errors import MalformedMessageError

MAGIC = b"SFGLMSG1"
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32
NONCE_BYTES = 16
#: stages of each backend, in protocol order ('register', 'directory' (the clients' public keys),
#: 'plan' (the public plan of an exchange, :mod:`protocols.plan`), 'block_ids' and 'report' -- a value a
#: client publishes in the clear by design, e.g. GCFL's update norms -- are shared)
SHARED_STAGES = ("register", "directory", "plan")
STAGES = {
    "mask": SHARED_STAGES
    + (
        "group_seed",
        "block_ids",
        "advertise_keys",
        "share_keys",
        "masked_upload",
        "consistency",
        "unmask",
        "download",
        "report",
    ),
    "ckks": SHARED_STAGES + ("key_setup", "block_ids", "upload", "download", "report"),
    "plain": SHARED_STAGES + ("block_ids", "upload", "download", "report"),
    "ckks-mp": SHARED_STAGES + ("key_setup", "block_ids", "upload", "keyswitch", "download", "release", "report"),
}
_U32, _U64, _I64 = struct.Struct(">I"), struct.Struct(">Q"), struct.Struct(">q")
_MAX_FIELD = 1 << 16  # header strings are short; anything longer is garbage
_MAX_DIMS = 32


@dataclass(frozen=True)
class Envelope:
    """Header of one message.

    ``body`` (its canonical bytes) is optional on the receiving side of the simulation, where the digest is checked
    against the delivered payload.
    """

    run_id: bytes
    session: bytes
    protocol: str
    fingerprint: str
    exchange: int
    round: int
    tag: str
    stage: str
    part: int
    sender: str
    recipient: str
    kind: str
    shape: tuple[int, ...]
    digest: bytes
    body_len: int
    body: bytes | None = field(default=None, compare=False)

    # ------------------------------------------------------------------ encoding
    def header_bytes(self) -> bytes:
        """The canonical signed header."""
        for name, value, size in (
            ("run id", self.run_id, NONCE_BYTES),
            ("session", self.session, NONCE_BYTES),
            ("digest", self.digest, DIGEST_BYTES),
        ):
            if not isinstance(value, bytes) or len(value) != size:
                raise MalformedMessageError(f"envelope {name} must be {size} bytes")
        if not (
            0 <= self.exchange < 1 << 64
            and -(1 << 63) <= self.round < 1 << 63
            and 0 <= self.part < 1 << 32
            and 0 <= self.body_len < 1 << 64
        ):
            raise MalformedMessageError(
                "envelope exchange/round/part/body length out of range "
                f"({self.exchange}, {self.round}, {self.part}, {self.body_len})"
            )
        if len(self.shape) > _MAX_DIMS or any(not 0 <= int(d) < 1 << 63 for d in self.shape):
            raise MalformedMessageError(f"envelope shape {self.shape!r} is not a list of non-negative sizes")
        fields = [
            self.run_id,
            self.session,
            _text(self.protocol),
            _text(self.fingerprint),
            _U64.pack(self.exchange),
            _I64.pack(self.round),
            _text(self.tag),
            _text(self.stage),
            _U32.pack(self.part),
            _text(self.sender),
            _text(self.recipient),
            _text(self.kind),
            b"".join(_U64.pack(int(d)) for d in self.shape),
            self.digest,
            _U64.pack(self.body_len),
        ]
        return MAGIC + b"".join(_U32.pack(len(f)) + f for f in fields)

    def to_bytes(self, signature: bytes) -> bytes:
        """``signature || u32 header length || header || body`` — what goes on the wire."""
        if self.body is None:
            raise MalformedMessageError("an envelope without its body cannot be serialized")
        header = self.header_bytes()
        return bytes(signature) + _U32.pack(len(header)) + header + self.body

    @classmethod
    def from_header(cls, header: bytes, body: bytes | None = None) -> Envelope:
        """Strict parse of :meth:`header_bytes` (and, with ``body``, its length and digest check)."""
        if not isinstance(header, (bytes, bytearray)) or not header.startswith(MAGIC):
            raise MalformedMessageError("envelope header does not start with the message magic")
        env = _parse_header(bytes(header))
        if body is None:
            return env
        if len(body) != env.body_len or hashlib.sha256(body).digest() != env.digest:
            raise MalformedMessageError("message body does not match the length and digest in its header")
        return replace(env, body=body)

    @classmethod
    def from_bytes(cls, data: bytes) -> tuple[Envelope, bytes]:
        """Strict parse of :meth:`to_bytes`: ``(envelope with body, signature)``."""
        signature, header, body = split_message(data)
        env = cls.from_header(header)
        if len(body) != env.body_len:
            raise MalformedMessageError(f"message body is {len(body)} bytes, its header says {env.body_len}")
        return cls.from_header(header, body), signature


@lru_cache(maxsize=4096)
def _parse_header(view: bytes) -> Envelope:
    """The strict, memoised parse behind :meth:`Envelope.from_header`.

    The strict parse behind :meth:`Envelope.from_header`, memoised on the exact header bytes: a
    receiver reads one header several times (bundle parse, routing, verification), and an
    :class:`Envelope` is immutable, so the same bytes always give the same envelope.  A header that
    fails to parse raises every time (exceptions are not cached).
    """
    pos, parts, size, unpack = len(MAGIC), [], len(view), _U32.unpack_from
    for _ in range(15):
        if pos + 4 > size:
            raise MalformedMessageError("envelope header truncated")
        (n,) = unpack(view, pos)
        end = pos + 4 + n
        if n > _MAX_FIELD or end > size:
            raise MalformedMessageError(f"envelope field length {n} exceeds the header")
        parts.append(view[pos + 4 : end])
        pos = end
    if pos != size:
        raise MalformedMessageError(f"{size - pos} trailing bytes after the envelope header")
    (run_id, session, protocol, fp, exch, rnd, tag, stage, part, sender, recipient, kind, shape, digest, body_len) = (
        parts
    )
    for name, raw, size in (
        ("exchange", exch, 8),
        ("round", rnd, 8),
        ("part", part, 4),
        ("body length", body_len, 8),
        ("run id", run_id, NONCE_BYTES),
        ("session", session, NONCE_BYTES),
        ("digest", digest, DIGEST_BYTES),
    ):
        if len(raw) != size:
            raise MalformedMessageError(f"envelope {name} field is {len(raw)} bytes, expected {size}")
    if len(shape) % 8 or len(shape) > 8 * _MAX_DIMS:
        raise MalformedMessageError("envelope shape field is not a list of u64 sizes")
    env = Envelope(
        run_id,
        session,
        _untext(protocol),
        _untext(fp),
        _U64.unpack(exch)[0],
        _I64.unpack(rnd)[0],
        _untext(tag),
        _untext(stage),
        _U32.unpack(part)[0],
        _untext(sender),
        _untext(recipient),
        _untext(kind),
        tuple(v for (v,) in _U64.iter_unpack(shape)),
        digest,
        _U64.unpack(body_len)[0],
    )
    if any(d >= 1 << 63 for d in env.shape):
        raise MalformedMessageError("envelope shape entry out of range")
    if env.protocol in STAGES and env.stage not in STAGES[env.protocol]:
        raise MalformedMessageError(f"unknown stage {env.stage!r} for protocol {env.protocol!r}")
    return env


def split_message(data: bytes | bytearray | memoryview) -> tuple[bytes, bytes, bytes]:
    """``(signature, header, body)`` of a message's wire bytes; MalformedMessageError if truncated."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < SIGNATURE_BYTES + 4:
        raise MalformedMessageError("message truncated before its header")
    data = memoryview(data)
    (n,) = _U32.unpack_from(data, SIGNATURE_BYTES)
    start = SIGNATURE_BYTES + 4
    if start + n > len(data):
        raise MalformedMessageError("message truncated inside its header")
    return bytes(data[:SIGNATURE_BYTES]), bytes(data[start : start + n]), bytes(data[start + n :])


def _text(s: str) -> bytes:
    if not isinstance(s, str):
        raise MalformedMessageError(f"envelope text field must be str, got {type(s).__name__}")
    try:
        raw = s.encode("utf-8")
    except UnicodeEncodeError:
        raise MalformedMessageError(f"envelope text field {s!r} is not valid UTF-8") from None
    if len(raw) > _MAX_FIELD:
        raise MalformedMessageError("envelope text field too long")
    return raw


def _untext(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedMessageError("envelope text field is not valid UTF-8") from None


# ---------------------------------------------------------------------- canonical body
def _pieces(obj: Any) -> list[bytes | memoryview]:
    """The canonical encoding of ``obj`` as a list of byte strings (arrays as views, not copies)."""
    parts: list[bytes | memoryview] = []
    _encode(obj, parts)
    return parts


def _encode(obj: Any, parts: list[bytes | memoryview]) -> None:
    t = type(obj)
    if t is bytes:  # the common types first, by exact type (no isinstance chain)
        parts.append(b"B" + _U64.pack(len(obj)))
        parts.append(obj)
    elif t is str:
        b = _text(obj) if len(obj) <= _MAX_FIELD else obj.encode("utf-8", "strict")
        parts.append(b"S" + _U64.pack(len(b)) + b)
    elif t is int:
        b = obj.to_bytes((obj.bit_length() + 8) // 8, "big", signed=True)
        parts.append(b"I" + _U32.pack(len(b)) + b)
    elif t is dict:
        items = sorted(((_key_bytes(k), v) for k, v in obj.items()), key=lambda kv: kv[0])
        parts.append(b"M" + _U64.pack(len(items)))
        for kb, value in items:
            parts.append(kb)
            _encode(value, parts)
    elif t is list or t is tuple:
        parts.append(b"L" + _U64.pack(len(obj)))
        for item in obj:
            _encode(item, parts)
    elif obj is None:
        parts.append(b"N")
    elif isinstance(obj, bool):
        parts.append(b"T" if obj else b"F")
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        b = bytes(obj)
        parts.append(b"B" + _U64.pack(len(b)))
        parts.append(b)
    elif isinstance(obj, str):
        _encode(str(obj), parts)
    elif isinstance(obj, (int, np.integer)):
        _encode(int(obj), parts)
    elif isinstance(obj, (float, np.floating)):
        parts.append(b"D" + struct.pack(">d", float(obj)))
    elif isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise MalformedMessageError(f"array payloads must be numeric, got dtype {obj.dtype}")
        a = np.ascontiguousarray(obj)
        d = a.dtype.str.encode()
        parts.append(b"A" + _U32.pack(len(d)) + d + _U32.pack(a.ndim) + b"".join(_U64.pack(s) for s in a.shape))
        parts.append(a.data.cast("B") if a.size else b"")
    elif isinstance(obj, (list, tuple)):
        _encode(list(obj), parts)
    elif isinstance(obj, dict):
        _encode(dict(obj), parts)
    else:
        raise MalformedMessageError(f"payload of type {type(obj).__name__} has no canonical encoding")


def _key_bytes(key: Any) -> bytes:
    """The canonical encoding of a dict key (items are sorted by it)."""
    t = type(key)
    if t is int:
        b: bytes = key.to_bytes((key.bit_length() + 8) // 8, "big", signed=True)
        return b"I" + _U32.pack(len(b)) + b
    if t is str and len(key) <= _MAX_FIELD:
        b = _text(key)
        return b"S" + _U64.pack(len(b)) + b
    return b"".join(_pieces(key))


def encode_body(payload: Any) -> bytes:
    """Canonical bytes of a payload."""
    return b"".join(_pieces(payload))


def body_digest(payload: Any) -> tuple[bytes, int]:
    """``(SHA-256, length)`` of :func:`encode_body` of ``payload``, computed in one pass without building it."""
    h, n = hashlib.sha256(), 0
    for piece in _pieces(payload):
        h.update(piece)
        n += len(piece)
    return h.digest(), n


def decode_body(data: bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`encode_body`; strict (truncation or trailing bytes raise).

    Arrays are
    read-only views into ``data`` when it is (a view of) immutable ``bytes``, as the framing's
    messages are: a received body is not copied again per array.
    """
    if not (isinstance(data, bytes) or isinstance(data, memoryview) and isinstance(data.obj, bytes)):
        data = bytes(data)
    data = memoryview(data)
    value, pos = _read(data, 0, 0)
    if pos != len(data):
        raise MalformedMessageError(f"{len(data) - pos} trailing bytes after the message body")
    return value


_T_NONE, _T_TRUE, _T_FALSE, _T_BYTES, _T_STR, _T_INT, _T_FLOAT, _T_ARRAY, _T_LIST, _T_MAP = b"NTFBSIDALM"
_MAX_DEPTH = 16
_UNPACK_U32, _UNPACK_U64 = _U32.unpack_from, _U64.unpack_from
_UNPACK_F64 = struct.Struct(">d").unpack_from


@lru_cache(maxsize=64)
def _array_dtype(raw: bytes) -> np.dtype:
    """The numeric dtype an array body names (memoised: a run uses a handful)."""
    try:
        dtype = np.dtype(_untext(raw))
    except TypeError:
        raise MalformedMessageError("array body has an unknown dtype") from None
    if dtype.kind not in "biuf":
        raise MalformedMessageError(f"array body has non-numeric dtype {dtype}")
    return dtype


def _truncated() -> MalformedMessageError:
    return MalformedMessageError("message body truncated")


def _read(data: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    """One value of the canonical body at ``pos``: ``(value, position after it)``; strict."""
    if depth > _MAX_DEPTH:
        raise MalformedMessageError("message body nested too deeply")
    size = len(data)
    if pos >= size:
        raise _truncated()
    t = data[pos]
    pos += 1
    if t == _T_BYTES or t == _T_STR:
        if pos + 8 > size:
            raise _truncated()
        end = pos + 8 + _UNPACK_U64(data, pos)[0]
        if end > size:
            raise _truncated()
        raw = bytes(data[pos + 8 : end])
        return (raw if t == _T_BYTES else _untext(raw)), end
    if t == _T_INT:
        if pos + 4 > size:
            raise _truncated()
        end = pos + 4 + _UNPACK_U32(data, pos)[0]
        if end > size:
            raise _truncated()
        return int.from_bytes(data[pos + 4 : end], "big", signed=True), end
    if t == _T_LIST or t == _T_MAP:
        if pos + 8 > size:
            raise _truncated()
        (n,) = _UNPACK_U64(data, pos)
        pos += 8
        if n > size:
            raise MalformedMessageError("message body count exceeds its length")
        if t == _T_LIST:
            items = []
            for _ in range(n):
                v, pos = _read(data, pos, depth + 1)
                items.append(v)
            return items, pos
        out = {}
        for _ in range(n):
            k, pos = _read(data, pos, depth + 1)
            v, pos = _read(data, pos, depth + 1)
            try:
                out[k] = v
            except TypeError:
                raise MalformedMessageError("message body has an unhashable dict key") from None
        return out, pos
    if t == _T_ARRAY:
        if pos + 4 > size:
            raise _truncated()
        end = pos + 4 + _UNPACK_U32(data, pos)[0]
        if end > size:
            raise _truncated()
        dtype = _array_dtype(bytes(data[pos + 4 : end]))
        if end + 4 > size:
            raise _truncated()
        (ndim,) = _UNPACK_U32(data, end)
        if ndim > _MAX_DIMS:
            raise MalformedMessageError("array body has too many dimensions")
        start = end + 4 + 8 * ndim
        if start > size:
            raise _truncated()
        shape = struct.unpack_from(f">{ndim}Q", data, end + 4)
        stop = start + math.prod(shape) * dtype.itemsize
        if stop > size:
            raise _truncated()
        return np.frombuffer(data[start:stop], dtype=dtype).reshape(shape), stop
    if t == _T_NONE:
        return None, pos
    if t == _T_TRUE or t == _T_FALSE:
        return t == _T_TRUE, pos
    if t == _T_FLOAT:
        if pos + 8 > size:
            raise _truncated()
        return _UNPACK_F64(data, pos)[0], pos + 8
    raise MalformedMessageError(f"unknown body type byte {bytes([t])!r}")
