"""Who holds which CKKS key: the clients' key ring and the server's public context.

Key generation happens on the CLIENT side (docs/design.md, threat model).  Client 0 creates
one CKKS context per parameter chain (:class:`~protocols.ckks.params.ChainParams`) the
run needs and sends

* the **secret context** to every other client (transcript kind ``secret_key``, its real
  serialized size; the bytes are never kept in the transcript), and
* the **public context** to the server (kind ``public_key``): serialized without secret
  key, Galois keys or relinearisation keys.  Aggregation only adds ciphertexts, which
  needs none of them.

The server-side object, :class:`ServerContext`, is built *only* from those public bytes
and checks on construction that it cannot decrypt.

Encryption type: **symmetric** by default.  Every client holds the secret key anyway
(it must decrypt the aggregate), and SEAL's secret-key encryption is faster than
public-key encryption at the same ciphertext size, with smaller fresh noise
(error model in :mod:`protocols.ckks.params`).  With symmetric
encryption the public context carries only the parameters (no public key exists), so
the public bytes are prefixed with a random 16-byte key id drawn by client 0: the
context fingerprint, ``sha256(public bytes)``, then identifies this key pair and not just
the parameter set.  Layout of the public bytes: ``MAGIC | key id | length | TenSEAL
public context | zero padding`` to a size fixed by the chain (256 B symmetric; the
uncompressed public-key size asymmetric); the secret context is likewise sent padded
to the uncompressed secret-key size, so key-exchange sizes do not vary run to run.  ``encryption='asymmetric'`` (the public key goes to the server,
which could then encrypt) is available and is what the FedGraph-style reference uses.

Limitation (docs/security.md): with one shared secret key any client could decrypt another
client's upload if it saw it; uploads must travel over authenticated, encrypted
client-server channels (TLS).  Threshold or multi-key HE would remove this.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import tenseal as ts
from tenseal import sealapi  # noqa: F401  (registers SEAL types used by the parameter checks)

from ..errors import ConfigurationError, IntegrityError
from .params import ChainParams, check_security

MAGIC = b"SFGLCKK1"
KEY_ID_BYTES = 16
#: key material is padded to a size fixed by the chain (zstd makes raw sizes vary slightly;
#: padded, every transcript size is a function of public parameters only)
SYMMETRIC_PUBLIC_BYTES = 256


def padded_key_bytes(chain: ChainParams, polys: int) -> int:
    """Upper bound of a serialized key of ``polys`` polynomials over every prime of ``chain``."""
    return polys * chain.poly_modulus_degree * 8 * len(chain.coeff_mod_bit_sizes) + 1024


ENCRYPTION_TYPES = {"symmetric": ts.ENCRYPTION_TYPE.SYMMETRIC, "asymmetric": ts.ENCRYPTION_TYPE.ASYMMETRIC}


def fingerprint_of(public_bytes: bytes) -> str:
    """Context fingerprint: sha256 of the public context bytes (hex)."""
    return hashlib.sha256(public_bytes).hexdigest()


def context_chain(context: ts.Context) -> tuple[int, tuple[int, ...]]:
    """(N, coeff-modulus bit sizes) a TenSEAL context was built with."""
    parms = context.seal_context().data.key_context_data().parms()
    return int(parms.poly_modulus_degree()), tuple(int(m.bit_count()) for m in parms.coeff_modulus())


def make_secret_context(chain: ChainParams, encryption: str) -> ts.Context:
    """A fresh key pair for ``chain`` (client side).  Security-checked before creation."""
    check_security(chain)
    if encryption not in ENCRYPTION_TYPES:
        raise ConfigurationError(f"encryption must be one of {sorted(ENCRYPTION_TYPES)}, got {encryption!r}")
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        chain.poly_modulus_degree,
        coeff_mod_bit_sizes=list(chain.coeff_mod_bit_sizes),
        encryption_type=ENCRYPTION_TYPES[encryption],
        n_threads=1,
    )
    ctx.global_scale = 2.0**20  # unused: every encryption passes the exchange's own scale
    return ctx


@dataclass
class ClientKey:
    """One chain's key material as the clients hold it."""

    chain: ChainParams
    context: ts.Context  # secret context (clients only)
    public_bytes: bytes  # what the server receives
    secret_nbytes: int  # size of the secret context sent to each other client
    fingerprint: str


