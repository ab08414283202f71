"""The round loop: train, evaluate, select by validation, checkpoint, resume.

Model selection: the reported test accuracy is the one at the round of best mean
validation accuracy (node-weighted over clients); with ``patience`` set, training stops
after that many rounds without improvement.  A checkpoint is written after every
round (plain data only, bound to the run's settings: :mod:`.checkpoint`); resuming from it
continues with the same RNG state, so an interrupted run ends with the same result as an
uninterrupted one — except under DP: the noise comes from a fresh OS-keyed generator after
a resume (:mod:`protocols.csprng`), so DP runs are not bit-reproducible, by design.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from ..config import ConfigError, RunConfig
from .checkpoint import load_checkpoint, save_checkpoint
from .device import rng_state, set_rng_state

if TYPE_CHECKING:  # the runtime imports the engine
    from ..runtime.strategy import Strategy

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainState:
    """The round loop's state: next round, per-round rows, best evaluation so far, early-stopping count and timings."""

    next_round: int = 0
    rounds: list[dict] = field(default_factory=list)
    best: dict | None = None
    best_round: int = -1
    since_best: int = 0
    time: dict = field(default_factory=lambda: {"train": 0.0, "eval": 0.0})
    stopped_early: bool = False


def _summary(ev: dict) -> dict:
    return {k: v for k, v in ev.items() if k != "per_client"}


def _restore(saved: dict, path: Path, algo: Strategy, extra_state) -> TrainState:
    """Load a checkpoint's content into ``algo`` (and ``extra_state``).

    Content that does not fit this run (a key missing, a wrong type or shape) is refused in one line.
    """
    try:
        algo.load_state_dict(saved["algorithm"])
        state = TrainState(**saved["train"])
        set_rng_state(saved["rng"])
        if extra_state is not None:
            extra_state[1](saved["extra"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError) as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ConfigError(
            f"checkpoint {path} matches this run's settings but its content does not load "
            f"({type(exc).__name__}: {reason}); delete it or run without --resume"
        ) from None
    return state


def train(
    algo: Strategy, cfg: RunConfig, out_dir: Path | None, *, progress: bool = True, extra_state=None, hooks=()
) -> TrainState:
    """Run rounds ``next_round..rounds-1``.

    ``extra_state`` is a (save, load) pair of callables for run-level state the checkpoint must carry (transcript,
    accountant); ``hooks``: ``hook(row, state, algo)`` after each round (:mod:`.hooks`).
    """
    state = TrainState()
    ckpt = out_dir / CHECKPOINT if out_dir is not None else None
    if cfg.resume and ckpt is not None and ckpt.exists():
        state = _restore(load_checkpoint(ckpt, cfg), ckpt, algo, extra_state)
    bar = tqdm(
        range(state.next_round, cfg.rounds),
        initial=state.next_round,
        total=cfg.rounds,
        desc=f"{cfg.algorithm}/{cfg.mode}",
        disable=not progress,
        dynamic_ncols=True,
        leave=False,
    )
    for rnd in bar:
        if state.stopped_early:
            break
        t0 = time.perf_counter()
        metrics = algo.train_round(rnd)
        t1 = time.perf_counter()
        ev = algo.evaluate()
        t2 = time.perf_counter()
        state.time["train"] += t1 - t0
        state.time["eval"] += t2 - t1
        row = {"round": rnd, **metrics, **_summary(ev)}
        state.rounds.append(row)
        if state.best is None or ev["val_acc"] > state.best["val_acc"]:
            state.best, state.best_round, state.since_best = ev, rnd, 0
        else:
            state.since_best += 1
        if cfg.patience is not None and state.since_best >= cfg.patience:
            state.stopped_early = True
        state.next_round = rnd + 1
        bar.set_postfix(
            loss=f"{metrics.get('train_loss', 0):.3f}",
            val=f"{ev['val_acc']:.3f}",
            best_val=f"{state.best['val_acc']:.3f}",
        )  # test accuracy only at the end
        for hook in hooks:
            hook(row, state, algo)
        if ckpt is not None:
            save_checkpoint(
                ckpt,
                cfg,
                {
                    "algorithm": algo.state_dict(),
                    "train": asdict(state),
                    "rng": rng_state(),
                    "extra": extra_state[0]() if extra_state is not None else None,
                },
            )
    bar.close()
    return state
