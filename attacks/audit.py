"""Transcript audit.

What each party saw, and whether a secure mode hides every individual contribution from the server.

Checks, for a run in a secure mode (``ckks``/``mask``):

1. **Kinds.**  Every message the server receives is ``ciphertext``/``masked`` (or a
   ``public_key``, ``metadata``, ``share`` or ``control``: mask's share commitments and
   survivor-set MACs); a ``plain`` upload fails, and so does any
   ``secret_key`` reaching the server.
2. **Sizes.**  Uploads of one exchange (tag, round) have equal sizes across clients unless
   the exchange declares a data-dependent layout (client ``metadata`` messages in the same
   exchange: the sparse row layout's published block ids, a documented leak -> warning).
   A spread of at most :data:`SIZE_JITTER` (2 %) is compressed-serialisation jitter (CKKS
   ciphertexts are uniformly random whatever they encrypt; their zstd length varies a little)
   and only warned about.
3. **Side fields.**  No plaintext number rides along a protected payload: float leaves in a
   ciphertext/masked/metadata payload, float ring elements in a masked payload, or fields named
   like counts/ratios/norms/weights fail.
4. **Aggregates.**  A ``plain`` download the server sends means it can read that aggregate:
   reported as a warning (allowed by the threat model, but it is what server-side attacks on
   aggregates then read).

A **declared release** (:data:`DECLARED_RELEASES`: a message outside the protocol's exchanges
that the run publishes to the server on purpose, e.g. the client runtimes' evaluation counts)
is listed as a warning naming what it releases, and is not an exchange of the size table.

The audit never decrypts anything; it reads only message metadata and payload *types*.
Secure-mode attack results are called "at chance" only when the audit passed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from protocols.transcript import SERVER, Message

#: kinds the server may receive in a secure mode
SECURE_SERVER_KINDS = frozenset({"ciphertext", "masked", "public_key", "metadata", "share", "control"})
#: plaintext messages to the server a run publishes on purpose, outside the protocol's exchanges
#: (tag -> what it releases); ``eval/counts``: :data:`secure_fgl.runtime.strategy.EVAL_TAG`
DECLARED_RELEASES = {"eval/counts": "each client's correct/total counts per split (evaluation)"}
#: payload keys that are structural (ids, who-is-included), never data
STRUCTURAL_KEYS = frozenset(
    {
        "block_ids",
        "ids",
        "included",
        "blocks",
        "round",
        "tag",
        "sender",
        "receiver",
        "shape",
        "peer",
        "peers",
        "client",
        "clients",
        "index",
        "share_index",
    }
)
#: relative spread of upload sizes in a dense exchange tolerated as serialisation jitter
SIZE_JITTER = 0.02
SIDE_FIELD = re.compile(
    r"(^|_)(count|counts|n_k|num|n|weight|weights|ratio|ratios|norm|norms|size|sizes|"
    r"label|labels|dist|prior|mean|sum)($|_)",
    re.I,
)


@dataclass
class AuditReport:
    """Result of :func:`audit_transcript`.

    ``passed`` is meaningful for secure modes; for ``plain`` the failures are the expected exposure and are listed as
    such.
    """

    mode: str
    secure: bool
    passed: bool
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    parties: dict[str, dict] = field(default_factory=dict)
    exchanges: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The report as JSON-ready data (at most 50 failures and 50 warnings listed, with their full counts)."""
        return {
            "mode": self.mode,
            "secure": self.secure,
            "passed": self.passed,
            "failures": self.failures[:50],
            "num_failures": len(self.failures),
            "warnings": self.warnings[:50],
            "num_warnings": len(self.warnings),
            "parties": self.parties,
            "exchanges": self.exchanges,
        }

    def __str__(self) -> str:
        head = f"transcript audit [{self.mode}]: {'PASS' if self.passed else 'FAIL'}"
        lines = [head] + [f"  FAIL {f}" for f in self.failures[:20]] + [f"  warn {w}" for w in self.warnings[:20]]
        return "\n".join(lines)


