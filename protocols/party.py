"""The two halves of a protocol backend: one client half per client, one server half.

A backend is divided along the privacy boundary (docs/parties.md):

* :class:`ClientHalf` — one object per client, built from the run's **public** setup bytes
  only (:class:`PartySetup`), so it can live in another process or machine.  It makes its
  own keys (Ed25519 signing, X25519 channel, and whatever the backend needs) from the OS
  CSPRNG, asks its ``provider`` for its contribution, encodes / encrypts / masks and signs
  it, verifies what the server sends, and decodes its own result (:meth:`ClientHalf.result`).
* :class:`ServerHalf` — verifies, aggregates and routes.  It never holds a secret key or
  unmasking material; it records every message it sends or receives in the transcript.

Between them only bytes travel, through a :class:`~protocols.link.ClientLink`: for each named
stage (:data:`protocols.message.STAGES`) the server hands the link one request bundle per
client and gets back the bundles of the clients that answered (:mod:`protocols.framing`).
Every message is a signed envelope (:mod:`protocols.message`), verified by its receiver
(:func:`protocols.auth.verify`) before anything reads it.

Stages every backend shares:

``register``  (once per run) the server sends each client its identity (signing) key; each
              client answers with its identity key and its channel key, the latter signed
              by its identity key (:func:`~protocols.auth.sign_public_key`).  Identity keys
              must be the ones the run manifest lists (:mod:`protocols.manifest`).
``directory`` (backends whose clients talk to each other through the server) the server
              forwards each client the registered keys of all clients with their owners'
              signatures, verbatim; each client checks every identity key against the
              manifest and every channel key against its owner's signature
              (:class:`~protocols.errors.KeySubstitutionError` otherwise).  It travels in
              the client's next request bundle.
``plan``      the first message of every exchange: :class:`~protocols.plan.ExchangePlan`
              for that client; it travels in the bundle of the exchange's first stage.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .auth import KeyRegistry, ReplayCache, SigningKey, check_public_key, sign_public_key, split_auth, verify
from .broadcast_view import ROUND_BINDING_MODES, VIEW_BINDING_MODES, BroadcastViews
from .channel import ChannelKey, associated_data
from .errors import (
    ClearReportRefusedError,
    ConfigurationError,
    DropoutError,
    IntegrityError,
    KeySubstitutionError,
    MalformedMessageError,
    NoiseAllowanceError,
    PlanRefusedError,
    ProtocolError,
)
from .exchange import BlockTable
from .fixed_point import grid_sums, to_grid
from .framing import message_from_bytes, message_to_bytes, pack_bundle, unpack_bundle
from .manifest import Manifest
from .message import NONCE_BYTES, SIGNATURE_BYTES, Envelope, decode_body, encode_body
from .plan import ExchangePlan
from .plan_policy import CollusionBound, PlanPolicy, collusion_bound
from .report import REPORT_STAGE, client_report
from .schedule import PublicSchedule
from .similarity_exchange import SIMILARITY_SHAPE, similarity_client_step
from .transcript import SERVER, Kind, Message, Transcript, client_party, party_client

if TYPE_CHECKING:
    from .dp import DPConfig
    from .link import ClientLink

#: tag of the once-per-run registration of the clients' public keys
AUTH_TAG = "auth/keys"

#: what a client half asks for its contribution: the plan of the exchange (tag, round,
#: layout, blocks) -> its blocks.  Given at exchange time (the facade reads the dict the
#: algorithm passed; a client runtime computes it from its own data).
Provider = Callable[[ExchangePlan], BlockTable]


@dataclass(frozen=True)
class PartySetup:
    """The public facts of a run every party starts from (no key, no data)."""

    mode: str
    num_clients: int
    run_id: bytes
    session: bytes
    options: dict[str, Any]
    #: the run's collusion bound: c and the minimum contributors every client requires
    collusion: CollusionBound = CollusionBound()

    def to_bytes(self) -> bytes:
        """Canonical encoding of the set-up (mode, client count, run id, session, options, collusion bound)."""
        return encode_body(
            {
                "mode": self.mode,
                "num_clients": int(self.num_clients),
                "run_id": self.run_id,
                "session": self.session,
                "options": dict(self.options),
                "collusion": self.collusion.to_dict(),
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> PartySetup:
        """Parse a set-up written by :meth:`to_bytes`.

        Raises:
            MalformedMessageError: a field is missing or malformed, or the run id, session or client count is invalid.
        """
        try:
            p = decode_body(data)
            bound = CollusionBound.of(int(p["collusion"]["max_colluders"]), int(p["collusion"]["min_contributors"]))
            setup = cls(
                str(p["mode"]),
                int(p["num_clients"]),
                bytes(p["run_id"]),
                bytes(p["session"]),
                dict(p["options"]),
                bound,
            )
        except (KeyError, TypeError, ValueError, ConfigurationError) as e:
            raise MalformedMessageError(f"malformed party setup ({e})") from None
        if len(setup.run_id) != NONCE_BYTES or len(setup.session) != NONCE_BYTES or setup.num_clients < 1:
            raise MalformedMessageError("party setup with a bad run id, session or client count")
        return setup


def check_exchange_fields(msg: Message, protocol: str, fingerprint: str, rnd: int, tag: str, client: int) -> None:
    """Server side: refuse a message that is not of this exchange.

    Server side: refuse a message whose protocol, context fingerprint, round or tag are not
    this exchange's (IntegrityError naming the client and what differs).
    """
    expected = (protocol, fingerprint, rnd, tag)
    got = (msg.protocol, msg.fingerprint, msg.round, msg.tag)
    if got != expected:
        names = ("protocol", "context fingerprint", "round", "tag")
        bad = [f"{n} {g!r} (expected {e!r})" for n, g, e in zip(names, got, expected) if g != e]
        raise IntegrityError(
            "message rejected: wrong "
            + "; ".join(bad)
            + ". The client must use this run's public context and current exchange",
            tag=tag,
            round=rnd,
            client=client,
        )


def envelope_for(
    msg: Message, run_id: bytes, session: bytes, exchange: int, stage: str, part: int, digest: bytes, length: int
) -> Envelope:
    """The envelope that binds ``msg`` to the run, session, exchange and stage.

    The envelope that binds ``msg`` (its header fields and a body of ``length`` bytes with SHA-256
    ``digest``) to the run, the session, the exchange and the stage.
    """
    return Envelope(
        run_id,
        session,
        msg.protocol,
        msg.fingerprint,
        exchange,
        int(msg.round),
        msg.tag,
        stage,
        int(part),
        msg.sender,
        msg.receiver,
        msg.kind,
        tuple(int(d) for d in msg.shape),
        digest,
        length,
    )


def envelope_of(msg: Message) -> Envelope:
    """The signed header of a sealed message."""
    return Envelope.from_header(bytes(msg.auth[SIGNATURE_BYTES:]))


class Party:
    """What both halves share: a name, a signing key, the keys it trusts, a replay cache."""

    def __init__(self, name: str, setup: PartySetup):
        self.name, self.setup = name, setup
        self.signing = SigningKey()
        self.registry = KeyRegistry()
        self.replay = ReplayCache()
        #: number of the exchange in progress (set by the server; bound into every envelope)
        self.exchange = 0
        #: the run manifest this party pins identity keys from (:meth:`use_manifest`)
        self.manifest: Manifest | None = None
        #: register identity keys as the server relays them (no manifest; secure only against a
        #: server that follows the protocol)
        self.trust_on_first_use = False
        #: the public exchange schedule, from the run manifest (:mod:`protocols.schedule`; none without one)
        self.schedule: PublicSchedule | None = None

    def use_manifest(self, manifest: Manifest, identity: SigningKey | None = None) -> None:
        """Pin the identity keys ``manifest`` lists and sign as ``identity``.

        ``identity`` is this party's key, which the manifest must list. Called before the first exchange, by whoever
        builds this party from the manifest it holds (never with one relayed by the server). The public setup must
        be the manifest's run (mode, client count, run id, options: ConfigurationError otherwise), so every option a
        half reads from its setup is one the sites compared.
        """
        manifest.check_setup(self.setup.mode, self.setup.num_clients, self.setup.run_id, self.setup.options)
        identity = identity if identity is not None else self.signing
        if manifest.parties.get(self.name) != identity.fingerprint:
            raise ConfigurationError(
                f"{self.name}'s identity key is not the one the run manifest lists; "
                "use the key whose fingerprint the manifest holds for this party"
            )
        self.manifest, self.signing = manifest, identity
        self.registry = KeyRegistry(pinned=dict(manifest.parties))
        self.schedule = PublicSchedule.of(manifest.num_clients, manifest.security)

    def parameter(self, name: str, default: Any = None) -> Any:
        """A security parameter of the run.

        It is read from the pinned manifest (:meth:`Manifest.parameter`); a party without one (trust on first use)
        reads its public setup options.
        """
        if self.manifest is not None:
            return self.manifest.parameter(name, default)
        return self.setup.options.get(name, default)

    def seal(self, msg: Message, stage: str, part: int = 0) -> tuple[Message, bytes]:
        """Sign ``msg`` as this party: ``(sealed message, its wire bytes)``; ``nbytes == len(bytes)``."""
        body = encode_body(msg.payload)
        env = envelope_for(
            msg, self.setup.run_id, self.setup.session, self.exchange, stage, part, self._body_digest(body), len(body)
        )
        header = env.header_bytes()
        signature = self.signing.sign(header)
        wire = signature + len(header).to_bytes(4, "big") + header + body
        return replace(msg, auth=signature + header, nbytes=len(wire)), wire

    #: bodies from this size up are compared with the last one sealed before hashing (the server
    #: sends every recipient of a dense sum the same blocks: one hash, then byte comparisons)
    REUSE_DIGEST_BYTES, REUSE_DIGEST_MAX = 1 << 14, 1 << 24
    _last_body: tuple[bytes, bytes] | None = None

    def _body_digest(self, body: bytes) -> bytes:
        """SHA-256 of ``body``; the same bytes as the previous large body reuse its digest."""
        last = self._last_body
        if last is not None and len(last[0]) == len(body) and last[0] == body:
            return last[1]
        digest = hashlib.sha256(body).digest()
        if self.REUSE_DIGEST_BYTES <= len(body) <= self.REUSE_DIGEST_MAX:
            self._last_body = (body, digest)
        return digest

    def check(
        self, msg: Message, sender: str, stage: str, part: int, where: dict[str, Any], exchange: int | None = None
    ) -> Message:
        """Verify a received message.

        Checks signature, sender, recipient, session, exchange, stage, digest and replay; an IntegrityError naming
        ``where`` otherwise. ``exchange``: the exchange it must belong to (default: the one in progress).
        """
        expected = dict(
            run_id=self.setup.run_id,
            session=self.setup.session,
            exchange=self.exchange if exchange is None else exchange,
            stage=stage,
            part=part,
            sender=sender,
            recipient=self.name,
        )
        try:
            verify(msg, expected, self.registry, self.replay, where)
        except MalformedMessageError as e:
            if e.client is None:
                raise MalformedMessageError(str(e), **where) from None
            raise
        return msg

    @staticmethod
    def parse(data: bytes, where: dict[str, Any]) -> list[Message]:
        """The messages of a received bundle (strict; errors name ``where``)."""
        try:
            return [message_from_bytes(b) for b in unpack_bundle(data)]
        except MalformedMessageError as e:
            raise MalformedMessageError(str(e), **where) from None


class ClientHalf(Party):
    """Client ``client_id``'s half of a backend, built from public setup bytes only.

    Subclasses implement :meth:`on_stage`.  ``provider`` answers "my contribution for this
    plan"; :meth:`result` is the client's own decoded result of its last exchange.
    """

    mode = "base"
    #: refuse plans that break the run's collusion bound (:mod:`protocols.plan_policy`); off only
    #: where the server reads every contribution anyway (plain)
    checks_plans = True

    def __init__(self, client_id: int, setup: bytes, provider: Provider | None = None):
        parsed = PartySetup.from_bytes(setup)
        super().__init__(client_party(int(client_id)), parsed)
        self.id = int(client_id)
        self.policy = PlanPolicy(self.id, parsed.num_clients, collusion_bound(parsed))
        self._refused: int | None = None  # the exchange whose plan this client refused
        #: digests of the broadcasts this client received (:mod:`protocols.broadcast_view`)
        self.views = BroadcastViews()
        self.channel = ChannelKey(self.name)
        self.provider = provider
        #: the tags whose contribution this client's owner agreed to send in the clear (reports,
        #: :mod:`protocols.report`); a report plan for any other tag is refused
        self.clear_tags: set[str] = set()
        self.plan: ExchangePlan | None = None
        #: the run's DP configuration (:class:`protocols.dp.DPConfig`; ``None``: no DP), for the
        #: contributors a sum may miss (:meth:`check_noise_allowance`); set by whoever builds this half
        #: from the run's own config, never from a plan
        self.dp_config: DPConfig | None = None
        #: the rows of its blocks this client keeps of its next result
        #: (:class:`protocols.row_blocks.RowSelection`; ``None``: whole blocks)
        self.selection = None
        self._result: tuple[int, dict[int, np.ndarray]] | None = None
        #: (exchange, secret context) while this client decides a similarity exchange (ckks)
        self.similarity_secret: tuple[int, Any] | None = None

    def check_noise_allowance(self, survivors: Iterable[int]) -> None:
        """Refuse to release the current sum over fewer than ``n - d`` of the plan's ``n`` contributors.

        ``d`` is :attr:`dp_config`'s ``allowed_missing`` of the plan's tag: with distributed DP each contributor adds
        ``sigma / sqrt(max(1, n - d - c))`` (:mod:`protocols.dp`), so a sum over fewer survivors is
        short of noise, whoever declared the others dropped.

        Raises:
            NoiseAllowanceError: fewer than ``n - d`` survivors.
        """
        plan = cast(ExchangePlan, self.plan)
        allowed = None if self.dp_config is None else self.dp_config.allowed_missing(plan.tag)
        n, kept = len(plan.contributors), len(set(survivors))
        if allowed is not None and kept < n - allowed:
            raise NoiseAllowanceError(
                f"asked to release a sum over {kept} of the plan's {n} contributors, but the run's distributed "
                f"DP noise holds with at most {allowed} missing (--dp-dropouts): the sum would be short of "
                "noise; refused",
                **self.where(),
            )

    # ------------------------------------------------------------------ transport entry point
    def handle(self, stage: str, request: bytes) -> bytes:
        """Answer one stage: parse and verify the request bundle, return the response bundle."""
        where = self.where()
        inbox = []
        out: list[bytes] = []
        planned = None
        for msg in self.parse(request, where):
            env = envelope_of(msg)
            if env.stage == "register" and msg.sender == SERVER:
                out.append(self._register(msg))
                continue
            if env.exchange > self.exchange and msg.sender == SERVER:
                self._adopt_exchange(msg, env.exchange)
            if env.stage == "directory" and msg.sender == SERVER:
                self._directory(msg)
            elif env.stage == "plan" and msg.sender == SERVER:
                self._accept_plan(msg)
                planned = self.plan  # (a backend's override may refuse it: None)
            else:
                inbox.append(msg)
        inbox = self.take_run_material(inbox)  # kept even when the plan below is refused
        if planned is not None:
            try:  # the bundle's last plan: an earlier one it supersedes was never used
                if self.schedule is not None:  # every mode, every stage: an exchange of the run's algorithm
                    self.schedule.check_listed(planned, self.id)
                if self.checks_plans and stage != REPORT_STAGE:
                    self.policy.check(planned, self.groups())
                    if self.schedule is not None:
                        self.schedule.check(planned, self.id)
            except PlanRefusedError:
                self.plan, self._refused = None, self.exchange  # never contribute under a refused plan
                raise
        if self._refused == self.exchange and self.plan is None:
            raise PlanRefusedError(
                "this client refused the plan of this exchange and takes no further part in it", **where
            )
        if stage == REPORT_STAGE:  # a scalar in the clear (protocols/report.py)
            if self.checks_plans and (self.plan is None or self.plan.tag not in self.clear_tags):
                raise ClearReportRefusedError(
                    f"the server asks for {getattr(self.plan, 'tag', None)!r} in the clear, a "
                    "tag this client's owner did not mark as a report",
                    **where,
                )
            out.append(client_report(self)[1])
        elif self.plan is not None and self.plan.encoding.get("shape") == SIMILARITY_SHAPE:
            out += [wire for _, wire in similarity_client_step(self, stage, inbox)]  # protocols/similarity_exchange.py
        else:
            out += [wire for _, wire in self.on_stage(stage, inbox)]
        return pack_bundle(out)

    def groups(self) -> dict[str, tuple[tuple[str, ...], ...]]:
        """The public schedule's related-input groups this half enforces (``mask``, ``ckks-mp``; plan_policy rule 4)."""
        if self.schedule is None or self.mode not in VIEW_BINDING_MODES:
            return {}
        return self.schedule.groups

    def released_over(self, plan: ExchangePlan, included: Iterable[int]) -> None:
        """Report the contributors ``included`` that ``plan``'s sum is released over (plan_policy rule 4)."""
        if self.id in plan.contributors:
            for group in self.groups().get(plan.tag, ()):
                self.policy.released_over(plan, group, included)

    def view_digest(self) -> bytes:
        """The digest of what this client received that the current plan's contribution depends on.

        The broadcasts under the plan's tag (a statistic: under every tag), the release commitments and the round's
        statistics; the client binds it into its contribution (:mod:`protocols.broadcast_view`); all-zero when there
        is nothing.
        """
        assert self.plan is not None  # called while a plan is under way
        statistic = self.schedule is not None and self.schedule.is_statistic(self.plan.tag)
        return self.views.digest(self.plan.tag, self.plan.round, every_chain=statistic)

    def _adopt_exchange(self, msg: Message, exchange: int) -> None:
        """Adopt the exchange number of a verified server message.

        The server numbers exchanges (older ones are replays): a later number is adopted only
        from a message whose signature verifies under the server's registered key and whose
        envelope names this run, this session and this client, so neither a forged packet nor a
        server message recorded elsewhere can push this client past the exchanges to come (such a
        message is refused when it is read).
        """
        signature, header = split_auth(msg.auth)
        self.registry.check_signature(SERVER, header, signature, dict(tag=msg.tag, round=msg.round, client=self.id))
        env = Envelope.from_header(header)
        if (env.run_id, env.session, env.recipient, env.exchange) == (
            self.setup.run_id,
            self.setup.session,
            self.name,
            exchange,
        ):
            self.exchange = exchange

    def take_run_material(self, inbox: list[Message]) -> list[Message]:
        """Verify and keep the messages of ``inbox`` that carry set-up material of the whole run.

        Material of the whole run, not of one exchange (a backend that has some overrides this); returns the other
        messages. :meth:`handle` calls it before the plan is checked, so a refused plan does not drop them.
        """
        return inbox

    def on_stage(self, stage: str, inbox: list[Message]) -> list[tuple[Message, bytes]]:
        """The backend's step for ``stage``: the verified-on-read ``inbox`` -> sealed responses."""
        raise NotImplementedError

    def coalition_secrets(self) -> dict[str, bytes]:
        """Attack simulations only: the key material this client hands a coalition.

        A backend that has some overrides this (:mod:`attacks.parties`).
        """
        return {}

    def result(self) -> dict[int, np.ndarray]:
        """This client's decoded result of its last exchange: block id -> summed block."""
        if self._result is None or self.plan is None or self._result[0] != self.plan.exchange:
            raise DropoutError("no result was delivered to this client for its last exchange", **self.where())
        return self._result[1]

    # ------------------------------------------------------------------ helpers for backends
    def where(self) -> dict[str, Any]:
        """Tag, round and client id of the current exchange, for error messages."""
        p = self.plan
        return dict(tag=p.tag if p else None, round=p.round if p else None, client=self.id)

    def message(
        self,
        receiver: str,
        kind: str,
        shape: tuple[int, ...],
        payload: Any,
        fingerprint: str,
        note: str = "",
        tag: str | None = None,
        round: int | None = None,
    ) -> Message:
        """A message from this client to ``receiver`` in the current exchange (its round and tag unless given)."""
        p = cast(ExchangePlan, self.plan)
        return Message(
            p.round if round is None else round,
            tag or p.tag,
            self.name,
            receiver,
            cast(Kind, kind),  # the kinds a backend sends (transcript.Kind)
            tuple(int(s) for s in shape),
            0,
            self.mode,
            fingerprint,
            payload,
            note,
        )

    def contribution(self, dense: bool = True) -> BlockTable:
        """Ask the provider for this exchange's contribution and check it against the plan.

        ``dense=False`` keeps a lazily built table (:class:`protocols.row_blocks.BlockRows`) lazy, for
        halves that read it chunk by chunk (ckks) instead of holding every block at once.
        """
        if self.provider is None:
            raise ProtocolError("this client half has no provider of contributions", **self.where())
        plan = cast(ExchangePlan, self.plan)
        table = self.provider(plan)
        plan.check_table(table, self.id)
        bits = plan.spec.grid_bits
        values = np.asarray(table.values) if dense or bits is not None else table.values
        if bits is not None:  # the exchange's public grid, in every mode (ValueSpec.grid_bits)
            values = to_grid(values, bits)
        return BlockTable(np.asarray(table.ids, dtype=np.int64).ravel(), values)

    def take_result(self) -> dict[int, np.ndarray]:
        """:meth:`result`, which this half then forgets (the caller holds the only copy)."""
        out = self.result()
        self._result = None
        return out

    def keep(self, block_id: int, block: np.ndarray) -> np.ndarray:
        """What this client keeps of decoded block ``block_id``.

        The rows of :attr:`selection` (idempotent), else the whole block. Halves that decode block by block call it
        at once, so a block's other rows are dropped as soon as they are decoded.
        """
        return block if self.selection is None else self.selection.take(block_id, block)

    def deliver(self, blocks: dict[int, np.ndarray]) -> None:
        """Keep this exchange's decoded blocks.

        The blocks are cut to :attr:`selection` (:meth:`keep`); on a grid exchange they are rounded back to the
        grid, after checking that the codec landed within its planned quarter step (else the sum is refused).
        """
        assert self.plan is not None  # a result belongs to the plan under way
        if self.plan.spec.grid_bits is not None:
            blocks = grid_sums(blocks, self.plan.spec.grid_bits, self.where())
        if self.schedule is not None and self.schedule.binds_views(self.plan.tag):
            self.views.record(self.plan.tag, self.plan.round, blocks)
        elif (
            self.schedule is not None and self.schedule.is_statistic(self.plan.tag) and self.mode in ROUND_BINDING_MODES
        ):
            self.views.record_statistic(self.plan.tag, self.plan.round, blocks)
        self._result = (self.plan.exchange, {b: self.keep(b, v) for b, v in blocks.items()})

    def open_relayed(self, msg: Message, stage: str, part: int = 0, exchange: int | None = None) -> bytes:
        """Verify and decrypt a message a peer relayed through the server.

        Verify and decrypt a message a peer sent through the server (:mod:`protocols.channel`);
        ``exchange``: the exchange it was sent in (default: the one in progress).
        """
        peer = msg.sender
        exchange = self.exchange if exchange is None else exchange
        self.check(msg, peer, stage, part, self.where(), exchange)
        ad = associated_data(
            self.setup.run_id, self.setup.session, exchange, msg.round, msg.tag, stage, peer, self.name
        )
        return self.channel.open(
            peer,
            self._peer_channel(peer),
            self.setup.run_id,
            msg.payload,
            ad,
            dict(tag=msg.tag, round=msg.round, client=party_client(peer)),
        )

    def seal_relayed(
        self,
        peer: int,
        stage: str,
        secret: bytes,
        note: str,
        fingerprint: str,
        part: int = 0,
        tag: str | None = None,
        round: int | None = None,
    ) -> tuple[Message, bytes]:
        """``secret`` for client ``peer``, channel-encrypted and signed; the server relays it."""
        pb = client_party(peer)
        plan = cast(ExchangePlan, self.plan)
        tag = tag or plan.tag
        rnd = plan.round if round is None else round
        ad = associated_data(self.setup.run_id, self.setup.session, self.exchange, rnd, tag, stage, self.name, pb)
        sealed = self.channel.seal(pb, self._peer_channel(pb), self.setup.run_id, secret, ad)
        msg = self.message(
            pb,
            "ciphertext",
            (len(sealed),),
            sealed,
            fingerprint,
            note + " (channel-encrypted, relayed by the server)",
            tag=tag,
            round=rnd,
        )
        return self.seal(replace(msg, relay=SERVER), stage, part)

    def _peer_channel(self, peer: str) -> bytes:
        """``peer``'s owner-signed channel key from the directory (IntegrityError if it was withheld)."""
        key = self.registry.channel.get(peer)
        if key is None:
            raise IntegrityError(
                f"no channel key of {peer} in the key directory (withheld by the server)", **self.where()
            )
        return key

    # ------------------------------------------------------------------ shared stages
    def _register(self, msg: Message) -> bytes:
        payload = msg.payload if isinstance(msg.payload, dict) else {}
        where: dict[str, Any] = dict(tag=AUTH_TAG, round=msg.round, client=self.id)
        if self.manifest is None:
            if not self.trust_on_first_use:
                raise ConfigurationError(
                    "this client half holds no run manifest: build it with use_manifest() "
                    "(or set trust_on_first_use, which an active server defeats)",
                    **where,
                )
            warnings.warn(
                f"{self.name} registers keys by trust on first use: a server that substitutes keys "
                "reads every input; pin them with a run manifest",
                RuntimeWarning,
                stacklevel=2,
            )
        try:
            self.registry.register(SERVER, bytes(payload.get("signing", b"")))  # pinned by the manifest
        except (TypeError, ValueError) as e:
            raise IntegrityError(f"malformed server key ({e})", **where) from None
        exchange = max(self.exchange, envelope_of(msg).exchange)
        self.check(msg, SERVER, "register", 0, where, exchange)
        self.exchange = exchange  # adopted once the signature verified
        self.registry.register(self.name, self.signing.public_bytes, self.channel.public_bytes)
        mine = {
            "signing": self.signing.public_bytes,
            "channel": self.channel.public_bytes,
            "channel_signature": sign_public_key(
                self.signing, "channel", self.setup.run_id, self.name, self.channel.public_bytes
            ),
        }
        reply = Message(
            msg.round,
            AUTH_TAG,
            self.name,
            SERVER,
            "public_key",
            (2, 32),
            0,
            self.mode,
            "",
            mine,
            note="Ed25519 identity key and X25519 channel key (signed by the identity key)",
        )
        return self.seal(reply, "register")[1]

    def _directory(self, msg: Message) -> None:
        where: dict[str, Any] = dict(tag=AUTH_TAG, round=msg.round, client=self.id)
        self.check(msg, SERVER, "directory", 0, where)
        try:
            entries = [
                (str(p), bytes(k["signing"]), bytes(k["channel"]), bytes(k["channel_signature"]))
                for p, k in msg.payload.items()
            ]
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"malformed key directory ({e})", **where) from None
        for party, signing, channel, signature in entries:
            if party == self.name:
                if (signing, channel) != (self.signing.public_bytes, self.channel.public_bytes):
                    raise KeySubstitutionError("the key directory lists other keys for this client", **where)
                continue
            self.registry.register(party, signing)  # the identity key the manifest lists
            check_public_key(
                self.registry,
                "channel",
                self.setup.run_id,
                party,
                channel,
                signature,
                dict(where, client=party_client(party)),
            )
            self.registry.register(party, signing, channel)

    def _accept_plan(self, msg: Message) -> ExchangePlan:
        """Verify the plan.

        :meth:`handle` then checks it against the run's rules (:mod:`protocols.plan_policy`) before anything is
        contributed (a report exchange sends a scalar in the clear by design: no sum to check).
        """
        self.check(msg, SERVER, "plan", 0, dict(tag=msg.tag, round=msg.round, client=self.id))
        plan = ExchangePlan.from_payload(msg.payload)
        if (plan.tag, plan.round, plan.exchange) != (msg.tag, msg.round, self.exchange):
            raise IntegrityError(
                "the exchange plan does not match its signed envelope", tag=msg.tag, round=msg.round, client=self.id
            )
        self.plan = plan
        return plan


