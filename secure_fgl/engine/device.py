"""Device selection and seeding."""

from __future__ import annotations

import random

import numpy as np
import torch

from ..validation import ConfigError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto``: CUDA when present, else CPU.  ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {name} asked for CUDA but none is available; use --device auto or cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown --device {name!r}; use auto, cpu or cuda[:N]") from None


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """The global generators' states (CUDA's too when present), for checkpoints."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore the states returned by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