class ClientKeyRing:
    """Client side: one secret context per chain, created by client 0 on first use.

    In this single-process simulation all clients use client 0's context object; the
    transcript records the secret-context transfer to each of them with its real size.
    """

    def __init__(self, encryption: str = "symmetric"):
        if encryption not in ENCRYPTION_TYPES:
            raise ConfigurationError(f"encryption must be one of {sorted(ENCRYPTION_TYPES)}, got {encryption!r}")
        self.encryption = encryption
        self._keys: dict[str, ClientKey] = {}

    def __contains__(self, chain: ChainParams) -> bool:
        return chain.name in self._keys

    def get(self, chain: ChainParams) -> ClientKey:
        """This client's key for ``chain`` (made earlier by :meth:`create`)."""
        return self._keys[chain.name]

    def by_fingerprint(self, fingerprint: str) -> ClientKey | None:
        """The key whose public context has ``fingerprint`` (the one a message names), if any."""
        return next((k for k in self._keys.values() if k.fingerprint == fingerprint), None)

    def adopt(self, context: ts.Context, fingerprint: str, secret_nbytes: int) -> ClientKey:
        """Adopt a chain's secret context received from client 0.

        A chain's secret context received from client 0 (its fingerprint names the chain's
        public context, which this client does not need).
        """
        n, bits = context_chain(context)
        chain = next(
            (c for c in _known_chains() if (c.poly_modulus_degree, c.coeff_mod_bit_sizes) == (n, bits)), None
        ) or ChainParams(f"n{n}-{'-'.join(map(str, bits))}", n, bits)
        check_security(chain)
        if not context.is_private():
            raise IntegrityError("the relayed context holds no secret key")
        key = ClientKey(chain, context, b"", int(secret_nbytes), fingerprint)
        self._keys[chain.name] = key
        return key

    def create(self, chain: ChainParams) -> ClientKey:
        """Make a fresh CKKS key pair for ``chain`` and its padded public blob (the bytes the server fingerprints).

        The public context carries the public key only in asymmetric mode; it is padded to a fixed size, so its length
        does not depend on the key.

        Raises:
            ConfigurationError: the serialised public context is larger than its padded size.
        """
        ctx = make_secret_context(chain, self.encryption)
        secret = ctx.serialize(
            save_public_key=False, save_secret_key=True, save_galois_keys=False, save_relin_keys=False
        )
        public = ctx.serialize(
            save_public_key=self.encryption == "asymmetric",
            save_secret_key=False,
            save_galois_keys=False,
            save_relin_keys=False,
        )
        size = SYMMETRIC_PUBLIC_BYTES if self.encryption == "symmetric" else padded_key_bytes(chain, 2)
        if len(public) > size:
            raise ConfigurationError(f"public context of {len(public)} bytes exceeds its padded size {size}")
        blob = (
            MAGIC
            + secrets.token_bytes(KEY_ID_BYTES)
            + struct.pack(">I", len(public))
            + public
            + bytes(size - len(public))
        )
        secret_size = max(len(secret), padded_key_bytes(chain, 1))  # sent padded to a fixed size
        key = ClientKey(chain, ctx, blob, secret_size, fingerprint_of(blob))
        self._keys[chain.name] = key
        return key


def _known_chains() -> Iterable[ChainParams]:
    from .params import NAMED_CHAINS

    return NAMED_CHAINS.values()


class ServerContext:
    """Server side: the public context, deserialized from the public bytes and nothing else.

    Raises :class:`IntegrityError` if the bytes are malformed and
    :class:`ConfigurationError` if they hold any secret, Galois or relinearisation key,
    or parameters other than the expected (security-checked) chain.
    """

    def __init__(self, public_bytes: bytes, chain: ChainParams):
        check_security(chain)
        head = len(MAGIC) + KEY_ID_BYTES
        if not isinstance(public_bytes, bytes) or not public_bytes.startswith(MAGIC) or len(public_bytes) <= head + 4:
            raise IntegrityError("public context bytes are malformed (bad header)")
        (n_bytes,) = struct.unpack(">I", public_bytes[head : head + 4])
        try:
            ctx = ts.context_from(public_bytes[head + 4 : head + 4 + n_bytes], n_threads=1)
        except Exception as exc:  # noqa: BLE001 - TenSEAL raises several types
            raise IntegrityError(f"public context bytes do not deserialize: {exc}") from exc
        if ctx.is_private() or ctx.has_secret_key():
            raise ConfigurationError(
                "the server was handed a context holding the secret key; serialize it with save_secret_key=False"
            )
        if ctx.has_galois_keys() or ctx.has_relin_keys():
            raise ConfigurationError(
                "the server's public context must not hold Galois or relinearisation keys: aggregation only adds"
            )
        n, bits = context_chain(ctx)
        if (n, bits) != (chain.poly_modulus_degree, tuple(chain.coeff_mod_bit_sizes)):
            raise ConfigurationError(f"public context has N={n} {list(bits)}, expected {chain.describe()}")
        check_security(ChainParams(chain.name, n, bits))
        self.chain = chain
        self.context = ctx
        self.fingerprint = fingerprint_of(public_bytes)
        data = ctx.seal_context().data
        self.parms_id = list(data.first_parms_id())
