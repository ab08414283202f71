"""Whole-run overhead (issue 17): the checkpointed transcript and the overhead benchmark's records."""
from __future__ import annotations

import numpy as np

from protocols import make_protocol
from secure_fgl.engine.transcript_state import TranscriptState


def _transcript_after_exchanges(n: int):
    proto = make_protocol("mask", 3)
    for r in range(n):
        proto.weighted_mean("t", r, {k: np.full(4, float(k)) for k in range(3)})
    return proto.transcript


def test_transcript_state_round_trips_every_message_without_payloads():
    transcript = _transcript_after_exchanges(2)
    text = TranscriptState(transcript).encode()
    copy = _transcript_after_exchanges(0)
    TranscriptState(copy).restore(text)
    assert copy.messages == [m.without_payload() for m in transcript.messages]
    assert copy.comm()["per_tag"]["t"]["bytes_up"] == transcript.comm()["per_tag"]["t"]["bytes_up"] > 0


def test_transcript_state_encodes_only_new_messages():
    proto = make_protocol("plain", 2)
    state = TranscriptState(proto.transcript)
    proto.weighted_sum("a", 0, {0: np.ones(2), 1: np.ones(2)})
    first = state.encode()
    proto.weighted_sum("a", 1, {0: np.ones(2), 1: np.ones(2)})
    second = state.encode()
    assert second.startswith(first + "\n") and second.count("\n") + 1 == len(proto.transcript.messages)


# ----------------------------------------------------------------------------- batched small exchanges
import pytest  # noqa: E402

from protocols.batch import batched_weighted_mean  # noqa: E402


def _parts(rng, K=3):
    return {"x/a/mean": {k: rng.random(5) for k in range(K)},
            "x/b/mean": {k: rng.random((2, 4)) for k in range(K)}}


@pytest.mark.parametrize("mode", ("plain", "mask", "ckks"))
def test_batched_weighted_means_equal_the_unbatched_ones(mode):
    rng = np.random.default_rng(0)
    parts, weights = _parts(rng), {0: 3.0, 1: 1.0, 2: 5.0}
    got = batched_weighted_mean(make_protocol(mode, 3), "x/stats", 0, parts, weights)
    separate = make_protocol(mode, 3)
    for tag, values in parts.items():
        np.testing.assert_allclose(got[tag], separate.weighted_mean(tag, 0, values, weights), rtol=0, atol=1e-6)
        assert got[tag].shape == next(iter(values.values())).shape


@pytest.mark.parametrize("mode", ("plain", "mask", "ckks"))
def test_batch_attribution_per_tag_sums_to_the_total(mode):
    rng = np.random.default_rng(1)
    proto = make_protocol(mode, 3)
    for r in range(2):
        batched_weighted_mean(proto, "x/stats", r, _parts(rng), {0: 1.0, 1: 2.0, 2: 3.0})
    proto.weighted_mean("x/model", 0, {k: rng.random(7) for k in range(3)})
    comm = proto.transcript.comm()
    assert "x/stats" not in comm["per_tag"] and {"x/a/mean", "x/b/mean"} <= set(comm["per_tag"])
    assert {"x/a/mean", "x/b/mean"} <= set(proto.transcript.tags())
    for key in ("bytes_up", "bytes_down", "bytes_p2p", "plaintext_bytes_up", "plaintext_bytes_down"):
        assert sum(v.get(key, 0) for v in comm["per_tag"].values()) == comm[key]
    a, b = comm["per_tag"]["x/a/mean"], comm["per_tag"]["x/b/mean"]
    assert 0 < a["bytes_up"] < b["bytes_up"] and a["batched_in"] == "x/stats"   # 5 of 13 entries vs 8
    # the float32 baseline: 3 clients x 2 rounds x (1 + 5 + 8) entries x 4 bytes, split 5 : 8 (+ weight)
    assert a["plaintext_bytes_up"] + b["plaintext_bytes_up"] == 3 * 2 * 14 * 4


@pytest.mark.parametrize("mode", ("plain", "ckks"))
def test_fedomd_batched_statistics_equal_the_per_layer_exchanges(mode):
    import torch

    from secure_fgl.algorithms.fedomd import exchange_hidden_statistics
    torch.manual_seed(0)
    hidden = {k: [torch.rand(6 + 4 * k, 3), torch.rand(6 + 4 * k, 2)] for k in range(3)}
    per_layer = make_protocol(mode, 3)
    batched = make_protocol(mode, 3)
    a = exchange_hidden_statistics(per_layer, 0, hidden, (2, 3), 0.0, 1.0)
    b = exchange_hidden_statistics(batched, 0, hidden, (2, 3), 0.0, 1.0, batch=True)
    for x, y in zip(a, b):
        torch.testing.assert_close(x.mean, y.mean, rtol=0, atol=1e-6)
        for j in (2, 3):
            torch.testing.assert_close(x.moments[j], y.moments[j], rtol=0, atol=1e-6)
    uploads = lambda p: [m for m in p.transcript.messages if m.receiver == "server" and m.tag.startswith("fedomd/")]  # noqa: E731
    assert len(uploads(batched)) == 2 * 3 and len(uploads(per_layer)) == 4 * 3     # 2 stages x 3 clients
    assert set(batched.transcript.comm()["per_tag"]) >= {"fedomd/hidden1/mean", "fedomd/hidden2/moments"}


