"""Malicious server halves shared by the tests that attack key distribution."""

from __future__ import annotations

from dataclasses import replace

from protocols.auth import SigningKey, sign_public_key
from protocols.channel import ChannelKey
from protocols.registry import backend_class


def directory_forger(mode: str, *, resign: bool, identity: bool = False):
    """A server half that puts its own keys for client 1 in the key directory.

    A server half that puts its own channel key (and, with ``identity``, its own identity
    key) for client1 into client0's key directory, signed by itself (``resign``) or with
    client1's original signature.
    """
    base = backend_class(mode).server_half

    class DirectoryForger(base):
        def _outgoing(self, msg, stage, part, intercept=None):
            if stage == "directory" and msg.receiver == "client0":
                self.mitm = ChannelKey("client1")
                impostor = SigningKey()
                entry = dict(msg.payload["client1"], channel=self.mitm.public_bytes)
                if identity:
                    entry["signing"] = impostor.public_bytes
                if resign or identity:
                    signer = impostor if identity else self.signing
                    entry["channel_signature"] = sign_public_key(
                        signer, "channel", self.setup.run_id, "client1", self.mitm.public_bytes
                    )
                msg = replace(msg, payload={**msg.payload, "client1": entry})
            return super()._outgoing(msg, stage, part, intercept)

    return DirectoryForger
