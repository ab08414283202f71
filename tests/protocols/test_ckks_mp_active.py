"""Ckks-mp against a server that deviates.

ckks-mp against a server that deviates: each attack is a malicious server half (a subclass of
the honest one that changes what it sends, never the clients' code), and each either aborts with
a specific ProtocolError at an honest client or, by construction, yields nothing beyond chance.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from support.ckks_mp import mixed_exchange as support_mixed_exchange

from protocols import ValueSpec
from protocols.ckks_mp import encoding, encryption
from protocols.ckks_mp.backend import CKKSMPProtocol
from protocols.ckks_mp.keys import RECIPIENT_KEY, key_fingerprint, key_pair
from protocols.ckks_mp.keyswitch import combine_shares
from protocols.ckks_mp.params import smudging_bits
from protocols.ckks_mp.sampling import crs_seed, upload_c1
from protocols.ckks_mp.server import CKKSMPServer
from protocols.errors import (
    DowngradeError,
    IntegrityError,
    KeySubstitutionError,
    KeySwitchRefusedError,
    ModulusPlanError,
    RecipientKeyError,
    RepeatedKeySwitchError,
    RepeatedUploadError,
)
from protocols.transcript import SERVER, client_party

K = 3
FLOATS = ValueSpec(max_abs=1.0, tolerance=1e-3)
COUNTS = ValueSpec(integer=True, max_abs=1, sum_max=K)


class EvilServer(CKKSMPServer):
    """Runs the honest server, but tampers with every request before it is signed.

    Runs the honest server, but passes every request it builds through :meth:`tamper` before it is
    signed and sent (``stage``, client, message, part) -> list of (message, part).
    """

    def tamper(self, stage: str, client: int, msg, part: int):
        return [(msg, part)]

    def call(self, link, stage, messages, *, hook=True):
        messages = {
            k: [x for msg, part in batch for x in self.tamper(stage, k, msg, part)] for k, batch in messages.items()
        }
        return super().call(link, stage, messages, hook=hook)


def protocol_with(server_class) -> CKKSMPProtocol:
    cls = type("Attacked", (CKKSMPProtocol,), {"server_half": server_class})
    return cls(K)


def broadcast_exchange(p, tag="x"):
    return p.weighted_sum(tag, 0, {c: np.full(8, 0.25 * (c + 1)) for c in range(K)}, spec=FLOATS)


def scoped_exchange(p, tag="scoped"):
    """A sparse row sum whose K blocks go one to each client (scoped: switched per recipient)."""
    rpb = p.rows_per_block(COUNTS, 2, 10**7)
    rows = np.arange(K) * rpb
    return p.row_sum(
        tag,
        0,
        {c: (rows, np.ones((K, 2))) for c in range(K)},
        {c: rows[c : c + 1] for c in range(K)},
        K * rpb,
        layout="sparse",
        spec=COUNTS,
    )


def with_payload(msg, **changes):
    return replace(msg, payload={**msg.payload, **changes})


def with_switch(msg, **changes):
    """A key-switching request changed, its planned switch (first batch) changed alike: the client checks that plan."""
    msg = with_payload(msg, **changes)
    if "planned" in msg.payload:
        msg = with_payload(msg, planned={"groups": msg.payload["groups"], "blocks": msg.payload["blocks"]})
    return msg


# ------------------------------------------------------------------ forged and adaptive c1
class ForgedC1(EvilServer):
    """A key-switching request with a forged ``c1``.

    Measured attack on the earlier design: a key-switching request with ``c1 = 2^(b+3)`` (so that
    the partial decryption ``s_i c1 + noise`` reveals ``s_i``) to a key of the server's own.
    """

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch":
            level, n = self.last_level, self.params.n
            forged = np.full((1, level, n), (1 << (smudging_bits(self.params, K) + 3)) % self.params.primes[0])
            msg = with_payload(msg, c1=encryption.to_bytes(forged))
        return [(msg, part)]

    def run(self, plan, link):
        from protocols.ckks_mp.params import plan_exchange

        self.last_level = plan_exchange(self.params, plan.spec, K, plan.dp_noise_std, plan.block_len).level
        return super().run(plan, link)


class AdaptiveC1(ForgedC1):
    """The adaptive variant: ``c1`` chosen after the uploads are in (here: a victim's own ``c0``)."""

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch":
            victim = next(
                m
                for m in self.transcript.messages
                if m.sender == client_party(1) and m.receiver == SERVER and m.kind == "ciphertext"
            )
            msg = with_payload(msg, c1=victim.payload)
        return [(msg, part)]


@pytest.mark.parametrize("server", [ForgedC1, AdaptiveC1])
def test_a_c1_from_the_server_is_refused(server):
    with pytest.raises(KeySwitchRefusedError, match="compute every c1 themselves"):
        broadcast_exchange(protocol_with(server))


def test_c1_is_public_fresh_per_exchange_and_block():
    """C1 is public fresh per exchange and block.

    By construction the server has no c1 to choose: each client encrypts and key-switches with
    the expansion of the run's seed at (session, exchange, block, piece), never reused.
    """
    p = CKKSMPProtocol(K)
    broadcast_exchange(p, "a")
    broadcast_exchange(p, "b")
    seed, s = crs_seed(p.setup.run_id), p.setup.session
    primes, n = p.params.primes[:2], p.params.n
    one = upload_c1(seed, s, 1, [0, 1], 1, primes, n)
    assert not np.array_equal(one[0], one[1])  # two blocks
    assert not np.array_equal(one[0], upload_c1(seed, s, 2, [0], 1, primes, n)[0])  # two exchanges
    assert np.array_equal(one, upload_c1(seed, s, 1, [0, 1], 1, primes, n))  # recomputable
    # the exchanges' uploads decrypt under the client's own share with exactly that c1
    plan = p.plan(FLOATS, block_len=8, broadcast=True)
    for tag in ("a", "b"):
        msg = next(
            m for m in p.transcript.select(tag=tag, sender=client_party(0), receiver=SERVER) if m.kind == "ciphertext"
        )
        dec = encoding.crt_centered(
            p.ring, encryption.decrypt(p.ring, p._clients[0]._share, p.upload_ciphertexts(msg, plan)[0])
        )
        fields = np.array([(int(c) + (1 << (plan.scale_bits - 1))) >> plan.scale_bits for c in dec[:8]])
        assert fields[0] == encoding.quantize(np.full(8, 0.25), plan)[0]


# ------------------------------------------------------------------ recipient keys
class OwnRecipientKey(EvilServer):
    """A scoped key switch whose recipient key is the server's own (client 1's signature kept)."""

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch" and msg.payload["keys"]:
            mine = key_pair(self.ring, self._a(), self.params.eta).p_hat
            keys = {r: {**v, "key": encryption.to_bytes(mine)} for r, v in msg.payload["keys"].items()}
            msg = with_payload(msg, keys=keys)
        return [(msg, part)]

    def _a(self):
        from protocols.ckks_mp.sampling import common_polynomial

        return common_polynomial(crs_seed(self.setup.run_id), self.params.primes, self.params.n)


class StrangerRecipient(EvilServer):
    """A key switch to a recipient that is no client of the run."""

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch":
            groups = np.array(msg.payload["groups"]).copy()
            groups[:, 0] = np.where(groups[:, 0] == 1, 7, groups[:, 0])
            msg = with_payload(msg, groups=groups)
        return [(msg, part)]


class RogueKey(EvilServer):
    """The rogue-key / speak-last variant.

    A colluder's own key, validly signed by the colluder (client 2), presented to client 0 as client 1's key.
    """

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch" and client == 0:
            colluder = self.recipient_pks[2]
            keys = {
                r: {"key": colluder[0], "sig": colluder[1]} if r == 1 else v for r, v in msg.payload["keys"].items()
            }
            msg = with_payload(msg, keys=keys)
        return [(msg, part)]


@pytest.mark.parametrize(
    "server,error",
    [(OwnRecipientKey, KeySubstitutionError), (RogueKey, KeySubstitutionError), (StrangerRecipient, RecipientKeyError)],
)
def test_recipient_key_not_signed_by_its_owner_is_refused(server, error):
    with pytest.raises(error):
        scoped_exchange(protocol_with(server))


def test_recipient_keys_are_owner_signed_statements():
    """The honest path: every p_R a client accepts verifies under its owner's identity key."""
    from protocols.auth import check_public_key

    p = CKKSMPProtocol(K)
    scoped_exchange(p)
    for r, (key, sig) in p.server.recipient_pks.items():
        check_public_key(
            p.clients[0].registry if r else p.clients[1].registry,
            RECIPIENT_KEY,
            p.setup.run_id,
            client_party(r),
            key,
            sig,
            {},
        )
    assert set(p.clients[0].recipient_keys) == {1, 2}


# ------------------------------------------------------------------ broadcast key
class SubstitutedBroadcastKey(EvilServer):
    """Key substitution of the broadcast key.

    Key substitution: the server hands a broadcast key of its own (with a matching fingerprint, the
    dealer's signature kept) to the clients ``victims``.
    """

    victims = (1, 2)

    def tamper(self, stage, client, msg, part):
        if stage == "key_setup" and part == 1 and client in self.victims:
            mine = encryption.to_bytes(key_pair(self.ring, OwnRecipientKey._a(self), self.params.eta).p_hat)
            fp = key_fingerprint(self.params.describe(), crs_seed(self.setup.run_id), mine)
            msg = replace(with_payload(msg, broadcast=mine), fingerprint=fp)
        return [(msg, part)]


class SubstitutedDealerKey(SubstitutedBroadcastKey):
    victims = (0,)


@pytest.mark.parametrize(
    "server,match",
    [
        (SubstitutedBroadcastKey, "client0's ckks-mp/broadcast key"),
        (SubstitutedDealerKey, "changed the broadcast public key"),
    ],
)
def test_substituted_broadcast_key_is_refused(server, match):
    with pytest.raises(KeySubstitutionError, match=match):
        broadcast_exchange(protocol_with(server))


def test_no_collective_public_key_exists_to_substitute():
    """No collective public key exists to substitute.

    Uploads are encrypted under each client's own share, so no party ever receives a collective
    public key (the earlier design's substituted key read every upload): the key set-up delivers
    only p_B, signed by its dealer.
    """
    p = CKKSMPProtocol(K)
    broadcast_exchange(p)
    setup = [
        m for m in p.transcript.messages if m.tag == "ckks-mp/keys" and m.sender == SERVER and m.kind == "public_key"
    ]
    assert setup and all(set(m.payload) == {"broadcast", "broadcast_sig"} for m in setup)


# ------------------------------------------------------------------ downgrade and repetition
class Downgrade(EvilServer):
    """Scoped blocks switched to the broadcast key (every client would read every block)."""

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch":
            blocks = np.asarray(msg.payload["blocks"])
            msg = with_switch(msg, groups=np.array([[-1, blocks.size]]), keys={})
        return [(msg, part)]


class DowngradedDownload(EvilServer):
    """A scoped block delivered as if switched to the broadcast key."""

    def tamper(self, stage, client, msg, part):
        if stage == "download":
            msg = with_payload(msg, to=-1)
        return [(msg, part)]


class SecondKeySwitch(EvilServer):
    """Two key-switching requests in one exchange (two partial decryptions of the same c1)."""

    def call(self, link, stage, messages, *, hook=True):
        if stage == "keyswitch":
            super().call(link, stage, messages, hook=hook)
            messages = {k: [(replace(msg, note="again"), part) for msg, part in batch] for k, batch in messages.items()}
        return super().call(link, stage, messages, hook=hook)


class SecondUpload(EvilServer):
    """Two uploads in one exchange (the same c1 twice: their difference is the input difference)."""

    def call(self, link, stage, messages, *, hook=True):
        if stage == "upload":
            super().call(link, stage, messages, hook=hook)
        return super().call(link, stage, messages, hook=hook)


@pytest.mark.parametrize("server,error", [(Downgrade, DowngradeError), (DowngradedDownload, DowngradeError)])
def test_downgrade_to_the_broadcast_key_is_refused(server, error):
    with pytest.raises(error):
        scoped_exchange(protocol_with(server))


@pytest.mark.parametrize(
    "server,error", [(SecondKeySwitch, RepeatedKeySwitchError), (SecondUpload, RepeatedUploadError)]
)
def test_one_upload_and_one_key_switch_per_exchange(server, error):
    with pytest.raises(error):
        broadcast_exchange(protocol_with(server))


# ------------------------------------------------------------------ the modulus plan
class ChangedPlan(CKKSMPServer):
    """Sends a plan whose switch or moduli are not the ones the public facts give (:meth:`change`)."""

    def change(self, encoding: dict, honest) -> dict:
        return encoding

    def run(self, plan, link):
        from protocols.ckks_mp.params import plan_exchange

        broadcast = "broadcast_blocks" in plan.encoding  # these tests' exchanges switch every block alike
        honest = plan_exchange(self.params, plan.spec, K, plan.dp_noise_std, plan.block_len, broadcast=broadcast)
        return super().run(replace(plan, encoding=self.change(dict(plan.encoding), honest)), link)


class SmallerScale(ChangedPlan):
    """A scale 2^4 below the plan's: the recipients' decryption margin over the worst-case noise gone."""

    def change(self, encoding, honest):
        return {**encoding, "plan": replace(honest, scale_bits=honest.scale_bits - 4).describe()}


class OtherLevels(ChangedPlan):
    """One prime more for the uploads and for the shares and downloads than the plan's."""

    def change(self, encoding, honest):
        other = replace(honest, level=honest.level + 1, switch_level=honest.switch_level + 1)
        return {**encoding, "plan": other.describe()}


class SwitchNotNamed(ChangedPlan):
    """A broadcast's levels (sized for CKS's smaller rounding) without the switch they were sized for."""

    def change(self, encoding, honest):
        return {k: v for k, v in encoding.items() if k not in ("broadcast_blocks", "broadcast_to")}


class ScopedSizedForTheBroadcastKey(ChangedPlan):
    """A scoped sum planned as a switch of every block to the broadcast key, which every client holds."""

    def change(self, encoding, honest):
        cks = replace(honest, broadcast=True)
        return {**encoding, "plan": cks.describe(), "broadcast_blocks": np.arange(K), "broadcast_to": np.arange(K)}


@pytest.mark.parametrize(
    "server,exchange,error",
    [
        (SmallerScale, broadcast_exchange, ModulusPlanError),
        (OtherLevels, broadcast_exchange, ModulusPlanError),
        (OtherLevels, scoped_exchange, ModulusPlanError),
        (SwitchNotNamed, broadcast_exchange, ModulusPlanError),
        (ScopedSizedForTheBroadcastKey, scoped_exchange, DowngradeError),
    ],
)
def test_a_plan_with_other_moduli_or_switch_is_refused_before_anything_is_sent(server, exchange, error):
    """Every client recomputes the exchange's switch and moduli from its public facts and refuses any other.

    Adversary: a server that names levels, a scale or a switch of its own choosing (the client's
    answer at a level sized for a smaller noise than the switch it then asks for, or a scoped sum
    readable with the broadcast key).  Refused before any upload leaves a client.
    """
    p = protocol_with(server)
    with pytest.raises(error):
        exchange(p)
    assert not [m for m in p.transcript.messages if m.receiver == SERVER and m.kind in ("ciphertext", "share")]


class PerRecipientUnderABroadcastPlan(EvilServer):
    """A broadcast planned (and sized) for the broadcast key, then switched to each recipient's key."""

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch":
            blocks = np.asarray(msg.payload["blocks"])
            groups = np.array([[r, blocks.size] for r in range(K)])
            keys = {r: {"key": key, "sig": sig} for r, (key, sig) in self.recipient_pks.items() if r != client}
            msg = with_switch(msg, groups=groups, blocks=np.tile(blocks, K), keys=keys)
        return [(msg, part)]


def test_a_switch_other_than_the_planned_one_is_refused():
    with pytest.raises(RecipientKeyError, match="plan switches them to the broadcast key"):
        broadcast_exchange(protocol_with(PerRecipientUnderABroadcastPlan))


# ------------------------------------------------------------------ a recipient colluding with the server
def test_server_and_a_recipient_cannot_open_one_clients_share():
    """Server and a recipient cannot open one clients share.

    The server holds client 1's key-switching share of a broadcast exchange, s_1 c1 + z_1 + noise (switched to
    the broadcast key, which client 0 would also lend it).  Added to client 1's upload c0_1 it would open that
    upload if not for the zero-sum mask z_1: correlation with client 1's plaintext at chance.  Positive control:
    with the mask removed (which needs client 1's pairwise seeds) the upload opens exactly.
    """
    p = CKKSMPProtocol(K)
    rng = np.random.default_rng(3)
    vals = {c: rng.integers(0, 2, 4000).astype(float) for c in range(K)}
    spec = ValueSpec(integer=True, max_abs=1, sum_max=K)
    p.weighted_sum("v", 0, vals, spec=spec)
    plan = p.plan(spec, block_len=4000, broadcast=True)
    up = next(
        m for m in p.transcript.select(tag="v", sender=client_party(1), receiver=SERVER) if m.kind == "ciphertext"
    )
    share = next(m for m in p.transcript.select(tag="v", sender=client_party(1), receiver=SERVER) if m.kind == "share")
    c0 = p.upload_ciphertexts(up, plan)[0, 0]
    opened = encryption.from_bytes(p.ring, share.payload, (1, plan.switch_level, p.params.n))[
        0
    ]  # (s_1 c1 + z_1 + e0) / P
    used = encoding.used_coefficients(plan, 4000)
    truth = np.array(
        [
            float(x)
            for x in encoding.crt_centered(p.ring, encoding.encode(p.ring, plan, encoding.quantize(vals[1], plan)))[
                :used
            ]
        ]
    )

    def corr_with_truth(poly_coeffs):
        got = np.array([float(x) for x in encoding.crt_centered(p.ring, poly_coeffs)[:used]])
        return abs(np.corrcoef(got, truth)[0, 1])

    attack = p.ring.add(encryption.switch_down(p.ring, c0, plan.switch_level), opened)
    assert corr_with_truth(attack) < 5 / np.sqrt(used)
    mask = p.ring.rescale(p.clients[1]._masks(plan, -1, [0])[0], plan.switch_level)  # still held; coefficient form
    assert corr_with_truth(p.ring.add(attack, p.ring.neg(mask))) > 0.999


class MixedBlocks(EvilServer):
    """Asks client 1 to switch the recipient's blocks in the reverse order.

    Asks client 1 to switch the recipient's blocks in the reverse order, so that summing the
    shares position by position would combine client 1's block-1 share with the others' block-0
    shares: a mixed sum (client 1's block 1 + the others' block 0) the plan never releases.
    """

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch" and client == 1:
            msg = with_payload(msg, blocks=np.asarray(msg.payload["blocks"])[::-1].copy())
        return [(msg, part)]


def test_shares_of_different_blocks_do_not_combine():
    """Shares of different blocks do not combine.

    The masks are bound to (exchange, recipient, block, piece): shares of different blocks never
    cancel each other's masks, so the mixed sum decrypts to noise for the recipient colluding with the
    server (and the delivery is refused); the same shares regrouped by block decrypt exactly (control).
    """
    from protocols.errors import IntegrityError

    p = protocol_with(MixedBlocks)
    rpb = p.rows_per_block(COUNTS, 2, 10**7)
    rows = np.array([0, rpb])  # two blocks, both to client 0
    rng = np.random.default_rng(5)
    contrib = {c: (rows, rng.integers(0, 2, (2, 2)).astype(float)) for c in range(K)}
    with pytest.raises(IntegrityError, match="corrupted"):
        p.row_sum("mix", 0, contrib, {0: rows}, 2 * rpb, layout="sparse", spec=COUNTS)
    plan = p.plan(COUNTS, block_len=rpb * 2)
    level, n = plan.switch_level, p.params.n  # the shares travel switched down
    c0 = {
        c: p.upload_ciphertexts(
            next(
                m
                for m in p.transcript.select(tag="mix", sender=client_party(c), receiver=SERVER)
                if m.kind == "ciphertext"
            ),
            plan,
            blocks=[0, 1],
        )[:, 0]
        for c in range(K)
    }
    shares = {
        c: encryption.from_bytes(
            p.ring,
            next(
                m for m in p.transcript.select(tag="mix", sender=client_party(c), receiver=SERVER) if m.kind == "share"
            ).payload,
            (2, 2, level, n),
        )
        for c in range(K)
    }
    s_r = p._clients[0]._own.s_hat

    def residual(blocks_of_client):
        """Decrypt the combined shares and return the largest distance from the Delta grid.

        Decrypt sum_c (c0_c[b_c] + share_c[b_c]) under s_R; the largest distance from the Delta grid
        in the uploads' units.
        """
        pos = {c: (b if c != 1 else 1 - b) for c, b in blocks_of_client.items()}  # client 1's shares reversed
        c0_sum = sum(c0[c][b] for c, b in blocks_of_client.items()) % p.ring.q[: plan.level]
        ct = combine_shares(p.ring, p.ring.intt(c0_sum[None]), [shares[c][pos[c]][None] for c in range(K)])[0]
        decrypted = encryption.decrypt_switched(p.ring, s_r, ct)
        coeffs = [c * plan.switch_factor for c in encoding.crt_centered(p.ring, decrypted)]
        d = plan.scale_bits
        return max(abs(int(c) - (((int(c) + (1 << (d - 1))) >> d) << d)) for c in coeffs)

    assert residual({0: 0, 1: 0, 2: 0}) <= plan.noise_bound  # control: block 0, by block
    assert residual({0: 0, 1: 1, 2: 0}) > 2 ** (plan.scale_bits - 2)  # mixed: noise across the grid


class KeySwitchFirst(CKKSMPServer):
    """Asks for key-switching shares before any upload of the exchange.

    A share of a c1 the client has not yet encrypted under.
    """

    def run(self, plan, link):
        self.ensure_keys(link, plan.round)
        plan = replace(plan, encoding={**plan.encoding, "fingerprint": self.fingerprint})
        self.begin(plan, link, self.fingerprint, extra=tuple(range(K)))
        body = {"groups": np.array([[-1, 1]]), "blocks": np.array([0]), "keys": {}}
        self.call(
            link, "keyswitch", {k: [(self.message(k, "control", (1, 2), body, self.fingerprint), 0)] for k in range(K)}
        )
        return tuple(plan.contributors)


def test_key_switch_before_the_upload_is_refused():
    with pytest.raises(KeySwitchRefusedError, match="before this client's upload"):
        broadcast_exchange(protocol_with(KeySwitchFirst))


# ------------------------------------------------------------------ the switch chosen per block
SHARED = 2  # blocks 0..SHARED-1 go to every client; block SHARED + c to client c only


def mixed_exchange(p, tag="mixed"):
    """:func:`support.ckks_mp.mixed_exchange` with this file's clients and shared blocks."""
    return support_mixed_exchange(p, COUNTS, K, SHARED, tag)


def test_blocks_every_client_receives_go_to_the_broadcast_key_the_others_per_recipient():
    """One exchange, both switches: the shared blocks by CKS (one share per client), each client's own by PCKS.

    Every recipient decrypts exactly the plain sum of each of its blocks; its download carries the shared blocks as
    ``c0'`` (the same bytes for every recipient) and its own block switched to its key.
    """
    p = CKKSMPProtocol(K)
    got, exact = mixed_exchange(p)
    assert all(np.array_equal(got[c], exact[c]) for c in range(K))
    plan = next(m for m in p.transcript.select(tag="mixed", sender=SERVER) if m.note == "exchange plan").payload
    assert plan["encoding"]["broadcast_blocks"].tolist() == list(range(SHARED))
    requests = [m for m in p.transcript.select(tag="mixed", sender=SERVER) if m.note.startswith("block ids to key")]
    assert len(requests) == K and all(
        m.payload["groups"].tolist() == [[-1, SHARED]] + [[r, 1] for r in range(K)] for m in requests
    )
    shares = [m for m in p.transcript.select(tag="mixed") if m.kind == "share"]
    assert len(shares) == K * (1 + K)  # per client: one CKS share, one PCKS share per recipient's own block
    downloads = [m for m in p.transcript.select(tag="mixed", sender=SERVER) if "key-switched" in m.note]
    assert len({m.payload["broadcast"] for m in downloads}) == 1
    ep = p.plan_of("mixed", 0)
    assert all(len(m.payload["data"]) == 2 * ep.switch_level * ep.n * 4 for m in downloads)


def test_each_recipient_decrypts_only_its_own_scoped_block():
    """A scoped block of a mixed exchange opens under its recipient's key only.

    Client 0's block (switched to its key) decrypted with client 1's recipient key or with the broadcast key that every
    client holds: residual above the worst-case noise bound (uniform, the decryption is refused); with client 0's key:
    within it.
    """
    p = CKKSMPProtocol(K)
    mixed_exchange(p)
    ep = p.plan_of("mixed", 0)
    down = next(
        m for m in p.transcript.select(tag="mixed", sender=SERVER, receiver=client_party(0)) if "key-switched" in m.note
    )
    pair = encryption.from_bytes(p.ring, down.payload["data"], (1, 2, ep.switch_level, ep.n))
    keys = p._clients

    def residual(s_hat):
        plain = encryption.decrypt_switched(p.ring, s_hat, pair)
        return encoding.decode(p.ring, ep, plain[0], 2)[1]

    assert residual(keys[0]._own.s_hat) <= ep.noise_bound
    assert residual(keys[1]._own.s_hat) > ep.noise_bound  # refused as corrupted: a uniform residual
    assert residual(keys[1]._broadcast.s_hat) > ep.noise_bound


class PartialBlockAsBroadcast(CKKSMPServer):
    """Plans block ``SHARED`` (client 0's alone) for the broadcast key too, so that every client could read it."""

    def run(self, plan, link):
        from protocols.ckks_mp.params import plan_exchange

        shared = np.arange(SHARED + 1)
        ep = plan_exchange(self.params, plan.spec, K, plan.dp_noise_std, plan.block_len)  # still mixed: PCKS-sized
        encoding = {**plan.encoding, "plan": ep.describe(), "broadcast_blocks": shared}
        return super().run(replace(plan, encoding=encoding), link)


def test_a_block_some_client_does_not_receive_planned_for_the_broadcast_key_is_refused():
    """Adversary: a server planning a block only client 0 receives for the broadcast key, which every client holds.

    Clients 1 and 2 do not receive that block and refuse the plan before anything of the exchange is sent.
    """
    p = protocol_with(PartialBlockAsBroadcast)
    with pytest.raises(DowngradeError, match=rf"block\(s\) \[{SHARED}\] switched to the broadcast key"):
        mixed_exchange(p)
    assert not [m for m in p.transcript.messages if m.receiver == SERVER and m.kind in ("ciphertext", "share")]


class ScopedBlockInTheBroadcastGroup(EvilServer):
    """The honest plan, then a key-switching request that moves client 0's own block into the broadcast group."""

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch":
            shared = list(range(SHARED)) + [SHARED]
            rest = [b for b in np.asarray(msg.payload["blocks"]).tolist() if b not in shared]
            groups = [[-1, len(shared)]] + [[r, n] for r, n in msg.payload["groups"].tolist() if r not in (-1, 0)]
            msg = with_switch(msg, groups=np.array(groups), blocks=np.array(shared + rest))
        return [(msg, part)]


def test_a_scoped_block_in_the_broadcast_group_is_refused():
    with pytest.raises(DowngradeError, match=rf"block\(s\) \[{SHARED}\] are scoped"):
        mixed_exchange(protocol_with(ScopedBlockInTheBroadcastGroup))


class SplitBroadcastLists(EvilServer):
    """Tells client 2 another list of broadcast blocks than the others, each list valid for its holder.

    Blocks 0 and 1 reach every client: clients 0 and 1 hold a plan switching block 1 to the broadcast key (block 0
    to each recipient's key), client 2 one switching block 0 (and block 1 per recipient), and each is asked for the
    switch its plan names.  Each client's own checks pass; the plans differ, so the masks (labelled by the digest of
    the plan each client holds) do not cancel.
    """

    victim = 2

    def run(self, plan, link):
        return super().run(replace(plan, encoding={**plan.encoding, "broadcast_blocks": np.array([1])}), link)

    def begin(self, plan, link, fingerprint, extra=()):
        self.plan, self.exchange = plan, plan.exchange
        parties = sorted(set(plan.parties) | set(extra))
        self.register(link, plan.round, parties)
        for k in parties:
            told = plan
            if k == self.victim:
                told = replace(plan, encoding={**plan.encoding, "broadcast_blocks": np.array([0])})
            msg = self.message(k, "control", (), told.for_client(k).to_payload(), fingerprint, note="exchange plan")
            self.queue(k, msg, "plan")

    def tamper(self, stage, client, msg, part):
        if stage == "keyswitch" and client == self.victim:
            blocks = np.asarray(msg.payload["blocks"]).copy()
            blocks[blocks == 1], blocks[blocks == 0] = -7, 1
            blocks[blocks == -7] = 0
            msg = with_switch(msg, blocks=blocks)
        return [(msg, part)]


def test_clients_told_different_broadcast_blocks_deliver_nothing():
    """A plan digest mismatch: clients holding different lists of broadcast blocks get a refusal, never a sum."""
    p = protocol_with(SplitBroadcastLists)
    with pytest.raises(IntegrityError, match="corrupted; nothing was delivered"):
        mixed_exchange(p)
    assert all(r is None for r in p.client_results().values())
