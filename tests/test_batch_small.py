"""Batched small exchanges (protocols.batch.batched_sum): FedSpray's encoder and proxies in one upload
per client per round -- the same sums and model trajectory as the two exchanges, bytes attributed per
tag summing to the total, malformed or out-of-range parts refused before anything is encrypted."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from protocols import SERVER, Transcript, ValueSpec, make_protocol
from protocols.batch import batch_spec, batched_sum
from protocols.errors import BoundError, NonFiniteError, ProtocolError, ShapeError
from secure_fgl.algorithms.fedspray import PROXY_SPEC, FedSpray
from secure_fgl.algorithms.base import model_spec
from secure_fgl.config import RunConfig

from test_fedspray import K, _fed_with_absent_classes

TAGS = ("fedspray/encoder", "fedspray/proxies")


def _parts(rng, clients=range(3), sizes=(7, 4)):
    return {f"t/part{i}": {k: rng.normal(size=n) for k in clients} for i, n in enumerate(sizes)}


@pytest.mark.parametrize("mode", ("plain", "mask", "ckks"))
def test_a_batch_gives_every_part_the_sum_of_its_own_exchange(mode):
    rng = np.random.default_rng(0)
    parts = _parts(rng)
    spec = ValueSpec(max_abs=10.0, tolerance=1e-6)
    batched = batched_sum(make_protocol(mode, 3), "t/batch", 0, parts, spec)
    for name, values in parts.items():
        alone = make_protocol(mode, 3).weighted_sum(name, 0, values, spec=spec)
        exact = sum(values.values())
        if mode == "ckks":
            np.testing.assert_allclose(batched[name], exact, atol=1e-6)
            np.testing.assert_allclose(alone, exact, atol=1e-6)
        else:
            np.testing.assert_array_equal(batched[name], alone)


def _run(mode: str, batch: bool, rounds: int = 2):
    torch.manual_seed(0)
    protocol = make_protocol(mode, K, transcript=Transcript(keep_payloads="none"))
    cfg = RunConfig(algorithm="fedspray", mode=mode, clients=K, rounds=rounds)
    algo = FedSpray(_fed_with_absent_classes(), protocol, cfg, torch.device("cpu"),
                    FedSpray.Options(phase_epochs=1, proxy_dim=8, gnn_hidden=8, batch_exchanges=batch))
    trajectory = []
    for rnd in range(rounds):
        algo.train_round(rnd)
        trajectory.append((algo.global_encoder.clone(), algo.proxies.clone()))
    return trajectory, protocol.transcript


@pytest.mark.parametrize("mode", ("plain", "mask"))
def test_fedspray_batched_round_keeps_the_model_trajectory_and_the_bytes_per_tag(mode):
    batched, tb = _run(mode, True)
    separate, ts = _run(mode, False)
    for (e1, s1), (e2, s2) in zip(batched, separate):          # exact codecs: the same bits
        assert torch.equal(e1, e2) and torch.equal(s1, s2)
    uploads = [m for m in tb.messages if m.receiver == SERVER and m.kind in ("plain", "masked")]
    assert {m.tag for m in uploads} == {"fedspray/batch"}        # one data upload per client per round
    assert len(uploads) == 2 * K
    comm = tb.comm()
    per_tag = comm["per_tag"]
    assert set(TAGS) <= set(per_tag) and "fedspray/batch" not in per_tag
    for key in ("bytes_up", "bytes_down", "bytes_p2p", "plaintext_bytes_up", "plaintext_bytes_down"):
        assert sum(v.get(key, 0) for v in per_tag.values()) == comm[key]
    assert comm["bytes_up"] < ts.comm()["bytes_up"]              # one exchange's overhead saved per round
    # the float32 baseline is what the two exchanges carry, up to the one shared vector's block padding
    assert per_tag["fedspray/proxies"]["plaintext_bytes_up"] < per_tag["fedspray/encoder"]["plaintext_bytes_up"]


def test_specs_merge_only_where_no_part_changes():
    enc, grid = model_spec(4, 4), model_spec(4, 4, 1.0, grid=True)
    assert batch_spec([enc, PROXY_SPEC]) == PROXY_SPEC                   # the default: equal specs
    merged = batch_spec([model_spec(4, 4, 1.0), PROXY_SPEC])
    assert merged.max_abs == PROXY_SPEC.max_abs and merged.tolerance == min(PROXY_SPEC.tolerance,
                                                                           model_spec(4, 4, 1.0).tolerance)
    assert batch_spec([grid, PROXY_SPEC]) is None                        # proxies off the encoder's grid
    assert batch_spec([ValueSpec(integer=True), PROXY_SPEC]) is None


@pytest.mark.parametrize("mode", ("mask", "ckks"))
@pytest.mark.parametrize("fault", ("nan", "clients", "shape", "range"))
def test_malformed_or_out_of_range_batches_are_refused_before_encryption(mode, fault):
    rng = np.random.default_rng(1)
    parts = _parts(rng)
    expected = {"nan": NonFiniteError, "clients": ShapeError, "shape": ShapeError, "range": BoundError}[fault]
    if fault == "nan":
        parts["t/part1"][2][1] = np.nan
    elif fault == "clients":
        del parts["t/part1"][2]
    elif fault == "shape":
        parts["t/part0"][1] = rng.normal(size=8)
    else:
        parts["t/part1"][0][3] = 50.0
    protocol = make_protocol(mode, 3, transcript=Transcript(keep_payloads="all"))
    with pytest.raises(expected) as err:
        batched_sum(protocol, "t/batch", 0, parts, ValueSpec(max_abs=10.0, tolerance=1e-6))
    assert isinstance(err.value, ProtocolError)
    # nothing of the values reached the server (mask's key agreement between clients may have begun)
    assert not [m for m in protocol.transcript.messages if m.receiver == SERVER and m.kind in ("ciphertext", "masked")]
