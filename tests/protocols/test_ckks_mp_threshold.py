"""T-out-of-n ckks-mp.

t-out-of-n ckks-mp (``threshold``): Shamir-shared client secrets, an active set of exactly t
clients key-switching with Lagrange-weighted shares, dropouts of up to n - t clients, and a server
that names a wrong active set or misreports the uploaders (malicious server halves: subclasses
that change what the honest server sends, never the clients' code).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

import numpy as np
import pytest

from protocols import DropoutError, ValueSpec, make_protocol
from protocols.ckks_mp import encoding, encryption
from protocols.ckks_mp.backend import CKKSMPProtocol, params_to_options
from protocols.ckks_mp.client import ROTATION_PART, THRESHOLD_TAG, CKKSMPClient
from protocols.ckks_mp.keys import secret_key
from protocols.ckks_mp.params import MPParams
from protocols.ckks_mp.server import CKKSMPServer
from protocols.ckks_mp.threshold import lagrange_coefficient, share_secret
from protocols.errors import (
    ActiveSetError,
    ConfigurationError,
    DowngradeError,
    IntegrityError,
    RepeatedKeySwitchError,
)
from protocols.party import PartySetup
from protocols.transcript import SERVER, client_party
from secure_fgl.runtime.dropouts import DropoutSchedule, DroppingLink, LostAfter, parse_dropouts
from secure_fgl.runtime.exchange import dense_result, plan_dense, plan_rows, rows_table, run_server_half

K, T = 4, 3
COUNTS = ValueSpec(integer=True, max_abs=50, sum_max=K * 50)
LENGTH = 16


def inputs(n: int = K) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(3)
    return {k: rng.integers(0, 51, LENGTH).astype(float) for k in range(n)}


def exchange(p, x, rnd: int = 0, tag: str = "t/sum"):
    """One dense integer sum of every client's vector to every client; returns (included, results)."""
    for k, half in p.clients.items():
        half.provider = lambda plan, v=x[k]: plan.dense_table(v)
    included = run_server_half(p, plan_dense(p, tag, rnd, range(K), range(K), LENGTH, COUNTS))
    got = {}
    for k, half in p.clients.items():
        try:
            got[k] = dense_result(half.result(), LENGTH)
        except DropoutError:
            pass
    return included, got


def dropping(p, spec: str):
    """``p`` with its clients dropping by ``spec`` (a fresh schedule over its undropping link)."""
    base = p.link.link if isinstance(p.link, DroppingLink) else p.link
    p.link = DroppingLink(base, DropoutSchedule(parse_dropouts(spec, K, "ckks-mp")))
    return p


