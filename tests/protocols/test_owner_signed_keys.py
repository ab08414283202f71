"""Owner-signed public keys: a relayed key verifies only under its owner's identity key."""

import pytest

from protocols.auth import KeyRegistry, SigningKey, check_public_key, sign_public_key
from protocols.errors import KeySubstitutionError

RUN = b"r" * 16


def _registry():
    owner, server = SigningKey(), SigningKey()
    reg = KeyRegistry()
    reg.register("client0", owner.public_bytes)
    reg.register("server", server.public_bytes)
    return reg, owner, server


def test_owner_signed_key_verifies():
    reg, owner, _ = _registry()
    sig = sign_public_key(owner, "channel", RUN, "client0", b"k" * 32)
    check_public_key(reg, "channel", RUN, "client0", b"k" * 32, sig, {})


@pytest.mark.parametrize("change", ["key", "kind", "run", "owner_signed_by_server"])
def test_substituted_key_is_refused(change):
    reg, owner, server = _registry()
    sig = sign_public_key(owner, "channel", RUN, "client0", b"k" * 32)
    key, kind, run = b"k" * 32, "channel", RUN
    if change == "key":
        key = b"x" * 32
    elif change == "kind":
        kind = "mask"
    elif change == "run":
        run = b"s" * 16
    else:  # the relaying server signs a key of its own choosing in client0's name
        key = b"x" * 32
        sig = sign_public_key(server, "channel", RUN, "client0", key)
    with pytest.raises(KeySubstitutionError):
        check_public_key(reg, kind, run, "client0", key, sig, {})
