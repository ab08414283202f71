"""Rounds, evaluation, checkpoints and devices (one process; clients simulated in turn)."""

from .device import resolve_device, seed_everything
from .trainer import TrainState, train

__all__ = ["resolve_device", "seed_everything", "train", "TrainState"]
