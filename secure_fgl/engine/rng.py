"""Per-client, per-step training randomness that does not depend on the data.

Training randomness (dropout masks) must be a function of the run seed and *where* it is
used, never of the values being trained on: a secure run whose inputs differ from plain's
by 1e-7 (or whose decrypted zeros are not exactly zero) must still draw the same masks.

* :func:`client_generator` — one ``torch.Generator`` per ``(seed, round, client, step)``,
  seeded through ``numpy.random.SeedSequence`` (well-mixed, independent streams), so a
  client's randomness in a step does not depend on what any other client or earlier step
  consumed.
* :func:`using` — makes a generator the source of the training randomness inside a ``with``
  block (a context variable, so the models need no extra argument).
* :func:`draw_key` — one 63-bit key per random operation, from the active generator (or,
  outside :func:`using`, from torch's global generator): a fixed number of draws per call.
* :func:`uniform_at` — counter-based uniforms ``u = h(key, i)`` in ``[0, 1)`` for flat
  positions ``i`` (splitmix64's finaliser as the mixing function ``h``; Steele et al.,
  OOPSLA 2014), so a mask entry depends only on the key and its position: the same whether
  it is computed at all entries or only at the non-zeros of a sparse input.

These are simulation seeds for reproducible training, not cryptographic randomness
(keys, masks and DP noise come from the OS CSPRNG elsewhere).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import numpy as np
import torch

_ACTIVE: contextvars.ContextVar[torch.Generator | None] = contextvars.ContextVar("training_generator",
                                                                                 default=None)

# splitmix64 constants as signed int64 (torch has no uint64 arithmetic; products wrap mod 2^64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_UNIFORM_BITS = 24          # float32 has a 24-bit significand: u = top 24 bits / 2^24


def client_generator(seed: int, rnd: int, client: int, step: int) -> torch.Generator:
    """CPU generator for client ``client``'s local step ``step`` of round ``rnd`` of run ``seed``."""
    state = np.random.SeedSequence([int(seed), int(rnd), int(client), int(step)]).generate_state(2, np.uint64)
    g = torch.Generator()
    g.manual_seed(int(state[0] >> np.uint64(1)))
    return g


@contextlib.contextmanager
def using(generator: torch.Generator) -> Iterator[torch.Generator]:
    """Draw the training randomness (``draw_key``) from ``generator`` inside the block."""
    token = _ACTIVE.set(generator)
    try:
        yield generator
    finally:
        _ACTIVE.reset(token)


def draw_key() -> int:
    """One key in ``[0, 2^63)`` from the active generator (torch's global one outside :func:`using`)."""
    return int(torch.randint(0, 2 ** 63 - 1, (1,), generator=_ACTIVE.get()))


def _logical_shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def uniform_at(key: int, index: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in ``[0, 1)``, one per int64 position in ``index``:
    ``z = key + (i + 1) * golden``, then splitmix64's finaliser
    ``z ^= z >> 30; z *= m1; z ^= z >> 27; z *= m2; z ^= z >> 31`` and the top 24 bits."""
    z = index.to(torch.int64).add(1).mul_(_GOLDEN).add_(key)
    z = (z ^ _logical_shift_right(z, 30)).mul_(_MIX1)
    z = (z ^ _logical_shift_right(z, 27)).mul_(_MIX2)
    z = z ^ _logical_shift_right(z, 31)
    return _logical_shift_right(z, 64 - _UNIFORM_BITS).to(torch.float32).mul_(2.0 ** -_UNIFORM_BITS)
