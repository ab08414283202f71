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
    default :func:`model_every_round`).
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

    def exchanges_of(self, cfg) -> dict[str, tuple[int, int]]:
        """The run's public exchange listing (``schedule``, default :func:`model_every_round`)."""
        return (self.schedule or model_every_round)(cfg)

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
