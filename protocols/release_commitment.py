r"""A commitment to a sum released as different rows to different recipients, and each recipient's proof.

FedGCN's pre-training exchange sends each client other blocks of one summed matrix, so the
clients cannot compare what they received as they compare a broadcast (:mod:`protocols.broadcast_view`).
The server instead commits to the whole released sum, a Merkle tree whose leaf ``b`` is block
``b`` of the plan (``B = plan.num_blocks`` leaves, a block nobody receives hashing to the empty leaf):

.. math::

    \ell_b = \mathrm{SHA\text{-}256}(\mathrm{domain}_\ell \,\|\, b \,\|\, \mathrm{bytes}_b), \qquad
    n = \mathrm{SHA\text{-}256}(\mathrm{domain}_n \,\|\, \mathrm{left} \,\|\, \mathrm{right}), \qquad
    \mathrm{root} = \mathrm{SHA\text{-}256}(\mathrm{domain}_r \,\|\, B \,\|\, \mathrm{top})

(an odd node at the end of a level moves up unchanged).  Each recipient receives with its blocks
the root and the siblings it needs to recompute it from its own leaves (:func:`prove`, level by
level, ascending positions), checks them (:func:`verify`), and chains the root into the digest it
binds into every later contribution (:meth:`~protocols.broadcast_view.BroadcastViews.release`).
The leaf's position is its block id, so the tree holds one leaf per block: two recipients of one
block that verify against one root received the same bytes for it; recipients that were given
different roots are refused in the next sum they share.  Proof size: at most
``32 * m * ceil(log2 B)`` bytes for ``m`` own blocks, fewer when they are neighbours.

``ckks-mp`` key-switches each recipient's blocks to its own key, so no two recipients receive the
same bytes: there leaf ``b`` is :func:`leaf` of the recipients' keyed digest of the values they
decoded (:meth:`protocols.ckks_mp.client.CKKSMPClient._release_digest`), reported with the download
and committed to one stage later.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

LEAF_DOMAIN = b"secure-fgl/release-leaf/v1"
NODE_DOMAIN = b"secure-fgl/release-node/v1"
ROOT_DOMAIN = b"secure-fgl/release-root/v1"
DIGEST_BYTES = 32


def leaf(block: int, data: bytes) -> bytes:
    """``l_b`` of block ``block`` holding ``data`` (its wire bytes and whatever its decoding reads)."""
    return hashlib.sha256(LEAF_DOMAIN + int(block).to_bytes(8, "big") + data).digest()


def block_leaf(block: int, wire: bytes, contributors: Iterable[int]) -> bytes:
    """A released block's leaf: its wire bytes and the sorted contributors its decoding removes masks of."""
    members = sorted(int(k) for k in contributors)
    return leaf(block, len(wire).to_bytes(8, "big") + wire + b"".join(k.to_bytes(4, "big") for k in members))


def empty_leaf(block: int) -> bytes:
    """The leaf of a block the exchange releases to nobody."""
    return leaf(block, b"")


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_DOMAIN + left + right).digest()


def _root(top: bytes, num_leaves: int) -> bytes:
    return hashlib.sha256(ROOT_DOMAIN + int(num_leaves).to_bytes(8, "big") + top).digest()


def tree(leaves: list[bytes]) -> list[list[bytes]]:
    """Every level of the tree, leaves first."""
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        low = levels[-1]
        levels.append([_node(low[i], low[i + 1]) if i + 1 < len(low) else low[i] for i in range(0, len(low), 2)])
    return levels


def root_of(levels: list[list[bytes]]) -> bytes:
    """The root of the tree :func:`tree` built."""
    return _root(levels[-1][0], len(levels[0]))


def prove(levels: list[list[bytes]], positions: Iterable[int]) -> bytes:
    """The siblings recipient of leaves ``positions`` needs, concatenated in :func:`verify`'s order."""
    known, out = set(int(p) for p in positions), []
    for level in levels[:-1]:
        for p in sorted(known):
            sib = p ^ 1
            if sib < len(level) and sib not in known:
                out.append(level[sib])
        known = {p // 2 for p in known}
    return b"".join(out)


def verify(root: bytes, num_leaves: int, own: dict[int, bytes], proof: bytes) -> bool:
    """Whether leaves ``own`` (position -> leaf) and ``proof`` recompute ``root`` over ``num_leaves`` leaves."""
    if not own or len(proof) % DIGEST_BYTES or any(not 0 <= p < num_leaves for p in own):
        return False
    siblings = [proof[i : i + DIGEST_BYTES] for i in range(0, len(proof), DIGEST_BYTES)]
    known, width, used = dict(own), int(num_leaves), 0
    while width > 1:
        up = {}
        for p in sorted(known):
            if p // 2 in up:
                continue
            sib = p ^ 1
            if sib >= width:
                up[p // 2] = known[p]
                continue
            if sib in known:
                other = known[sib]
            elif used < len(siblings):
                other, used = siblings[used], used + 1
            else:
                return False
            up[p // 2] = _node(known[p], other) if p % 2 == 0 else _node(other, known[p])
        known, width = up, (width + 1) // 2
    return used == len(siblings) and _root(known[0], num_leaves) == root
