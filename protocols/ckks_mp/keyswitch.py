"""Collective key switching of an aggregate: to a recipient's public key (PCKS) or to the broadcast key (CKS).

Public-key switching (PCKS; Mouchet et al. 2021, Protocol 5 "PubKeySwitch"), for a block one recipient receives.

A ciphertext ``(c0, c1)`` under the secret ``s_S = sum_{i in S} s_i`` of a block's contributors
is re-encrypted to a recipient's public key ``(p_R = -a s_R + e_R, a)`` without anyone decrypting
it.  Client i (every client of the run) sends

    ``h0_i = [i in S] s_i c1 + z_i + p_R u_i + e0_i``,   ``h1_i = a u_i + e1_i``,

with ``c1`` the public ``a_{x,b,j}`` the client recomputes itself (:func:`.sampling.upload_c1`),
``z_i`` its zero-sum pairwise mask (:func:`.sampling.pairwise_mask`; ``sum_i z_i = 0``), ``u_i``
ternary, ``e1_i`` centered binomial, and ``e0_i`` the **smudging noise**, uniform in
``[-2^b, 2^b)`` (:func:`.params.smudging_bits`).  The server adds all K shares and outputs

    ``(c0 + sum_i h0_i, sum_i h1_i)``,

which decrypts under ``s_R`` to ``c0 + s_S c1 + sum_i (e_R u_i + e0_i + s_R e1_i)``.  Each share
is an RLWE encryption under ``p_R`` (masked by ``p_R u_i``), so the server learns nothing; a
recipient colluding with the server reads ``s_i c1 + z_i + noise`` per client, where the uniform
``z_i`` hides ``s_i c1`` (which would open client i's upload ``c0_i``) and only the sum is
meaningful.  A missing share leaves ``s_i c1 + z_i`` uncancelled (the result is uniform), hence
n-out-of-n.  Shares travel switched down to the plan's level ``L'`` (:mod:`.params`), and the mask is added
after the switch-down: ``h0_i = round((s_i c1 + p_R u_i + e0_i) / P) + z_i`` with ``z_i`` uniform in ``R_{Q_L'}``,
which hides the share as before and cancels exactly in the sum (``L'`` primes to expand, not ``L``).
t-out-of-n (:mod:`.threshold`): only the ``t`` clients of the active set ``A`` send
shares, each with ``lambda_j^A sum_{i in U} sigma_{i,j}`` in place of ``s_i`` (``U``: the block's
uploaders) and its mask over ``A``; the noise terms are added after that product, unchanged.

Collective key switching to the broadcast key (CKS; Mouchet et al. 2021, "KeySwitch"), for a block every
client receives.  Every client holds the broadcast secret ``s_B`` and the public ``c1``, so the target needs
no public key and no fresh ``c1``: client i sends the single polynomial

    ``h_i = [i in S] s_i c1 - [i = d] s_B c1 + z_i + e0_i``

(``d``: the lowest-numbered client answering the key switch), and the server outputs only

    ``c0' = c0 + sum_i h_i = Delta m - s_B c1 + e + sum_i e0_i``,

an encryption of the sum under ``s_B`` with the public ``c1``, which every recipient recomputes:
``c0' + s_B c1 = Delta m + e + sum_i e0_i``.  The noise is the upload errors plus the smudging, without
PCKS's ``e_R u_i + s_R e1_i`` terms.  What the server holds, ``c0'`` and ``sum_i h_i = (s_S - s_B) c1 + sum_i
e0_i``, are RLWE samples under ``s_B`` and ``s_S - s_B`` with a fresh uniform ``c1`` and errors at least as wide
as one honest client's smudging noise (an RLWE error far wider than the standard's, at the same ``N`` and
``Q``), and each single share is hidden by its uniform mask ``z_i`` as in PCKS.  Every client may decrypt
the result, so a block goes to the broadcast key only where every client may read it (:func:`broadcast_blocks`).

The switch is chosen per block: one exchange may send its blocks every client receives to the broadcast key (one CKS
share per client for all of them) and each recipient's other blocks to its own key (PCKS, one share per client and
recipient).  A client answers only the switch the plan it checked names for each block (:mod:`.client`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .ring import RNSRing
from .sampling import LIMB_BITS, centered_binomial, smudging_limbs, ternary


def broadcast_blocks(
    requests: Mapping[int, np.ndarray], num_blocks: int, num_clients: int, public_to_all: bool
) -> np.ndarray:
    """The blocks of an exchange switched to the broadcast key (CKS), sorted; every other requested block: PCKS.

    Block ``b`` goes to the broadcast key when every recipient receives it and either every client of the run is a
    recipient or ``public_to_all`` (the public schedule makes the sum a broadcast every client trains on); each
    recipient's other blocks are switched to its own key.  Every client holds ``s_B`` and may read a CKS result, so a
    block goes to the broadcast key only where every client may read it: a client absent from a broadcast (a
    dropout) was meant to receive it and holds ``s_B`` anyway.
    """
    none = np.zeros(0, dtype=np.int64)
    if not requests or not (public_to_all or sorted(int(r) for r in requests) == list(range(num_clients))):
        return none
    received = np.zeros(num_blocks, dtype=np.int64)
    for bids in requests.values():
        received[np.unique(np.asarray(bids, dtype=np.int64))] += 1
    return np.flatnonzero(received == len(requests)).astype(np.int64)


def planned_broadcast_blocks(encoding: Mapping[str, object], num_blocks: int) -> np.ndarray:
    """The plan's blocks switched to the broadcast key (its ``broadcast_blocks``; none when absent), checked.

    Raises:
        ValueError: not distinct sorted block ids of the exchange.
    """
    try:
        blocks = np.asarray(encoding.get("broadcast_blocks", ()), dtype=np.int64).ravel()
    except (TypeError, ValueError) as e:
        raise ValueError(f"malformed broadcast blocks ({e})") from None
    if blocks.size and (blocks[0] < 0 or blocks[-1] >= num_blocks or (np.diff(blocks) <= 0).any()):
        raise ValueError(f"broadcast blocks {blocks[:8].tolist()}: distinct sorted blocks of 0..{num_blocks - 1}")
    return blocks


def pcks_share(
    ring: RNSRing,
    s_c1: np.ndarray,
    mask: np.ndarray,
    p_r_hat: np.ndarray,
    a_hat: np.ndarray,
    eta: int,
    smudge_bits: int,
    switch_level: int,
) -> np.ndarray:
    """Client i's public-key switching share, switched down to ``switch_level``.

    Client i's share ``[B, 2, L', N]`` in coefficient form from ``s_c1`` ``[B, L, N]``, its key times each
    ciphertext's ``c1`` in coefficient form (:func:`.encryption.key_product`; zero rows for blocks client i
    did not upload), and its masks ``mask`` ``[B, L', N]`` (uniform residues at the switch level ``L'``, added after
    the switch-down: ``h0_i = round((p_R u_i + s_i c1 + e0_i) / P) + z_i``, so they cancel exactly in the sum).
    """
    batch, level = s_c1.shape[0], s_c1.shape[1]
    u_hat = ring.ntt(ring.from_signed(ternary((batch, ring.n)), level))
    e0 = ring.from_limbs(smudging_limbs((batch, ring.n), smudge_bits), LIMB_BITS, smudge_bits, level)
    e1 = ring.from_signed(centered_binomial((batch, ring.n), eta), level)
    h = ring.intt(np.stack([ring.mul(p_r_hat[:level], u_hat), ring.mul(a_hat[:level], u_hat)], axis=1))
    h = ring.rescale(np.stack([ring.add(ring.add(h[:, 0], s_c1), e0), ring.add(h[:, 1], e1)], axis=1), switch_level)
    h[:, 0] += mask
    return ring.reduce(h)


def combine_shares(ring: RNSRing, c0: np.ndarray, shares: list[np.ndarray]) -> np.ndarray:
    """Server side: combine the clients' key-switching shares with the aggregate ciphertext.

    Server side: ``(c0 + sum h0_i, sum h1_i)`` ``[B, 2, L', N]`` in coefficient form, from the
    aggregate ``c0`` ``[B, L, N]`` (coefficient form, switched down here) and the clients' shares, each
    switched down to ``L'`` by its sender (:meth:`.ring.RNSRing.rescale`).
    """
    h = np.zeros(shares[0].shape, dtype=np.int64)
    h[:, 0] = ring.rescale(c0, shares[0].shape[-2])
    for share in shares:  # K < 2^32 residues below 2^31 each: one reduction at the end
        h += share
    return ring.reduce(h)


def cks_share(
    ring: RNSRing,
    s_c1: np.ndarray,
    mask: np.ndarray,
    smudge_bits: int,
    switch_level: int,
    s_b_c1: np.ndarray | None = None,
) -> np.ndarray:
    """Client i's collective key-switching share to the broadcast key, switched down to ``switch_level``.

    ``h_i = round((s_i c1 + e0_i) / P) + z_i`` ``[B, L', N]`` in coefficient form (one polynomial per ciphertext),
    from ``s_c1`` and ``mask`` as in :func:`pcks_share`: no transform.  ``s_b_c1``: ``s_B c1`` in coefficient form,
    for the one client ``d`` that also subtracts it before the switch-down (module docstring).
    """
    batch, level = s_c1.shape[0], s_c1.shape[1]
    q = ring.q[:level]
    out = np.empty(mask.shape, dtype=np.int64)
    for rows in ring.batches(batch, level):  # s c1 + e0 (+ q - s_B c1): below 3q, one reduction
        h = s_c1[rows] + ring.from_limbs(
            smudging_limbs((rows.stop - rows.start, ring.n), smudge_bits), LIMB_BITS, smudge_bits, level
        )
        if s_b_c1 is not None:
            h += q - s_b_c1[rows]
        h = ring.rescale(ring.reduce(h), switch_level)
        h += mask[rows]
        out[rows] = ring.reduce(h)
    return out


def combine_broadcast(ring: RNSRing, c0: np.ndarray, shares: list[np.ndarray]) -> np.ndarray:
    """Server side: ``c0' = c0 + sum_i h_i`` ``[B, L', N]`` in coefficient form (the ``c1`` stays public).

    From the aggregate ``c0`` ``[B, L, N]`` (coefficient form, switched down here) and the clients' CKS shares,
    each switched down to ``L'`` by its sender.
    """
    h = ring.rescale(c0, shares[0].shape[-2])
    for share in shares:  # K < 2^32 residues below 2^31 each: one reduction at the end
        h += share
    return ring.reduce(h)