def test_fedomd_one_stage_raw_moments_match_within_the_stated_trade():
    import torch

    from secure_fgl.algorithms.fedomd import exchange_hidden_statistics
    torch.manual_seed(1)
    hidden = {k: [torch.rand(8 + 3 * k, 4), torch.rand(8 + 3 * k, 2)] for k in range(3)}
    exact = exchange_hidden_statistics(make_protocol("plain", 3), 0, hidden, (2, 3, 4, 5), 0.0, 1.0)
    proto = make_protocol("ckks", 3)
    raw = exchange_hidden_statistics(proto, 0, hidden, (2, 3, 4, 5), 0.0, 1.0, batch=True, raw_moments=True)
    for x, y in zip(exact, raw):
        torch.testing.assert_close(x.mean, y.mean, rtol=0, atol=1e-6)
        for j in (2, 3, 4, 5):
            torch.testing.assert_close(x.moments[j], y.moments[j], rtol=0, atol=2 ** j * 1e-6)
    ups = [m for m in proto.transcript.messages if m.receiver == "server" and m.tag.startswith("fedomd/")]
    assert len(ups) == 3 and {m.tag for m in ups} == {"fedomd/stats/raw"}                 # one per client


# ----------------------------------------------------------------------------- memory at scale
def test_block_rows_equal_the_dense_blocks_in_every_chunk():
    from protocols.row_blocks import BlockRows
    rng = np.random.default_rng(2)
    rpb, dim, num_rows = 4, 3, 50
    ids = rng.choice(num_rows, 17, replace=False)
    rows = rng.random((17, dim))
    bids = np.unique(ids // rpb)
    dense = np.zeros((bids.size, rpb, dim))
    dense[np.searchsorted(bids, ids // rpb), ids % rpb] = rows
    dense = dense.reshape(bids.size, rpb * dim)
    lazy = BlockRows(bids, ids, rows, rpb)
    assert lazy.shape == dense.shape and np.array_equal(np.asarray(lazy), dense)
    for i0 in range(bids.size):
        for i1 in range(i0, bids.size + 1):
            assert np.array_equal(lazy[i0:i1], dense[i0:i1])
    assert np.array_equal(lazy[-1], dense[-1]) and np.array_equal(lazy.astype(np.float32), dense.astype(np.float32))


# ----------------------------------------------------------------------------- the overhead benchmark
def test_overhead_worker_record_has_the_issue_fields():
    from secure_fgl.bench.overhead import run_worker, tag_table, workload_config
    values = {**workload_config("cora-fedomd", "ckks", quick=True), "dataset": "sbm", "rounds": 1,
              "clients": 3}
    rec = run_worker(values)
    assert rec["wall_s"] > 0 and rec["peak_rss_mb"] > 0 and rec["bytes_up"] > 0
    # data exchanges only, against the one float32 baseline (key set-up counted apart)
    assert rec["bytes_up_ratio_to_plain"] == rec["bytes_up"] / rec["bytes_up_float32"] > 1
    assert rec["bytes_up_keys"] > 0
    assert rec["per_tag"]["fedomd/hidden1/mean"]["plaintext_bytes_up"] > 0
    lines = tag_table([{"workload": "w", "mode": "ckks", **rec}])
    assert any("fedomd/hidden1/moments" in line for line in lines)


@pytest.mark.parametrize("mode", ("plain", "ckks"))
def test_row_sum_streams_blocks_and_readable_rows_hold_the_requested_totals(mode):
    rng = np.random.default_rng(3)
    num_rows, d = 40, 3
    contributions = {k: (ids, rng.integers(0, 3, (ids.size, d)).astype(float))
                     for k, ids in ((k, np.sort(rng.choice(num_rows, 12, replace=False))) for k in range(3))}
    requests = {k: np.sort(rng.choice(num_rows, 5, replace=False)) for k in range(3)}
    proto = make_protocol(mode, 3)
    out = proto.row_sum("r", 0, contributions, requests, num_rows, layout="sparse")
    exact = np.zeros((num_rows, d))
    for ids, rows in contributions.values():
        exact[ids] += rows
    for k, req in requests.items():
        np.testing.assert_allclose(out[k], exact[req], atol=1e-6)
        rows, totals = proto.last_readable[k]
        assert set(req) <= set(rows) and rows.max() < num_rows
        np.testing.assert_allclose(totals, exact[rows], atol=1e-6)
