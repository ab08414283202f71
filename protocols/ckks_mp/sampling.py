"""Randomness of the multiparty scheme: secret samplers and the common reference polynomial.

Secret randomness (key shares ``s_i``, encryption randomness ``u``, errors ``e``, smudging
noise) is read from the operating system's CSPRNG (``os.urandom``); numpy's generators are
never used for it (they are not cryptographic and the run seed would fix them).

* :func:`ternary` — uniform over ``{-1, 0, 1}`` (secret and ephemeral keys; the HE standard's
  ternary-secret table applies).
* :func:`centered_binomial` — ``sum_{i<eta} (b_i - b'_i)`` with fair bits: mean 0, variance
  ``eta / 2``, support ``[-eta, eta]``.  ``eta = 21`` gives standard deviation 3.24, at least
  the HE standard's error width 3.19, and a hard bound |e| <= 21 that makes every noise
  bound of :mod:`.params` a worst-case bound, not a tail estimate.
* :func:`smudging_limbs` — uniform integers in ``[-2^b, 2^b)`` as 30-bit limbs (``b`` ~ 80
  exceeds int64; :meth:`RNSRing.from_limbs` carries them into RNS).

The common random polynomial ``a`` (Mouchet et al. 2021, "CRS") is public: it is expanded
from the run's public seed (:func:`crs_seed`, a hash of the run id) by AES-256-CTR
(:func:`protocols.mask.prg.keystream`), read as 31-bit words with rejection above each prime,
so every party derives the same ``a`` and nothing secret depends on the seed.  The same
expansion under other labels gives each uploaded ciphertext its own public ``c1``
(:func:`upload_c1`) and each pair of clients its zero-sum key-switching mask
(:func:`pairwise_mask`, from the pair's secret seed).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import numpy as np

from ..mask.prg import keystream

LIMB_BITS = 30
#: words read beyond N per prime of a common polynomial, for the rejections (each word: probability < 2^-10)
_SPARE_WORDS = 64


def ternary(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform ``{-1, 0, 1}`` int64 array (rejection of the byte 255 keeps it exactly uniform)."""
    count = int(np.prod(shape))
    out = np.empty(0, dtype=np.int64)
    while out.size < count:
        raw = np.frombuffer(os.urandom(count - out.size + 64), dtype=np.uint8)
        raw = raw[raw < 255]
        out = np.concatenate([out, raw.astype(np.int64) % 3 - 1])
    return out[:count].reshape(shape)


#: popcount of every byte value
_POPCOUNT = np.array([v.bit_count() for v in range(256)], dtype=np.uint8)


