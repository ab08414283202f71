"""What the run needs to know of an algorithm, in one record: :class:`AlgorithmSpec`.

Preflight, the CLI (``--help``, ``secure-fgl algorithms``), the docs and the executors read an
algorithm only through its spec (registered in :mod:`.specs`): its name, task, options class and
cross-field check, the modes it runs in, its catalogue text, and the two halves that run it: the
client logic (one per client runtime) and the server strategy.  The halves are named as
``"module:Class"`` and imported on use, so ``--help`` and a client process load only what they run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


def load(ref: str):
    """The object ``"package.module:Name"`` names."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def every_round(cfg, *tags: str) -> dict[str, tuple[int, int]]:
    """``tags`` listed in every training round ``0 .. rounds - 1``."""
    return {tag: (0, int(cfg.rounds) - 1) for tag in tags}


def model_every_round(cfg) -> dict[str, tuple[int, int]]:
    """FedAvg's schedule: the model mean ``<algorithm>/model`` every round."""
    return every_round(cfg, f"{cfg.algorithm}/model")


def model_broadcast(cfg) -> tuple[str, ...]:
    """FedAvg's broadcast: every client trains on the result of ``<algorithm>/model``."""
    return (f"{cfg.algorithm}/model",)


def no_exchanges(cfg) -> dict[str, tuple[int, int]]:
    """An algorithm that exchanges nothing: every plan is refused."""
    return {}


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm's specification.

    One algorithm: ``name`` (``--algorithm``), ``task`` (``node``/``graph`` classification),
    ``options`` (its settings dataclass, :mod:`.options`), ``check`` (cross-field rules,
    ``check(options, cfg)`` raising ConfigError, run before any data is loaded), ``modes`` (the
    ``--mode`` values it runs in), the catalogue text (``summary``, ``paper``, ``exchanges``: what
    crosses the wire, by tag), ``logic`` and ``strategy`` (``"module:Class"`` of its client logic
    and server strategy), ``mode_note`` (why other modes are refused, after the name; ``{mode}``
    is filled in), ``schedule`` (``schedule(cfg) -> {tag: (first round, last round)}``: every
    exchange the algorithm plans, from the public configuration alone; the run manifest lists it
    and every client refuses a plan for any other (round, tag), :mod:`protocols.schedule`;
    default :func:`model_every_round`), ``broadcasts`` (``broadcasts(cfg) -> tags``: the listed
    exchanges whose one result every recipient gets whole and trains on, given the schedule's
    ``broadcast`` role so that each client binds the chain of those it received into its next
    contribution, :mod:`protocols.broadcast_view`; default none), ``releases`` (``releases(cfg) ->
    tags``: the listed exchanges whose sum reaches its recipients as different rows, given the
    ``release`` role: bound by a commitment to the whole sum, :mod:`protocols.release_commitment`),
    ``statistics`` (``statistics(cfg) -> tags``: sums the round's sample receives whole and uses in
    that round only, the ``statistic`` role) and ``groups`` (``groups(cfg) -> [tags, ...]``: tags whose
    exchanges carry related inputs, summed over one contributor set per round, :mod:`protocols.schedule`).
    """

    name: str
    summary: str
    paper: str
    exchanges: str
    options: type
    logic: str
    strategy: str
    modes: tuple[str, ...]
    task: str = "node"
    check: Callable | None = None
    mode_note: str = ""
    schedule: Callable | None = None
    broadcasts: Callable | None = None
    releases: Callable | None = None
    statistics: Callable | None = None
    groups: Callable | None = None

    def exchanges_of(self, cfg) -> dict[str, tuple[int, int]]:
        """The run's public exchange listing (``schedule``, default :func:`model_every_round`)."""
        return (self.schedule or model_every_round)(cfg)

    def broadcasts_of(self, cfg) -> tuple[str, ...]:
        """The run's broadcast tags (``broadcasts``), those of them the schedule lists."""
        return self._listed(self.broadcasts, cfg)

    def releases_of(self, cfg) -> tuple[str, ...]:
        """The run's released-rows tags (``releases``), those of them the schedule lists."""
        return self._listed(self.releases, cfg)

    def statistics_of(self, cfg) -> tuple[str, ...]:
        """The run's statistic tags (``statistics``), those of them the schedule lists."""
        return self._listed(self.statistics, cfg)

    def groups_of(self, cfg) -> list[list[str]]:
        """The run's related-input groups (``groups``) of at least two listed tags."""
        listed = self.exchanges_of(cfg)
        groups = [[tag for tag in group if tag in listed] for group in (self.groups(cfg) if self.groups else [])]
        return [sorted(group) for group in groups if len(group) > 1]

    def _listed(self, tags_of: Callable | None, cfg) -> tuple[str, ...]:
        listed = self.exchanges_of(cfg)
        return tuple(tag for tag in (tags_of(cfg) if tags_of else ()) if tag in listed)

    def logic_class(self) -> type:
        """The client logic class, imported on first use."""
        return load(self.logic)

    def strategy_class(self) -> type:
        """The server strategy class, imported on first use."""
        return load(self.strategy)

    def mode_refusal(self, mode: str) -> str:
        """The one line refusing ``--mode mode``."""
        if self.mode_note:
            return f"{self.name} {self.mode_note.format(mode=mode)}"
        return f"{self.name} cannot run in --mode {mode}: use one of {', '.join(self.modes)}"
