"""Whole-run overhead: the checkpointed transcript and the overhead benchmark's records."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from protocols import make_protocol
from secure_fgl.config import ConfigError
from secure_fgl.engine.transcript_state import TranscriptState


def _transcript_after_exchanges(n: int):
    proto = make_protocol("mask", 3)
    for r in range(n):
        proto.weighted_mean("t", r, {k: np.full(4, float(k)) for k in range(3)})
    return proto.transcript


def test_transcript_state_round_trips_every_message_without_payloads(tmp_path):
    transcript = _transcript_after_exchanges(2)
    ref = TranscriptState(transcript, tmp_path / "t.jsonl").encode()
    copy = _transcript_after_exchanges(0)
    TranscriptState(copy, tmp_path / "t.jsonl").restore(ref)
    assert copy.messages == [m.without_payload() for m in transcript.messages]
    assert copy.comm()["per_tag"]["t"]["bytes_up"] == transcript.comm()["per_tag"]["t"]["bytes_up"] > 0


def test_transcript_state_appends_only_new_messages(tmp_path):
    proto = make_protocol("plain", 2)
    state = TranscriptState(proto.transcript, tmp_path / "t.jsonl")
    proto.weighted_sum("a", 0, {0: np.ones(2), 1: np.ones(2)})
    first = state.encode()
    written = (tmp_path / "t.jsonl").read_bytes()
    proto.weighted_sum("a", 1, {0: np.ones(2), 1: np.ones(2)})
    second = state.encode()
    assert (tmp_path / "t.jsonl").read_bytes().startswith(written)  # appended, not rewritten
    assert second["messages"] == len(proto.transcript.messages) > first["messages"]
    assert second["bytes"] == (tmp_path / "t.jsonl").stat().st_size


def test_resume_cuts_lines_written_after_the_checkpoint(tmp_path):
    """A crash between the side file's append and the checkpoint leaves extra lines: cut off."""
    proto = make_protocol("plain", 2)
    path = tmp_path / "t.jsonl"
    state = TranscriptState(proto.transcript, path)
    proto.weighted_sum("a", 0, {0: np.ones(2), 1: np.ones(2)})
    ref = state.encode()
    kept = list(proto.transcript.messages)
    proto.weighted_sum("a", 1, {0: np.ones(2), 1: np.ones(2)})
    state.encode()  # appended, but its checkpoint never written
    copy = make_protocol("plain", 2).transcript
    resumed = TranscriptState(copy, path)
    resumed.restore(ref)
    assert copy.messages == [m.without_payload() for m in kept] and path.stat().st_size == ref["bytes"]
    copy.messages.append(kept[0])
    assert resumed.encode()["messages"] == len(kept) + 1  # appends after the cut


@pytest.mark.parametrize("tamper", ("edit", "truncate", "delete"))
def test_resume_refuses_a_side_file_that_does_not_match_the_checkpoint(tmp_path, tamper):
    proto = make_protocol("mask", 3)
    path = tmp_path / "t.jsonl"
    state = TranscriptState(proto.transcript, path)
    proto.weighted_mean("t", 0, {k: np.full(4, float(k)) for k in range(3)})
    ref = state.encode()
    data = path.read_bytes()
    if tamper == "edit":  # one message's byte count changed: same length, other hash
        i = data.index(b'"nbytes":') + len(b'"nbytes":')
        path.write_bytes(data[:i] + (b"9" if data[i : i + 1] != b"9" else b"8") + data[i + 1 :])
    elif tamper == "truncate":
        path.write_bytes(data[:-10])
    else:
        path.unlink()
    copy = make_protocol("mask", 3).transcript
    with pytest.raises(ConfigError, match="--resume") as err:
        TranscriptState(copy, path).restore(ref)
    assert "\n" not in str(err.value) and copy.messages == []


# ----------------------------------------------------------------------------- batched small exchanges
def _fedomd_stats(run_small, mode: str, **options):
    """Client 0's pooled statistics after one FedOMD round over the runtimes, and the uploads of them."""
    from secure_fgl.config import RunConfig

    cfg = RunConfig(
        algorithm="fedomd",
        dataset="sbm",
        clients=3,
        mode=mode,
        partition="louvain",
        split="fedomd",
        rounds=1,
        hidden=8,
        synthetic={"num_nodes": 240, "num_features": 24},
        seed=1,
        options=options,
    )
    run = run_small(cfg)
    run.train(1)
    ups = [
        m
        for m in run.protocol.transcript.messages
        if m.receiver == "server"
        and m.tag.startswith("fedomd/")
        and m.tag != "fedomd/model"
        and m.kind in ("plain", "masked", "ciphertext")
    ]
    return run.logic(0).global_stats, ups, run.protocol.transcript


