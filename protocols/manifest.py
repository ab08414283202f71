"""The run manifest: the public-key infrastructure and the security parameters of a run.

A manifest lists, for one run, every party's Ed25519 identity-key fingerprint
(:func:`protocols.auth.key_fingerprint`) and the public parameters every client enforces:

* ``mode`` and the backend's public ``options`` (ring sizes, ckks-mp parameters, the mask
  threshold ...), exactly the options each client half is built with;
* ``security``: parameters a client checks plans against (colluders ``c``, minimum
  contributors, the client-sampling seed, ...);
* ``schedule``: SHA-256 of the public run configuration that fixes the exchange schedule;
* ``nonce``: 16 random bytes, so that two runs of the same parties never share a run id.

Its bytes are canonical JSON (sorted keys, no spaces, UTF-8), so every site that holds the
same manifest computes the same digest ``H = SHA-256(bytes)``.  The run id is the first 16
bytes of ``H``; every signed envelope binds the run id (:mod:`protocols.message`) and every
owner-signed key statement binds it too (:func:`protocols.auth.key_statement`), so parties
holding different manifests refuse each other's first message.  The *comparison code* is
``H`` in base32, cut to 32 characters (160 bits) in groups of four: sites read it to each
other over a channel of their own before the run; equal codes mean equal manifests.  The
length is set by the adversary that builds the manifest itself (any site may, the server
too): it can search for two manifests with one code (say, one listing its own keys for every
peer of a victim site) by a birthday search, about 2^(bits/2) hashes -- 2^80 at 160 bits,
where 100 bits (2^50 hashes) would be within reach.

The manifest holds no secret and no signature: it is the root of trust only because each
site compared its code out of band.  Clients pin the identity keys it lists
(``KeyRegistry(pinned=...)``) and accept every other public key only when its owner's
identity key signed it (:func:`protocols.auth.check_public_key`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError
from .message import NONCE_BYTES
from .transcript import SERVER, client_party

MANIFEST_VERSION = 1
#: characters of the comparison code (base32, 5 bits each)
CODE_CHARS = 32
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, no NaN."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"a run manifest holds only JSON numbers, strings, lists and maps ({e})") from None


def schedule_digest(public_config: dict[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of the public configuration that fixes the exchange schedule."""
    return hashlib.sha256(canonical_json(public_config)).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """The public facts of a run every site agrees on before it starts (see the module docstring)."""

    mode: str
    #: party name ('server', 'client0', ...) -> SHA-256 hex of its Ed25519 identity key
    parties: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)
    security: dict[str, Any] = field(default_factory=dict)
    schedule: str = ""
    nonce: str = ""
    version: int = MANIFEST_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.mode, str) or not self.mode:
            raise ConfigurationError("a run manifest needs a mode")
        if SERVER not in self.parties or client_party(0) not in self.parties:
            raise ConfigurationError("a run manifest lists the server and at least client0")
        expected = {SERVER} | {client_party(k) for k in range(len(self.parties) - 1)}
        if set(self.parties) != expected:
            raise ConfigurationError(
                f"a run manifest's parties are 'server' and client0..client{len(expected) - 2} "
                f"without gaps, got {sorted(self.parties)}"
            )
        for party, fp in self.parties.items():
            if not isinstance(fp, str) or not _FINGERPRINT.match(fp):
                raise ConfigurationError(
                    f"{party}'s fingerprint must be 64 lower-case hex digits (the SHA-256 "
                    f"that 'secure-fgl keys new' prints), got {fp!r}"
                )
        if self.version != MANIFEST_VERSION:
            raise ConfigurationError(
                f"run manifest version {self.version!r}; this release reads version {MANIFEST_VERSION}"
            )
        canonical_json(self.to_dict())  # refuses what JSON cannot carry exactly

    @classmethod
    def new(
        cls,
        mode: str,
        parties: dict[str, str],
        options: dict[str, Any] | None = None,
        security: dict[str, Any] | None = None,
        schedule: str = "",
    ) -> Manifest:
        """A manifest with a fresh random nonce (the OS CSPRNG)."""
        return cls(
            mode, dict(parties), dict(options or {}), dict(security or {}), schedule, os.urandom(NONCE_BYTES).hex()
        )

    # ------------------------------------------------------------------ encoding
    def to_dict(self) -> dict[str, Any]:
        """The manifest as a plain dict."""
        return {
            "version": self.version,
            "mode": self.mode,
            "parties": dict(self.parties),
            "options": dict(self.options),
            "security": dict(self.security),
            "schedule": self.schedule,
            "nonce": self.nonce,
        }

    def to_bytes(self) -> bytes:
        """Canonical JSON of :meth:`to_dict` (the bytes every party hashes and signs)."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Strict parse of a canonical manifest document.

        Strict parse; a document that is not canonical (re-indented, re-ordered) is accepted
        only through :meth:`from_dict` so that the digest is always over canonical bytes.
        """
        try:
            doc = json.loads(bytes(data).decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise ConfigurationError(f"a run manifest is JSON ({e})") from None
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: Any) -> Manifest:
        """Parse a manifest from a plain dict.

        Raises:
            ConfigurationError: the fields are missing, extra, or of the wrong type.
        """
        keys = {"version", "mode", "parties", "options", "security", "schedule", "nonce"}
        if not isinstance(doc, dict) or set(doc) != keys:
            raise ConfigurationError(f"a run manifest has exactly the fields {sorted(keys)}")
        if not all(isinstance(doc[k], dict) for k in ("parties", "options", "security")):
            raise ConfigurationError("a run manifest's parties, options and security are maps")
        return cls(
            doc["mode"],
            dict(doc["parties"]),
            dict(doc["options"]),
            dict(doc["security"]),
            str(doc["schedule"]),
            str(doc["nonce"]),
            doc["version"],
        )

    # ------------------------------------------------------------------ identity of the run
    @property
    def digest(self) -> bytes:
        """SHA-256 of the canonical bytes."""
        return hashlib.sha256(self.to_bytes()).digest()

    @property
    def run_id(self) -> bytes:
        """The run id every envelope binds: the first 16 bytes of :attr:`digest`."""
        return self.digest[:NONCE_BYTES]

    @property
    def comparison_code(self) -> str:
        """What sites compare out of band: :attr:`digest` in base32, 32 characters in groups of 4."""
        code = base64.b32encode(self.digest).decode()[:CODE_CHARS]
        return "-".join(code[i : i + 4] for i in range(0, CODE_CHARS, 4))

    @property
    def num_clients(self) -> int:
        """Number of clients (every party except the server)."""
        return len(self.parties) - 1

    # ------------------------------------------------------------------ what clients read from it
    def parameter(self, name: str, default: Any = None) -> Any:
        """A security parameter: ``security[name]``, else ``options[name]``, else ``default``."""
        if name in self.security:
            return self.security[name]
        return self.options.get(name, default)

    def check_setup(self, mode: str, num_clients: int, run_id: bytes, options: dict[str, Any]) -> None:
        """Refuse a party setup that is not this manifest's run (ConfigurationError naming the field)."""
        for what, got, want in (
            ("mode", mode, self.mode),
            ("client count", num_clients, self.num_clients),
            ("run id", bytes(run_id), self.run_id),
        ):
            if got != want:
                raise ConfigurationError(
                    f"the party setup's {what} differs from the run manifest's: this party "
                    "was handed another run's setup"
                )
        if canonical_json(options) != canonical_json(self.options):
            raise ConfigurationError("the party setup's options differ from the run manifest's")
