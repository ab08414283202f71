"""Simulated dropouts (``--simulate-dropouts SPEC``): clients that stop answering at a protocol stage.

A dropped client does not answer from the named stage on, until the end of that round: its
requests are never delivered, so the server half sees exactly what it sees when a client's
process dies (:mod:`protocols.link`: a missing answer is a dropout) and the backend decides --
``mask`` recovers the survivors' sum when at least ``t`` of them answered, else
:class:`~protocols.DropoutError` naming the missing clients; shared-key ``ckks`` and ``plain`` sum
the clients that uploaded; ``ckks-mp`` (n-of-n) stops with DropoutError; t-out-of-n ``ckks-mp``
leaves up to n - t out.  The client answers again the next round, except one that missed t-out-of-n
``ckks-mp``'s key set-up: it holds no share of the run's keys and is lost for the rest of the
run.  Evaluation, checkpoints and local training are not protocol stages: a dropped
client still answers those (its model missed the round's aggregate).  One that missed a model
broadcast is out of sync for the rest of the run, in every mode alike: it trains its own model and
joins no later model sum (:meth:`~secure_fgl.algorithms.fedavg.server.ModelAveragingStrategy.note_missed_download`).

SPEC is one or more rules separated by ``;``::

    WHO@STAGE[:rROUND[-ROUND]]

* ``WHO``: a count ``k`` (the ``k`` highest client ids, e.g. ``2`` with 10 clients: 8 and 9) or
  client ids separated by commas (``1,4``; one id with a trailing comma: ``3,``);
* ``STAGE``: a stage of the mode's backend (:data:`protocols.message.STAGES`, except
  ``directory`` and ``plan``, which travel inside other stages' bundles); ``upload`` also names
  mask's ``masked_upload``;
* ``:rR`` / ``:rA-B``: only in round ``R`` / rounds ``A..B`` (0-based, as ``result.json`` numbers
  them; round 0 includes the pre-training exchanges); default every round.

Examples: ``2@upload``, ``2@upload:r3``, ``1,4@unmask``, ``3,@keyswitch:r1-2;1@download``.

:class:`SimulatedDropouts` applies a schedule at the executor, where a client runtime's half
answers a stage (``half:<stage>``), so every backend and every executor (local, Ray) drops the
same way; :class:`DroppingLink` applies it to any :class:`~protocols.link.ClientLink` (the
protocol's own tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from protocols.link import ClientLink
from protocols.message import STAGES

from ..validation import ConfigError

#: runtime methods that are not protocol stages: a dropped client still answers them
NOT_PROTOCOL = frozenset({"evaluate", "save", "load", "weights", "local_update"})
#: stages that never travel as a call of their own
_BUNDLED = ("directory", "plan")
_RULE = re.compile(
    r"^\s*(?P<who>\d+|(?:\d+\s*,\s*)+\d*)\s*@\s*(?P<stage>[a-z_]+)"
    r"(?::r(?P<first>\d+)(?:-(?P<last>\d+))?)?\s*$"
)


def drop_stages(mode: str) -> tuple[str, ...]:
    """The stages of ``mode`` a client can drop at."""
    return tuple(s for s in STAGES[mode] if s not in _BUNDLED)


@dataclass(frozen=True)
class DropRule:
    """Clients ``clients`` stop answering at ``stage`` in rounds ``first..last`` (``None``: every round)."""

    clients: tuple[int, ...]
    stage: str
    first: int | None = None
    last: int | None = None

    def applies(self, rnd: int) -> bool:
        """Whether the rule is active in round ``rnd``."""
        return self.first is None or self.first <= rnd <= self.last

    def describe(self) -> dict:
        """The rule as plain data."""
        return {
            "clients": list(self.clients),
            "stage": self.stage,
            "rounds": "all" if self.first is None else [self.first, self.last],
        }


def parse_dropouts(spec: str, num_clients: int, mode: str, rounds: int | None = None) -> tuple[DropRule, ...]:
    """``--simulate-dropouts SPEC`` as rules (module docstring); a bad spec: ConfigError naming the fix."""
    stages = drop_stages(mode)
    rules = []
    for text in (r for r in str(spec).split(";") if r.strip()):
        m = _RULE.match(text)
        if m is None:
            raise ConfigError(
                f"--simulate-dropouts {text.strip()!r}: expected WHO@STAGE[:rROUND[-ROUND]], e.g. "
                "2@upload, 2@upload:r3 or 1,4@unmask (WHO: a count, or ids with commas)"
            )
        who, stage = m["who"].replace(" ", ""), m["stage"]
        if stage == "upload" and "upload" not in stages and "masked_upload" in stages:
            stage = "masked_upload"
        if stage not in stages:
            raise ConfigError(
                f"--simulate-dropouts {text.strip()!r}: mode {mode} has no stage {stage!r}; "
                f"its stages: {', '.join(stages)}"
            )
        if "," in who:
            clients = tuple(sorted({int(x) for x in who.split(",") if x}))
            bad = [k for k in clients if k >= num_clients]
            if bad:
                raise ConfigError(
                    f"--simulate-dropouts {text.strip()!r}: client id(s) {bad} out of range "
                    f"(clients are 0..{num_clients - 1})"
                )
        else:
            count = int(who)
            if not 1 <= count <= num_clients:
                raise ConfigError(
                    f"--simulate-dropouts {text.strip()!r}: a count of 1..{num_clients} clients; "
                    "for client ids write them with commas (one id: '3,')"
                )
            clients = tuple(range(num_clients - count, num_clients))
        first = last = None
        if m["first"] is not None:
            first = int(m["first"])
            last = int(m["last"]) if m["last"] is not None else first
            if last < first or (rounds is not None and last >= rounds):
                raise ConfigError(
                    f"--simulate-dropouts {text.strip()!r}: rounds must be an increasing range in "
                    f"0..{(rounds or 1) - 1}"
                )
        rules.append(DropRule(clients, stage, first, last))
    if not rules:
        raise ConfigError("--simulate-dropouts: an empty spec; e.g. 2@upload")
    return tuple(rules)


class DropoutSchedule:
    """Which clients are silent, call by call: :meth:`silent` with the current round and stage."""

    def __init__(self, rules: tuple[DropRule, ...]):
        self.rules = rules
        self._round: int | None = None
        #: clients dropped in the current round -> the stage they dropped at
        self.gone: dict[int, str] = {}
        #: (round, stage) -> the clients that dropped there (what happened, for result.json)
        self.events: dict[tuple[int, str], list[int]] = {}

    def silent(self, rnd: int, stage: str | None, addressed) -> set[int]:
        """The clients among ``addressed`` that do not answer this call.

        ``stage`` None: not a protocol stage, only clients already gone this round stay silent.
        """
        if rnd != self._round:  # a new round: every dropped client rejoins
            self._round, self.gone = rnd, {}
        addressed = {int(k) for k in addressed}
        for rule in self.rules:
            if stage == rule.stage and rule.applies(rnd):
                for k in addressed.intersection(rule.clients) - set(self.gone):
                    self.gone[k] = stage
                    self.events.setdefault((rnd, stage), []).append(k)
        return {k for k in addressed if k in self.gone}

    def describe(self) -> dict:
        """The rules and the dropouts that happened (``result.json``'s ``runtime.simulated_dropouts``)."""
        return {
            "rules": [r.describe() for r in self.rules],
            "dropped": [{"round": r, "stage": s, "clients": sorted(ks)} for (r, s), ks in self.events.items()],
        }


class SimulatedDropouts:
    """An executor whose clients drop out by ``schedule``.

    An executor whose clients drop by ``schedule`` (module docstring): a silent client's request
    is not delivered, so the call returns without its answer.  ``clock()`` is the round in progress
    (the strategy's, set by :func:`~.build.make_strategy`).  Everything else is the wrapped executor's.
    """

    def __init__(self, executor, schedule: DropoutSchedule):
        self.executor, self.schedule = executor, schedule
        self.clock: Callable[[], int] = lambda: 0

    def call(self, method: str, requests: Mapping[int, bytes], label: str = ""):
        """The wrapped executor's call, without the requests of the clients silent at this round and stage."""
        stage = method[5:] if method.startswith("half:") else None
        silent = set() if method in NOT_PROTOCOL else self.schedule.silent(self.clock(), stage, requests)
        return self.executor.call(method, {k: v for k, v in requests.items() if k not in silent}, label)

    def describe(self) -> dict:
        """The wrapped executor's description plus the dropout schedule."""
        return {**self.executor.describe(), "simulated_dropouts": self.schedule.describe()}

    def __getattr__(self, name):  # start, shutdown, stats, sequential, name, Ray's extras
        return getattr(self.executor, name)


class DroppingLink(ClientLink):
    """A :class:`~protocols.link.ClientLink` whose clients drop by ``schedule``; ``clock()``: the round."""

    def __init__(self, link: ClientLink, schedule: DropoutSchedule, clock: Callable[[], int] = lambda: 0):
        self.link, self.schedule, self.clock = link, schedule, clock
        self.sequential = getattr(link, "sequential", False)

    def call(self, stage: str, requests: Mapping[int, bytes]) -> dict[int, bytes]:
        """The wrapped link's call, without the requests of the clients silent at this round and stage."""
        silent = self.schedule.silent(self.clock(), stage, requests)
        return self.link.call(stage, {k: v for k, v in requests.items() if k not in silent})


class LostAfter(ClientLink):
    """A :class:`~protocols.link.ClientLink` whose clients ``lost`` disconnect after ``calls`` calls of ``stage``.

    The default is a loss right after ``ckks-mp``'s key-switching liveness probe (the first ``keyswitch`` call), which
    a stage of ``--simulate-dropouts`` cannot express: the server then re-plans its active set.
    """

    def __init__(self, link: ClientLink, lost, stage: str = "keyswitch", calls: int = 1):
        self.link, self.lost, self.stage, self.left = link, {int(k) for k in lost}, stage, int(calls)
        self.sequential = getattr(link, "sequential", False)

    def call(self, stage: str, requests: Mapping[int, bytes]) -> dict[int, bytes]:
        """Deliver ``requests`` but those of the lost clients once their ``calls`` are spent."""
        gone = self.lost if self.left <= 0 else set()
        self.left -= stage == self.stage
        return self.link.call(stage, {k: v for k, v in requests.items() if k not in gone})
