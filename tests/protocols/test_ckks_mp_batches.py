"""Ckks-mp's key switch in bounded batches, and the clients' check that the batches make up one planned switch.

The server asks for an exchange's key-switching shares in batches whose share bytes (all clients'; t-out-of-n: the
active set's) stay within ``keyswitch_batch_bytes``; the first batch names the exchange's planned switch (every key's
blocks; t-out-of-n also its uploaders), which each client checks whole, and every batch must hold only planned (key,
block) pairs not switched before, t-out-of-n from the active set that opened the switch.  Each attack is a malicious
server half (a subclass of the honest one) and ends in a specific ProtocolError at an honest client.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from support.ckks_mp import mixed_exchange as support_mixed_exchange

from protocols import ValueSpec
from protocols.ckks_mp.backend import CKKSMPProtocol
from protocols.ckks_mp.server import CKKSMPServer, batches_of
from protocols.errors import (
    ActiveSetError,
    IntegrityError,
    KeySwitchRefusedError,
    ProtocolError,
    RepeatedKeySwitchError,
    UnplannedKeySwitchError,
)
from protocols.link import ClientLink
from protocols.transcript import SERVER, client_party
from secure_fgl.runtime.dropouts import DropoutSchedule, DroppingLink, LostAfter, parse_dropouts
from secure_fgl.runtime.exchange import plan_rows, rows_table, run_server_half

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


def switched_downloads(protocol):
    """(receiver, data blocks, broadcast blocks) of each key-switched download of the ``mixed`` exchange."""
    return sorted(
        (m.receiver, len(m.payload["data"]), len(m.payload["broadcast"]))
        for m in protocol.transcript.select(tag="mixed", sender=SERVER)
        if "key-switched" in m.note
    )


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
    assert switched_downloads(whole) == switched_downloads(batched)
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

    def _keyswitch(self, link, groups, needed, active, attempt, shape, planned):
        got = super()._keyswitch(link, groups, needed, active, attempt, shape, planned)
        batch, replan, part = attempt
        if batch == 4:
            super()._keyswitch(link, groups, needed, active, (5, replan, part + 1), shape, None)
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

    def _keyswitch(self, link, groups, needed, active, attempt, shape, planned):
        if attempt[0] < 4:
            return super()._keyswitch(link, groups, needed, active, attempt, shape, planned)
        pieces, *ct_shape = shape
        return [[np.zeros((len(rows) * pieces, *ct_shape), dtype=np.uint32)] * K for _, rows in groups], []


def test_a_download_before_the_whole_planned_switch_is_refused():
    p = protocol_with(StopsEarly)
    with pytest.raises(IntegrityError, match="a download before this client switched every block"):
        mixed_exchange(p)


# ------------------------------------------------------------------ t-out-of-n: the same batches from the active set
T = 2  # of K = 3: the active set is the first two probe responders, (0, 1)


def threshold_protocol(server_class=CKKSMPServer, batch_bytes=1, clients=K, threshold=T) -> CKKSMPProtocol:
    cls = type("Batched", (CKKSMPProtocol,), {"server_half": server_class})
    return cls(clients, threshold=threshold, keyswitch_batch_bytes=batch_bytes)


def test_a_threshold_key_switch_in_batches_gives_the_one_call_result():
    """A t-out-of-n switch, one row per batch: the results are those of one call, byte for byte, and exact.

    Every batch goes to the same active set, and only the first names the planned switch (with the uploaders and
    each planned block's).
    """
    whole, batched = threshold_protocol(batch_bytes=256 << 20), threshold_protocol()
    got_whole, exact = mixed_exchange(whole)
    got, _ = mixed_exchange(batched)
    for c in range(K):
        assert got[c].tobytes() == got_whole[c].tobytes() and np.array_equal(got[c], exact[c])
    assert len(requests_of(whole)) == 1 and whole.server.last_stats["keyswitch_batches"] == 1
    batches = requests_of(batched)
    assert [m.payload["groups"].tolist() for m in batches] == [[[-1, 1]], [[-1, 1]], [[0, 1]], [[1, 1]], [[2, 1]]]
    assert all(m.payload["active"].tolist() == [0, 1] for m in batches)
    assert not requests_of(batched, 2)  # outside the active set: asked nothing
    planned = batches[0].payload["planned"]
    assert sorted(planned) == ["blocks", "groups", "uploaded", "uploaders"]
    assert planned["groups"].tolist() == requests_of(whole)[0].payload["planned"]["groups"].tolist()
    assert not any("planned" in m.payload for m in batches[1:])
    stats = batched.server.last_stats
    assert stats["keyswitch_batches"] == stats["keyswitch_requests"] == 5 and stats["active"] == (0, 1)
    assert switched_downloads(whole) == switched_downloads(batched)


def test_threshold_batches_are_cut_for_the_active_sets_share_bytes():
    """The bound counts the shares of the t clients asked, not of all K.

    A bound of two broadcast rows' shares from t clients (= one recipient row's, PCKS being twice CKS) holds the
    broadcast group in one batch and each recipient's row in one; counted for K clients it would split them all.
    """
    whole = threshold_protocol(batch_bytes=256 << 20)
    mixed_exchange(whole)
    cks = next(m for m in whole.transcript.select(tag="mixed") if m.kind == "share")  # a client's first: CKS
    row = len(cks.payload) // SHARED  # one client's CKS share of one aggregate row
    batched = threshold_protocol(batch_bytes=2 * row * T)
    got, exact = mixed_exchange(batched)
    assert all(np.array_equal(got[c], exact[c]) for c in range(K))
    assert [m.payload["groups"].tolist() for m in requests_of(batched)] == [[[-1, 2]], [[0, 1]], [[1, 1]], [[2, 1]]]


def test_a_batched_threshold_key_switch_survives_n_minus_t_silent_clients():
    """With 5 clients and t = 3, client 4 is silent from the probe on and client 1 lost after two of seven batches.

    The server re-plans the five batches left with the active set (0, 2, 3) (the re-plan names the planned switch
    again, to the new member too): the three clients left decrypt the exact sums; the two silent get nothing.
    """
    n, spec = 5, ValueSpec(integer=True, max_abs=1, sum_max=5)
    p = threshold_protocol(clients=n, threshold=3)
    silent = DroppingLink(p.link, DropoutSchedule(parse_dropouts("4,@keyswitch", n, "ckks-mp")))
    p.link = LostAfter(silent, {1}, "keyswitch", calls=3)  # the probe and two batches
    rpb = p.rows_per_block(spec, 2, 10**7)
    values = {c: (np.arange(2 * (SHARED + n)).reshape(-1, 2) + c) % 2 for c in range(n)}  # as mixed_exchange's
    rows = np.arange(SHARED + n) * rpb  # one row at the start of each block
    for c, half in p.clients.items():
        half.provider = lambda plan, v=values[c]: rows_table(plan, rows, v.astype(float))
    wanted = {c: np.r_[np.arange(SHARED), SHARED + c] for c in range(n)}  # blocks
    ctx = plan_rows("mixed", 0, {c: rows.size for c in range(n)}, wanted, {c: 1 + SHARED for c in range(n)},
                    rows.size * rpb, 2, "sparse", spec, rpb)  # fmt: skip
    assert run_server_half(p, ctx) == tuple(range(n))  # every upload is in the sums
    total = sum(values.values())
    for c in (0, 2, 3):
        assert {b: block[:2].tolist() for b, block in p.clients[c].take_result().items()} == {
            b: total[b].tolist() for b in wanted[c]
        }
    stats = p.server.last_stats
    assert stats["lost"] == (1,) and stats["replans"] == 1 and stats["active"] == (0, 2, 3)
    assert stats["keyswitch_batches"] == SHARED + n and stats["keyswitch_requests"] == SHARED + n + 1
    assert p.server.last_undelivered == (1, 4)
    replan = [m for m in requests_of(p, 3) if "planned" in m.payload]
    assert len(replan) == 1 and replan[0].payload["active"].tolist() == [0, 2, 3]


class EachClient(ClientLink):
    """Delivers each client's request on its own and records every refusal (re-raising the first, as a stage would)."""

    sequential = True

    def __init__(self, link: ClientLink):
        self.link, self.refused = link, {}

    def call(self, stage, requests):
        out = {}
        for k, request in requests.items():
            try:
                out.update(self.link.call(stage, {k: request}))
            except ProtocolError as exc:
                self.refused[k] = exc
        if self.refused:
            raise next(iter(self.refused.values()))
        return out


