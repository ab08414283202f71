"""The encrypted client-to-client channel relayed by the server (Bonawitz et al., CCS 2017, §4).

Secrets that one client sends another — Shamir shares of mask keys and self-mask seeds, the
output-mask group seed, the CKKS secret context — travel through the server, which relays
and records them but cannot read them.  As in Bonawitz et al. (round ShareKeys), each client
has a second key pair, an X25519 *channel* key (registered with its signing key,
:mod:`protocols.auth`), and clients ``u, v`` share

    k_uv = HKDF-SHA256(X25519(c_u^SK, c_v^PK), salt = run id, info = "secure_fgl/channel/v1" || u || v)

(``u < v``), used with ChaCha20-Poly1305 (RFC 8439): ``nonce (12, os.urandom) || AEAD(k_uv,
nonce, plaintext, associated data)``.  The associated data is the routing part of the
envelope (run, session, exchange, round, tag, stage, sender, recipient), so a ciphertext
moved to another exchange, stage or recipient fails to open.  The relayed message is itself
signed by its sender like every other message.
"""

from __future__ import annotations

import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import IntegrityError
from .message import encode_body

NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = NONCE_BYTES + TAG_BYTES
_RAW: dict[str, Any] = dict(encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw)


class ChannelKey:
    """A client's X25519 channel key pair; pairwise AEAD keys are cached per peer."""

    def __init__(self, party: str):
        self.party = party
        self._private = X25519PrivateKey.generate()
        self.public_bytes = self._private.public_key().public_bytes(**_RAW)
        self._keys: dict[tuple[str, bytes, bytes], ChaCha20Poly1305] = {}

    def _aead(self, peer: str, peer_public: bytes, run_id: bytes) -> ChaCha20Poly1305:
        slot = (peer, bytes(peer_public), run_id)
        if slot not in self._keys:
            try:
                shared = self._private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
            except ValueError as e:  # wrong length or a low-order point (all-zero output)
                raise IntegrityError(f"{peer}'s channel key is unusable ({e})") from None
            lo, hi = sorted([self.party, peer])
            info = encode_body(["secure_fgl/channel/v1", lo, hi])
            self._keys[slot] = ChaCha20Poly1305(
                HKDF(algorithm=hashes.SHA256(), length=32, salt=run_id, info=info).derive(shared)
            )
        return self._keys[slot]

    def pair_seed(self, peer: str, peer_public: bytes, run_id: bytes, label: str) -> bytes:
        """A 32-byte secret both ends of the pair derive alike.

        X25519, then HKDF with ``label`` and the sorted pair in ``info``, domain-separated from the channel key.
        """
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
        except ValueError as e:
            raise IntegrityError(f"{peer}'s channel key is unusable ({e})") from None
        lo, hi = sorted([self.party, peer])
        info = encode_body(["secure_fgl/pair-seed/v1", label, lo, hi])
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=run_id, info=info).derive(shared)

    def seal(self, peer: str, peer_public: bytes, run_id: bytes, plaintext: bytes, ad: bytes) -> bytes:
        """Encrypt ``plaintext`` for ``peer`` with ChaCha20-Poly1305 under the X25519+HKDF pairwise key.

        The key is bound to ``run_id`` and the two party names; ``ad`` is authenticated, not encrypted. Returns the
        random
        12-byte nonce followed by the ciphertext and tag.
        """
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead(peer, peer_public, run_id).encrypt(nonce, bytes(plaintext), ad)

    def open(
        self, peer: str, peer_public: bytes, run_id: bytes, sealed: object, ad: bytes, where: dict[str, Any]
    ) -> bytes:
        """Decrypt and authenticate a ciphertext made by :meth:`seal` on ``peer``'s side.

        Raises:
            IntegrityError: the ciphertext is truncated, or does not authenticate under this pair's key and ``ad``.
        """
        if not isinstance(sealed, (bytes, bytearray)) or len(sealed) < OVERHEAD:
            raise IntegrityError("channel ciphertext truncated", **where)
        try:
            return self._aead(peer, peer_public, run_id).decrypt(
                bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:]), ad
            )
        except InvalidTag:
            raise IntegrityError(
                f"channel ciphertext from {peer} does not authenticate (changed in transit or "
                "moved from another exchange/recipient)",
                **where,
            ) from None


def associated_data(
    run_id: bytes, session: bytes, exchange: int, rnd: int, tag: str, stage: str, sender: str, recipient: str
) -> bytes:
    """The routing fields an AEAD ciphertext is bound to."""
    return encode_body([run_id, session, exchange, rnd, tag, stage, sender, recipient])
