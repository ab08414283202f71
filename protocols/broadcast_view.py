r"""What a client binds of the broadcasts it trained on: one digest chain per broadcast tag.

A server that deviates can send one client a different model than the others (the
model-inconsistency attack of Pasquini et al., CCS 2022: a model under which only the victim's
update survives in the sum).  Each client therefore keeps, per tag the public schedule marks as
a broadcast (:mod:`protocols.schedule`), the chain

.. math::

    v_0 = 0^{32}, \qquad v_{j} = \mathrm{SHA\text{-}256}(\mathrm{domain} \,\|\, v_{j-1} \,\|\,
    \mathrm{tag} \,\|\, r_j \,\|\, \mathrm{ids}_j \,\|\, \mathrm{values}_j)

over the results ``j = 1, 2, ...`` it received under the tag (round ``r_j``, block ids, float64
values as decoded), and binds ``v`` into what it contributes next under that tag: mask signs it in
the consistency round (:func:`protocols.mask.client.survivor_statement`), ckks-mp labels its
key-switching masks with it.  Two honest clients of one sum then hold one ``v`` or the sum is
refused.  Every recipient of a broadcast decodes the same bytes (mask: the same ring sum; ckks-mp:
one ciphertext under the broadcast key), so honest chains agree exactly.

The chain, not the last broadcast, because a broadcast may be an update the client adds to its
model (FedAvg: :math:`w \leftarrow w + \Delta_r`), so the model it trains on, and state built from
it such as optimizer moments, depends on every broadcast received: a victim sent
:math:`\Delta_r + \delta`, then left out of one round, would otherwise match the others again while
its model still differs by :math:`\delta`.  For the same reason a client that missed a broadcast
stays out of sync (docs/security.md, "Same model for everyone").

A sum released as different rows to different recipients (the schedule's ``release`` role:
FedGCN's pre-training neighbour sums) is bound through the root of the server's commitment to
the whole sum, which each recipient verified its rows against (:mod:`protocols.release_commitment`):
the roots are chained into ``u`` (same recursion, domain ``RELEASE_DOMAIN``), and once ``u`` is
not all-zero the digest a client binds under any tag is
``SHA-256(domain || u || v)``, so clients handed different sums cannot complete a later sum together.

A statistic of the round's sample (the schedule's ``statistic`` role: FedOMD's pooled moments)
is computed on the models received and used in its round only.  Its contributions bind, in place
of ``v``, the hash of every broadcast chain the client holds (the models it computed them on);
in ``mask`` each one received is chained into the round's view ``w_r`` (same recursion, domain
``ROUND_DOMAIN``, restarted each round), and a contribution of round ``r`` binds
``SHA-256(domain || u || v || w_r)`` once ``w_r`` is set: the victim of a forged statistic is
refused at the round's next sum (its moments, its model update).  ``ckks-mp`` binds no ``w_r``
(every client key-switches every exchange, and the clients outside the sample received none): it
commits to a statistic as to a release, and every client, sampled or not, chains the root into ``u``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

#: the modes whose contributions bind the chain (shared-key ``ckks`` gains nothing: any one client
#: can read every upload, docs/security.md)
VIEW_BINDING_MODES = ("mask", "ckks-mp")
#: domain separator of the chain
VIEW_DOMAIN = b"secure-fgl/broadcast-view/v1"
EMPTY_VIEW = bytes(32)
#: domain separator of the chain of release commitments
RELEASE_DOMAIN = b"secure-fgl/release-view/v1"
#: domain separator of a round's chain of statistics
ROUND_DOMAIN = b"secure-fgl/round-view/v1"
#: the modes that chain a round's statistics (module docstring)
ROUND_BINDING_MODES = ("mask",)


class BroadcastViews:
    """A client's digest chain per broadcast tag (module docstring)."""

    def __init__(self) -> None:
        self.chains: dict[str, bytes] = {}
        #: ``u``: the chain of the release commitments received (all-zero before the first)
        self.released = EMPTY_VIEW
        #: ``(r, w_r)``: the chain of the statistics received in round ``r``
        self.round_view: tuple[int, bytes] | None = None

    def digest(self, tag: str, rnd: int | None = None, every_chain: bool = False) -> bytes:
        """What a contribution under ``tag`` in round ``rnd`` binds (module docstring).

        ``v`` (all-zero before the first broadcast; ``every_chain``: the hash of every chain, for a
        statistic), with ``u`` and ``w_rnd`` once set.
        """
        if every_chain:
            h = hashlib.sha256(VIEW_DOMAIN)
            for name, v in sorted(self.chains.items()):
                h.update(len(name.encode()).to_bytes(4, "big") + name.encode() + v)
            chain = h.digest()
        else:
            chain = self.chains.get(tag, EMPTY_VIEW)
        w = self.round_view[1] if self.round_view is not None and self.round_view[0] == rnd else None
        if self.released == EMPTY_VIEW and w is None:
            return chain
        return hashlib.sha256(VIEW_DOMAIN + self.released + chain + (w or b"")).digest()

    def record_statistic(self, tag: str, rnd: int, blocks: dict[int, np.ndarray]) -> None:
        """Chain one received statistic into round ``rnd``'s view ``w_rnd`` (restarted each round)."""
        before = self.round_view[1] if self.round_view is not None and self.round_view[0] == rnd else EMPTY_VIEW
        self.round_view = (int(rnd), _chained(ROUND_DOMAIN + before, tag, rnd, blocks))

    def release(self, tag: str, rnd: int, root: bytes) -> None:
        """Chain the verified root of a released sum (:mod:`protocols.release_commitment`) into ``u``."""
        h = hashlib.sha256(RELEASE_DOMAIN + self.released)
        h.update(len(tag.encode()).to_bytes(4, "big") + tag.encode() + int(rnd).to_bytes(8, "big", signed=True))
        h.update(bytes(root))
        self.released = h.digest()

    def state_dict(self) -> dict[str, Any]:
        """The chains, for a client's checkpoint (bytes as hex; a round's statistics end with their round)."""
        return {"chains": {t: v.hex() for t, v in sorted(self.chains.items())}, "released": self.released.hex()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.chains = {str(t): bytes.fromhex(v) for t, v in dict(state.get("chains", {})).items()}
        self.released = bytes.fromhex(state.get("released", EMPTY_VIEW.hex()))

    def record(self, tag: str, rnd: int, blocks: dict[int, np.ndarray]) -> None:
        """Chain one received result (block id -> decoded values) into ``tag``'s digest."""
        self.chains[tag] = _chained(VIEW_DOMAIN + self.chains.get(tag, EMPTY_VIEW), tag, rnd, blocks)


def _chained(prefix: bytes, tag: str, rnd: int, blocks: dict[int, np.ndarray]) -> bytes:
    """``SHA-256(prefix || tag || r || ids || values)``, one link of a chain (module docstring)."""
    h = hashlib.sha256(prefix)
    h.update(len(tag.encode()).to_bytes(4, "big") + tag.encode() + int(rnd).to_bytes(8, "big", signed=True))
    for b in sorted(blocks):
        h.update(int(b).to_bytes(8, "big") + np.ascontiguousarray(blocks[b], dtype=np.float64).tobytes())
    return h.digest()