class ThresholdTampering(CKKSMPServer):
    """t-out-of-n, batches of one row each; :meth:`redo` may change batch ``b``'s active set and planned switch."""

    def redo(self, batch: int, active: list[int], planned):
        return active, planned

    def _keyswitch(self, link, groups, needed, active, attempt, shape, planned):
        active, planned = self.redo(attempt[0], active, planned)
        return super()._keyswitch(link, groups, needed, active, attempt, shape, planned)


class OtherActiveSet(ThresholdTampering):
    """From batch 2 on, asks (0, 2) instead of (0, 1), without a re-plan: other Lagrange weights on one switch."""

    def redo(self, batch, active, planned):
        return ([0, 2], planned) if batch >= 2 else (active, planned)


class BackToAnEarlierSet(ThresholdTampering):
    """Batch 2 re-plans to (0, 2) as if client 1 were lost, batch 3 re-plans back to (0, 1)."""

    def redo(self, batch, active, planned):
        if batch in (2, 3):
            return ([0, 2] if batch == 2 else [0, 1]), self.planned_switch
        self.planned_switch = planned if planned is not None else self.planned_switch
        return active, planned


class SecondThresholdPlan(ThresholdTampering):
    """Batch 2 names the planned switch again with the same active set (a second plan, not a re-plan)."""

    def redo(self, batch, active, planned):
        if planned is not None:
            self.planned_switch = planned
        return active, (self.planned_switch if batch == 2 else planned)


