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
* :func:`uniform_at` — counter-based uniforms ``u = h(key XOR i)`` in ``[0, 1)`` for flat
  positions ``i`` (``h`` = Wellons' ``lowbias32`` integer hash, a bijection of 32-bit words
  with low avalanche bias; 32-bit because int32 products vectorise on CPUs and int64 ones do
  not), so a mask entry depends only on the key and its position: the same whether it is
  computed at all entries or only at the non-zeros of a sparse input.

These are simulation seeds for reproducible training, not cryptographic randomness
(keys, masks and DP noise come from the OS CSPRNG elsewhere).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import numpy as np
import torch

_ACTIVE: contextvars.ContextVar[torch.Generator | None] = contextvars.ContextVar("training_generator", default=None)

# lowbias32's multipliers as signed int32 (torch has no uint32 arithmetic; products wrap mod 2^32)
_MIX1 = 0x7FEB352D
_MIX2 = 0x846CA68B - (1 << 32)
_UNIFORM_BITS = 24  # float32 has a 24-bit significand: u = top 24 bits / 2^24


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
    """One 32-bit key (as a signed int32) from the active generator (torch's global one outside :func:`using`)."""
    return int(torch.randint(-(2**31), 2**31, (1,), generator=_ACTIVE.get()))


def _logical_shift_right(z: torch.Tensor, bits: int, out: torch.Tensor) -> torch.Tensor:
    """``z >>> bits`` (logical: torch shifts int32 arithmetically) into ``out``."""
    torch.bitwise_right_shift(z, bits, out=out)
    return out.bitwise_and_((1 << (32 - bits)) - 1)


def uniform_at(key: int, index: torch.Tensor) -> torch.Tensor:
    """Float32 uniforms in ``[0, 1)``, one per position in ``index``.

    float32 uniforms in ``[0, 1)``, one per position in ``index`` (taken mod 2^32):
    ``z = key XOR i``, then ``z ^= z >> 16; z *= 0x7feb352d; z ^= z >> 15; z *= 0x846ca68b;
    z ^= z >> 16`` and the top 24 bits (in place on two buffers: dropout calls it every step).
    """
    z = index.to(torch.int32) ^ key
    tmp = torch.empty_like(z)
    z.bitwise_xor_(_logical_shift_right(z, 16, tmp)).mul_(_MIX1)
    z.bitwise_xor_(_logical_shift_right(z, 15, tmp)).mul_(_MIX2)
    z.bitwise_xor_(_logical_shift_right(z, 16, tmp))
    return _logical_shift_right(z, 32 - _UNIFORM_BITS, tmp).to(torch.float32).mul_(2.0**-_UNIFORM_BITS)