@pytest.mark.parametrize("mode", ("plain", "ckks"))
def test_fedomd_batched_statistics_equal_the_per_layer_exchanges(mode, run_small):
    batched, b_ups, tb = _fedomd_stats(run_small, mode, batch_stats=True)
    per_layer, l_ups, _ = _fedomd_stats(run_small, mode, batch_stats=False)
    assert len(batched) == len(per_layer) == 2
    for x, y in zip(per_layer, batched):
        torch.testing.assert_close(x.mean, y.mean, rtol=0, atol=1e-6)
        for j in x.moments:
            torch.testing.assert_close(x.moments[j], y.moments[j], rtol=0, atol=1e-6)
    assert len(b_ups) == 2 * 3 and len(l_ups) == 4 * 3  # 2 stages (x 2 layers) x 3 clients
    comm = tb.comm()
    assert set(comm["per_tag"]) >= {"fedomd/hidden1/mean", "fedomd/hidden2/moments"}
    assert comm["per_tag"]["fedomd/hidden1/mean"]["batched_in"] == "fedomd/stats/mean"
    for key in ("bytes_up", "bytes_down", "bytes_p2p", "plaintext_bytes_up", "plaintext_bytes_down"):
        assert sum(v.get(key, 0) for v in comm["per_tag"].values()) == comm[key]


def test_fedomd_one_stage_raw_moments_match_within_the_stated_trade(run_small):
    exact, _, _ = _fedomd_stats(run_small, "plain", batch_stats=True)
    raw, ups, _ = _fedomd_stats(run_small, "ckks", batch_stats=True, raw_moments=True)
    for x, y in zip(exact, raw):
        # a float exchange: its decrypted sums are released on a power-of-two grid within the default
        # tolerance 1e-4 (protocols.ckks.params.release_step), here divided by >= 8 rows per client
        torch.testing.assert_close(x.mean, y.mean, rtol=0, atol=1e-4 / 8)
        for j in x.moments:
            torch.testing.assert_close(x.moments[j], y.moments[j], rtol=0, atol=2**j * 1e-6)
    assert len(ups) == 3 and {m.tag for m in ups} == {"fedomd/stats/raw"}  # one per client


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
    built32 = np.asarray(lazy, dtype=np.float32)  # built in the wire's width, rounded once
    assert built32.dtype == np.float32 and np.array_equal(built32, dense.astype(np.float32))


# ----------------------------------------------------------------------------- the overhead benchmark
def test_overhead_worker_record_has_the_issue_fields():
    from secure_fgl.bench.overhead import run_worker, tag_table, workload_config

    values = {**workload_config("cora-fedomd", "ckks", quick=True), "dataset": "sbm", "rounds": 1, "clients": 3}
    rec = run_worker(values)
    assert rec["wall_s"] > 0 and rec["peak_rss_mb"] > 0 and rec["bytes_up"] > 0
    # data exchanges only, against the one float32 baseline (key set-up counted apart)
    assert rec["bytes_up_ratio_to_plain"] == rec["bytes_up"] / rec["bytes_up_float32"] > 1
    assert rec["bytes_up_keys"] > 0
    assert rec["per_tag"]["fedomd/hidden1/mean"]["plaintext_bytes_up"] > 0
    lines = tag_table([{"workload": "w", "mode": "ckks", **rec}])
    assert any("fedomd/hidden1/moments" in line for line in lines)


def test_overhead_reports_ckks_mp_and_per_exchange_ratios_to_plain():
    from secure_fgl.bench.overhead import MODES, exchange_table, workload_config

    assert "ckks-mp" in MODES
    assert workload_config("cora-fedgcn-2hop", "ckks-mp", quick=True)["options"] == {"hops": 2, "layout": "dense"}

    def tag(up, down):
        return {"bytes_up": up, "bytes_down": down, "plaintext_bytes_up": 100}

    records = [
        {"workload": "w", "mode": "plain", "cpu_ratio_to_plain": 1.0, "per_tag": {"m": tag(100, 100)}},
        {"workload": "w", "mode": "ckks-mp", "cpu_ratio_to_plain": 2.5, "per_tag": {"m": tag(500, 300)}},
    ]
    lines = exchange_table(records)
    assert any("ckks-mp" in line and "cpu 2.50x" in line and "m 4.00x" in line for line in lines)


