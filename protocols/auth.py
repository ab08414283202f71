"""Identities: Ed25519 identity keys, the run's key registry, owner-signed keys, message verification.

Every party (each client and the server) holds an Ed25519 identity key (RFC 8032,
``cryptography``; drawn from the OS CSPRNG, never from the run seed) and each client an
X25519 channel key (:mod:`protocols.channel`).  **Trust assumption: the run manifest.**  The
manifest (:mod:`protocols.manifest`) lists every party's identity-key fingerprint; each site
compares its comparison code out of band before the run, and every party pins the listed
keys (``KeyRegistry(pinned=...)``): an identity key the manifest does not list is refused
with :class:`~protocols.errors.KeySubstitutionError`.  Every other public key a party
publishes (channel key, mask key, ...) travels with its owner's signature over
:func:`key_statement` (domain, run id, owner, kind, key hash), is forwarded verbatim by the
server, and is accepted only if :func:`check_public_key` verifies it under the owner's
pinned identity key.  A key registered once never changes for the run (a second, different
key raises :class:`AuthenticationError`).  Without a manifest a party registers keys as the
server relays them (trust on first use): only as an explicit, warned option, secure only
against a server that follows the protocol.

Verification (:func:`verify`), done by the server for every client->server message and by
the recipient for every server->client download and every relayed client->client message,
before the content is used: strict header parse, signature under the claimed sender's key,
the sender expected in this slot, the recipient, the run id (which derives from the
manifest, so parties holding different manifests refuse each other's first message), the
session and exchange (replays), the body digest, then a replay cache keyed by
``(session, exchange, stage, sender, recipient, part)``.  Each failure has its own
:class:`~protocols.errors.IntegrityError` subclass naming the client and exchange.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import (
    AuthenticationError,
    DigestError,
    KeySubstitutionError,
    MalformedMessageError,
    MisdirectedError,
    ReplayError,
)
from .message import SIGNATURE_BYTES, Envelope, body_digest
from .transcript import party_client

if TYPE_CHECKING:
    from .transcript import Message

_RAW: dict[str, Any] = dict(encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw)


class SigningKey:
    """A party's Ed25519 identity key pair (the private half never leaves the party).

    ``SigningKey()`` draws a fresh one from the OS CSPRNG.
    """

    def __init__(self, private: Ed25519PrivateKey | None = None):
        self._private = private if private is not None else Ed25519PrivateKey.generate()
        self.public_bytes = self._private.public_key().public_bytes(**_RAW)

    @property
    def fingerprint(self) -> str:
        """:func:`key_fingerprint` of the public key (what a run manifest lists)."""
        return key_fingerprint(self.public_bytes)

    def sign(self, header: bytes) -> bytes:
        """Ed25519 signature of ``header`` under this party's private key."""
        return self._private.sign(header)

    def private_bytes(self) -> bytes:
        """The raw 32-byte private key (to hand a client runtime its identity, or to save it)."""
        return self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the private key as PKCS#8 PEM readable by its owner only.

        Write the private key as unencrypted PKCS#8 PEM, readable by its owner only (mode 0600);
        an existing file is never overwritten.
        """
        pem = self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        """Read a key written by :meth:`save` (an Ed25519 PKCS#8 PEM file)."""
        try:
            with open(path, "rb") as f:
                private = serialization.load_pem_private_key(f.read(), password=None)
        except (TypeError, ValueError) as e:
            raise AuthenticationError(f"{path} is not an identity key file ({e})") from None
        if not isinstance(private, Ed25519PrivateKey):
            raise AuthenticationError(f"{path} holds a {type(private).__name__}, not an Ed25519 identity key")
        return cls(private)

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> SigningKey:
        """Load a key pair from its 32 raw private-key bytes.

        Raises:
            AuthenticationError: ``raw`` is not a valid Ed25519 private key.
        """
        try:
            return cls(Ed25519PrivateKey.from_private_bytes(bytes(raw)))
        except (TypeError, ValueError) as e:
            raise AuthenticationError(f"malformed identity key ({e})") from None


def key_fingerprint(public_bytes: bytes) -> str:
    """SHA-256 of a public key, hex (what is printed and pinned)."""
    return hashlib.sha256(public_bytes).hexdigest()


@dataclass
class KeyRegistry:
    """Party -> registered public keys (signing, channel); trust on first use unless ``pinned``."""

    pinned: dict[str, str] | None = None
    signing: dict[str, bytes] = field(default_factory=dict)
    channel: dict[str, bytes] = field(default_factory=dict)
    #: party -> (its registered key bytes, the loaded verifier): loaded once, not per message
    _verifiers: dict[str, tuple[bytes, Ed25519PublicKey]] = field(default_factory=dict, repr=False, compare=False)
    #: the last signature that verified, as (key, header, signature): a message checked twice by its receiver (first
    #: to adopt its exchange number, then when it is read) is verified once; verification is a function of these
    _last_verified: tuple[bytes, bytes, bytes] | None = field(default=None, repr=False, compare=False)

    def register(self, party: str, signing_public: bytes, channel_public: bytes | None = None) -> None:
        """Register ``party``'s keys (the server has a signing key only)."""
        if party in self.signing:
            known_channel = self.channel.get(party, channel_public)
            if self.signing[party] != signing_public or (
                channel_public is not None and known_channel != channel_public
            ):
                raise AuthenticationError(
                    f"{party} tried to register a second, different key; the registry is fixed at first use",
                    client=party_client(party),
                )
            if channel_public is not None:
                self.channel[party] = bytes(channel_public)
            return
        if self.pinned is not None and self.pinned.get(party) != key_fingerprint(bytes(signing_public)):
            raise KeySubstitutionError(
                f"{party}'s identity key is not the one the run manifest lists "
                f"({'not listed' if party not in self.pinned else 'fingerprint differs'}): "
                "a substituted key, or sites holding different manifests",
                client=party_client(party),
            )
        try:
            Ed25519PublicKey.from_public_bytes(signing_public)
        except ValueError:
            raise AuthenticationError(
                f"{party} registered a malformed signing key", client=party_client(party)
            ) from None
        self.signing[party] = bytes(signing_public)
        if channel_public is not None:
            self.channel[party] = bytes(channel_public)

    def fingerprints(self) -> dict[str, dict[str, str]]:
        """Party -> {'signing': sha256 hex, 'channel': sha256 hex} (the server: signing only)."""
        return {
            p: {
                "signing": key_fingerprint(self.signing[p]),
                **({"channel": key_fingerprint(self.channel[p])} if p in self.channel else {}),
            }
            for p in sorted(self.signing)
        }

    def check_signature(self, party: str, header: bytes, signature: bytes, where: dict[str, Any]) -> None:
        """Verify ``signature`` over ``header`` under ``party``'s registered signing key.

        Raises:
            AuthenticationError: ``party`` has no registered key, or the signature does not verify.
        """
        key = self.signing.get(party)
        if key is None:
            raise AuthenticationError(f"no registered key for sender {party!r}", **where)
        checked = (key, bytes(header), bytes(signature))
        if checked == self._last_verified:
            return
        try:
            loaded = self._verifiers.get(party)
            if loaded is None or loaded[0] != key:
                loaded = self._verifiers[party] = (key, Ed25519PublicKey.from_public_bytes(key))
            loaded[1].verify(checked[2], checked[1])
            self._last_verified = checked
        except (InvalidSignature, ValueError, TypeError):
            raise AuthenticationError(
                f"the signature of {party}'s message does not verify under its registered "
                "key: the message was forged or changed in transit",
                **where,
            ) from None


#: domain separator of an owner-signed public key statement
KEY_STATEMENT_DOMAIN = b"secure-fgl/owner-signed-key/v1"


def key_statement(kind: str, run_id: bytes, owner: str, public_key: bytes) -> bytes:
    """The bytes an owner signs to publish ``public_key``.

    Domain, run, owner, kind and a SHA-256 of the key, length-prefixed so that no two statements share an encoding.
    """
    fields = (
        KEY_STATEMENT_DOMAIN,
        bytes(run_id),
        owner.encode(),
        kind.encode(),
        hashlib.sha256(bytes(public_key)).digest(),
    )
    return b"".join(len(f).to_bytes(4, "big") + f for f in fields)


def sign_public_key(signing: SigningKey, kind: str, run_id: bytes, owner: str, public_key: bytes) -> bytes:
    """The owner's Ed25519 signature over :func:`key_statement` (forwarded verbatim by the server)."""
    return signing.sign(key_statement(kind, run_id, owner, public_key))


def check_public_key(
    registry: KeyRegistry,
    kind: str,
    run_id: bytes,
    owner: str,
    public_key: bytes,
    signature: bytes,
    where: dict[str, Any],
) -> None:
    """Refuse a public key its claimed owner did not sign.

    Catches a key substituted by whoever relayed it: verifies ``signature`` over :func:`key_statement` under the owner's
    registered identity key. Raises :class:`~protocols.errors.KeySubstitutionError`.
    """
    try:
        registry.check_signature(owner, key_statement(kind, run_id, owner, public_key), bytes(signature), where)
    except AuthenticationError:
        raise KeySubstitutionError(
            f"{owner}'s {kind} key is not signed by {owner}'s identity key: it was "
            "substituted or changed by the party that relayed it",
            **where,
        ) from None


def split_auth(auth: Any) -> tuple[bytes, bytes]:
    """``(signature, header)`` of the ``auth`` bytes a transcript Message carries."""
    if not isinstance(auth, (bytes, bytearray)) or len(auth) <= SIGNATURE_BYTES:
        raise MalformedMessageError("the message carries no signed envelope (truncated or stripped)")
    return bytes(auth[:SIGNATURE_BYTES]), bytes(auth[SIGNATURE_BYTES:])


@dataclass
class ReplayCache:
    """Keys of the messages a receiver has accepted."""

    seen: set[tuple[bytes, int, str, str, str, int]] = field(default_factory=set)

    def admit(self, env: Envelope, where: dict[str, Any]) -> None:
        """Accept ``env`` once; refuse a second message with the same key.

        The key is (session, exchange, stage, sender, recipient, part).

        Raises:
            ReplayError: the message was already received.
        """
        key = (env.session, env.exchange, env.stage, env.sender, env.recipient, env.part)
        if key in self.seen:
            raise ReplayError(
                f"replay: {env.sender}'s '{env.stage}' message (part {env.part}) of this exchange was already received",
                **where,
            )
        self.seen.add(key)


def verify(
    msg: Message, expected: dict[str, Any], registry: KeyRegistry, cache: ReplayCache, where: dict[str, Any]
) -> Envelope:
    """Check a delivered transcript ``Message`` against its signed envelope and the receiver's expectations.

    Check a delivered transcript ``Message`` against its signed envelope and what the
    receiver expects (``expected``: run_id, session, exchange, stage, part, sender, recipient).
    Returns the envelope; raises an IntegrityError subclass otherwise.
    """
    signature, header = split_auth(getattr(msg, "auth", None))
    env = Envelope.from_header(header)
    registry.check_signature(env.sender, header, signature, where)
    if env.sender != expected["sender"] or msg.sender != expected["sender"]:
        raise AuthenticationError(
            f"sender spoofing: expected a message from {expected['sender']}, the envelope "
            f"is signed by {env.sender} and claims {msg.sender!r}",
            **where,
        )
    if env.recipient != expected["recipient"] or msg.receiver != expected["recipient"]:
        raise MisdirectedError(
            f"message addressed to {env.recipient!r} delivered to {expected['recipient']!r}", **where
        )
    if env.run_id != expected["run_id"]:
        raise ReplayError(
            "message of another run: replayed from elsewhere, or its sender holds a different run "
            "manifest (compare the manifests' comparison codes)",
            **where,
        )
    if env.session != expected["session"]:
        raise ReplayError("message of another session (replayed from elsewhere)", **where)
    if env.exchange != expected["exchange"]:
        raise ReplayError(f"message of exchange {env.exchange} replayed in exchange {expected['exchange']}", **where)
    for name, got in (
        ("protocol", msg.protocol),
        ("fingerprint", msg.fingerprint),
        ("round", msg.round),
        ("tag", msg.tag),
        ("kind", msg.kind),
        ("shape", tuple(msg.shape)),
    ):
        if getattr(env, name) != got:
            raise AuthenticationError(
                f"the message's {name} {got!r} differs from the signed envelope's "
                f"{getattr(env, name)!r} (changed in transit)",
                **where,
            )
    if env.stage != expected["stage"] or env.part != expected["part"]:
        raise ReplayError(
            f"a '{env.stage}' message (part {env.part}) delivered where '{expected['stage']}' part "
            f"{expected['part']} was expected",
            **where,
        )
    received = getattr(msg, "received", None)  # the arrived body's hash, for exactly this payload
    digest, length = received[1:] if received is not None and received[0] is msg.payload else body_digest(msg.payload)
    if digest != env.digest or length != env.body_len:
        raise DigestError("the message body does not match the digest its sender signed: changed in transit", **where)
    cache.admit(env, where)
    return env
