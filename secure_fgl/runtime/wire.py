"""Explicit serialization of what crosses between the driver and the client runtimes.

Only bytes cross the seam between parties: a request or response is a flat
mapping of names to numpy arrays / torch tensors (whitelisted numeric dtypes) and JSON
values, written as::

    MAGIC (6 bytes) | header length (4 bytes, big endian) | JSON header | raw array buffers

The header names each array's dtype, shape and byte range.  Nothing is unpickled, so a
malformed or hostile frame can only raise :class:`WireError`, never run code.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

MAGIC = b"SFGRT1"
#: dtypes an array may have on the wire
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float32", "float64")


class WireError(ValueError):
    """A frame that is not a well-formed runtime message."""


def pack(fields: Mapping[str, Any]) -> bytes:
    """``fields`` (name -> array, tensor or JSON value) as one frame."""
    arrays, values, buffers, offset = {}, {}, [], 0
    for name, value in fields.items():
        if torch.is_tensor(value):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            a = np.ascontiguousarray(value)
            if a.dtype.name not in DTYPES:
                raise WireError(f"field {name!r}: dtype {a.dtype} is not one of {', '.join(DTYPES)}")
            raw = a.tobytes()
            arrays[name] = [a.dtype.name, list(a.shape), offset, len(raw)]
            buffers.append(raw)
            offset += len(raw)
        else:
            values[name] = value
    header = json.dumps({"arrays": arrays, "values": values}, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack(">I", len(header)), header, *buffers])


def unpack(frame: bytes) -> dict[str, Any]:
    """Inverse of :func:`pack`; arrays come back as writable numpy arrays."""
    if not isinstance(frame, (bytes, bytearray, memoryview)) or bytes(frame[: len(MAGIC)]) != MAGIC:
        raise WireError("not a runtime frame (bad magic)")
    frame = memoryview(frame)
    start = len(MAGIC) + 4
    if len(frame) < start:
        raise WireError("truncated frame header")
    (hlen,) = struct.unpack(">I", frame[len(MAGIC) : start])
    try:
        header = json.loads(bytes(frame[start : start + hlen]))
        arrays, values = header["arrays"], header["values"]
    except (ValueError, KeyError, TypeError) as e:
        raise WireError(f"malformed frame header: {e}") from None
    body, out = frame[start + hlen :], dict(values)
    for name, (dtype, shape, off, n) in arrays.items():
        if dtype not in DTYPES or off < 0 or n < 0 or off + n > len(body):
            raise WireError(f"field {name!r}: bad dtype or byte range")
        a = np.frombuffer(body[off : off + n], dtype=dtype)
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise WireError(f"field {name!r}: {a.size} values do not fill shape {shape}")
        out[name] = a.reshape(shape).copy()
    return out