@pytest.mark.parametrize("mode", ("plain", "ckks"))
def test_row_sum_streams_blocks_and_readable_rows_hold_the_requested_totals(mode):
    rng = np.random.default_rng(3)
    num_rows, d = 40, 3
    contributions = {
        k: (ids, rng.integers(0, 3, (ids.size, d)).astype(float))
        for k, ids in ((k, np.sort(rng.choice(num_rows, 12, replace=False))) for k in range(3))
    }
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


def test_a_resumed_mask_run_reports_the_communication_of_an_uninterrupted_one(tmp_path):
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment

    def cfg(out, rounds, **kw):
        return RunConfig(
            algorithm="fedavg",
            mode="mask",
            dataset="sbm",
            clients=3,
            rounds=rounds,
            seed=0,
            synthetic={"num_nodes": 120, "num_features": 8, "num_classes": 3},
            out=str(out),
            **kw,
        )

    full = run_experiment(cfg(tmp_path / "full", 4), progress=False)
    first = run_experiment(cfg(tmp_path / "part", 2), progress=False)
    side = tmp_path / "part" / "transcript.jsonl"
    before = side.read_bytes()
    resumed = run_experiment(cfg(tmp_path / "part", 4, resume=True), progress=False)

    def keys(run, up, kinds=("public_key",)):
        """Mask keys are advertised once per run and the self-mask shares dealt with commitments.

        Mask keys are advertised once per run and the self-mask shares dealt with signed commitments
        (``control`` uploads) once per session: a resumed session does both again.
        """
        lines = [json.loads(line) for line in (tmp_path / run / "transcript.jsonl").read_text().splitlines()]
        return sum(
            m["nbytes"]
            for m in lines
            if m["tag"] == "fedavg/model" and m["kind"] in kinds and (m["receiver"] == "server") == up
        )

    model_r, model_f = resumed["comm"]["per_tag"]["fedavg/model"], full["comm"]["per_tag"]["fedavg/model"]
    assert keys("part", True) == 2 * keys("full", True) > 0
    setup = ("public_key", "control")  # the control uploads: commitments and survivor-set MACs
    for key, up in (("bytes_up", True), ("bytes_down", False)):  # relayed shares (p2p): not compared
        assert model_r[key] - keys("part", up, setup) == model_f[key] - keys("full", up, setup)
    assert model_r["plaintext_bytes_up"] == model_f["plaintext_bytes_up"]
    assert [r["test_acc"] for r in resumed["rounds"]] == [r["test_acc"] for r in full["rounds"]]
    assert side.read_bytes().startswith(before)  # the first session's lines, kept
    assert side.read_text().count("\n") == resumed["comm"]["messages"] > first["comm"]["messages"]
    assert "transcript.jsonl" in resumed["files"]


def test_overhead_repeats_report_the_median_of_per_repeat_ratios():
    from secure_fgl.bench.overhead import medians

    runs = [
        {
            "workload": "w",
            "mode": m,
            "repeat": r,
            "wall_s": w,
            "cpu_s": w,
            "wall_ratio_to_plain": q,
            "cpu_ratio_to_plain": q,
        }
        for r, (m, w, q) in enumerate(
            [
                ("plain", 20.0, 1.0),
                ("mask", 23.0, 1.15),
                ("plain", 21.0, 1.0),
                ("mask", 22.0, 1.05),
                ("plain", 19.0, 1.0),
                ("mask", 21.0, 1.08),
            ]
        )
    ]
    runs.append({"workload": "w", "mode": "mask", "repeat": 3, "error": "worker exited 1"})
    rec = {r["mode"]: r for r in medians(runs)}
    assert rec["mask"]["repeats"] == 3 and rec["mask"]["wall_ratio_to_plain"] == 1.08
    assert rec["mask"]["wall_ratio_to_plain_range"] == [1.05, 1.15] and rec["plain"]["wall_s"] == 20.0
