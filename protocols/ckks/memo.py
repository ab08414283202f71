"""Co-located clients decrypt each distinct ciphertext once (a simulation shortcut)."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import numpy as np


class DecryptionMemo:
    """Clients in one process decrypt each distinct summed ciphertext once.

    A simulation shortcut (the in-process default plays K clients on one core): identical
    ciphertext bytes under the same key decrypt to the same values, so a client that presents
    a frame some co-located client already decrypted in this exchange gets a copy of those
    values.  It learns nothing it could not compute itself (it holds the frame and the key);
    no array is shared (every hit is a copy).  Entries of the current scope only (the caller's:
    one streamed chunk of one exchange, so memory holds one chunk of decrypted blocks).
    """

    def __init__(self) -> None:
        self._scope: Hashable | None = None
        self._values: dict[bytes, np.ndarray] = {}

    def decrypt(self, scope: Hashable, frame: bytes, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """``compute()`` for ``frame`` in ``scope``, once per distinct frame; always a copy."""
        if scope != self._scope:
            self._scope, self._values = scope, {}
        hit = self._values.get(frame)
        if hit is None:
            hit = self._values[frame] = compute()
        copy: np.ndarray = hit.copy()
        return copy
