"""Key agreement and seed derivation for pairwise masking.

Bonawitz et al. (CCS 2017, §4, round AdvertiseKeys) have every client ``u`` publish
a Diffie-Hellman public key ``s_u^PK``; clients ``u, v`` then share the seed
``s_{u,v} = KA.agree(s_u^SK, s_v^PK)`` that expands into their pairwise mask, and
the server, which relays the public keys, never learns it.  Here:

* KA = X25519 (RFC 7748) from ``cryptography``; one key pair per client **per run**, whose
  secret key never leaves the client: dropout recovery reveals the dropped client's
  pairwise seeds *of that exchange*, given by the survivors (:mod:`.backend`, step 5),
  never the key (Bonawitz et al. share the key itself, which is why they draw a fresh one
  per aggregation).  The DH output of each pair is computed once and cached.
* The raw DH output goes through HKDF-SHA256 (RFC 5869) with ``salt = run id`` and an
  ``info`` that binds the purpose, the exchange (sequence number, tag, round) and
  the ordered pair (lower id, higher id, both public keys), giving a 32-byte seed
  used as an AES-256 key exactly once (see :mod:`.prg`).
* Each advertised public key travels **owner-signed** (:func:`signed_mask_key`): the key
  followed by its owner's Ed25519 signature over :func:`protocols.auth.key_statement`
  (kind ``mask``, the run id, the owner).  The server forwards it verbatim; each receiver
  verifies it under the owner's identity key pinned by the run manifest
  (:func:`check_signed_mask_key`), so a server that substitutes a key of its own in the
  broadcast is refused with :class:`~protocols.errors.KeySubstitutionError` before any
  seed is derived from it.
* The consistency round's MAC key of the pair (:func:`MaskKeyPair.consistency_key`) is HKDF of the
  same X25519 output with its own ``info`` (purpose ``consistency-mac``, the ordered pair and both
  public keys), once per run: domain-separated from every pairwise-mask seed, so revealing the
  seeds of one exchange for dropout recovery reveals nothing of it.  The server, which never holds
  a mask secret key, can neither compute nor check these MACs.
* The output-mask key of client id ``k`` is HKDF(group seed, same bindings, ``k``): the key of
  ``P_k``; contributor ``k`` adds ``R_k = P_k - P_{k+1}`` (:mod:`.backend`).  The group seed is
  32 random bytes known to every client and never to the server.

Key generation is **random** (the OS CSPRNG via ``X25519PrivateKey.generate`` and
``os.urandom``), not derived from the protocol ``seed``: that seed is a public run
setting (it appears in configs and result.json), so keys derived from it would be
known to the server.  Results do not depend on the keys: masks cancel exactly in
the ring, so runs with the same protocol seed give bit-identical sums.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .. import validate
from ..auth import KeyRegistry, SigningKey, check_public_key, sign_public_key
from ..errors import ConfigurationError, IntegrityError
from ..message import SIGNATURE_BYTES

PUBLIC_KEY_BYTES = 32
SEED_BYTES = 32
#: an advertised mask key: the X25519 public key, then its owner's Ed25519 signature
SIGNED_KEY_BYTES = PUBLIC_KEY_BYTES + SIGNATURE_BYTES
#: the ``kind`` of a mask key in an owner-signed key statement
KEY_KIND = "mask"
_RAW: dict[str, Any] = dict(encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class ExchangeBinding:
    """What every derived seed is bound to: the run, the exchange number, tag and round."""

    run_id: bytes
    seq: int
    tag: str
    round: int

    def __post_init__(self) -> None:
        validate.exchange(self.tag, self.round)
        validate.count(self.seq, "the exchange sequence number", self.tag, self.round, minimum=0, maximum=2**63 - 1)
        if not isinstance(self.run_id, bytes):
            raise ConfigurationError("an exchange binding needs a bytes run id", tag=self.tag, round=self.round)

    @cached_property
    def encoded(self) -> bytes:
        """The binding's unambiguous bytes (computed once)."""
        return _join(self.seq.to_bytes(8, "big"), self.tag.encode(), self.round.to_bytes(8, "big", signed=True))