def centered_binomial(shape: tuple[int, ...], eta: int) -> np.ndarray:
    """Centered binomial int64 samples with parameter ``eta``.

    Centered binomial int64 array with parameter ``eta`` (|e| <= eta): per value, the popcount
    of ``eta`` fresh bits minus the popcount of ``eta`` others (bytes, the top one masked to the
    bits left, counted with a byte table: no per-bit array).
    """
    count = int(np.prod(shape))
    nbytes = -(-eta // 8)
    raw = np.frombuffer(os.urandom(count * 2 * nbytes), dtype=np.uint8).reshape(count, 2, nbytes).copy()
    raw[:, :, -1] &= (1 << (eta - 8 * (nbytes - 1))) - 1
    ones = _POPCOUNT[raw].sum(axis=2, dtype=np.int64)
    centred: np.ndarray = (ones[:, 0] - ones[:, 1]).reshape(shape)
    return centred


def smudging_limbs(shape: tuple[int, ...], bits: int) -> np.ndarray:
    """Limbs of a uniform smudging integer.

    Limbs ``[ceil((bits+1)/30), *shape]`` of a uniform integer in ``[0, 2^(bits+1))``;
    subtracting ``2^bits`` (done in RNS) makes it uniform in ``[-2^bits, 2^bits)``.
    """
    total = bits + 1
    nl = -(-total // LIMB_BITS)
    count = int(np.prod(shape))
    raw = np.frombuffer(os.urandom(nl * count * 4), dtype=np.uint32).astype(np.int64).reshape((nl,) + tuple(shape))
    limbs = raw & ((1 << LIMB_BITS) - 1)
    top = total - LIMB_BITS * (nl - 1)
    limbs[-1] &= (1 << top) - 1
    return limbs


def common_polynomial(seed: bytes, primes: tuple[int, ...], n: int, label: str = "a") -> np.ndarray:
    """The public uniform polynomial ``a`` in ``R_Q`` (NTT form) expanded from ``seed``.

    Uniform residues are uniform in NTT form too (the NTT is a bijection), so the words
    are read directly as NTT-domain values: one AES-CTR stream of 31-bit words, ``N + 64`` per
    prime, each prime's row keeping its first ``N`` words below ``q_j`` (rejection sampling; a row
    short of ``N`` -- probability below ``2^-160`` -- reads on in a stream of its own).
    """
    key = hashlib.sha256(b"secure_fgl/ckks-mp/crs/v2" + label.encode() + seed).digest()
    width = n + _SPARE_WORDS
    words = np.frombuffer(keystream(key, bytes(8), 0, len(primes) * width * 4), dtype="<u4").reshape(len(primes), width)
    words = (words & np.uint32((1 << 31) - 1)).astype(np.int64)
    out = np.empty((len(primes), n), dtype=np.int64)
    for j, q in enumerate(primes):
        row = words[j]
        kept = row[row < q]
        offset, sid = 0, (j + 1).to_bytes(8, "big")
        while kept.size < n:
            more = np.frombuffer(keystream(key, sid, offset, 4 * n), dtype="<u4").astype(np.int64) & ((1 << 31) - 1)
            offset += 4 * n
            kept = np.concatenate([kept, more[more < q]])
        out[j] = kept[:n]
    return out


def crs_seed(run_id: bytes) -> bytes:
    """The run's public CRS seed: a hash of its run id.

    The one accessor every party uses; the server cannot choose it.
    """
    return hashlib.sha256(b"secure_fgl/ckks-mp/crs-seed/v1" + bytes(run_id)).digest()


def upload_c1(
    seed: bytes, session: bytes, exchange: int, blocks: Sequence[int], pieces: int, primes: tuple[int, ...], n: int
) -> np.ndarray:
    """The public ``c1`` of every piece of the uploaded blocks, expanded from the CRS seed.

    The public ``c1 = a_{x,b,j}`` of piece ``j`` of block ``b`` in exchange ``x``, ``[len(blocks) *
    pieces, L, N]`` (NTT form), expanded from the CRS seed: every client encrypts its piece under
    its own key share with it and recomputes it when asked to key-switch the sum.  The label binds
    session, exchange, block and piece, so no two ciphertexts of a run share a ``c1``.
    """
    out = np.empty((len(blocks) * pieces, len(primes), n), dtype=np.int64)
    for i, b in enumerate(blocks):
        for j in range(pieces):
            label = f"c1/{bytes(session).hex()}/{int(exchange)}/{int(b)}/{j}"
            out[i * pieces + j] = common_polynomial(seed, primes, n, label)
    return out


def pairwise_mask(
    pair_seeds: dict[int, bytes], me: int, labels: list[str], primes: tuple[int, ...], n: int
) -> np.ndarray:
    """Client ``me``'s zero-sum masks, one per label.

    Client ``me``'s zero-sum masks ``z_me = sum_{j > me} PRG(k_{me j}) - sum_{j < me} PRG(k_{j me})``,
    one per label, ``[len(labels), L, N]`` (uniform residues of ``R_Q``, added in coefficient form): over all
    clients the masks of one label cancel exactly, while one client's mask hides its key-switching share from everyone
    who lacks one of its pairwise seeds ``k_{me j}`` (:meth:`protocols.channel.ChannelKey.pair_seed`).
    A label names one key-switched ciphertext (exchange, recipient, block, piece), so the masks cancel
    only in the sum of the shares of that ciphertext, never across blocks or recipients.
    """
    q = np.asarray(primes, dtype=np.int64)[:, None]
    total = np.zeros((len(labels), len(primes), n), dtype=np.int64)
    for c, label in enumerate(labels):  # at most 2^32 peers of 31 bits each: no reduction before the end
        for peer, seed in sorted(pair_seeds.items()):
            if peer > me:
                total[c] += common_polynomial(seed, primes, n, label)
            else:
                total[c] -= common_polynomial(seed, primes, n, label)
        total[c] %= q
    return total