class ThresholdDuplicate(Tampering):
    """t-out-of-n: batch 1 asks again for batch 0's pair (block 0 to the broadcast key)."""

    def tamper(self, part, payload):
        return {**payload, **row(-1, 0)} if part == 2 else payload


class ThresholdOutsideThePlan(Tampering):
    """t-out-of-n: batch 4 switches client 2's scoped block to the broadcast key."""

    def tamper(self, part, payload):
        return {**payload, **row(-1, SHARED + 2)} if part == 5 else payload


class TwoUploaderSets(Tampering):
    """Plans block SHARED to recipient 1 as well, keyed without client 2 (outside the active set) there.

    Recipient 0 would decrypt block SHARED with client 2's input and a colluding recipient 1 without it: the
    difference is client 2's input.
    """

    def tamper(self, part, payload):
        if "planned" not in payload:
            return payload
        planned = dict(payload["planned"])
        groups, blocks, uploaded = planned["groups"].copy(), planned["blocks"].tolist(), planned["uploaded"]
        at = int(groups[:3, 1].sum())  # recipient 1's group is the third
        groups[2, 1] += 1
        without_2 = uploaded[blocks.index(SHARED)].copy()
        without_2[2] = 0
        planned.update(
            groups=groups,
            blocks=np.array(blocks[:at] + [SHARED] + blocks[at:]),
            uploaded=np.insert(uploaded, at, without_2, axis=0),
        )
        return {**payload, "planned": planned}


@pytest.mark.parametrize(
    "server,refused,match",
    [
        (OtherActiveSet, {0: ActiveSetError, 2: KeySwitchRefusedError}, r"the active set is fixed for a switch"),
        (BackToAnEarlierSet, {0: RepeatedKeySwitchError, 1: RepeatedKeySwitchError}, "answered before"),
        (SecondThresholdPlan, {0: RepeatedKeySwitchError, 1: RepeatedKeySwitchError}, "answered before"),
        (ThresholdDuplicate, {0: RepeatedKeySwitchError, 1: RepeatedKeySwitchError}, "switched to the broadcast key"),
        (ThresholdOutsideThePlan, {0: UnplannedKeySwitchError, 1: UnplannedKeySwitchError}, "to the broadcast key"),
        (TwoUploaderSets, {0: ActiveSetError, 1: ActiveSetError}, "two different sets of uploaders"),
    ],
)
def test_threshold_batches_outside_one_switch_by_one_active_set_are_refused(server, refused, match):
    """Adversary: an actively malicious server.  Every batch of a t-out-of-n switch comes from one active set.

    Another active set between batches without a re-plan (other Lagrange weights on the same uploads), a re-plan
    back to an active set answered before, a second plan with the same set, a pair twice, a pair outside the plan,
    a block planned with two uploader sets: every client asked refuses before any share of that batch leaves it,
    and nothing is delivered.
    """
    p = threshold_protocol(server)
    p.link = each = EachClient(p.link)
    with pytest.raises(tuple(refused.values()), match=match):
        mixed_exchange(p)
    assert {k: type(e) for k, e in each.refused.items()} == refused
    assert all(r is None for r in p.client_results().values())