# ------------------------------------------------------------------ Shamir over R_Q
def test_any_t_shares_reconstruct_the_secret_and_t_minus_1_give_noise():
    p = make_protocol("ckks-mp", 5, threshold=3)
    ring, level = p.ring, p.params.num_primes
    s = secret_key(ring, level)
    shares = share_secret(ring, s, 3, 5)
    q0 = ring.primes[0]

    def interpolate(subset):
        total = np.zeros_like(s)
        for j in subset:
            total = ring.add(total, ring.mul(shares[j], lagrange_coefficient(ring.primes[:level], subset, j)))
        return total

    for subset in combinations(range(5), 3):
        assert np.array_equal(interpolate(list(subset)), s)
    for subset in combinations(range(5), 2):  # as if the coalition's two points were all there is
        guess = ring.intt(interpolate(list(subset)))[0]
        centred = np.where(guess > q0 // 2, guess - q0, guess)
        # a ternary secret has every coefficient in {-1, 0, 1}; a uniform residue almost never
        assert np.mean(np.abs(centred) <= 1) < 1e-3


def test_threshold_outside_1_to_n_or_without_an_honest_overlap_is_refused():
    """Threshold outside 1..n, or with two active sets that could share no honest client, is refused.

    With 2t <= n + c two active sets of t could share only colluders, and the server could have each
    key-switch another sum (their difference an honest input): t-out-of-n needs 2t > n + c.
    """
    with pytest.raises(ConfigurationError, match="choose t in 1..4"):
        CKKSMPProtocol(K, threshold=5)
    with pytest.raises(ConfigurationError, match=r"2t > n \+ c, i.e. t >= 3"):
        CKKSMPProtocol(K, threshold=2)
    with pytest.raises(ConfigurationError, match=r"i.e. t >= 4"):
        CKKSMPProtocol(K, threshold=3, max_colluders=2)
    # a public setup built past the facade: every client half refuses it itself
    options = {"params": params_to_options(MPParams()), "keep_payload_bytes": 1, "threshold": 2}
    with pytest.raises(IntegrityError, match=r"2t > n \+ c"):
        CKKSMPClient(0, PartySetup("ckks-mp", K, b"r" * 16, b"s" * 16, options).to_bytes())


# ------------------------------------------------------------------ t of n decrypt, exactly
def test_any_t_of_n_clients_decrypt_exactly_and_fewer_is_a_dropout_error():
    """Any t of n clients decrypt exactly and fewer is a dropout error.

    Each round drops a different client at key switching: the four active sets of 3 of 4
    clients each key-switch every upload (the dropped client's included) to the exact sum.
    """
    p = make_protocol("ckks-mp", K, threshold=T)
    x = inputs()
    active_sets = []
    for rnd in range(K):
        included, got = exchange(dropping(p, f"{rnd},@keyswitch"), x, rnd, f"t/r{rnd}")
        assert included == tuple(range(K))
        assert sorted(got) == [k for k in range(K) if k != rnd]  # the dropped one gets nothing
        for total in got.values():
            assert np.array_equal(total, sum(x.values()))
        active_sets.append(p.server.last_stats["active"])
    assert sorted(active_sets) == sorted(tuple(a) for a in combinations(range(K), T))
    # two of four at key switching: fewer than t left, a DropoutError naming both, nothing delivered
    p = dropping(make_protocol("ckks-mp", K, threshold=T), "2,3@keyswitch")
    with pytest.raises(DropoutError) as err:
        exchange(p, x)
    assert err.value.clients == (2, 3)
    for half in p.clients.values():  # nothing delivered
        with pytest.raises(DropoutError):
            half.result()


def test_dropout_at_upload_sums_the_uploaders_and_n_minus_t_is_the_limit():
    x = inputs()
    included, got = exchange(dropping(make_protocol("ckks-mp", K, threshold=T), "1,@upload"), x)
    assert included == (0, 2, 3) and sorted(got) == [0, 2, 3]
    for total in got.values():
        assert np.array_equal(total, x[0] + x[2] + x[3])
    with pytest.raises(DropoutError, match=r"client\(s\) 1, 2 did not send its upload") as err:
        exchange(dropping(make_protocol("ckks-mp", K, threshold=T), "1,2@upload"), x)
    assert err.value.clients == (1, 2)


@pytest.mark.parametrize("spec", ["3,@upload", "1,@block_ids"])
def test_sparse_row_sum_keys_each_block_to_its_own_uploaders(spec):
    """Sparse row sum keys each block to its own uploaders.

    Sparse layout: client c uploads blocks c and c + 1 (mod 4), client r receives block r.  A
    client dropped before its upload is left out of exactly the blocks it would have uploaded.
    """
    p = dropping(make_protocol("ckks-mp", K, threshold=T), spec)
    spec_rows = ValueSpec(integer=True, max_abs=1, sum_max=K)
    rpb, dim = p.rows_per_block(spec_rows, 2, 10**7), 2
    for c, half in p.clients.items():
        ids = np.sort(np.array([c, (c + 1) % K]) * rpb)
        half.provider = lambda plan, ids=ids: rows_table(plan, ids, np.ones((2, dim)))
    ctx = plan_rows(
        "t/rows",
        0,
        {c: 2 for c in range(K)},
        {c: np.array([c]) for c in range(K)},
        {c: 1 for c in range(K)},
        K * rpb,
        dim,
        "sparse",
        spec_rows,
        rpb,
    )
    dropped = int(spec[0])
    assert run_server_half(p, ctx) == tuple(c for c in range(K) if c != dropped)
    for r in range(K):  # block r's uploaders are clients r - 1 and r; the dropped one gets nothing
        if r != dropped:
            uploaders = {(r - 1) % K, r} - {dropped}
            assert np.array_equal(p.clients[r].take_result()[r][:dim], np.full(dim, len(uploaders)))


def test_set_up_streams_n_times_n_minus_1_shares_holding_one_rotation_at_a_time():
    """Set-up streams n (n - 1) shares holding one rotation at a time.

    n (n - 1) shares of one ring element each cross the server, and its relay counter never holds more than one
    rotation's n of them (the n - 1 of one dealer, plus one); it keeps no sealed share in its transcript.
    """
    p = make_protocol("ckks-mp", K, threshold=T)
    exchange(p, inputs())
    relayed = [m for m in p.transcript.messages if m.tag == THRESHOLD_TAG and m.receiver != SERVER]
    assert len(relayed) == K * (K - 1)
    element = p.params.num_primes * p.params.n * 4  # L x N uint32 residues
    assert all(element <= m.nbytes < element + 1024 for m in relayed)
    assert all(m.payload is None for m in relayed)
    share = max(m.nbytes for m in relayed) + 1024  # a share's wire bytes, at most
    assert (K - 1) * element < p.server.relay_peak <= K * share
    assert p.server.relay_held == 0


def test_a_client_lost_during_the_share_rotations_is_left_out_for_the_rest_of_the_run():
    """Client 2 answers part 0 and the first rotation, then disconnects: the set-up finishes without it.

    The three finishers hold no share of client 2's secret (it dealt only to client 3 before it vanished), no share is
    sent for it once it is known gone, every sum
    from then on covers 0, 1 and 3 (client 2 back online is never addressed again), and a second dropout, past
    n - t in all, is a DropoutError naming both.
    """
    p = make_protocol("ckks-mp", K, threshold=T)
    p.link = LostAfter(p.link, {2}, "key_setup", calls=2)
    x = inputs()
    included, got = exchange(p, x)
    assert included == (0, 1, 3) and sorted(got) == [0, 1, 3]
    for total in got.values():
        assert np.array_equal(total, x[0] + x[1] + x[3])
    assert p.server.unfinished == {2} and p.server.last_undelivered == (2,)
    shares = [m for m in p.transcript.messages if m.tag == THRESHOLD_TAG and m.receiver != SERVER]
    assert len(shares) == 9  # 3 x 2 among the finishers, 2 -> 3, and 1 -> 2, 0 -> 2 before it was known gone
    skipped = [m.receiver for m in p.transcript.messages if m.note.startswith("skip your Shamir share")]
    assert skipped == [client_party(3)]  # the last rotation: client 3's share for client 2 is never sent
    for k in (0, 1, 3):
        assert p.clients[k].finishers == {0, 1, 3} and p.clients[k].keys.dealers == {0, 1, 3}
    assert p.server.relay_held == 0
    p.link = p.link.link  # client 2 is back: never asked again
    included, got = exchange(p, x, 1, "t/again")
    assert included == (0, 1, 3) and sorted(got) == [0, 1, 3]
    with pytest.raises(DropoutError, match=r"client\(s\) 2, 3 did not send its upload") as err:
        exchange(dropping(p, "3,@upload"), x, 2, "t/more")
    assert err.value.clients == (2, 3)


def test_the_broadcast_dealer_lost_at_key_set_up_is_replaced_by_the_next_client():
    """Client 0 (the broadcast key's dealer) never answers, and client 1, asked to deal in its place, is lost too.

    With n = 5 and t = 3 the set-up finishes with 2, 3 and 4, client 2 dealing the broadcast key; their sum is exact.
    """
    p = make_protocol("ckks-mp", 5, threshold=3)
    dealer_gone = DropoutSchedule(parse_dropouts("0,@key_setup", 5, "ckks-mp"))
    p.link = DroppingLink(LostAfter(p.link, {1}, "key_setup", calls=1), dealer_gone)
    x = {k: np.full(LENGTH, float(k + 1)) for k in range(5)}
    for k, half in p.clients.items():
        half.provider = lambda plan, v=x[k]: plan.dense_table(v)
    included = run_server_half(p, plan_dense(p, "t/sum", 0, range(5), range(5), LENGTH, COUNTS))
    assert included == (2, 3, 4) and p.server.unfinished == {0, 1}
    for k in (2, 3, 4):
        assert np.array_equal(dense_result(p.clients[k].result(), LENGTH), x[2] + x[3] + x[4])
    asked = [m.receiver for m in p.transcript.messages if m.note == "deal the broadcast key"]
    assert asked == [client_party(1), client_party(2)]
    assert p.server.fingerprint == p.clients[2].fingerprint == p.clients[4].fingerprint


# ------------------------------------------------------------------ a server naming a wrong active set
class EvilServer(CKKSMPServer):
    """The honest server, with every request passed through :meth:`tamper` before it is signed."""

    def tamper(self, stage: str, client: int, msg, part: int):
        return [(msg, part)]

    def call(self, link, stage, messages, *, hook=True):
        messages = {
            k: [x for msg, part in batch for x in self.tamper(stage, k, msg, part)] for k, batch in messages.items()
        }
        return super().call(link, stage, messages, hook=hook)


def changed(payload: dict, **fields) -> dict:
    """A key-switching request with ``fields`` replaced: ``active`` in the request, the others in its planned switch."""
    planned = {**payload["planned"], **{k: v for k, v in fields.items() if k != "active"}}
    return {**payload, **{k: v for k, v in fields.items() if k == "active"}, "planned": planned}


def request_changer(**changes):
    """A server that rewrites fields of the t-out-of-n key-switching request opening the switch (part 1)."""

    class Changed(EvilServer):
        def tamper(self, stage, client, msg, part):
            if stage == "keyswitch" and part == 1:
                msg = replace(msg, payload=changed(msg.payload, **{k: f(msg.payload) for k, f in changes.items()}))
            return [(msg, part)]

    return Changed


def attacked(server_class) -> CKKSMPProtocol:
    cls = type("Attacked", (CKKSMPProtocol,), {"server_half": server_class})
    return cls(K, threshold=T)


@pytest.mark.parametrize(
    "server,message",
    [
        (request_changer(active=lambda p: np.array([0, 1])), "needs exactly t = 3"),  # t - 1
        (request_changer(active=lambda p: np.arange(4)), "needs exactly t = 3"),  # t + 1
        (request_changer(active=lambda p: np.array([0, 1, 0])), "needs exactly t = 3"),  # a repeat
        (request_changer(active=lambda p: np.array([0, 1, 7])), r"client\(s\) \[7\], not among"),
        # the three honest members are told that client 0 did not upload (to leave it out)
        (request_changer(uploaders=lambda p: np.array([1, 2, 3])), "name this client's own upload"),
        # more uploads declared missing than n - t
        (request_changer(uploaders=lambda p: np.array([0, 1])), "at most n - t = 1 missing"),
        (request_changer(uploaders=lambda p: np.array([0, 1, 2, 3, 9])), r"client\(s\) \[9\], not among"),
    ],
)
def test_a_wrong_active_set_or_uploader_set_is_refused(server, message):
    with pytest.raises(ActiveSetError, match=message):
        exchange(attacked(server), inputs())


class NamesTheLeftOut(EvilServer):
    """Client 3 left the set-up; the server names it among the uploaders of a key switch anyway."""

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch" and part == 1:
            msg = replace(msg, payload=changed(msg.payload, uploaders=np.arange(K)))
        return [(msg, part)]


class TooFewFinishers(EvilServer):
    """The server tells client 0 that only t - 1 clients finished the set-up."""

    def tamper(self, stage, client, msg, part):
        if stage == "key_setup" and part == 1 and client == 0:
            msg = replace(msg, payload={**msg.payload, "finishers": np.array([0, 1])})
        return [(msg, part)]


class SkipsAFinisher(CKKSMPServer):
    """In the first rotation the server tells client 0 to skip its share for client 1, which stays in the set-up."""

    def _relay_shares(self, link, rnd, offset):
        if offset > 1:
            return super()._relay_shares(link, rnd, offset)
        ask = {
            k: [(self._key_request(rnd, k, {"to": (k + 1) % K, "skip": k == 0}, "a rotation"), ROTATION_PART)]
            for k in range(K)
        }
        self.call(link, "key_setup", ask, hook=False)


def test_a_server_naming_a_client_outside_the_finishers_or_too_few_of_them_is_refused():
    p = attacked(NamesTheLeftOut)
    p.link = LostAfter(p.link, {3}, "key_setup", calls=1)
    with pytest.raises(ActiveSetError, match=r"client\(s\) \[3\], which did not finish the key set-up"):
        exchange(p, inputs())
    with pytest.raises(IntegrityError, match="needs at least t = 3"):
        exchange(attacked(TooFewFinishers), inputs())
    with pytest.raises(IntegrityError, match=r"unsent: \[1\]"):  # a finisher must hold a share from each other
        exchange(attacked(SkipsAFinisher), inputs())


def test_a_sum_never_covers_fewer_uploaders_than_the_runs_minimum_contributors():
    """A sum never covers fewer uploaders than the runs minimum contributors.

    With a run minimum of 4 contributors, a server that declares one honest upload dropped (as a
    real dropout would) cannot get the other three key-switched.
    """
    p = dropping(make_protocol("ckks-mp", K, threshold=T, min_contributors=4), "3,@upload")
    with pytest.raises(ActiveSetError, match="at least 4"):
        exchange(p, inputs())


class Replan(EvilServer):
    """After the honest key switch by (0, 1, 2), re-plans as if client 2 were lost, asking ``again``.

    ``again``: the active set of the re-plan; ``change``: how it rewrites the request's uploaders.
    """

    again: tuple[int, ...] = (0, 1, 3)
    change = staticmethod(lambda extra: extra)

    def _keyswitch(self, link, groups, needed, active, attempt, shape, planned):
        got = super()._keyswitch(link, groups, needed, active, attempt, shape, planned)
        batch, replan, part = attempt
        if replan == 0:
            again = (batch, 1, part + 1)
            super()._keyswitch(link, groups, needed, list(self.again), again, shape, self.change(planned))
        return got


def without_3(planned):
    """The uploaders without client 3: a second sum, whose difference from the first is client 3's input."""
    uploaded = np.array(planned["uploaded"])
    uploaded[:, 3] = 0
    return {**planned, "uploaders": np.array([0, 1, 2]), "uploaded": uploaded}


@pytest.mark.parametrize(
    "again,change,message",
    [
        ((0, 1, 2), None, "answered before"),  # the same active set twice
        ((0, 1, 3), without_3, "re-plan may change only the active set"),  # a second, different sum
    ],
)
def test_a_replan_releases_no_second_sum(again, change, message):
    server = type("Evil", (Replan,), {"again": again, **({"change": staticmethod(change)} if change else {})})
    with pytest.raises(RepeatedKeySwitchError, match=message):
        exchange(attacked(server), inputs())


def test_a_member_of_the_active_set_lost_after_the_probe_is_replaced():
    """A member of the active set lost after the probe is replaced.

    Client 2 of the active set (0, 1, 2) answers the probe, then disconnects: the server re-plans with (0, 1, 3) and
    the others decrypt the exact sum of all four uploads; losing 2 and then 3 leaves fewer than t, a DropoutError.
    """
    x = inputs()
    p = make_protocol("ckks-mp", K, threshold=T)
    p.link = LostAfter(p.link, {2})
    included, got = exchange(p, x)
    assert included == tuple(range(K)) and sorted(got) == [0, 1, 3]
    assert p.server.last_stats["active"] == (0, 1, 3) and p.server.last_stats["lost"] == (2,)
    assert p.server.last_stats["replans"] == 1
    for total in got.values():
        assert np.array_equal(total, sum(x.values()))
    p = make_protocol("ckks-mp", K, threshold=T)
    p.link = LostAfter(p.link, {2, 3})
    with pytest.raises(DropoutError, match="key-switching") as err:
        exchange(p, x)
    assert err.value.clients == (2, 3)


class SplitUploaders(EvilServer):
    """Tells client 2 that client 3's upload is missing while clients 0 and 1 count it.

    The shares (keys and masks of two different views) combine to noise, which the recipients refuse.
    """

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch" and part == 1 and client == 2:
            msg = replace(msg, payload={**msg.payload, "planned": without_3(msg.payload["planned"])})
        return [(msg, part)]


def test_clients_told_different_uploaders_deliver_noise_not_a_sum():
    with pytest.raises(IntegrityError, match="a key-switching share or ciphertext was corrupted"):
        exchange(attacked(SplitUploaders), inputs())


# ------------------------------------------------------------------ a broadcast to the surviving recipients
def survivors_sum(p):
    """Clients 0-2 sum a vector each and receive the sum; client 3 (lost in an earlier round) is absent.

    Returns (the results, the key-switching share messages, the downloads).
    """
    x = inputs()
    for k, half in p.clients.items():
        half.provider = lambda plan, v=x[k]: plan.dense_table(v)
    assert run_server_half(dropping(p, "3,@keyswitch"), plan_dense(p, "t/model", 0, range(3), range(3), LENGTH, COUNTS))
    got = {k: dense_result(p.clients[k].result(), LENGTH) for k in range(3)}
    assert all(np.array_equal(total, x[0] + x[1] + x[2]) for total in got.values())
    messages = list(p.transcript.select(tag="t/model"))
    shares = [m for m in messages if m.kind == "share"]
    downloads = [m for m in messages if m.sender == SERVER and "key-switched" in m.note]
    return got, shares, downloads


def test_a_broadcast_reaches_its_surviving_recipients_through_one_switch_to_the_broadcast_key():
    """A schedule broadcast with a client absent goes once to the broadcast key; any other sum per recipient.

    The public schedule makes ``t/model`` a broadcast every client trains on, so the sum may go to
    ``s_B`` although client 3 receives nothing: it holds ``s_B`` and would have received it.  The t
    active clients each send one one-polynomial share (CKS) instead of one two-polynomial share per
    recipient (PCKS), and every recipient decrypts the exact sum.
    """
    _, cks, cks_downloads = survivors_sum(make_protocol("ckks-mp", K, threshold=T, roles={"t/model": "broadcast"}))
    _, pcks, pcks_downloads = survivors_sum(make_protocol("ckks-mp", K, threshold=T))
    assert len(cks) == T and len(cks_downloads) == 3 and all(not m.payload["data"] for m in cks_downloads)
    assert len(pcks) == 3 * T and all(m.payload["data"] and not m.payload["broadcast"] for m in pcks_downloads)
    assert 3 * sum(m.nbytes for m in cks) < sum(m.nbytes for m in pcks)


class BroadcastsToTheSurvivors(CKKSMPServer):
    """Plans a switch to the broadcast key for the survivors of a sum the schedule does not make a broadcast."""

    def run(self, plan, link):
        from protocols.ckks_mp.params import plan_exchange

        cks = plan_exchange(self.params, plan.spec, K, plan.dp_noise_std, plan.block_len, broadcast=True)
        recipients = np.array(sorted(plan.requests), dtype=np.int64)
        every = np.arange(plan.num_blocks)
        encoding = {**plan.encoding, "plan": cks.describe(), "broadcast_blocks": every, "broadcast_to": recipients}
        return super().run(replace(plan, encoding=encoding), link)


def test_a_switch_to_the_broadcast_key_with_non_recipients_needs_the_schedules_broadcast_role():
    """Without the broadcast role, a sum some client does not receive never goes to a key every client holds.

    Adversary: a server planning the survivors' sum for ``s_B`` so that a colluding client that was
    no recipient reads it.  Every recipient refuses the plan before its upload.
    """
    with pytest.raises(DowngradeError, match=r"client\(s\) \[3\] receive nothing"):
        survivors_sum(attacked(BroadcastsToTheSurvivors))


# ------------------------------------------------------------------ a coalition of t - 1 clients
def test_t_minus_1_clients_and_the_server_cannot_decrypt_an_upload():
    """T minus 1 clients and the server cannot decrypt an upload.

    Clients 0 and 1 (t - 1 = 2) pool their Shamir shares of client 3's secret and interpolate
    as well as two points allow; the victim's upload decrypts to noise (correlation at chance).
    Positive control: with a third share the upload opens exactly.
    """
    p = make_protocol("ckks-mp", K, threshold=T)
    x = inputs()
    victim, length = 3, 4000
    rng = np.random.default_rng(5)
    vals = {k: rng.integers(0, 51, length).astype(float) for k in range(K)}
    spec = ValueSpec(integer=True, max_abs=50, sum_max=K * 50)
    exchange(p, x)  # key set-up
    p.weighted_sum("victim", 0, vals, spec=spec)
    plan = p.plan(spec, block_len=length, broadcast=True)
    msg = next(
        m
        for m in p.transcript.select(tag="victim", sender=client_party(victim), receiver=SERVER)
        if m.kind == "ciphertext"
    )
    ct = p.upload_ciphertexts(msg, plan)[0]
    used = encoding.used_coefficients(plan, length)
    truth = centred(p, encoding.encode(p.ring, plan, encoding.quantize(vals[victim], plan)))[:used]
    level = p.params.num_primes

    def pooled(coalition):
        key = np.zeros_like(p._clients[0]._dealt[victim])
        for j in coalition:
            lam = lagrange_coefficient(p.ring.primes[:level], coalition, j)
            key = p.ring.add(key, p.ring.mul(p._clients[j]._dealt[victim], lam))
        return centred(p, encryption.decrypt(p.ring, key, ct))[:used]

    assert abs(np.corrcoef(pooled([0, 1]), truth)[0, 1]) < 5 / np.sqrt(used)
    assert np.corrcoef(pooled([0, 1, 2]), truth)[0, 1] > 0.999999


def centred(p, residues) -> np.ndarray:
    return np.array([float(c) for c in encoding.crt_centered(p.ring, residues)])


# ------------------------------------------------------------------ the run's settings and threat model
@pytest.mark.parametrize(
    "options,message",
    [
        ({"mode": "mask", "threshold": 3}, "use --mode ckks-mp"),
        ({"mode": "ckks-mp", "threshold": 5}, "exceeds --clients 4"),
        ({"mode": "ckks-mp", "threshold": 2, "max_colluders": 2}, "threshold must exceed the colluders"),
        ({"mode": "ckks-mp", "threshold": 2}, r"2t > n \+ c, i.e. --threshold >= 3"),
        ({"mode": "ckks-mp", "threshold": 3, "max_colluders": 2}, r"2t > n \+ c, i.e. --threshold >= 4"),
    ],
)
def test_threshold_setting_is_checked_before_the_run(options, message):
    from secure_fgl.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match=message):
        RunConfig(clients=4, **options).validate()


def test_threat_model_records_the_key_collusion_bound():
    from secure_fgl.config import RunConfig
    from secure_fgl.manifest import threat_model
    from secure_fgl.runtime.build import make_run_protocol

    for t, bound in ((None, K - 1), (T, T - 1)):
        cfg = RunConfig(clients=K, mode="ckks-mp", threshold=t).validate()
        model = threat_model(cfg, make_run_protocol(cfg, K))
        assert model["key_collusion_bound"] == bound
        assert (f"t = {T}" in model["holds"]) == (t is not None)
