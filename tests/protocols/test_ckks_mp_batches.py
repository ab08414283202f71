"""Ckks-mp's key switch in bounded batches, and the clients' check that the batches make up one planned switch.

The server asks for an exchange's key-switching shares in batches whose share bytes (all clients') stay within
``keyswitch_batch_bytes``; the first batch names the exchange's planned switch (every key's blocks), which each
client checks whole, and every batch must hold only planned (key, block) pairs not switched before.  Each attack is a
malicious server half (a subclass of the honest one) and ends in a specific ProtocolError at an honest client.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from support.ckks_mp import mixed_exchange as support_mixed_exchange

from protocols import ValueSpec
from protocols.ckks_mp.backend import CKKSMPProtocol
from protocols.ckks_mp.server import CKKSMPServer, batches_of
from protocols.errors import IntegrityError, KeySwitchRefusedError, RepeatedKeySwitchError, UnplannedKeySwitchError
from protocols.transcript import SERVER, client_party

K = 3
COUNTS = ValueSpec(integer=True, max_abs=1, sum_max=K)
SHARED = 2  # blocks 0..SHARED-1 go to every client (broadcast key); block SHARED + c to client c only


def mixed_exchange(p):
    """:func:`support.ckks_mp.mixed_exchange` with this file's clients and shared blocks."""
    return support_mixed_exchange(p, COUNTS, K, SHARED)


def protocol_with(server_class=CKKSMPServer, batch_bytes=1) -> CKKSMPProtocol:
    """``batch_bytes`` 1: every aggregate row is a batch of its own (a row above the bound travels alone)."""
    cls = type("Batched", (CKKSMPProtocol,), {"server_half": server_class})
    return cls(K, keyswitch_batch_bytes=batch_bytes)


def requests_of(p, client=0):
    return [
        m
        for m in p.transcript.select(tag="mixed", sender=SERVER, receiver=client_party(client))
        if m.note.startswith("block ids to key")
    ]


def test_a_key_switch_in_batches_gives_the_one_call_result():
    """One row per batch: the sums decrypt exactly and the downloads are those of one call, byte for byte.

    The broadcast key's group is split across batches too (the designated client keeps its ``s_B c1`` of each).
    """
    whole, batched = CKKSMPProtocol(K), protocol_with()
    got_whole, exact = mixed_exchange(whole)
    got, _ = mixed_exchange(batched)
    assert all(np.array_equal(got[c], exact[c]) and np.array_equal(got_whole[c], exact[c]) for c in range(K))
    assert len(requests_of(whole)) == 1
    batches = requests_of(batched)
    assert [m.payload["groups"].tolist() for m in batches] == [[[-1, 1]], [[-1, 1]], [[0, 1]], [[1, 1]], [[2, 1]]]
    assert "planned" in batches[0].payload and not any("planned" in m.payload for m in batches[1:])
    assert batches[0].payload["planned"]["groups"].tolist() == requests_of(whole)[0].payload["groups"].tolist()
    assert batched.server.last_stats["keyswitch_batches"] == 5
    downloads = [
        sorted(
            (m.receiver, len(m.payload["data"]), len(m.payload["broadcast"]))
            for m in p.transcript.select(tag="mixed", sender=SERVER)
            if "key-switched" in m.note
        )
        for p in (whole, batched)
    ]
    assert downloads[0] == downloads[1]
    assert all(not half.keys._uploaded for half in batched.clients.values())  # dropped after the last batch


@pytest.mark.parametrize("bound", [1, 5, 9, 64])
def test_batches_cover_the_groups_in_order_within_the_bound(bound):
    rng = np.random.default_rng(bound)
    groups = [(-1, list(range(7)))] + [(r, rng.integers(0, 99, rng.integers(0, 9)).tolist()) for r in range(5)]
    row_bytes = {-1: 3, **{r: 6 for r in range(5)}}
    batches = batches_of(groups, row_bytes.__getitem__, bound)
    joined: dict[int, list[int]] = {}
    for batch in batches:
        assert len({to for to, _ in batch}) == len(batch)  # one group per key in a batch
        size = sum(row_bytes[to] * len(rows) for to, rows in batch)
        assert size <= bound or (len(batch) == 1 and len(batch[0][1]) == 1)  # a row above the bound travels alone
        for to, rows in batch:
            joined.setdefault(to, []).extend(rows)
    assert joined == {to: rows for to, rows in groups if rows}
    assert batches_of([], row_bytes.__getitem__, bound) == [[]]


