"""Red-team attacks on ckks-mp and the signed envelopes.

Red-team attacks on ckks-mp and the signed envelopes by a server that deviates (plus colluding
clients): each is a malicious server half (a subclass of the honest one; the clients' code is never
changed) and either aborts with a specific ProtocolError at an honest client or learns nothing.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from protocols import ValueSpec
from protocols.ckks_mp.backend import CKKSMPProtocol
from protocols.ckks_mp.client import common_plan_digest
from protocols.ckks_mp.server import CKKSMPServer
from protocols.errors import IntegrityError, RecipientKeyError, RepeatedKeySwitchError
from protocols.transcript import client_party

K = 3
FLOATS = ValueSpec(max_abs=1.0, tolerance=1e-3)


def protocol_with(server_class) -> CKKSMPProtocol:
    return type("Attacked", (CKKSMPProtocol,), {"server_half": server_class})(K)


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    return {c: rng.uniform(-1, 1, 8) for c in range(K)}


# ------------------------------------------------------------------ one honest client told it does not contribute
class SplitView(CKKSMPServer):
    """Server + colluding recipient (client 2) against the victim (client 0).

    Every client but
    ``excluded`` gets the true plan (all K contributors, so a minimum-contributors check passes at
    the victim); ``excluded`` (honest client 1) is told it is no contributor, so it uploads nothing
    and key-switches without its share ``s_1``.  The server adds only the victim's and the
    colluder's uploads: if the masks cancelled, the delivered sum would be ``x_0 + x_2`` and the
    colluder would read ``x_0``.
    """

    excluded: int | None = 1

    def run(self, plan, link):
        self._announced = plan.contributors
        return super().run(replace(plan, contributors=tuple(c for c in plan.contributors if c != self.excluded)), link)

    def begin(self, plan, link, fingerprint, extra=()):
        self.plan, self.exchange = plan, plan.exchange
        parties = sorted(set(plan.parties) | set(extra))
        self.register(link, plan.round, parties)
        for k in parties:
            told = plan if k == self.excluded else replace(plan, contributors=self._announced)
            msg = self.message(k, "control", (), told.for_client(k).to_payload(), fingerprint, note="exchange plan")
            self.queue(k, msg, "plan")


class OneView(SplitView):
    """Control: the same machinery with no client excluded (every client holds one plan)."""

    excluded = None


def test_a_client_told_it_does_not_contribute_cannot_isolate_the_victim():
    """A client told it does not contribute cannot isolate the victim.

    The key-switching masks are labelled by the digest of the plan each client holds, so they
    cancel only when all K clients hold one plan: here the sum stays masked by the honest pair's
    (0, 1) PRG stream, the recipients refuse it as corrupted and nothing is delivered.
    """
    x = inputs()
    p = protocol_with(SplitView)
    with pytest.raises(IntegrityError, match="corrupted; nothing was delivered"):
        p.weighted_sum("w", 0, x, spec=FLOATS)
    assert all(r is None for r in p.client_results().values())
    views = {k: common_plan_digest(c.plan) for k, c in p.clients.items()}
    assert views[0] == views[2] != views[1]

    control = protocol_with(OneView).weighted_sum("w", 0, x, spec=FLOATS)  # the machinery is sound
    assert np.abs(control - sum(x.values())).max() <= 2 * K * FLOATS.tolerance


# ------------------------------------------------------------------ broadcast key under other labels
class TwoBroadcastLabels(CKKSMPServer):
    """Asks every client to switch its blocks to the broadcast key twice.

    Asks every client to switch its blocks to the broadcast key twice, under the recipient ids
    -2 and -3 (both negative: both would be treated as the broadcast key, with fresh masks).
    """

    def call(self, link, stage, messages, *, hook=True):
        if stage == "keyswitch":
            for batch in messages.values():
                msg, part = batch[0]
                blocks = np.asarray(msg.payload["blocks"])
                payload = {
                    **msg.payload,
                    "groups": np.array([[-2, blocks.size], [-3, blocks.size]]),
                    "blocks": np.concatenate([blocks, blocks]),
                }
                batch[0] = (replace(msg, payload=payload, shape=(2, 2)), part)
        return super().call(link, stage, messages, hook=hook)


def test_recipient_ids_below_the_broadcast_key_are_refused():
    with pytest.raises((RecipientKeyError, RepeatedKeySwitchError), match="recipient -2"):
        protocol_with(TwoBroadcastLabels).weighted_sum("w", 0, inputs(), spec=FLOATS)


# ------------------------------------------------------------------ a server message from another session
class ForeignSession(CKKSMPServer):
    """Replays a server message recorded in another session.

    A server message recorded in another session (same server identity key: a site reuses its key
    across runs, and a resumed run gets a new session) with an exchange number 1000 ahead, slipped
    into client 1's bundle.  It needs no key: an eavesdropper can
    replay it.  Client 1 is no recipient of the exchange, so the packet travels in its next bundle.  If
    client 1 adopts its exchange number, every later exchange fails at client 1.
    """

    def call(self, link, stage, messages, *, hook=True):
        if stage == "download" and not getattr(self, "_sent", False):
            self._sent = True
            own = self.setup, self.exchange
            self.setup, self.exchange = replace(self.setup, session=os.urandom(16)), self.exchange + 1000
            try:
                _, wire = self.seal(self.message(1, "control", (), {}, "", note="recorded elsewhere"), "download")
            finally:
                self.setup, self.exchange = own
            self._outbox.setdefault(1, []).append(wire)
        return super().call(link, stage, messages, hook=hook)


def test_a_server_message_of_another_session_does_not_move_the_exchange_number():
    from protocols.errors import ProtocolError

    p = protocol_with(ForeignSession)
    x = inputs()
    p.weighted_sum("a", 0, x, spec=FLOATS, recipients=[0])  # the packet waits in client 1's next bundle
    try:  # refusing the exchange it arrives in is allowed
        p.weighted_sum("b", 1, x, spec=FLOATS)
    except ProtocolError:
        pass
    assert p.clients[1].exchange == p.clients[0].exchange  # moving the counter is not
    third = p.weighted_sum("c", 2, x, spec=FLOATS)  # and the exchanges after it still run
    assert np.abs(third - sum(x.values())).max() <= 2 * K * FLOATS.tolerance


# ------------------------------------------------------------------ a subset of the uploads key-switched
class DropsAnUpload(CKKSMPServer):
    """Replaces honest client 1's upload by zeros.

    Every client holds the same plan, but the server replaces honest client 1's upload by zeros
    before adding, so that the aggregate holds only the victim's (0) and the colluder's (2) ``c0``.
    """

    def responses(self, got, k, stage, kind=None, part=0):
        msg = super().responses(got, k, stage, kind, part)
        if stage == "upload" and k == 1 and msg is not None:
            msg = replace(msg, payload=bytes(len(msg.payload)))
        return msg


def test_key_switching_a_subset_of_the_uploads_gives_noise():
    """Key switching a subset of the uploads gives noise.

    The key-switching shares always carry ``s_i c1`` of every client that uploaded the block, and
    the only multiple of ``s_1 c1`` the server holds is client 1's upload, which carries its input:
    without that upload the delivery is ``Delta (m_0 + m_2) + s_1 c1 + noise``, uniform modulo Q.
    The recipients refuse it; the colluder (client 2, holder of s_B) decrypting it finds no
    correlation with ``m_0 + m_2`` beyond chance.  Control: the honest delivery correlates > 0.999.
    """
    from protocols.ckks_mp import encoding, encryption
    from protocols.transcript import SERVER

    rng = np.random.default_rng(7)
    spec = ValueSpec(integer=True, max_abs=1, sum_max=K)
    vals = {c: rng.integers(0, 2, 4000).astype(float) for c in range(K)}

    def delivery_correlation(p, tag):
        plan = p.plan(spec, block_len=4000, broadcast=True)
        msg = next(
            m for m in p.transcript.select(tag=tag, sender=SERVER, receiver=client_party(2)) if m.kind == "ciphertext"
        )
        c0 = encryption.from_bytes(p.ring, msg.payload["broadcast"], (1, plan.switch_level, p.params.n))  # c0' only
        upload = next(
            m for m in p.transcript.select(tag=tag, sender=client_party(0), receiver=SERVER) if m.kind == "ciphertext"
        )
        c1 = p.upload_ciphertexts(upload, plan)[:, 1]  # the public c1 every client recomputes
        s_b_c1 = encryption.key_product(p.ring, p._clients[2]._broadcast.s_hat, c1)
        opened = encryption.decrypt_broadcast(p.ring, c0, s_b_c1)[0]
        used = encoding.used_coefficients(plan, 4000)
        target = encoding.quantize(vals[0] + vals[2], plan) - (K - 2) * encoding.quantize(np.zeros(4000), plan)
        truth = [float(x) for x in encoding.crt_centered(p.ring, encoding.encode(p.ring, plan, target))[:used]]
        got = [float(x) for x in encoding.crt_centered(p.ring, opened)[:used]]
        return abs(np.corrcoef(got, truth)[0, 1]), used

    p = protocol_with(DropsAnUpload)
    with pytest.raises(IntegrityError, match="corrupted"):
        p.weighted_sum("v", 0, vals, spec=spec)
    corr, used = delivery_correlation(p, "v")
    assert corr < 5 / np.sqrt(used)

    honest = CKKSMPProtocol(K)
    vals[1] = np.zeros(4000)  # the honest sum then equals m_0 + m_2
    honest.weighted_sum("v", 0, vals, spec=spec)
    assert delivery_correlation(honest, "v")[0] > 0.999


# ------------------------------------------------------------------ a withheld directory entry
class WithheldPeer(CKKSMPServer):
    """Leaves client 2 out of the key directory it sends client 1.

    Client 1 then has no pairwise seed with client 2 for its key-switching mask.
    """

    def _outgoing(self, msg, stage, part, intercept=None):
        if stage == "directory" and msg.receiver == client_party(1):
            kept = {p: v for p, v in msg.payload.items() if p != client_party(2)}
            msg = replace(msg, payload=kept, shape=(len(kept), 2, 32))
        return super()._outgoing(msg, stage, part, intercept)


def test_a_withheld_peer_key_is_a_named_refusal():
    with pytest.raises(IntegrityError, match="no channel key of client2 in the key directory"):
        protocol_with(WithheldPeer).weighted_sum("w", 0, inputs(), spec=FLOATS)


# ------------------------------------------------------------------ another exchange shape for the same contribution
def detour_server(base, shape: str):
    """A server half of ``base`` that detours the exchange it was asked to run.

    A server half of ``base`` that, in place of the exchange it was asked to run, asks the victim
    (client 0) for the same contribution through a step that does not hide it: ``pairwise`` (GCFL's
    similarity statistics: encrypted under a key the colluding decider, client 2, holds alone) or
    ``report`` (a scalar report: sent in the clear).  What the server receives is kept in ``stolen``.
    """

    def run(self, plan, link):
        if shape == "pairwise":
            detour = replace(
                plan,
                contributors=(0, 2),
                requests={2: np.zeros(1, np.int64)},
                encoding={"shape": "pairwise", "decider": 2},
            )
            self.begin(detour, link, "")
            self.call(link, "key_setup", {2: []})
            stage, kind = "upload", "ciphertext"
        else:
            self.begin(replace(plan, contributors=(0,), requests={}, encoding={}), link, "")
            stage, kind = "report", "plain"
        got = self.call(link, stage, {0: []})
        type(self).stolen = self.responses(got, 0, stage, kind).payload
        return plan.contributors

    return type(f"{shape.title()}Detour", (base,), {"run": run, "stolen": None})


def what_the_coalition_reads(p, shape):
    """The victim's contribution as the server and its colluders read it.

    The victim's contribution as the server (with the decider, for ``pairwise``) reads it; the
    pairwise step normalises it, so it is compared as a unit vector.
    """
    stolen = p.server.stolen
    if stolen is None:
        return None
    if shape == "pairwise":
        import tenseal as ts

        return np.array(ts.ckks_vector_from(p.clients[2].similarity_secret[1], stolen["frames"][0]).decrypt()[:8])
    return np.asarray(stolen, dtype=float)


def _mask_protocol(server):
    from protocols.mask import MaskProtocol
    from protocols.mask.server import MaskServer

    return type("Attacked", (MaskProtocol,), {"server_half": detour_server(MaskServer, server)})(K)


def _mp_protocol(server):
    return protocol_with(detour_server(CKKSMPServer, server))


@pytest.mark.parametrize(
    "make,shape",
    [
        (_mp_protocol, "pairwise"),
        (_mask_protocol, "pairwise"),  # refused by the framing: 'key_setup' is no stage of mask
        (_mp_protocol, "report"),  # refused: the tag is not one its owner reports in the clear
        (_mask_protocol, "report"),
    ],
)
def test_a_contribution_is_never_sent_through_a_step_that_does_not_hide_it(make, shape):
    """A contribution is never sent through a step that does not hide it.

    Server (+ the decider) against client 0: the exchange of tag 'w' is replaced by a pairwise or a
    report step for the same tag.  Required: a refusal before anything is sent, so the coalition
    reads nothing of client 0's contribution.
    """
    from protocols.errors import ProtocolError

    p = make(shape)
    x = inputs()
    with pytest.raises(ProtocolError):
        p.weighted_sum("w", 0, x, spec=FLOATS)
    read = what_the_coalition_reads(p, shape)
    if read is not None:
        target = x[0] / np.linalg.norm(x[0]) if shape == "pairwise" else x[0]
        assert np.abs(read[:8] - target).max() > 0.1, f"the coalition read client 0's input through '{shape}'"


# ------------------------------------------------------------------ an exchange number used twice
class RewoundExchange(CKKSMPServer):
    """Runs a second exchange under the first one's number.

    Runs a second exchange under the first one's number, so that each client would encrypt its
    second input with the first one's ``c1 = a_{x,b,j}`` (the difference of two such uploads is
    ``Delta (m - m') + small``: the difference of the inputs).
    """

    def run(self, plan, link):
        self.first = getattr(self, "first", plan.exchange)
        return super().run(replace(plan, exchange=self.first), link)


def test_an_exchange_number_is_never_used_twice():
    from protocols.errors import ReplayError
    from protocols.transcript import SERVER

    p = protocol_with(RewoundExchange)
    p.weighted_sum("first", 0, inputs(0), spec=FLOATS)
    with pytest.raises(ReplayError):
        p.weighted_sum("second", 1, inputs(1), spec=FLOATS)
    assert not [m for m in p.transcript.select(tag="second", receiver=SERVER) if m.kind == "ciphertext"]
