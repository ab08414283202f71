"""The transport seam between a backend's server half and its client halves.

The server half drives an exchange stage by stage.  For each stage it hands the link one
request per client (bytes: a bundle of signed messages, :mod:`protocols.framing`) and gets
back the responses of the clients that answered:

    responses = link.call(stage, {client_id: request_bytes})    # {client_id: response_bytes}

* A client whose response is **missing** (it died, timed out, or its transport failed)
  has dropped out; the backend decides what that means (mask: recovery above the
  threshold, else :class:`~protocols.errors.DropoutError` naming the clients; plain and
  ckks: an error naming them).
* A :class:`~protocols.errors.ProtocolError` raised by a client half is **re-raised**: the
  client refused the exchange (a bound it checked, a message that failed verification),
  so nothing is aggregated and the error names that client.

:class:`InProcessLink` calls client halves living in this process (the default; what
tests and most research use).  A distributed link (Ray actors, gRPC) implements the same
``call`` with the same bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .errors import ProtocolError

if TYPE_CHECKING:  # pragma: no cover
    from .party import ClientHalf


class ClientLink(ABC):
    """Batch transport: one stage's requests out, the answering clients' responses back."""

    #: the clients answer one after another, in this process: a server half may then run a large stage
    #: client by client (:func:`stream_groups`) at no cost in time; ``False``: they answer in parallel
    sequential: bool = False

    @abstractmethod
    def call(self, stage: str, requests: Mapping[int, bytes]) -> dict[int, bytes]:
        """Deliver ``requests[k]`` to client ``k``'s half for ``stage``.

        Return the responses of the clients that answered. Missing key: that client dropped out. A ProtocolError a
        client half raised is re-raised.
        """


def stream_groups(link: ClientLink, clients: Iterable[int]) -> list[list[int]]:
    """The clients of one stage in the groups a server half calls them in.

    One at a time over a :attr:`~ClientLink.sequential` link (the server then holds one client's answer at a time,
    not every answer at once), all together over a parallel one.
    """
    members = [int(k) for k in clients]
    return [[k] for k in members] if getattr(link, "sequential", False) else [members]


class InProcessLink(ClientLink):
    """Client halves in this process, called one after the other.

    Dropout simulation: ``drop(k, stage)`` — client ``k`` disconnects: from that stage on (of any
    later exchange too, until :meth:`reconnect`) its requests go unanswered and unread;
    ``mute(k, stages)`` — client ``k`` reads its requests at those stages but its answers are
    lost (kept in :attr:`lost`, e.g. to replay a late upload).
    """

    sequential = True

    def __init__(self, halves: Mapping[int, ClientHalf]):
        self.halves = dict(halves)
        self._gone: dict[int, str] = {}
        self._muted: dict[int, frozenset[str]] = {}
        #: (client, stage) -> the answer a muted client gave and the link lost
        self.lost: dict[tuple[int, str], bytes] = {}

    def drop(self, client: int, stage: str) -> None:
        """Client ``client`` stops answering at ``stage`` (and after)."""
        self._gone[int(client)] = stage

    def mute(self, client: int, stages: Iterable[str]) -> None:
        """The answers of client ``client`` at ``stages`` are lost in transit."""
        self._muted[int(client)] = frozenset(stages)

    def reconnect(self, client: int) -> None:
        """Let ``client`` take part again after it was dropped or muted."""
        self._gone.pop(int(client), None)
        self._muted.pop(int(client), None)

    def call(self, stage: str, requests: Mapping[int, bytes]) -> dict[int, bytes]:
        """Deliver every request, then re-raise the first refusal.

        Every client reads its request, as separate processes would (a relayed key in a
        bundle reaches its client even when another client refuses this stage); then the first
        refusal, in client order, is re-raised.
        """
        out: dict[int, bytes] = {}
        refusal: ProtocolError | None = None
        for k, request in requests.items():
            if k in self._gone and self._gone[k] in (stage, "*"):
                self._gone[k] = "*"
                continue
            if k not in self.halves:
                continue
            try:
                answer = self.halves[k].handle(stage, request)
            except ProtocolError as exc:
                refusal = refusal or exc
                continue
            if stage in self._muted.get(k, ()):
                self.lost[(k, stage)] = answer
                continue
            out[k] = answer
        if refusal is not None:
            raise refusal
        return out