class Tampering(CKKSMPServer):
    """Batches of one row each; :meth:`tamper` rewrites batch ``part``'s request (groups, blocks) before it is sent."""

    def tamper(self, part: int, payload: dict) -> dict:
        return payload

    def call(self, link, stage, messages, *, hook=True):
        if stage == "keyswitch":
            messages = {
                k: [(replace(msg, payload=self.tamper(part, dict(msg.payload))), part) for msg, part in batch]
                for k, batch in messages.items()
            }
        return super().call(link, stage, messages, hook=hook)


def row(to: int, block: int) -> dict:
    return {"groups": np.array([[to, 1]]), "blocks": np.array([block])}


class DuplicateAcrossBatches(Tampering):
    """Batch 1 asks again for batch 0's pair (block 0 to the broadcast key): two shares of one ``s_i c1``."""

    def tamper(self, part, payload):
        return {**payload, **row(-1, 0)} if part == 1 else payload


class BlockToAnotherKey(Tampering):
    """Batch 3 switches block SHARED (planned for client 0 alone, switched to its key in batch 2) to client 1's key."""

    def tamper(self, part, payload):
        return {**payload, **row(1, SHARED)} if part == 3 else payload


class BatchOutsideThePlan(Tampering):
    """Batch 4 switches client 2's scoped block to the broadcast key, which every client holds."""

    def tamper(self, part, payload):
        return {**payload, **row(-1, SHARED + 2)} if part == 4 else payload


class SecondPlan(Tampering):
    """Batch 2 names a new planned switch (the scoped blocks to the broadcast key) along with its row."""

    def tamper(self, part, payload):
        if part != 2:
            return payload
        return {**payload, "planned": {"groups": np.array([[-1, SHARED + K]]), "blocks": np.arange(SHARED + K)}}


class ExtraBatch(CKKSMPServer):
    """After the honest batches, one more (a repeat of the last): past the planned switch."""

    def _keyswitch(self, link, groups, needed, active, extra, attempt, shape, planned):
        got = super()._keyswitch(link, groups, needed, active, extra, attempt, shape, planned)
        batch, replan, answered = attempt
        if batch == 4:
            super()._keyswitch(link, groups, needed, active, extra, (5, replan, answered + 1), shape, None)
        return got


@pytest.mark.parametrize(
    "server,error,match",
    [
        (DuplicateAcrossBatches, RepeatedKeySwitchError, r"block\(s\) \[0\] switched to the broadcast key again"),
        (BlockToAnotherKey, UnplannedKeySwitchError, rf"block\(s\) \[{SHARED}\] to recipient 1's key"),
        (BatchOutsideThePlan, UnplannedKeySwitchError, rf"block\(s\) \[{SHARED + 2}\] to the broadcast key"),
        (SecondPlan, KeySwitchRefusedError, "only the first batch of an exchange names its planned switch"),
        (ExtraBatch, RepeatedKeySwitchError, "after this client switched every block"),
    ],
)
def test_batches_outside_one_planned_switch_are_refused(server, error, match):
    """Adversary: an actively malicious server.  The union of a client's batches is at most its planned switch.

    A pair twice, a planned block to a key its plan does not name, a pair outside the plan, a second plan, a batch
    after the plan is complete: each is refused before any share of that batch leaves the client, and nothing is
    delivered.
    """
    p = protocol_with(server)
    with pytest.raises(error, match=match):
        mixed_exchange(p)
    assert all(r is None for r in p.client_results().values())


class StopsEarly(CKKSMPServer):
    """Skips the last batch's request (client 2's block) and sends downloads from shares it made up."""

    def _keyswitch(self, link, groups, needed, active, extra, attempt, shape, planned):
        if attempt[0] < 4:
            return super()._keyswitch(link, groups, needed, active, extra, attempt, shape, planned)
        pieces, *ct_shape = shape
        return [[np.zeros((len(rows) * pieces, *ct_shape), dtype=np.uint32)] * K for _, rows in groups], []


def test_a_download_before_the_whole_planned_switch_is_refused():
    p = protocol_with(StopsEarly)
    with pytest.raises(IntegrityError, match="a download before this client switched every block"):
        mixed_exchange(p)
