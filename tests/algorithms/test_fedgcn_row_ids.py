"""FedGCN's row ids travel between clients over the encrypted channel: the server relays ciphertext only."""

from __future__ import annotations

import numpy as np
import pytest
from support.runs import small

from protocols import SERVER
from protocols.errors import IntegrityError
from secure_fgl.algorithms.fedgcn.ops import IDS_TAG
from secure_fgl.experiment import load_federation
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor


class FrameLog(LocalExecutor):
    """Keeps every frame handed to and returned from the runtimes; ``tamper`` may change a request."""

    tamper = None

    def _call(self, method, requests):
        if self.tamper is not None:
            requests = self.tamper(method, requests)
        responses, lost = super()._call(method, requests)
        self.frames = getattr(self, "frames", []) + list(requests.values()) + list(responses.values())
        return responses, lost


def _pretrain(executor):
    options = {"row_order": "signature"}
    cfg = small("fedgcn", "plain", executor="local", options=options).validate()
    fed = load_federation(cfg)
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, options, executor)
    strategy.setup()
    return protocol


def test_relayed_row_ids_are_ciphertext_not_the_plaintext_ids():
    executor = FrameLog()
    protocol = _pretrain(executor)
    logic = {k: rt.logic for k, rt in executor.runtimes.items()}
    checked = 0
    for k, owner in logic.items():
        gids = owner.data.global_ids.cpu().numpy()
        for j, receiver in logic.items():
            hit = np.flatnonzero((owner.signatures >> j) & 1)
            if j == k or hit.size < 3:
                continue
            # the receiver knows the owner's row ids of the nodes it touches (delivered, decrypted) ...
            assert all(receiver.row_of[int(g)] == owner.row_of[int(g)] for g in gids[hit])
            # ... and neither the ids nor the pairs appear in any frame that crossed the driver
            pairs = np.stack([gids[hit], [owner.row_of[int(g)] for g in gids[hit]]], axis=1).astype("<i8")
            for probe in (gids[hit].astype("<i8").tobytes(), pairs[:, 1].tobytes(), pairs.tobytes()):
                assert not any(probe in frame for frame in executor.frames)
            checked += 1
    assert checked >= 2
    relayed = protocol.transcript.select(tag=IDS_TAG)
    assert relayed and all(m.kind == "ciphertext" and m.relay == SERVER and m.sender != SERVER for m in relayed)


def test_a_row_id_ciphertext_changed_in_relay_is_refused():
    def flip(method, requests):
        from secure_fgl.runtime import wire

        out = {}
        for k, frame in requests.items():
            req = wire.unpack(frame) if method == "receive" else None
            if req is not None and req.get("tag") == IDS_TAG and req["sealed"].size:
                req["sealed"][-1] ^= 1
                frame = wire.pack(req)
            out[k] = frame
        return out

    executor = FrameLog()
    executor.tamper = flip
    with pytest.raises(IntegrityError, match="does not authenticate"):
        _pretrain(executor)
