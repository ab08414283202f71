"""A server that lies about keys: malicious server halves (subclasses) against the run manifest.

Adversary: the server, deviating from the protocol, with its own identity and channel keys.
Each attack ran against trust on first use (the server relayed every key) and read the
secret it aimed at; against the manifest-pinned, owner-signed keys each aborts with a
:class:`~protocols.errors.KeySubstitutionError` (or, for diverging manifests, a
:class:`~protocols.errors.ReplayError`) before the secret leaves its owner.
"""

from dataclasses import replace

import numpy as np
import pytest
from support.forgers import directory_forger

from protocols import ValueSpec, make_protocol
from protocols.auth import KeyRegistry, SigningKey
from protocols.channel import associated_data
from protocols.ckks_mp import CKKSMPProtocol
from protocols.errors import ConfigurationError, KeySubstitutionError, ProtocolError, ReplayError
from protocols.manifest import Manifest
from protocols.mask import MaskProtocol
from protocols.mask.keys import MaskKeyPair, signed_mask_key
from protocols.party import PartySetup, envelope_of
from protocols.registry import backend_class
from protocols.transcript import SERVER

K = 3
SPEC = ValueSpec(max_abs=8.0, tolerance=1e-3)
#: the secret a dealer relays through the server in its first exchange, per mode
DEALT = {"mask": "group_seed", "ckks": "key_setup"}


def _values():
    return {k: np.arange(4, dtype=float) + k for k in range(K)}


def _with_server(mode: str, server_cls, **options):
    """The mode's facade whose server half is ``server_cls`` (a subclass of its own)."""
    base = backend_class(mode)
    evil = type(f"Evil{base.__name__}", (base,), {"server_half": server_cls})
    return evil(K, **options)


def _relayed_secrets(proto, stage: str):
    """Messages client 0 relayed at ``stage`` (the dealt secret) in the server's transcript."""
    return [
        m
        for m in proto.transcript.view(SERVER)
        if m.relay == SERVER and m.sender == "client0" and envelope_of(m).stage == stage
    ]


@pytest.mark.parametrize("mode", ["mask", "ckks"])
@pytest.mark.parametrize(
    "resign,identity",
    [(True, False), (False, False), (True, True)],
    ids=["channel_key_server_signed", "channel_key_owner_signature_kept", "identity_key"],
)
def test_substituted_directory_key_never_receives_the_dealt_secret(mode, resign, identity):
    """Substituted directory key never receives the dealt secret.

    The measured attack: the server's channel key in client0's directory opened the relayed
    CKKS secret context / mask group seed.  Now client0 refuses the directory: nothing is dealt.
    """
    proto = _with_server(
        mode,
        directory_forger(mode, resign=resign, identity=identity),
        **({"params": "n4096"} if mode == "ckks" else {}),
    )
    with pytest.raises(KeySubstitutionError, match="client1"):
        proto.weighted_sum("w", 0, _values(), spec=SPEC)
    assert _relayed_secrets(proto, DEALT[mode]) == []


@pytest.mark.parametrize("mode", ["mask", "ckks"])
def test_control_trust_on_first_use_hands_the_server_the_dealt_secret(mode):
    """Control trust on first use hands the server the dealt secret.

    The same forger against clients that trust on first use (the former registration):
    client0 encrypts the mask group seed G / the CKKS secret context to the server's key, and
    the server opens it.
    """
    proto = _with_server(
        mode, directory_forger(mode, resign=True, identity=True), **({"params": "n4096"} if mode == "ckks" else {})
    )
    for k in range(K):
        half = proto.client_half(k, proto.setup.to_bytes())
        half.signing, half.trust_on_first_use = proto.clients[k].signing, True
        proto.clients[k] = proto.link.halves[k] = half
    with pytest.warns(RuntimeWarning, match="trust on first use"), pytest.raises(ProtocolError):
        proto.weighted_sum("w", 0, _values(), spec=SPEC)  # client1 cannot open what was sealed to the server
    to_victim = [m for m in _relayed_secrets(proto, DEALT[mode]) if m.receiver == "client1"]
    assert len(to_victim) == 1
    m, run_id = to_victim[0], proto.setup.run_id
    ad = associated_data(
        run_id, proto.session, envelope_of(m).exchange, m.round, m.tag, DEALT[mode], "client0", "client1"
    )
    opened = proto.server.mitm.open("client0", proto.clients[0].channel.public_bytes, run_id, m.payload, ad, {})
    if mode == "mask":
        assert opened == proto.clients[0].group_seed
    else:
        import tenseal as ts

        n = int.from_bytes(opened[:4], "big")
        assert ts.context_from(opened[4 : 4 + n]).has_secret_key()