class ServerHalf(Party):
    """The server's half of a backend: verify, aggregate, route; no secret key, no unmasking material.

    Subclasses implement :meth:`run`.
    """

    mode = "base"
    #: clients send each other messages through the server (they need the key directory)
    relays_between_clients = False
    #: stages whose answers may hold client -> client messages, which the server forwards
    relay_stages: frozenset[str] = frozenset()

    def __init__(self, setup: PartySetup, transcript: Transcript | None = None):
        super().__init__(SERVER, setup)
        self.transcript = transcript if transcript is not None else Transcript()
        #: test hook: called on every message in transit (may alter it, or drop it: ``None``)
        self.intercept: Callable[[Message], Message | None] | None = None
        self.plan: ExchangePlan | None = None
        self._outbox: dict[int, list[bytes]] = {}
        self.registered: set[int] = set()
        #: party -> its owner's signature over its channel key (forwarded verbatim in the directory)
        self.channel_signatures: dict[str, bytes] = {}
        #: the recipients of the last exchange whose ``download`` went unanswered (they got no result)
        self.last_undelivered: tuple[int, ...] = ()

    def run(self, plan: ExchangePlan, link: ClientLink) -> tuple[int, ...]:
        """Run one exchange over ``link``.

        Returns the clients whose contributions the result covers (the recipients decode it in their halves).
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers for backends
    def where(self, client: int | None = None) -> dict[str, Any]:
        """Tag, round and ``client`` of the current exchange, for error messages."""
        p = self.plan
        return dict(tag=p.tag if p else None, round=p.round if p else None, client=client)

    def message(
        self,
        receiver: int,
        kind: str,
        shape: tuple[int, ...],
        payload: Any,
        fingerprint: str,
        note: str = "",
        tag: str | None = None,
    ) -> Message:
        """A message from the server to client ``receiver`` in the current exchange."""
        p = cast(ExchangePlan, self.plan)
        return Message(
            p.round,
            tag or p.tag,
            SERVER,
            client_party(receiver),
            cast(Kind, kind),  # the kinds a backend sends (transcript.Kind)
            tuple(int(s) for s in shape),
            0,
            self.mode,
            fingerprint,
            payload,
            note,
        )

    def begin(self, plan: ExchangePlan, link: ClientLink, fingerprint: str, extra: tuple[int, ...] = ()) -> None:
        """Start an exchange.

        Register the clients (first time), queue each party's plan (and ``extra`` clients', which take part in a
        setup step only).
        """
        self.plan = plan
        self.exchange = plan.exchange
        self.last_undelivered = ()
        parties = sorted(set(plan.parties) | set(extra))
        self.register(link, plan.round, parties)
        for k in parties:
            msg = self.message(k, "control", (), plan.for_client(k).to_payload(), fingerprint, note="exchange plan")
            self.queue(k, msg, "plan")

    def queue(self, client: int, msg: Message, stage: str, part: int = 0) -> None:
        """Seal ``msg`` now; it travels in ``client``'s next request bundle."""
        wire = self._outgoing(msg, stage, part, self.intercept)
        if wire is not None:
            self._outbox.setdefault(client, []).append(wire)

    def forward(self, client: int, msg: Message) -> None:
        """Relay a client's message (already recorded when it arrived) to ``client``."""
        self._outbox.setdefault(client, []).append(message_to_bytes(msg))

    def call(
        self, link: ClientLink, stage: str, messages: dict[int, list[tuple[Message, int]]], *, hook: bool = True
    ) -> dict[int, list[Message]]:
        """Run one stage with the clients in ``messages``.

        One stage, to the clients in ``messages``: seal and record their messages (client ->
        [(message, part)]) after the ones queued for them, send one bundle per client, and return
        the parsed (recorded, not yet verified) responses of the clients that answered.  A client
        -> client message in a response is forwarded to its recipient's next bundle.  ``hook``:
        pass the messages through the test hook :attr:`intercept`.
        """
        intercept = self.intercept if hook else None
        requests = {}
        for k in sorted(messages):
            wires = self._outbox.pop(k, [])
            for msg, part in messages.get(k, []):
                wire = self._outgoing(msg, stage, part, intercept)
                if wire is not None:
                    wires.append(wire)
            requests[k] = pack_bundle(wires)
        responses = link.call(stage, requests)
        if stage in ("download", "release"):  # a result, or (ckks-mp) the commitment its delivery waits for
            self.last_undelivered = tuple(sorted(set(self.last_undelivered) | (set(requests) - set(responses))))
        out = {}
        for k, data in responses.items():
            msgs = []
            for msg in self.parse(data, self.where(k)):
                if intercept is not None:
                    changed = intercept(msg)
                    if changed is None:
                        continue
                    msg = changed
                peer = party_client(msg.receiver)
                if stage in self.relay_stages and peer is not None and msg.sender == client_party(k):
                    msg = replace(msg, relay=SERVER)  # client -> client: relay it
                    self.forward(peer, msg)
                self.record(msg)
                msgs.append(msg)
            out[k] = msgs
        return out

    def record(self, msg: Message) -> None:
        """Put a message that crossed the link in the transcript (a backend may strip payloads)."""
        self.transcript.record(msg)

    def _outgoing(
        self, msg: Message, stage: str, part: int, intercept: Callable[[Message], Message | None] | None = None
    ) -> bytes | None:
        sealed, wire = self.seal(msg, stage, part)
        if intercept is not None:
            changed = intercept(sealed)
            if changed is None:
                return None
            if changed is not sealed:
                sealed, wire = changed, message_to_bytes(changed)
        self.record(sealed)
        return wire

    def register(self, link: ClientLink, rnd: int, clients: Iterable[int]) -> None:
        """Register new clients and exchange identity and channel keys.

        The server's identity key to each new client; its identity key and owner-signed channel key
        back (each checked against the run manifest); then the key directory, forwarded verbatim.
        """
        new = [k for k in clients if k not in self.registered]
        if not new:
            return
        self.registry.register(SERVER, self.signing.public_bytes)
        msgs = {
            k: [
                (
                    Message(
                        rnd,
                        AUTH_TAG,
                        SERVER,
                        client_party(k),
                        "public_key",
                        (1, 32),
                        0,
                        self.mode,
                        "",
                        {"signing": self.signing.public_bytes},
                        note="the server's Ed25519 identity key (pinned by the run manifest)",
                    ),
                    0,
                )
            ]
            for k in new
        }
        replies = self.call(link, "register", msgs, hook=False)  # key set-up precedes any exchange
        for k in new:
            where: dict[str, Any] = dict(tag=AUTH_TAG, round=rnd, client=k)
            got = [m for m in replies.get(k, []) if m.sender == client_party(k)]
            if len(got) != 1 or not isinstance(got[0].payload, dict):
                raise DropoutError(f"client {k} did not register its keys", **where)
            keys = got[0].payload
            try:
                signing, channel = bytes(keys["signing"]), bytes(keys["channel"])
                signature = bytes(keys["channel_signature"])
            except (KeyError, TypeError, ValueError) as e:
                raise IntegrityError(f"malformed key registration ({e})", **where) from None
            self.registry.register(client_party(k), signing)
            self.check(got[0], client_party(k), "register", 0, where)
            check_public_key(self.registry, "channel", self.setup.run_id, client_party(k), channel, signature, where)
            self.registry.register(client_party(k), signing, channel)
            self.channel_signatures[client_party(k)] = signature
            self.registered.add(k)
        if self.relays_between_clients:
            directory = {
                client_party(k): {
                    "signing": self.registry.signing[client_party(k)],
                    "channel": self.registry.channel[client_party(k)],
                    "channel_signature": self.channel_signatures[client_party(k)],
                }
                for k in sorted(self.registered)
            }
            for k in sorted(self.registered):
                msg = Message(
                    rnd,
                    AUTH_TAG,
                    SERVER,
                    client_party(k),
                    "public_key",
                    (len(directory), 2, 32),
                    0,
                    self.mode,
                    "",
                    directory,
                    note="the clients' registered public keys",
                )
                wire = self._outgoing(msg, "directory", 0, self.intercept)
                if wire is not None:
                    self._outbox.setdefault(k, []).append(wire)

    def responses(
        self, got: dict[int, list[Message]], k: int, stage: str, kind: str | None = None, part: int = 0
    ) -> Message | None:
        """Client ``k``'s one verified ``stage`` message to the server (``None``: it sent none).

        Every message of its answer but the relayed ones must be that one (else it is refused).
        """
        mine = [m for m in got.get(k, []) if m.relay != SERVER]
        if not mine:
            return None
        if len(mine) != 1:
            raise IntegrityError(f"{len(mine)} messages where one '{stage}' message was expected", **self.where(k))
        msg = self.check(mine[0], client_party(k), stage, part, self.where(k))
        if kind is not None and msg.kind != kind:
            raise IntegrityError(
                f"message rejected: expected a '{kind}' message from {client_party(k)}, got '{msg.kind}'",
                **self.where(k),
            )
        return msg

    def check_envelope(self, msg: Message, fingerprint: str, k: int) -> None:
        """Refuse a message that does not belong to this exchange."""
        plan = cast(ExchangePlan, self.plan)
        check_exchange_fields(msg, self.mode, fingerprint, plan.round, plan.tag, k)