def _leaves(obj: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)) and obj and not isinstance(obj[0], (int, float, np.number)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def _is_float_data(v: Any) -> bool:
    if isinstance(v, (bool, np.bool_)):
        return False
    if isinstance(v, (float, np.floating)):
        return True
    if isinstance(v, np.ndarray):
        return v.dtype.kind in "fc"
    if isinstance(v, (list, tuple)) and v and all(isinstance(e, (float, np.floating)) for e in v):
        return True
    try:
        import torch

        if torch.is_tensor(v):
            return v.is_floating_point()
    except Exception:  # pragma: no cover
        pass
    return False


def _is_number_data(v: Any) -> bool:
    if isinstance(v, (bytes, bytearray, memoryview, str)):
        return False
    if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
        return True
    if isinstance(v, np.ndarray):
        return v.dtype.kind in "iufc"
    return _is_float_data(v)


def payload_side_fields(msg: Message) -> list[str]:
    """Plaintext numeric fields riding in a protected (ciphertext/masked/metadata/share) payload."""
    p = msg.payload
    if p is None or isinstance(p, (bytes, bytearray, memoryview)):
        return []
    found = []
    for path, leaf in _leaves(p):
        key = path.split(".")[-1].split("[")[0]
        if key in STRUCTURAL_KEYS:
            continue
        if msg.kind == "masked":
            # masked data must be ring elements (integers); floats are plaintext
            if _is_float_data(leaf):
                found.append(f"{path or '<payload>'} (float values in a masked payload)")
            elif key and SIDE_FIELD.search(key) and _is_number_data(leaf):
                found.append(f"{path} (named side field)")
        elif msg.kind in ("ciphertext", "share", "public_key"):
            if _is_float_data(leaf):
                found.append(f"{path or '<payload>'} (plaintext floats)")
            elif key and SIDE_FIELD.search(key) and _is_number_data(leaf):
                found.append(f"{path} (named side field)")
        elif msg.kind in ("metadata", "control"):  # control: share commitments, survivor-set MACs
            if _is_float_data(leaf) or (key and SIDE_FIELD.search(key) and _is_number_data(leaf)):
                found.append(f"{path or '<payload>'} (numbers beyond ids in metadata)")
    return found


def audit_transcript(messages: Iterable[Message], *, mode: str = "unknown", secure: bool | None = None) -> AuditReport:
    """Audit a list of messages (``Transcript.messages``).

    ``secure`` defaults to true unless ``mode`` is a registered backend that is not secure (:mod:`protocols.registry`).
    """
    messages = list(messages)
    if secure is None:  # only a registered backend that says so is audited as not secure
        from protocols.registry import modes, secure_modes

        secure = mode in secure_modes() or mode not in modes()
    secure = bool(secure)
    failures, warnings = [], []

    parties: dict[str, dict] = defaultdict(
        lambda: {"sent": defaultdict(lambda: [0, 0]), "received": defaultdict(lambda: [0, 0]), "readable_bytes": 0}
    )
    for m in messages:
        parties[m.sender]["sent"][m.kind][0] += 1
        parties[m.sender]["sent"][m.kind][1] += int(m.nbytes)
        parties[m.receiver]["received"][m.kind][0] += 1
        parties[m.receiver]["received"][m.kind][1] += int(m.nbytes)
        if m.kind in ("plain", "public_key", "metadata"):
            parties[m.receiver]["readable_bytes"] += int(m.nbytes)

    # -- 1, 3: kinds and side fields of what the server receives (grouped per tag and problem)
    groups: dict[tuple[str, str], dict] = {}

    def flag(bucket: str, m: Message, what: str) -> None:
        g = groups.setdefault((bucket, f"{m.tag}: {what}"), {"n": 0, "rounds": set(), "parties": set()})
        g["n"] += 1
        g["rounds"].add(m.round)
        g["parties"].add(m.sender if m.receiver == SERVER else m.receiver)

    for m in messages:
        if m.receiver == SERVER and m.tag in DECLARED_RELEASES and m.kind == "plain":
            flag("warn", m, f"declared release to the server in plain: {DECLARED_RELEASES[m.tag]}")
        elif m.receiver == SERVER:
            if m.kind == "secret_key":
                flag("fail", m, "the server received a secret key")
            elif m.kind not in SECURE_SERVER_KINDS:
                flag(
                    "fail",
                    m,
                    f"'{m.kind}' upload readable by the server" + (" (expected in plain mode)" if not secure else ""),
                )
            else:
                for f in payload_side_fields(m):
                    flag("fail", m, f"plaintext side field {f} in a '{m.kind}' message")
        elif m.sender == SERVER and m.kind == "plain" and secure:
            flag("warn", m, "the server sends (so reads) this aggregate in plain")
    for (bucket, what), g in groups.items():
        r = sorted(g["rounds"])
        rounds = f"round {r[0]}" if len(r) == 1 else f"rounds {r[0]}..{r[-1]}"
        line = f"{what} -- {g['n']} message(s), {rounds}, {len(g['parties'])} part(ies)"
        (failures if bucket == "fail" else warnings).append(line)

    # -- 2: sizes per exchange
    by_ex: dict[tuple[str, int], list[Message]] = defaultdict(list)
    for m in messages:
        if m.receiver == SERVER and m.tag not in DECLARED_RELEASES:
            by_ex[(m.tag, m.round)].append(m)
    table: dict[str, dict] = {}
    for (tag, rnd), msgs in sorted(by_ex.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        data = [m for m in msgs if m.kind in ("plain", "ciphertext", "masked")]
        declared_sparse = any(m.kind == "metadata" for m in msgs)
        sizes = defaultdict(int)
        for m in data:
            sizes[m.sender] += int(m.nbytes)
        varies = len(set(sizes.values())) > 1
        row = table.setdefault(
            tag,
            {
                "tag": tag,
                "kinds_up": set(),
                "rounds": 0,
                "bytes_up": 0,
                "min_client_bytes": None,
                "max_client_bytes": None,
                "size_depends_on_data": False,
                "layout": "dense",
                "side_fields": 0,
            },
        )
        row["kinds_up"].update(m.kind for m in msgs)
        row["rounds"] += 1
        row["bytes_up"] += sum(int(m.nbytes) for m in msgs)
        if sizes:
            lo, hi = min(sizes.values()), max(sizes.values())
            row["min_client_bytes"] = lo if row["min_client_bytes"] is None else min(lo, row["min_client_bytes"])
            row["max_client_bytes"] = hi if row["max_client_bytes"] is None else max(hi, row["max_client_bytes"])
        if declared_sparse:
            row["layout"] = "sparse"
        spread = (max(sizes.values()) - min(sizes.values())) / max(1, max(sizes.values())) if sizes else 0.0
        if varies and not declared_sparse and spread <= SIZE_JITTER:
            # compressed ciphertext serialisation (SEAL/zstd): lengths jitter with the random
            # ciphertext bits, whose distribution does not depend on the plaintext
            row["size_jitter"] = max(row.get("size_jitter", 0.0), spread)
            if secure:
                warnings.append(
                    f"{tag} round {rnd}: upload sizes jitter by {spread:.2%} across clients "
                    "(compressed serialisation; within tolerance)"
                )
        elif varies:
            row["size_depends_on_data"] = True
            if secure and not declared_sparse:
                failures.append(
                    f"{tag} round {rnd}: upload sizes differ across clients "
                    f"({min(sizes.values())}..{max(sizes.values())} bytes) in a dense layout"
                )
            elif secure:
                warnings.append(
                    f"{tag} round {rnd}: upload sizes depend on the data (sparse layout, "
                    "block ids published as metadata)"
                )
        row["side_fields"] += sum(len(payload_side_fields(m)) for m in msgs if m.kind in SECURE_SERVER_KINDS)
    exchanges = []
    for row in table.values():
        row["kinds_up"] = sorted(row["kinds_up"])
        exchanges.append(row)

    party_out = {
        p: {
            "sent": {k: {"messages": v[0], "bytes": v[1]} for k, v in d["sent"].items()},
            "received": {k: {"messages": v[0], "bytes": v[1]} for k, v in d["received"].items()},
            "readable_bytes": d["readable_bytes"],
        }
        for p, d in sorted(parties.items())
    }
    passed = not failures
    return AuditReport(
        mode=mode,
        secure=secure,
        passed=passed,
        failures=failures,
        warnings=warnings,
        parties=party_out,
        exchanges=exchanges,
    )


def audit_protocol(protocol) -> AuditReport:
    """Audit a protocol object's transcript; secure iff its backend is (:mod:`protocols.registry`)."""
    return audit_transcript(protocol.transcript.messages, mode=getattr(protocol, "mode", "unknown"))
