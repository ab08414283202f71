"""The client half of ``ckks-mp``: what one client holds and computes.

A :class:`MPClient` holds its collective-key share ``s_i`` and its own recipient key pair
``s_R`` — both secret, both sampled from the OS CSPRNG, neither ever serialized — and the
clients' common broadcast secret ``s_B`` (made by client 0, sent to each other client over
the encrypted client-to-client channel, so the relaying server never holds it).  In a
t-out-of-n run it also holds one Shamir share of every client's ``s_i`` (:mod:`.threshold`).  It
encrypts its contribution under its own share ``s_i`` with public per-ciphertext ``c1``
(:mod:`.encryption`), computes its key-switching shares for every recipient and for the broadcast key
(:mod:`.keyswitch`), and, as a recipient, decrypts what was switched to its key.  It
lives inside the client half (:mod:`.client`); the server half (:mod:`.server`) only ever sees
the bytes these methods return.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from . import encoding, encryption, keyswitch
from .keys import KeyPair, key_pair, secret_key
from .params import MPParams, Plan
from .ring import RNSRing
from .threshold import lagrange_coefficient, share_secret

#: a ciphertext's name: (exchange, block, piece)
Label = tuple[int, int, int]


class MPClient:
    """One client: key shares, encryption, PCKS shares, decryption of its own deliveries."""

    def __init__(self, client: int, ring: RNSRing, params: MPParams, a_hat: np.ndarray):
        self.client = client
        self.ring, self.params, self.a_hat = ring, params, a_hat
        self._share: np.ndarray = secret_key(ring, a_hat.shape[0])  # s_i: collective-key share
        self._own: KeyPair = key_pair(ring, a_hat, params.eta)  # s_R: recipient key
        self._broadcast: KeyPair | None = None  # s_B: every client's, the server's never
        #: t-out-of-n: dealer i -> this client's Shamir share sigma_{i,me} of s_i (NTT form)
        self._dealt: dict[int, np.ndarray] = {}
        #: ``s_i c1`` of this exchange's uploads, and ``s_B c1`` of its switch to the broadcast key, by label (uint32)
        self._uploaded: dict[Label, np.ndarray] = {}
        self._broadcast_products: dict[Label, np.ndarray] = {}

    # ------------------------------------------------------------------ public keys
    @property
    def recipient_public_key(self) -> bytes:
        """``p_R = -a s_R + e_R`` (NTT form) on the wire."""
        return encryption.to_bytes(self._own.p_hat)

    # ------------------------------------------------------------------ broadcast key
    def make_broadcast_key(self) -> bytes:
        """Dealer (client 0): sample ``s_B`` and return the broadcast public key ``p_B``."""
        self._broadcast = key_pair(self.ring, self.a_hat, self.params.eta)
        return encryption.to_bytes(self._broadcast.p_hat)

    def broadcast_secret(self) -> bytes:
        """Dealer: ``s_B`` as ``N`` signed bytes in {-1, 0, 1} (sent only over the encrypted channel)."""
        coeffs: np.ndarray = self.ring.intt(cast(KeyPair, self._broadcast).s_hat)[0]
        q0 = self.ring.primes[0]
        return np.where(coeffs > q0 // 2, coeffs - q0, coeffs).astype(np.int8).tobytes()

    def adopt_broadcast_key(self, secret: bytes, p_b_hat: np.ndarray) -> None:
        """Keep the dealt broadcast secret ``s_B`` after checking it against ``p_B``.

        Keep the dealt ``s_B`` after checking it is the secret of ``p_B``: ``p_B + a s_B`` must be
        an error within ``eta`` (ValueError otherwise: a wrong or corrupted key).
        """
        s = np.frombuffer(bytes(secret), dtype=np.int8).astype(np.int64)
        if s.size != self.ring.n or np.abs(s).max() > 1:
            raise ValueError(f"the broadcast secret must be {self.ring.n} coefficients in {{-1, 0, 1}}")
        level = self.a_hat.shape[0]
        s_hat = self.ring.ntt(self.ring.from_signed(s, level))
        e = self.ring.intt(self.ring.add(p_b_hat, self.ring.mul(self.a_hat, s_hat)))
        q0 = self.ring.primes[0]
        e0 = np.where(e[0] > q0 // 2, e[0] - q0, e[0])
        if np.abs(e0).max() > self.params.eta or not np.array_equal(self.ring.from_signed(e0, level), e):
            raise ValueError("the broadcast secret does not match the broadcast public key")
        self._broadcast = KeyPair(s_hat, p_b_hat)

    @property
    def broadcast_pk(self) -> np.ndarray:
        """This client's share p_hat of the collective public key."""
        return cast(KeyPair, self._broadcast).p_hat

    # ------------------------------------------------------------------ threshold shares
    def deal_threshold_shares(self, threshold: int, clients: int) -> dict[int, bytes]:
        """Shamir-share this client's secret ``s_i`` among ``clients`` with threshold ``t``.

        Shamir-share ``s_i`` among ``clients`` with threshold ``t`` (:func:`.threshold.share_secret`);
        keep this client's own share, return every other client's as wire bytes (each is sent only
        over the encrypted client-to-client channel).
        """
        shares = share_secret(self.ring, self._share, threshold, clients)
        self._dealt[self.client] = shares.pop(self.client)
        return {j: encryption.to_bytes(sigma) for j, sigma in shares.items()}

    @property
    def dealers(self) -> frozenset[int]:
        """The clients whose Shamir share this client holds (itself included once it dealt)."""
        return frozenset(self._dealt)

    def adopt_threshold_share(self, dealer: int, sigma_hat: np.ndarray) -> None:
        """Keep ``sigma_{dealer, me}`` (parsed and range-checked by the caller).

        Shares cannot be
        checked here: a dealer dealing inconsistent shares is caught only by the recipients'
        noise bound at decryption, without naming it.
        """
        self._dealt[int(dealer)] = sigma_hat

    def keep_dealers(self, dealers: Sequence[int]) -> None:
        """Drop the Shamir shares of every dealer outside ``dealers`` (clients that did not finish the key set-up)."""
        self._dealt = {d: sigma for d, sigma in self._dealt.items() if d in set(dealers)}

    def threshold_key(self, uploaders: Sequence[int], active: Sequence[int]) -> np.ndarray:
        """This client's threshold share of the uploaders' summed secret keys.

        ``lambda_me^A sum_{i in U} sigma_{i,me}`` (NTT form): summed over the active set ``A`` it
        is ``sum_{i in U} s_i`` exactly.
        """
        total = np.zeros_like(self._share)
        for dealer in uploaders:
            total = self.ring.add(total, self._dealt[int(dealer)])
        lam = lagrange_coefficient(self.ring.primes[: total.shape[0]], active, self.client)
        return self.ring.mul(total, lam)

    # ------------------------------------------------------------------ upload
    def encrypt_blocks(self, plan: Plan, rows: np.ndarray, c1_hat: np.ndarray, labels: list[Label]) -> bytes:
        """Encrypt blocks under this client's secret key share.

        Blocks ``[m, block_len]`` (validated) -> ``m * pieces`` polynomials ``c0`` under ``s_i`` (coefficient
        form), with the public ``c1_hat`` ``[m * pieces, L, N]`` of this exchange's pieces, named by ``labels``
        (one per ciphertext: exchange, block, piece).  ``s_i c1`` is kept under those labels for this client's
        key switch of the same exchange (:meth:`cks_shares`, :meth:`pcks_shares`).
        """
        per_ct = plan.capacity
        pieces = [row[a : a + per_ct] for row in rows for a in range(0, rows.shape[1], per_ct)]
        if not pieces:
            return b""
        plain = np.stack([encoding.encode(self.ring, plan, encoding.quantize(p, plan)) for p in pieces])
        s_c1 = encryption.key_product(self.ring, self._share, c1_hat)
        self._uploaded = dict(zip(labels, s_c1.astype(np.uint32)))  # residues below 2^32: half the memory
        return encryption.to_bytes(encryption.encrypt(self.ring, s_c1, plain, self.params.eta))

    # ------------------------------------------------------------------ key switching
    def _switch_products(
        self,
        c1_hat: np.ndarray,
        labels: list[Label],
        keyed: np.ndarray,
        threshold: tuple[list[tuple[int, ...]], Sequence[int]] | None,
    ) -> np.ndarray:
        """This client's key times each ciphertext's ``c1`` (coefficient form ``[B, L, N]``).

        n-out-of-n: ``s_i c1`` for the ``keyed`` ciphertexts (those of blocks this client uploaded; kept from
        its upload where the label matches, else computed), 0 for the rest; t-out-of-n: each ciphertext's
        :meth:`threshold_key` times its ``c1``.  The kept products serve every group of the exchange's key switch
        and are dropped after it (:meth:`forget_upload`).
        """
        kept = self._uploaded
        if threshold is not None:
            uploaders, active = threshold
            keys = {u: self.threshold_key(u, active) for u in sorted(set(uploaders))}
            key = keys[uploaders[0]] if len(keys) == 1 else np.stack([keys[u] for u in uploaders])
            return encryption.key_product(self.ring, key, c1_hat)
        out = np.zeros(c1_hat.shape, dtype=np.int64)
        missing = [i for i, (label, k) in enumerate(zip(labels, keyed)) if k and label not in kept]
        if missing:
            out[missing] = encryption.key_product(self.ring, self._share, c1_hat[missing])
        for i, (label, k) in enumerate(zip(labels, keyed)):
            if k and label in kept:
                out[i] = kept[label]
        return out

    def forget_upload(self) -> None:
        """Drop the ``s_i c1`` products kept from this client's upload (its key switch of the exchange is done)."""
        self._uploaded = {}

    def pcks_shares(
        self,
        c1_hat: np.ndarray,
        labels: list[Label],
        keyed: np.ndarray,
        mask: np.ndarray,
        recipient_pk: np.ndarray,
        smudge_bits: int,
        switch_level: int,
        threshold: tuple[list[tuple[int, ...]], Sequence[int]] | None = None,
    ) -> bytes:
        """This client's key-switching shares towards ``recipient_pk``, switched down to ``switch_level``.

        Shares ``(h0_i, h1_i)`` (:func:`.keyswitch.pcks_share`) switching the ciphertexts with ``c1_hat``
        ``[B, L, N]`` and ``labels``, masked by ``mask``, to ``recipient_pk``; ``keyed`` and ``threshold`` as in
        :meth:`_switch_products` (the uploaders of each ciphertext and the active set, t-out-of-n).
        """
        share = keyswitch.pcks_share(
            self.ring,
            self._switch_products(c1_hat, labels, keyed, threshold),
            mask,
            recipient_pk,
            self.a_hat,
            self.params.eta,
            smudge_bits,
            switch_level,
        )
        return encryption.to_bytes(share)

    def cks_shares(
        self,
        c1_hat: np.ndarray,
        labels: list[Label],
        keyed: np.ndarray,
        mask: np.ndarray,
        smudge_bits: int,
        switch_level: int,
        designated: bool,
        threshold: tuple[list[tuple[int, ...]], Sequence[int]] | None = None,
    ) -> bytes:
        """This client's shares switching ciphertexts to the broadcast key, switched down to ``switch_level``.

        One polynomial ``h_i`` per ciphertext (:func:`.keyswitch.cks_share`) for the public ``c1_hat``
        ``[B, L, N]``; ``keyed`` and ``threshold`` as in :meth:`_switch_products`; ``designated``: this client
        also subtracts ``s_B c1`` (kept for its own download, :meth:`decrypt_broadcast`).
        """
        s_b_c1 = None
        if designated:
            s_b_c1 = encryption.key_product(self.ring, cast(KeyPair, self._broadcast).s_hat, c1_hat)
            exchange = labels[0][0] if labels else None  # the exchange's batches add up; an older one's go
            kept = {label: p for label, p in self._broadcast_products.items() if label[0] == exchange}
            self._broadcast_products = {**kept, **dict(zip(labels, s_b_c1.astype(np.uint32)))}
        share = keyswitch.cks_share(
            self.ring, self._switch_products(c1_hat, labels, keyed, threshold), mask, smudge_bits, switch_level, s_b_c1
        )
        return encryption.to_bytes(share)

    # ------------------------------------------------------------------ download
    def decrypt_delivery(
        self, plan: Plan, ct_hat: np.ndarray, lengths: list[int]
    ) -> list[tuple[np.ndarray, int, bool]]:
        """Decrypt ciphertexts switched to this client's recipient key.

        Decrypt key-switched ciphertexts ``[B, 2, L', N]`` (switched down, coefficient form) with
        ``s_R``; per ciphertext ``(summed fields, max residual, in range)`` (:func:`.encoding.decode`).
        """
        plain = encryption.decrypt_switched(self.ring, self._own.s_hat, ct_hat)
        return [encoding.decode(self.ring, plan, p, n) for p, n in zip(plain, lengths)]

    def decrypt_broadcast(
        self, plan: Plan, c0: np.ndarray, labels: list[Label], c1_of: Callable[[], np.ndarray], lengths: list[int]
    ) -> list[tuple[np.ndarray, int, bool]]:
        """Decrypt broadcast downloads ``c0'`` ``[B, L', N]`` with ``s_B`` and the public ``c1``.

        ``s_B c1`` is the one this client kept from its key switch under ``labels``, else computed from
        ``c1_of()`` ``[B, L, N]``.  Per ciphertext ``(summed fields, max residual, in range)``
        (:func:`.encoding.decode`).
        """
        kept, self._broadcast_products = self._broadcast_products, {}
        if all(label in kept for label in labels):
            s_b_c1 = np.stack([kept[label] for label in labels]).astype(np.int64)
        else:
            s_b_c1 = encryption.key_product(self.ring, cast(KeyPair, self._broadcast).s_hat, c1_of())
        plain = encryption.decrypt_broadcast(self.ring, c0, s_b_c1)
        return [encoding.decode(self.ring, plan, p, n) for p, n in zip(plain, lengths)]