def _join(*parts: bytes) -> bytes:
    """Unambiguous concatenation (length-prefixed parts)."""
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def _hkdf(ikm: bytes, salt: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 (RFC 5869) with a 32-byte output: ``HMAC(HMAC(salt, ikm), info || 0x01)``."""
    return _expand(_extract(salt, ikm), info)


def _extract(salt: bytes, ikm: bytes) -> bytes:
    """HKDF-Extract: the pseudorandom key ``PRK = HMAC(salt, ikm)``."""
    return hmac.digest(salt, ikm, "sha256")


def _expand(prk: bytes, info: bytes) -> bytes:
    """HKDF-Expand to 32 bytes: ``HMAC(PRK, info || 0x01)``."""
    return hmac.digest(prk, info + b"\x01", "sha256")


class MaskKeyPair:
    """A client's X25519 mask key pair for one run."""

    def __init__(self, private: X25519PrivateKey):
        self._private = private
        self.public_bytes = private.public_key().public_bytes(**_RAW)
        #: (peer public key, run id) -> HKDF-Extract of the X25519 output (the DH is done once per peer)
        self._prk: dict[tuple[bytes, bytes], bytes] = {}
        #: (own id, peer id, peer public key) -> the ordered pair's part of an HKDF info
        self._pairs: dict[tuple[int, int, bytes], bytes] = {}
        #: (own id, peer id, peer public key, run id) -> the pair's consistency MAC key
        self._mac_keys: dict[tuple[int, int, bytes, bytes], bytes] = {}

    @classmethod
    def generate(cls) -> MaskKeyPair:
        """A fresh key pair from the OS CSPRNG."""
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> MaskKeyPair:
        """Rebuild a key pair from its 32 secret bytes (server side, after Shamir recovery)."""
        return cls(X25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        """The 32 secret bytes (only ever Shamir-shared, never sent whole)."""
        return self._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def _pair_prk(self, peer_id: int, peer_public: bytes, run_id: bytes, where: dict[str, Any]) -> bytes:
        """HKDF-Extract(salt = run id, X25519(own secret, peer public)), computed once per peer and run.

        A peer key that is not 32 bytes, or a low-order point (all-zero shared secret, which
        ``cryptography`` refuses with ``ValueError``), raises :class:`IntegrityError`.
        """
        if not isinstance(peer_public, (bytes, bytearray)):
            raise IntegrityError(f"an X25519 public key is bytes, got {type(peer_public).__name__}", **where)
        if len(peer_public) != PUBLIC_KEY_BYTES:
            raise IntegrityError(f"an X25519 public key is {PUBLIC_KEY_BYTES} bytes, got {len(peer_public)}", **where)
        prk = self._prk.get((bytes(peer_public), run_id))
        if prk is None:
            try:
                shared = self._private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
            except ValueError:
                raise IntegrityError(
                    "the peer's X25519 public key is a low-order point (all-zero shared secret): refused", **where
                ) from None
            prk = self._prk[(bytes(peer_public), run_id)] = _extract(run_id, shared)
        return prk

    def _pair_info(self, purpose: bytes, own_id: int, peer_id: int, peer_public: bytes, *bound: bytes) -> bytes:
        """HKDF ``info`` of a pair's key: the purpose, ``bound``, the ordered pair and both public keys.

        ``_join(domain, purpose, *bound, lo, hi, pk_lo, pk_hi)``; the pair's part is joined once per peer.
        """
        pair = self._pairs.get((own_id, peer_id, bytes(peer_public)))
        if pair is None:
            (lo, pk_lo), (hi, pk_hi) = sorted([(own_id, self.public_bytes), (peer_id, bytes(peer_public))])
            pair = _join(lo.to_bytes(4, "big"), hi.to_bytes(4, "big"), pk_lo, pk_hi)
            self._pairs[(own_id, peer_id, bytes(peer_public))] = pair
        return _join(b"secure_fgl/mask/v1", purpose, *bound) + pair

    def pairwise_seed(self, own_id: int, peer_id: int, peer_public: bytes, binding: ExchangeBinding) -> bytes:
        """``s_{own,peer}``: identical for both ends of the pair, unknown to anyone else.

        ``HKDF(X25519(own, peer); salt = run id, info = (pairwise-mask, exchange, pair, keys))``.
        """
        where: dict[str, Any] = dict(tag=binding.tag, round=binding.round, client=peer_id)
        prk = self._pair_prk(peer_id, peer_public, binding.run_id, where)
        return _expand(prk, self._pair_info(b"pairwise-mask", own_id, peer_id, peer_public, binding.encoded))

    def consistency_key(self, own_id: int, peer_id: int, peer_public: bytes, run_id: bytes) -> bytes:
        """``k_{own,peer}``: the pair's key of the consistency round's MACs, once per run.

        ``HKDF(X25519(own, peer); salt = run id, info = (consistency-mac, pair, keys))``: the same
        agreement as the mask seeds under another purpose, so no mask seed reveals it.
        """
        cached = (own_id, peer_id, bytes(peer_public), run_id)
        key = self._mac_keys.get(cached)
        if key is None:
            prk = self._pair_prk(peer_id, peer_public, run_id, dict(client=peer_id))
            key = self._mac_keys[cached] = _expand(
                prk, self._pair_info(b"consistency-mac", own_id, peer_id, peer_public)
            )
        return key


def signed_mask_key(signing: SigningKey, run_id: bytes, owner: str, public_bytes: bytes) -> bytes:
    """The mask key as its owner advertises it: ``public_bytes || signature``.

    ``public_bytes || signature``: the mask key as its owner advertises it (the signature by
    ``signing``, the owner's identity key, over :func:`protocols.auth.key_statement`).
    """
    return bytes(public_bytes) + sign_public_key(signing, KEY_KIND, run_id, owner, public_bytes)


def check_signed_mask_key(
    registry: KeyRegistry, run_id: bytes, owner: str, signed: object, where: dict[str, Any]
) -> bytes:
    """The mask public key of ``owner``, after checking its signature.

    The mask public key of ``owner`` from its advertised form, after checking the owner's
    signature under its registered (manifest-pinned) identity key; IntegrityError if malformed,
    :class:`~protocols.errors.KeySubstitutionError` if the owner did not sign it.
    """
    if not isinstance(signed, (bytes, bytearray)) or len(signed) != SIGNED_KEY_BYTES:
        raise IntegrityError(f"an advertised mask key is {SIGNED_KEY_BYTES} bytes (key and owner's signature)", **where)
    key = bytes(signed[:PUBLIC_KEY_BYTES])
    check_public_key(registry, KEY_KIND, run_id, owner, key, bytes(signed[PUBLIC_KEY_BYTES:]), where)
    return key


def output_mask_key(group_seed: bytes, client: int, binding: ExchangeBinding) -> bytes:
    """Key of ``P_client``, the output-mask stream of client id ``client`` in this exchange (clients only)."""
    info = _join(b"secure_fgl/mask/v1", b"output-mask", binding.encoded, client.to_bytes(4, "big"))
    return _hkdf(group_seed, binding.run_id, info)


def output_mask_keys(group_seed: bytes, k: int, num_clients: int, binding: ExchangeBinding) -> tuple[bytes, ...]:
    """The keys of contributor ``k``'s output mask.

    The keys of ``P_k`` and ``P_{k+1}`` in contributor ``k``'s output mask ``R_k = P_k - P_{k+1}``
    (just ``P_k`` for the last client id: ``P_K = 0``).
    """
    return tuple(output_mask_key(group_seed, j, binding) for j in range(k, min(k + 2, num_clients)))


def new_secret_seed() -> bytes:
    """32 random bytes from the OS CSPRNG (group seed, self-mask seeds, run ids)."""
    return os.urandom(SEED_BYTES)
