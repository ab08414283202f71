"""The algorithms' protocol facade over a backend built of client and server halves.

:class:`HalvesProtocol` keeps the four exchange shapes of :class:`~protocols.base.Protocol`
(``weighted_mean``, ``row_sum``, ``classwise_mean``, ``central_moments``) for algorithms that
hold every client's contribution in one dict, and runs each exchange as the parties would:

1. the server side computes the public :class:`~protocols.plan.ExchangePlan` (:meth:`plan_exchange`);
2. each client half's provider returns that client's blocks from the dict the algorithm passed;
3. the server half drives the backend's stages over the :class:`~protocols.link.ClientLink`
   (default :class:`~protocols.link.InProcessLink`: the halves in this process), only bytes
   crossing;
4. each recipient's half decodes its own result, which the facade hands back.

The client halves are built from the public setup bytes alone, exactly as a remote process
would build them; the facade keeps references to them only to play the algorithm's clients
(and, for the attack suite, to read what a colluding client holds).

The facade also plays the sites before the run (:mod:`protocols.manifest`): it draws each
party's identity key, writes the run manifest (identity fingerprints, public options and
security parameters), derives the run id from it and hands every half the manifest and its
own identity key directly, never through the server half.  In one process this is one trust
domain: it exercises the checks each client makes against the manifest, it does not
separate the parties.  Where the sites are separate (a deployment across organisations), each
site draws its own key and the facade is given the manifest built from their public keys: it
then draws no client key, and each client half signs with its site's key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, cast

import numpy as np

from .auth import SigningKey
from .base import Protocol
from .errors import ConfigurationError
from .exchange import ExchangeContext
from .link import ClientLink, InProcessLink
from .manifest import Manifest, canonical_json
from .message import NONCE_BYTES, SIGNATURE_BYTES, body_digest
from .party import ClientHalf, Party, PartySetup, ServerHalf, envelope_for
from .plan import ExchangePlan
from .plan_policy import CollusionBound
from .schedule import PublicSchedule
from .transcript import SERVER, Message, client_party, party_client


class HalvesProtocol(Protocol):
    """A :class:`Protocol` whose backend is a :attr:`server_half` and one :attr:`client_half` per client.

    ``link``: the transport to the client halves (default: in-process halves built here;
    with a link, :meth:`client_identity` is what the driver hands each client runtime).
    ``schedule``: SHA-256 hex of the public configuration fixing the exchange schedule
    (:func:`protocols.manifest.schedule_digest`), recorded in the manifest.
    ``max_colluders`` (c) and ``min_contributors`` (default ``c + 2``): the run's collusion bound,
    public (in the party setup and the manifest); every client half refuses a plan that breaks
    it (:mod:`protocols.plan_policy`).  ``client_fraction``, ``roles`` (tag -> role),
    ``exchanges`` (tag -> first and last round; ``None``: not listed) and ``groups`` (lists of tags
    with related inputs): the public schedule in the
    manifest, which every client half checks plans against too (:mod:`protocols.schedule`; the
    sampling seed is ``seed``).
    ``manifest`` and ``identity``: a manifest built from the sites' own identity keys
    (``secure-fgl manifest new``) and the server's key; with them no client key is drawn here,
    and each client runtime signs with the key its site holds (needs ``link``).
    """

    client_half: type[ClientHalf] = ClientHalf
    server_half: type[ServerHalf] = ServerHalf

    def __init__(
        self,
        num_clients: int,
        *,
        link: ClientLink | None = None,
        schedule: str = "",
        max_colluders: int = 0,
        min_contributors: int | None = None,
        client_fraction: float = 1.0,
        roles: dict[str, str] | None = None,
        exchanges: dict[str, tuple[int, int]] | None = None,
        groups: list[list[str]] | None = None,
        manifest: Manifest | None = None,
        identity: SigningKey | None = None,
        **base_options: Any,
    ):
        super().__init__(num_clients, **base_options)
        #: this session's nonce (os.urandom; a resumed run gets a new session)
        self.session = os.urandom(NONCE_BYTES)
        self.collusion = CollusionBound.of(max_colluders, min_contributors)
        listing: dict[str, Any] = {}
        if exchanges is not None:
            listing["exchanges"] = {t: [int(a), int(b)] for t, (a, b) in exchanges.items()}
        if groups:
            listing["groups"] = [sorted(str(t) for t in group) for group in groups]
        self.schedule = PublicSchedule.of(
            num_clients,
            {"sample_seed": int(self.seed), "client_fraction": client_fraction, "roles": roles or {}, **listing},
        )
        if manifest is None:  # this process plays every site: it draws every party's identity key
            identities: dict[str, SigningKey | None] = {
                SERVER: SigningKey(),
                **{client_party(k): SigningKey() for k in range(self.num_clients)},
            }
            manifest = Manifest.new(
                self.mode,
                {p: cast(SigningKey, key).fingerprint for p, key in identities.items()},  # all drawn above
                self.public_options(),
                self.security_parameters(),
                schedule,
            )
        else:  # the sites' manifest: each client's identity key stays at its site
            if link is None:
                raise ConfigurationError("a run manifest of the sites' keys needs the sites: give the link to them")
            self._check_manifest(manifest, schedule)
            identities = {SERVER: identity}  # None: use_manifest names the missing key
        self.manifest = manifest
        self.run_id = self.manifest.run_id
        self.setup = PartySetup(
            self.mode, self.num_clients, self.run_id, self.session, self.public_options(), self.collusion
        )
        self.server = self.server_half(self.setup, self.transcript)
        self.server.use_manifest(self.manifest, identities.pop(SERVER))
        setup_bytes = self.setup.to_bytes()
        self._identities = identities if link is not None else {}  # handed to the client runtimes
        self.clients: dict[int, ClientHalf] = {}
        for k in range(self.num_clients if link is None else 0):
            self.clients[k] = self.client_half(k, setup_bytes)
            self.clients[k].use_manifest(self.manifest, identities[client_party(k)])
            self.clients[k].dp_config = getattr(self.dp, "config", None)
        self.link = link if link is not None else InProcessLink(self.clients)
        # the facade's view of the parties' public keys (tests re-sign messages as a party)
        self.registry = self.server.registry
        self._server_signing = self.server.signing
        self._signing = {k: c.signing for k, c in self.clients.items()}
        self._channel = {k: c.channel for k, c in self.clients.items()}

    def public_options(self) -> dict[str, Any]:
        """Run-level public backend options every client half is built with."""
        return {}

    def security_parameters(self) -> dict[str, Any]:
        """The manifest's security parameters (those not already among :meth:`public_options`)."""
        schedule = {"sample_seed": self.schedule.sample_seed, "client_fraction": self.schedule.client_fraction}
        listed = self.schedule.exchanges
        listing: dict[str, Any] = (
            {} if listed is None else {"exchanges": {t: [a, b] for t, (a, b) in sorted(listed.items())}}
        )
        groups = sorted({group for of_tag in self.schedule.groups.values() for group in of_tag})
        if groups:
            listing["groups"] = [list(group) for group in groups]
        return {**schedule, "roles": dict(self.schedule.roles), **listing, **self.collusion.to_dict()}

    def client_identity(self, k: int) -> dict[str, bytes]:
        """What the driver hands client ``k``'s runtime directly, beside the public setup.

        The run manifest and ``k``'s identity key (:meth:`ClientHalf.use_manifest`); only the manifest when the
        sites hold their keys.
        """
        key = self._identities.get(client_party(k))
        return {"manifest": self.manifest.to_bytes(), **({"identity": key.private_bytes()} if key else {})}

    def _check_manifest(self, manifest: Manifest, schedule: str) -> None:
        """Refuse a given manifest that is not this run's (ConfigurationError naming the field)."""
        for what, got, want in (
            ("mode", manifest.mode, self.mode),
            ("client count", manifest.num_clients, self.num_clients),
            ("schedule", manifest.schedule, schedule),
            ("security parameters", manifest.security, self.security_parameters()),
            ("options", manifest.options, self.public_options()),
        ):
            if canonical_json(got) != canonical_json(want):
                raise ConfigurationError(
                    f"the run manifest's {what} differ from this run's: build the manifest with "
                    "secure-fgl manifest new --config of this run's settings"
                )

    # the test hook lives on the server half (every message crosses it)
    @property
    def intercept(self) -> Callable[[Message], Message | None] | None:
        """The server half's test hook on outgoing messages (None before the halves exist)."""
        return self.server.intercept if hasattr(self, "server") else None

    @intercept.setter
    def intercept(self, hook: Callable[[Message], Message | None] | None) -> None:
        if hasattr(self, "server"):
            self.server.intercept = hook

    # ------------------------------------------------------------------ one exchange
    def plan_exchange(self, ctx: ExchangeContext) -> ExchangePlan:
        """The public plan of the exchange (a backend adds its encoding)."""
        return ExchangePlan(
            ctx.tag,
            ctx.round,
            self.exchange,
            ctx.layout,
            ctx.num_blocks,
            ctx.block_len,
            tuple(sorted(int(k) for k in ctx.contributions)),
            {int(r): np.asarray(b, dtype=np.int64).ravel() for r, b in ctx.requests.items()},
            ctx.spec,
            float(ctx.dp_noise_std),
            self.plan_encoding(ctx),
        )

    def plan_encoding(self, ctx: ExchangeContext) -> dict[str, Any]:
        """The backend's encoding parameters for the exchange plan (none by default)."""
        return {}

    def _aggregate(self, ctx: ExchangeContext) -> dict[int, dict[int, np.ndarray]]:
        if self.server.plan is not None and self.server.plan.exchange >= self.exchange:
            self._begin_exchange(ctx.tag, ctx.round)  # called directly (tests): a fresh exchange number
        plan = self.plan_exchange(ctx)
        for k, half in self.clients.items():  # each half is handed its own table (and rows) only
            half.provider = lambda p, table=ctx.contributions.get(k): table
            half.selection = (ctx.keep or {}).get(k)
        try:
            self.server.run(plan, self.link)
            return {r: self.clients[r].take_result() for r in plan.requests}
        finally:
            for half in self.clients.values():
                half.provider = half.selection = None

    def _begin_exchange(self, tag: str, rnd: int) -> None:
        super()._begin_exchange(tag, rnd)
        self.server.exchange = self.exchange

    # ------------------------------------------------------------------ authentication (facade view)
    def identity_fingerprints(self) -> dict[str, dict[str, str]]:
        """SHA-256 fingerprints of every key the server half registered, its own signing key included.

        They are written to result.json.
        """
        return self.registry.fingerprints()

    def _ensure_registered(self, rnd: int) -> None:
        self.server.register(self.link, rnd, range(self.num_clients))

    def _seal(self, msg: Message, stage: str, part: int = 0) -> Message:
        """Sender side: the signed envelope of ``msg``; ``nbytes`` becomes the real wire size."""
        self._ensure_registered(msg.round)
        k = party_client(msg.sender)
        key = self._server_signing if k is None else self._signing[k]
        digest, length = body_digest(msg.payload)
        header = envelope_for(msg, self.run_id, self.session, self.exchange, stage, part, digest, length).header_bytes()
        return replace(msg, auth=key.sign(header) + header, nbytes=SIGNATURE_BYTES + 4 + len(header) + length)

    def _party(self, name: str) -> Party:
        k = party_client(name)
        return self.server if k is None else self.clients[k]

    def _authenticate(
        self, msg: Message, sender: str, recipient: str, stage: str, part: int, tag: str, rnd: int
    ) -> None:
        """Verify ``msg`` as its recipient's half does (its keys, its replay cache)."""
        where = dict(tag=tag, round=rnd, client=party_client(recipient if sender == SERVER else sender))
        self._party(recipient).check(msg, sender, stage, part, where)

    def client_results(self) -> Mapping[int, tuple[int, dict[int, np.ndarray]] | None]:
        """Each client half's last decoded result (for tests)."""
        return {k: c._result for k, c in self.clients.items()}
