"""Cost of the signed message envelope (protocols.message / protocols.auth).

Prints and writes ``DIR/messages.json``: envelope header bytes and per-message overhead
(signature + length + header), Ed25519 sign and verify time, SHA-256 body-digest time of a
4 MB body, and the mask backend's bytes per client against float32 on 1e6 floats in [-1, 1]
(K=10, ``weighted_sum``, tolerance 1e-4: the workload (b) of :mod:`secure_fgl.bench.protocols`).

Run: ``python -m secure_fgl.bench.messages --out runs/bench``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from protocols import SERVER, ValueSpec, make_protocol
from protocols.auth import SigningKey
from protocols.message import SIGNATURE_BYTES, Envelope, body_digest


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run_message_bench(out_dir: str, floats: int = 1_000_000, clients: int = 10) -> dict:
    """Envelope bytes, sign/verify/digest times and mask's bytes per client; writes ``OUT/messages.json``."""
    body = {"block_ids": np.arange(245, dtype=np.int32), "data": np.random.default_rng(0).bytes(4 << 20)}
    digest, n = body_digest(body)
    env = Envelope(
        bytes(16),
        bytes(16),
        "mask",
        "0" * 16,
        1,
        0,
        "fedavg/model",
        "masked_upload",
        0,
        "client1",
        SERVER,
        "masked",
        (245, 4096),
        digest,
        n,
    )
    header = env.header_bytes()
    key = SigningKey()
    sig = key.sign(header)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    pub = Ed25519PublicKey.from_public_bytes(key.public_bytes)
    rec = {
        "header_bytes": len(header),
        "signature_bytes": SIGNATURE_BYTES,
        "overhead_bytes_per_message": SIGNATURE_BYTES + 4 + len(header),
        "sign_us": 1e6 * _best(lambda: key.sign(header), 200),
        "verify_us": 1e6 * _best(lambda: pub.verify(sig, header), 200),
        "digest_ms_4MB": 1e3 * _best(lambda: body_digest(body), 20),
    }
    vals = {k: np.random.default_rng(k).uniform(-1, 1, floats) for k in range(clients)}
    proto = make_protocol("mask", clients)
    t = time.perf_counter()
    proto.weighted_sum("b/floats", 0, vals, spec=ValueSpec(max_abs=1.0, tolerance=1e-4))
    rec["mask_total_s"] = time.perf_counter() - t
    up = [m for m in proto.transcript.messages if m.tag == "b/floats" and m.sender == "client0"]
    rec["mask_bytes_up_per_client"] = sum(m.nbytes for m in up)
    rec["mask_messages_up_per_client"] = len(up)
    rec["mask_ratio_vs_float32"] = rec["mask_bytes_up_per_client"] / (4 * floats)
    rec["mask_ring_bits"] = proto.last_encoding.ring_bits
    rec["registration_bytes_per_client"] = sum(
        m.nbytes for m in proto.transcript.messages if m.tag == "auth/keys" and m.sender == "client0"
    )
    for k, v in rec.items():
        print(f"{k:32s} {v:.4g}" if isinstance(v, float) else f"{k:32s} {v}")
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "messages.json").write_text(json.dumps(rec, indent=1))
    return rec


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench", help="folder the results are written to")
    run_message_bench(ap.parse_args().out)
