"""The transcript: every message of a run, and what each party can read.

Communication accounting (``result.json['comm']``) and the attack suite both read
the transcript, so what is reported as sent is what was sent.  Payloads are kept
according to a policy (all, the latest round of each tag, or none) so that long
runs do not hold every model update in memory; metadata is always kept.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

SERVER = "server"

Kind = Literal["plain", "ciphertext", "masked", "public_key", "secret_key", "metadata", "share", "control"]
#: kinds a party can read without a key it does not hold
READABLE_KINDS = frozenset({"plain", "public_key", "metadata", "control"})


def client_party(client: int) -> str:
    """Party name of client ``client`` (``'client3'``)."""
    return f"client{client}"


def party_client(party: str) -> int | None:
    """Inverse of :func:`client_party`; ``None`` for the server."""
    return int(party[6:]) if party.startswith("client") else None


@dataclass(frozen=True)
class Message:
    """One message on the wire.

    ``kind`` says what the receiver can do with the payload: ``plain`` is readable by
    anyone who sees it; ``ciphertext`` needs the CKKS secret key; ``masked`` is a
    one-time-padded vector; ``share`` is a secret share; ``metadata`` are ids/counts
    the protocol publishes on purpose (e.g. which row blocks a client touches in the
    sparse layout); ``control`` is what the server composes from public facts alone (the plan of
    an exchange, an unmasking request) and carries nothing of a client.  ``nbytes`` is the serialized size actually sent: for a signed message,
    signature + envelope header + canonical body.  A client-to-client message relayed by the
    server has ``relay == "server"`` and appears in the server's :meth:`Transcript.view`.
    """

    round: int
    tag: str
    sender: str
    receiver: str
    kind: Kind
    shape: tuple[int, ...]
    nbytes: int
    protocol: str
    fingerprint: str
    payload: Any = None
    note: str = ""
    #: ``signature || envelope header`` (:mod:`protocols.message`) of a signed message, else b""
    auth: bytes = b""
    #: the party that relayed a client-to-client message ("server"), else ""
    relay: str = ""
    #: on the receiving side, ``(payload, SHA-256, length)`` of the body bytes this message was
    #: parsed from (:func:`protocols.framing.message_from_bytes`): the signed digest is checked
    #: against the bytes that arrived.  Valid only for that very payload object: a copy with
    #: another payload drops it (and so cannot keep a stripped payload alive).
    received: tuple[Any, bytes, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.received is not None and self.received[0] is not self.payload:
            object.__setattr__(self, "received", None)

    def without_payload(self) -> Message:
        """A copy with the payload dropped (size and metadata kept)."""
        return replace(self, payload=None)


@dataclass
class Transcript:
    """Ordered record of messages.

    keep_payloads: ``"all"``, ``"latest"`` (payloads of the most recent round of each
    tag; older ones dropped) or ``"none"``.
    """

    keep_payloads: Literal["all", "latest", "none"] = "latest"
    messages: list[Message] = field(default_factory=list)
    _latest_round: dict[str, int] = field(default_factory=dict)
    #: tag -> [bytes_up, bytes_down] the exchange would cost as plaintext float32
    plaintext_equiv: dict[str, list[int]] = field(default_factory=dict)
    #: batch tag -> ((part tag, entries), ...): how ``comm()`` attributes a batch's bytes
    #: (:mod:`protocols.batch`)
    batches: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)

    def attribute(self, batch_tag: str, layout: tuple[tuple[str, int], ...]) -> None:
        """Record how a batched exchange ``batch_tag`` splits into (tag, values) parts."""
        self.batches[batch_tag] = tuple((str(t), int(n)) for t, n in layout)

    def account_plaintext(self, tag: str, bytes_up: int, bytes_down: int) -> None:
        """Add the bytes an unencrypted exchange of ``tag`` would have sent up and down."""
        slot = self.plaintext_equiv.setdefault(tag, [0, 0])
        slot[0] += int(bytes_up)
        slot[1] += int(bytes_down)

    def record(self, msg: Message) -> Message:
        """Append ``msg``, dropping payloads as ``keep_payloads`` says (``none``, ``latest`` round per tag, or all)."""
        if self.keep_payloads == "none":
            msg = msg.without_payload()
        elif self.keep_payloads == "latest":
            last = self._latest_round.get(msg.tag)
            if last is not None and msg.round > last:
                self.messages = [
                    m.without_payload() if (m.tag == msg.tag and m.payload is not None) else m for m in self.messages
                ]
            self._latest_round[msg.tag] = max(msg.round, last if last is not None else msg.round)
        self.messages.append(msg)
        return msg

    def extend(self, msgs: Iterable[Message]) -> None:
        """Record each message of ``msgs``."""
        for m in msgs:
            self.record(m)

    # ------------------------------------------------------------------ queries
    def select(
        self,
        *,
        tag: str | None = None,
        round: int | None = None,
        sender: str | None = None,
        receiver: str | None = None,
    ) -> list[Message]:
        """Messages matching every given filter (tag, round, sender, receiver)."""
        return [
            m
            for m in self.messages
            if (tag is None or m.tag == tag)
            and (round is None or m.round == round)
            and (sender is None or m.sender == sender)
            and (receiver is None or m.receiver == receiver)
        ]

    def view(self, party: str) -> list[Message]:
        """Every message ``party`` sent, received or relayed: what it can read, given its keys."""
        return [m for m in self.messages if m.receiver == party or m.sender == party or m.relay == party]

    def tags(self) -> list[str]:
        """Tags of the recorded messages and the part tags of batched exchanges (:mod:`protocols.batch`)."""
        seen = {m.tag for m in self.messages}
        return sorted(seen | {part for batch, layout in self.batches.items() if batch in seen for part, _ in layout})

    def comm(self) -> dict[str, Any]:
        """Bytes up, down and peer-to-peer, total and per tag.

        Bytes up (client->server), down (server->client) and peer-to-peer, total and per tag,
        with the plaintext-float32 equivalent of each exchange (``plaintext_bytes_up/down``).
        A batched exchange's bytes are attributed to its part tags (:func:`apportion_batches`).
        """
        per_tag: dict[str, dict[str, int]] = defaultdict(
            lambda: {"bytes_up": 0, "bytes_down": 0, "bytes_p2p": 0, "messages": 0}
        )
        for m in self.messages:
            slot = per_tag[m.tag]
            slot["messages"] += 1
            if m.receiver == SERVER:
                slot["bytes_up"] += m.nbytes
            elif m.sender == SERVER:
                slot["bytes_down"] += m.nbytes
            else:
                slot["bytes_p2p"] += m.nbytes
        for tag, (up, down) in self.plaintext_equiv.items():
            per_tag[tag]["plaintext_bytes_up"] = up
            per_tag[tag]["plaintext_bytes_down"] = down
        total = {
            k: sum(v.get(k, 0) for v in per_tag.values())
            for k in ("bytes_up", "bytes_down", "bytes_p2p", "messages", "plaintext_bytes_up", "plaintext_bytes_down")
        }
        apportion_batches(per_tag, self.batches)
        return {**total, "per_tag": dict(sorted(per_tag.items()))}


#: per-tag counters that a batch's parts share in proportion to their entries
BATCH_SHARED_KEYS = ("bytes_up", "bytes_down", "bytes_p2p", "plaintext_bytes_up", "plaintext_bytes_down")


def apportion_batches(per_tag: dict[str, dict[str, Any]], batches: Mapping[str, tuple[tuple[str, int], ...]]) -> None:
    """Replace each batch tag's counters by its parts' shares.

    Replace each batch tag's counters in ``per_tag`` by its parts' shares, in place: in proportion to
    their entries, the remainder of the integer division to the last part (:mod:`protocols.batch`).
    """
    for batch, layout in batches.items():
        slot = per_tag.pop(batch, None)
        if slot is None:
            continue
        total_entries = sum(n for _, n in layout) or 1
        for i, (name, n) in enumerate(layout):
            part = per_tag.setdefault(name, {"bytes_up": 0, "bytes_down": 0, "bytes_p2p": 0, "messages": 0})
            part["messages"] = part.get("messages", 0) + slot.get("messages", 0)
            part["batched_in"] = batch
            for key in BATCH_SHARED_KEYS:
                if key not in slot:
                    continue
                value = slot[key]
                share = (
                    value - sum(value * m // total_entries for _, m in layout[:-1])
                    if i == len(layout) - 1
                    else value * n // total_entries
                )
                part[key] = part.get(key, 0) + share
