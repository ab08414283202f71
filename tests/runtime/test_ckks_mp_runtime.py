"""Ckks-mp through the client runtimes.

ckks-mp through the client runtimes: each runtime holds its client half and its key
shares; only counted bytes cross; a client silent at the partial decryption stops the run naming it.
"""

from __future__ import annotations

import pytest
from support.golden import assert_golden
from support.runs import FlakyExecutor, RecordingExecutor, protocol_bytes_crossing, run_with, small

from protocols import SERVER, DropoutError
from secure_fgl.algorithms.fedgcn.ops import IDS_TAG, ORDER_TAG
from secure_fgl.experiment import load_federation
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.strategy import EVAL_TAG


@pytest.mark.parametrize("algorithm,options", [("fedavg", {}), ("fedgcn", {"row_order": "signature"})])
def test_ckks_mp_halves_run_in_the_local_runtimes_golden(algorithm, options, request):
    """Ckks-mp halves run in the local runtimes golden.

    Keys made in each runtime, the driver holds no client half, the transcript counts exactly the
    bytes handed to / returned from the runtimes, and the run equals the golden one bit for bit
    (FedGCN signature order: per-recipient key switching).
    """
    cfg = small(algorithm, "ckks-mp", executor="local", options=dict(options), rounds=2).validate()
    fed = load_federation(cfg)
    executor = RecordingExecutor()
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, options, executor)
    assert protocol.clients == {}
    strategy.setup()
    losses = [strategy.train_round(r)["train_loss"] for r in range(cfg.rounds)]
    halves = [rt.half for rt in executor.runtimes.values()]
    assert all(h.keys is not None and h.fingerprint for h in halves)
    assert len({id(h.keys._share) for h in halves}) == len(halves)
    protocol_msgs = [m for m in protocol.transcript.messages if m.tag not in (EVAL_TAG, ORDER_TAG, IDS_TAG)]
    relayed = [m for m in protocol_msgs if m.relay == SERVER]  # s_B: to the server, then on: crosses twice
    assert len(relayed) == fed.num_clients - 1
    assert sum(m.nbytes for m in protocol_msgs) + sum(m.nbytes for m in relayed) == protocol_bytes_crossing(
        executor.frames
    )
    assert_golden("ckks_mp_runtime", request.node.name, {"train_loss": losses})


def test_ckks_mp_client_silent_at_partial_decryption_is_named():
    executor = FlakyExecutor(victim=1, method="half:keyswitch", nth=2)
    with (
        pytest.warns(RuntimeWarning, match=r"client\(s\) \[1\] lost in half:keyswitch"),
        pytest.raises(DropoutError, match=r"client\(s\) 1 did not send its key-switching") as err,
    ):
        run_with(small(mode="ckks-mp"), executor)
    assert err.value.clients == (1,)
