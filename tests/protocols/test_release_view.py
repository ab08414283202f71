"""FedGCN's pre-training sums bound to one view: the server commits to the whole released sum.

Each recipient of a ``release`` exchange (different rows of one sum to different clients) checks its blocks against
the server's Merkle commitment (:mod:`protocols.release_commitment`) and binds the root into every later
contribution (:mod:`protocols.broadcast_view`).  Malicious server halves (subclasses of the honest mask or ckks-mp
server) hand one client a different sum: with the honest commitment its proof fails; with a commitment of its own
the next broadcast exchange is refused before anything is unmasked (mask) or decrypted (ckks-mp).  Both abort with
InconsistentViewError.  In mask the commitment is over the blocks' wire bytes (every recipient of a block gets the
same bytes); in ckks-mp each recipient's blocks are key-switched to its own key, so the server commits to the
recipients' keyed digests of what they decoded, each delivered only once its digests are leaves of the root.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.forgers import ShiftedCommittedMPServer

from protocols import ValueSpec, make_protocol
from protocols.errors import DropoutError, InconsistentViewError
from protocols.release_commitment import block_leaf, empty_leaf, prove, root_of, tree, verify
from protocols.schedule import BROADCAST, RELEASE, STATISTIC

K, ROWS, DIM, VICTIM = 4, 8, 3, 1
ROLES = {"sums": RELEASE, "model": BROADCAST}
#: FedOMD's shape: a statistic of the round's sample, then the model sum
STATISTIC_ROLES = {"stats": STATISTIC, "model": BROADCAST}
SPEC = ValueSpec(max_abs=1.0, tolerance=1e-3)


def _protocol(server_mixin=None, mode="mask", roles=None):
    cls = make_protocol(mode, K).__class__
    if server_mixin is not None:
        server = type(f"Malicious{cls.server_half.__name__}", (server_mixin, cls.server_half), {})
        cls = type(f"Malicious{cls.__name__}", (cls,), {"server_half": server})
    return cls(K, roles=roles or ROLES)


def _sums(proto):
    """Every client contributes rows of the matrix; client k receives rows 2k, 2k+1 and row 0 (shared)."""
    rng = np.random.default_rng(0)
    contributions = {k: (np.arange(ROWS), rng.uniform(-0.2, 0.2, (ROWS, DIM))) for k in range(K)}
    requests = {k: np.array(sorted({0, 2 * k, 2 * k + 1})) for k in range(K)}
    got = proto.row_sum("sums", 0, contributions, requests, ROWS, layout="sparse", spec=SPEC)
    total = sum(rows for _, rows in contributions.values())
    return got, {k: total[r] for k, r in requests.items()}


def _model(proto, rnd=0):
    x = {k: np.full(5, 0.1 * (k + 1)) for k in range(K)}
    return proto.weighted_sum("model", rnd, x, spec=SPEC, recipients=range(K))


class TwoSumsServer:
    """Hands the victim a sum one unit of the ring larger in its first block, under a commitment of its own."""

    def stage_download(self, ex, link):
        if not self.schedule.releases(ex.plan.tag):
            return super().stage_download(ex, link)
        victim = {VICTIM: ex.plan.requests[VICTIM]}
        others = {r: b for r, b in ex.plan.requests.items() if r != VICTIM}
        forged = ex.total.copy()
        forged[int(np.searchsorted(ex.union, victim[VICTIM][0]))] += 1
        super().stage_download(dataclasses.replace(ex, plan=dataclasses.replace(ex.plan, requests=others)), link)
        forged_ex = dataclasses.replace(ex, plan=dataclasses.replace(ex.plan, requests=victim), total=forged)
        super().stage_download(forged_ex, link)


class TamperedRowsServer:
    """Changes the victim's downloaded rows after committing to the honest sum."""

    def call(self, link, stage, messages, *, hook=True):
        if stage == "download" and self.schedule.releases(self.plan.tag) and VICTIM in messages:
            (msg, part), *rest = messages[VICTIM]
            data = bytearray(msg.payload["data"])
            data[0] ^= 1
            msg = dataclasses.replace(msg, payload={**msg.payload, "data": bytes(data)})
            messages = {**messages, VICTIM: [(msg, part), *rest]}
        return super().call(link, stage, messages, hook=hook)


