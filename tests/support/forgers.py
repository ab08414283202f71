"""Malicious server halves shared by the tests that attack key distribution and the ckks-mp commitments."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from protocols.auth import SigningKey, sign_public_key
from protocols.channel import ChannelKey
from protocols.ckks_mp import encoding, encryption
from protocols.ckks_mp.keyswitch import planned_broadcast_blocks
from protocols.ckks_mp.params import plan_exchange
from protocols.registry import backend_class


def directory_forger(mode: str, *, resign: bool, identity: bool = False):
    """A server half that puts its own keys for client 1 in the key directory.

    A server half that puts its own channel key (and, with ``identity``, its own identity
    key) for client1 into client0's key directory, signed by itself (``resign``) or with
    client1's original signature.
    """
    base = backend_class(mode).server_half

    class DirectoryForger(base):
        def _outgoing(self, msg, stage, part, intercept=None):
            if stage == "directory" and msg.receiver == "client0":
                self.mitm = ChannelKey("client1")
                impostor = SigningKey()
                entry = dict(msg.payload["client1"], channel=self.mitm.public_bytes)
                if identity:
                    entry["signing"] = impostor.public_bytes
                if resign or identity:
                    signer = impostor if identity else self.signing
                    entry["channel_signature"] = sign_public_key(
                        signer, "channel", self.setup.run_id, "client1", self.mitm.public_bytes
                    )
                msg = replace(msg, payload={**msg.payload, "client1": entry})
            return super()._outgoing(msg, stage, part, intercept)

    return DirectoryForger


def shifted_ckks_mp_download(server, payload: dict) -> dict:
    """A ckks-mp download whose first field decodes one quantum larger: a valid ciphertext of another sum.

    ``server``: the server half of the exchange under way; ``payload``: the download's (``broadcast``: ``c0'`` of the
    blocks switched to the broadcast key, shifted when there are any; else ``data``, ``(c0', c1')`` per block).
    """
    plan, ring = server.plan, server.ring
    cks = planned_broadcast_blocks(plan.encoding, plan.num_blocks)  # the plan's switch per block
    ep = plan_exchange(
        server.params,
        plan.spec,
        server.setup.num_clients,
        plan.dp_noise_std,
        plan.block_len,
        tag=plan.tag,
        round=plan.round,
        broadcast=cks.size == plan.num_blocks,
    )
    unit = np.zeros(min(plan.block_len, ep.capacity), dtype=np.int64)
    shifted = unit.copy()
    shifted[0] = 1
    delta = ring.rescale(ring.sub(encoding.encode(ring, ep, shifted), encoding.encode(ring, ep, unit)), ep.switch_level)
    field = "broadcast" if cks.size else "data"
    pair = () if cks.size else (2,)
    data = payload[field]
    count = len(data) // (4 * int(np.prod(pair or (1,))) * ep.switch_level * ring.n)
    cts = encryption.from_bytes(ring, data, (count, *pair, ep.switch_level, ring.n)).copy()
    first = cts[0] if cks.size else cts[0, 0]
    first[:] = ring.add(first, delta)
    return {**payload, field: encryption.to_bytes(cts)}


class ShiftedCommittedMPServer:
    """ckks-mp server mixin: shifts client ``victim``'s download of tag ``forged`` by one quantum, commits apart.

    The victim decodes another value than the other recipients; its keyed digests go into a commitment of their own
    (the honest server would refuse two recipients' different digests of one block), so each client's digests verify
    against the root it is sent.  ``forged_round``: the round of the first forged download (forged once).
    """

    forged = ""
    victim = 1
    forged_round: int | None = None

    def call(self, link, stage, messages, *, hook=True):
        if stage == "download" and self.plan.tag == self.forged and self.victim in messages and self._first():
            (msg, part), *rest = messages[self.victim]
            msg = replace(msg, payload=shifted_ckks_mp_download(self, msg.payload))
            messages = {**messages, self.victim: [(msg, part), *rest]}
        return super().call(link, stage, messages, hook=hook)

    def _first(self) -> bool:
        if self.forged_round is None:
            self.forged_round = self.plan.round
        return self.forged_round == self.plan.round

    def release_messages(self, reports):
        if self.victim not in reports:
            return super().release_messages(reports)
        victim = {self.victim: reports.pop(self.victim)}
        return {**super().release_messages(reports), self.victim: super().release_messages(victim)[self.victim]}
