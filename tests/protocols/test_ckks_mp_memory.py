"""The ckks-mp server lets go of an exchange's key-switching shares before it sends the downloads.

Every client sends one share per (recipient, block) switched to a recipient's key, so the shares of a
scoped exchange are K times the sums the server sends back; holding them through the download stage
multiplies the server's peak memory.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from protocols import ValueSpec
from protocols.ckks_mp.backend import CKKSMPProtocol
from protocols.ckks_mp.server import CKKSMPServer
from protocols.transcript import Transcript

K = 3
COUNTS = ValueSpec(integer=True, max_abs=1, sum_max=K)


class Metered(CKKSMPServer):
    """The honest server, noting the traced memory once the shares arrived and when the downloads leave."""

    share_bytes = at_shares = at_download = 0

    def call(self, link, stage, messages, **kw):
        if stage == "download":
            self.at_download = tracemalloc.get_traced_memory()[0]
        got = super().call(link, stage, messages, **kw)
        if stage == "keyswitch":
            self.share_bytes = sum(len(m.payload) for msgs in got.values() for m in msgs if m.kind == "share")
            self.at_shares = tracemalloc.get_traced_memory()[0]
        return got


def test_shares_are_released_before_the_downloads():
    # a run without attacks keeps no payloads (runtime.build.run_transcript): nothing else holds the shares
    p = type("Metered", (CKKSMPProtocol,), {"server_half": Metered})(K, transcript=Transcript(keep_payloads="none"))
    blocks = 4 * K  # four blocks per client, each read by its owner alone: every share is a PCKS share
    rpb = p.rows_per_block(COUNTS, 2, 10**7)
    rows = np.arange(blocks) * rpb
    tracemalloc.start()
    try:
        out = p.row_sum(
            "scoped",
            0,
            {c: (rows, np.ones((blocks, 2))) for c in range(K)},
            {c: rows[4 * c : 4 * c + 4] for c in range(K)},
            blocks * rpb,
            layout="sparse",
            spec=COUNTS,
        )
    finally:
        tracemalloc.stop()
    server = p.server
    assert all(np.array_equal(out[c], np.full((4, 2), K)) for c in range(K))
    assert server.share_bytes > 0
    # the shares (K per switched sum) are gone; what remains is at most the sums themselves
    assert server.at_download < server.at_shares - server.share_bytes / 2


def test_upload_key_products_serve_every_group_and_go_with_the_key_switch():
    # blocks read by two recipients each: every client answers several per-recipient groups from one upload
    p = CKKSMPProtocol(K, transcript=Transcript(keep_payloads="none"))
    rpb = p.rows_per_block(COUNTS, 2, 10**7)
    rows = np.arange(K) * rpb
    requests = {c: np.sort(rows[[c, (c + 1) % K]]) for c in range(K)}
    out = p.row_sum(
        "shared", 0, {c: (rows, np.ones((K, 2))) for c in range(K)}, requests, K * rpb, layout="sparse", spec=COUNTS
    )
    assert all(np.array_equal(out[c], np.full((2, 2), K)) for c in range(K))
    assert all(not half.keys._uploaded for half in p.clients.values())  # dropped once the key switch ended