def test_honest_released_rows_verify_and_bind_one_commitment():
    proto = _protocol()
    got, want = _sums(proto)
    assert all(np.allclose(got[k], want[k], atol=1e-2) for k in range(K))
    released = {half.views.released for half in proto.clients.values()}
    assert len(released) == 1 and bytes(32) not in released
    assert np.allclose(_model(proto), sum(np.full(5, 0.1 * (k + 1)) for k in range(K)), atol=1e-2)


def test_a_different_sum_under_its_own_commitment_aborts_the_next_sum():
    proto = _protocol(TwoSumsServer)
    _sums(proto)  # each client's rows verify against the root it was given
    assert proto.clients[VICTIM].views.released != proto.clients[0].views.released
    with pytest.raises(InconsistentViewError, match="different broadcasts") as err:
        _model(proto)
    assert err.value.tag == "model"
    assert not [m for m in proto.transcript.messages if m.tag == "model" and m.kind == "share" and m.sender != "server"]


def test_rows_outside_the_committed_sum_are_refused():
    proto = _protocol(TamperedRowsServer)
    with pytest.raises(InconsistentViewError, match="not part of the sum the server committed to") as err:
        _sums(proto)
    assert (err.value.client, err.value.tag) == (VICTIM, "sums")
    assert proto.clients[VICTIM]._result is None


def test_merkle_proofs_recompute_the_root_only_for_the_committed_leaves():
    for num in (1, 2, 5, 16, 33):
        leaves = [block_leaf(b, bytes([b]) * 4, [0, 2]) for b in range(num - 1)] + [empty_leaf(num - 1)]
        levels = tree(leaves)
        for own in ({0}, {num - 1}, set(range(0, num, 3)), set(range(num))):
            proof = prove(levels, own)
            assert verify(root_of(levels), num, {p: leaves[p] for p in own}, proof)
            assert len(proof) <= 32 * len(own) * max(1, (num - 1).bit_length())
            first = min(own)
            assert not verify(
                root_of(levels), num, {**{p: leaves[p] for p in own}, first: block_leaf(first, b"forged", [0])}, proof
            )
            assert not verify(root_of(levels), num + 1, {p: leaves[p] for p in own}, proof)


class ShiftedRowsMPServer(ShiftedCommittedMPServer):
    """ckks-mp: shifts the victim's decoded rows by one quantum; commits to the victim's digests apart."""

    forged, victim = "sums", VICTIM


class OneCommitmentMPServer(ShiftedRowsMPServer):
    """ckks-mp: shifts the victim's rows but commits to the others' digests only, sending the victim that root."""

    def release_messages(self, reports):
        victim = sorted(reports.pop(VICTIM))
        honest = super(ShiftedCommittedMPServer, self).release_messages(reports)
        levels_root = honest[0]["root"]
        return {**honest, VICTIM: {"root": levels_root, "proof": b"\0" * 32 * max(1, len(victim))}}


def test_ckks_mp_honest_released_rows_verify_and_bind_one_commitment():
    proto = _protocol(mode="ckks-mp")
    got, want = _sums(proto)
    assert all(np.allclose(got[k], want[k], atol=1e-2) for k in range(K))
    released = {half.views.released for half in proto.clients.values()}
    assert len(released) == 1 and bytes(32) not in released
    assert np.allclose(_model(proto), sum(np.full(5, 0.1 * (k + 1)) for k in range(K)), atol=1e-2)


def test_ckks_mp_a_different_sum_under_its_own_commitment_aborts_the_next_sum():
    proto = _protocol(ShiftedRowsMPServer, mode="ckks-mp")
    got, want = _sums(proto)  # each client's digests verify against the root it was given
    assert got[VICTIM][0, 0] > got[0][0, 0]  # row 0 (every client's): the victim decoded another sum
    assert np.array_equal(got[VICTIM][0, 1:], got[0][0, 1:]) and np.array_equal(got[2][0], got[0][0])
    assert proto.clients[VICTIM].views.released != proto.clients[0].views.released
    with pytest.raises(InconsistentViewError, match="masks did not cancel") as err:
        _model(proto)
    assert err.value.tag == "model"


