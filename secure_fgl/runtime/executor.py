"""Executors: where the client runtimes run, and the one call that reaches them.

An executor hosts the :class:`~.client.ClientRuntime` of every client and offers one batch
call, ``call(method, {client: request bytes}) -> ({client: response bytes}, {client: why
lost})``: the server side hands each addressed client its request frame and collects the
response frames; a client that cannot answer (its process died, or it did not answer within
the round timeout) comes back in the second mapping, and the strategy turns it into a
protocol dropout.  Only bytes cross this seam, and every byte is counted
(:class:`ExecutorStats`).

A client that refuses (its runtime raises a :class:`protocols.ProtocolError`: a bound it
checked, a message that failed verification) does not stop the others: every addressed client
reads its request, as separate processes would (a relayed key in a bundle reaches its client
even when another client refuses the stage), then the first refusal in client order is
re-raised and no answer of that call is used (:func:`answer_each`).

:class:`LocalExecutor` (default) keeps the runtimes in the driver's process.
:class:`~.ray_executor.RayExecutor` places them on Ray actors.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocols import ProtocolError

from .memory import release_freed_memory


@dataclass
class ExecutorStats:
    """Bytes handed to and returned from client runtimes, per method, and the seconds spent in calls."""

    calls: int = 0
    messages: int = 0
    bytes_to_clients: int = 0
    bytes_from_clients: int = 0
    seconds: float = 0.0
    per_method: dict = field(default_factory=dict)

    def add(self, method: str, requests: Mapping[int, bytes], responses: Mapping[int, bytes], seconds: float):
        """Count one call: messages, bytes each way and seconds, in total and per method."""
        up, down = sum(map(len, responses.values())), sum(map(len, requests.values()))
        self.calls += 1
        self.messages += len(requests) + len(responses)
        self.bytes_to_clients += down
        self.bytes_from_clients += up
        self.seconds += seconds
        slot = self.per_method.setdefault(method, {"calls": 0, "bytes_to_clients": 0, "bytes_from_clients": 0})
        slot["calls"] += 1
        slot["bytes_to_clients"] += down
        slot["bytes_from_clients"] += up


def answer_each(runtimes: Mapping, method: str, requests: Mapping[int, bytes]) -> dict[int, bytes]:
    """Every addressed runtime answers ``method``, in client order.

    Then the first :class:`~protocols.ProtocolError` a runtime raised is re-raised (``refusing_client`` names it).
    Any other error is re-raised at once.
    """
    out, refusal = {}, None
    for k in sorted(requests):
        try:
            out[k] = runtimes[k].handle(method, requests[k])
        except ProtocolError as exc:
            if refusal is None:
                exc.refusing_client = k
                refusal = exc
    if refusal is not None:
        raise refusal
    return out


class Executor:
    """Base class (see the module docstring)."""

    name = "base"
    #: the runtimes answer a call one after another in this process (:attr:`protocols.link.ClientLink.sequential`)
    sequential = False

    def __init__(self):
        self.stats = ExecutorStats()

    def start(self, frames: Mapping[int, bytes]) -> None:
        """Build client ``k``'s runtime from its set-up frame ``frames[k]``."""
        raise NotImplementedError

    def call(
        self, method: str, requests: Mapping[int, bytes], label: str = ""
    ) -> tuple[dict[int, bytes], dict[int, str]]:
        """``label`` (e.g. the exchange tag) keys :attr:`ExecutorStats.per_method` next to ``method``."""
        t0 = time.perf_counter()
        responses, lost = self._call(method, dict(requests))
        self.stats.add(
            f"{method}:{label}" if label else method,
            {k: v for k, v in requests.items() if k in responses},
            responses,
            time.perf_counter() - t0,
        )
        return responses, lost

    def _call(self, method: str, requests: dict[int, bytes]) -> tuple[dict[int, bytes], dict[int, str]]:
        raise NotImplementedError

    def describe(self) -> dict:
        """The executor's description for the result."""
        return {"executor": self.name}

    def shutdown(self) -> None:
        """Release the executor's resources (default: nothing)."""
        pass


class LocalExecutor(Executor):
    """Every client runtime in the driver's process, called one after the other."""

    name = "local"
    sequential = True

    def __init__(self, device: str = "cpu"):
        super().__init__()
        self.device = device
        self.runtimes = {}

    def start(self, frames: Mapping[int, bytes]) -> None:
        """Build every client runtime in this process."""
        from .client import ClientRuntime

        self.runtimes = {k: ClientRuntime(f, self.device) for k, f in frames.items()}

    def _call(self, method, requests):
        return answer_each(self.runtimes, method, requests), {}

    def shutdown(self) -> None:
        """Drop the runtimes and hand their memory back to the OS.

        :mod:`.memory`. A process running several runs does not keep the last one's.
        """
        self.runtimes = {}
        release_freed_memory()