def test_substituted_mask_key_is_refused():
    """Substituted mask key is refused.

    The server replaces client1's advertised mask key in client0's broadcast by its own
    (signed by the server), to learn the pairwise seed s_{0,1}: refused before any seed is derived.
    """
    base = MaskProtocol.server_half

    class MaskKeyForger(base):
        def _outgoing(self, msg, stage, part, intercept=None):
            if (
                stage == "advertise_keys"
                and msg.receiver == "client0"
                and isinstance(msg.payload, dict)
                and 1 in msg.payload
            ):
                self.mitm = MaskKeyPair.generate()
                forged = signed_mask_key(self.signing, self.setup.run_id, "client1", self.mitm.public_bytes)
                msg = replace(msg, payload={**msg.payload, 1: forged})
            return super()._outgoing(msg, stage, part, intercept)

    proto = _with_server("mask", MaskKeyForger)
    with pytest.raises(KeySubstitutionError, match="mask key"):
        proto.weighted_sum("w", 0, _values(), spec=SPEC)
    assert not [m for m in proto.transcript.view(SERVER) if m.sender == "client0" and m.kind == "masked"]


def test_server_with_an_identity_key_the_manifest_does_not_list_is_refused():
    """Server with an identity key the manifest does not list is refused.

    A server that signs with a key of its own choosing (not the manifest's) is refused at
    registration by every client, before any key of theirs is sent.
    """
    base = MaskProtocol.server_half

    class Impostor(base):
        def use_manifest(self, manifest, identity=None):
            super().use_manifest(manifest, identity)
            self.signing, self.registry = SigningKey(), KeyRegistry()

    proto = _with_server("mask", Impostor)
    with pytest.raises(KeySubstitutionError, match="server's identity key is not the one the run manifest lists"):
        proto.weighted_sum("w", 0, _values(), spec=SPEC)
    assert not [m for m in proto.transcript.view(SERVER) if m.sender != SERVER]


@pytest.mark.parametrize("mode", ["mask", "ckks-mp"])
def test_diverging_manifests_abort_in_the_first_exchange(mode):
    """Diverging manifests abort in the first exchange.

    Client 2 holds a manifest that differs in one security parameter: its run id differs, so
    it refuses the server's first message and nothing of this run is aggregated.
    """
    proto = make_protocol(mode, K)
    theirs = Manifest.from_dict(
        {**proto.manifest.to_dict(), "security": {**proto.manifest.security, "sample_seed": 12345}}
    )
    assert theirs.run_id != proto.manifest.run_id
    setup = PartySetup(proto.mode, K, theirs.run_id, proto.session, proto.public_options())
    half = proto.client_half(2, setup.to_bytes())
    half.use_manifest(theirs, proto.clients[2].signing)
    proto.clients[2] = proto.link.halves[2] = half
    with pytest.raises(ReplayError, match="different run manifest"):
        proto.weighted_sum("w", 0, _values(), spec=SPEC)
    assert not [m for m in proto.transcript.view(SERVER) if m.kind in ("masked", "ciphertext")]


def test_client_half_without_a_manifest_refuses_unless_tofu_is_asked_for():
    proto = MaskProtocol(K)
    bare = proto.client_half(0, proto.setup.to_bytes())
    proto.clients[0] = proto.link.halves[0] = bare
    with pytest.raises(ConfigurationError, match="no run manifest"):
        proto.weighted_sum("w", 0, _values(), spec=SPEC)


def test_use_manifest_refuses_another_runs_setup_or_key():
    proto = CKKSMPProtocol(K)
    half = proto.client_half(1, proto.setup.to_bytes())
    with pytest.raises(ConfigurationError, match="identity key is not the one the run manifest lists"):
        half.use_manifest(proto.manifest, SigningKey())
    other = Manifest.from_dict({**proto.manifest.to_dict(), "nonce": "00" * 16})
    with pytest.raises(ConfigurationError, match="run id differs"):
        half.use_manifest(other, proto.clients[1].signing)