def test_ckks_mp_rows_outside_the_committed_sum_are_refused():
    proto = _protocol(OneCommitmentMPServer, mode="ckks-mp")
    with pytest.raises(InconsistentViewError, match="not part of the sum the server committed to") as err:
        _sums(proto)
    assert (err.value.client, err.value.tag) == (VICTIM, "sums")
    assert proto.clients[VICTIM]._result is None


def _statistic(proto):
    """Every client contributes a vector and receives the pooled sum (FedOMD's statistics, every client sampled)."""
    x = {k: np.linspace(-0.1, 0.1, DIM) * (k + 1) for k in range(K)}
    return proto.weighted_sum("stats", 0, x, spec=SPEC, recipients=range(K)), sum(x.values())


class ShiftedStatisticMPServer(ShiftedRowsMPServer):
    """ckks-mp: sends the victim a statistic one quantum off (its key-switched copy shifted), committed apart."""

    forged = "stats"


class OneStatisticCommitmentMPServer(OneCommitmentMPServer):
    """ckks-mp: shifts the victim's statistic and sends it the root over the others' digests."""

    forged = "stats"


def test_ckks_mp_honest_statistics_verify_and_bind_one_commitment():
    proto = _protocol(mode="ckks-mp", roles=STATISTIC_ROLES)
    got, want = _statistic(proto)
    assert np.allclose(got, want, atol=1e-2)
    released = {half.views.released for half in proto.clients.values()}
    assert len(released) == 1 and bytes(32) not in released
    assert np.allclose(_model(proto), sum(np.full(5, 0.1 * (k + 1)) for k in range(K)), atol=1e-2)


def test_ckks_mp_a_statistic_sent_to_one_client_alone_is_refused_at_the_next_sum():
    """Without the commitment the victim trains on the shifted statistic and the model sum completes."""
    proto = _protocol(ShiftedStatisticMPServer, mode="ckks-mp", roles=STATISTIC_ROLES)
    _statistic(proto)  # each client's digests verify against the root it was given
    with pytest.raises(InconsistentViewError, match="masks did not cancel") as err:
        _model(proto)
    assert err.value.tag == "model"
    assert all(half._result is None for half in proto.clients.values())  # nothing of the model sum delivered
    assert proto.clients[VICTIM].views.released != proto.clients[0].views.released


def test_ckks_mp_a_statistic_outside_the_committed_sum_is_refused_on_arrival():
    proto = _protocol(OneStatisticCommitmentMPServer, mode="ckks-mp", roles=STATISTIC_ROLES)
    with pytest.raises(InconsistentViewError, match="not part of the sum the server committed to") as err:
        _statistic(proto)
    assert (err.value.client, err.value.tag) == (VICTIM, "stats")
    assert proto.clients[VICTIM]._result is None


@pytest.mark.parametrize("exchange", [_sums, _statistic], ids=["release", "statistic"])
def test_ckks_mp_a_client_silent_at_the_release_stage_is_a_dropout_and_later_sums_are_refused(exchange):
    """Silent at ``release``: DropoutError naming it, nothing delivered to it, every later sum refused.

    It holds another commitment than the others, so every later exchange it key-switches fails to decrypt.
    """
    proto = _protocol(mode="ckks-mp", roles=STATISTIC_ROLES if exchange is _statistic else ROLES)
    proto.link.drop(VICTIM, "release")
    with pytest.raises(DropoutError, match="no result was delivered") as err:
        exchange(proto)
    assert err.value.client == VICTIM and proto.server.last_undelivered == (VICTIM,)
    assert proto.clients[VICTIM]._result is None and proto.clients[VICTIM].views.released == bytes(32)
    assert len({proto.clients[k].views.released for k in range(K) if k != VICTIM} - {bytes(32)}) == 1
    proto.link.reconnect(VICTIM)
    with pytest.raises(InconsistentViewError, match="masks did not cancel") as err:
        _model(proto)
    assert err.value.tag == "model"
