"""Batched small exchanges: FedSpray's encoder and proxies in one upload per client per round.

Batched small exchanges (protocols.batch) over the client runtimes: FedSpray's encoder and proxies in
one upload per client per round -- the same model trajectory as the two exchanges -- and GCFL+'s norms
in one clear-text report per client per round; bytes attributed per tag summing to the total.
"""

from __future__ import annotations

import pytest
import torch
from support.runs import fedspray_federation

from protocols import SERVER, DPRequest, Transcript, ValueSpec
from protocols.batch import batch_spec
from secure_fgl.algorithms.base import model_spec
from secure_fgl.algorithms.fedspray.ops import PROXY_SPEC, round_spec
from secure_fgl.algorithms.options import FedSprayOptions
from secure_fgl.config import RunConfig

K = 4
TAGS = ("fedspray/encoder", "fedspray/proxies")


def _run(run_small, mode: str, batch: bool, rounds: int = 2, **settings):
    """FedSpray over the client runtimes: client 0's global encoder and proxies after each round."""
    options = {"phase_epochs": 1, "proxy_dim": 8, "gnn_hidden": 8, "batch_exchanges": batch}
    cfg = RunConfig(algorithm="fedspray", mode=mode, clients=K, rounds=rounds, options=options, **settings)
    run = run_small(cfg, fedspray_federation(), transcript=Transcript(keep_payloads="none"))
    trajectory = []
    for rnd in range(rounds):
        run.strategy.train_round(rnd)
        trajectory.append((run.logic(0).global_encoder.clone(), run.logic(0).proxies.clone()))
    return trajectory, run.protocol.transcript


@pytest.mark.parametrize("mode", ("plain", "mask"))
def test_fedspray_batched_round_keeps_the_model_trajectory_and_the_bytes_per_tag(mode, run_small):
    # off the model grid (--grid-model-mean false): the batch keeps the proxies' own spec; on the grid
    # the batched proxies take the model's grid (test below), a different rounding than their own exchange
    batched, tb = _run(run_small, mode, True, grid_model_mean=False)
    separate, ts = _run(run_small, mode, False, grid_model_mean=False)
    for (e1, s1), (e2, s2) in zip(batched, separate):  # exact codecs: the same bits
        assert torch.equal(e1, e2) and torch.equal(s1, s2)
    uploads = [m for m in tb.messages if m.receiver == SERVER and m.kind in ("plain", "masked")]
    assert {m.tag for m in uploads} == {"fedspray/batch"}  # one data upload per client per round
    assert len(uploads) == 2 * K
    comm = tb.comm()
    per_tag = comm["per_tag"]
    assert set(TAGS) <= set(per_tag) and "fedspray/batch" not in per_tag
    for key in ("bytes_up", "bytes_down", "bytes_p2p", "plaintext_bytes_up", "plaintext_bytes_down"):
        assert sum(v.get(key, 0) for v in per_tag.values()) == comm[key]
    assert comm["bytes_up"] < ts.comm()["bytes_up"]  # one exchange's overhead saved per round
    # the float32 baseline is what the two exchanges carry, up to the one shared vector's block padding
    assert per_tag["fedspray/proxies"]["plaintext_bytes_up"] < per_tag["fedspray/encoder"]["plaintext_bytes_up"]


def test_on_the_model_grid_ckks_aligns_the_proxies_to_plains_bits(run_small):
    """On the model grid ckks aligns the proxies to plains bits.

    ckks's default (the encoder mean on its grid) puts the proxies on the same grid: the batched
    round gives the encoder and proxies of plain with --grid-model-mean bit for bit.
    """
    ckks, tc = _run(run_small, "ckks", True)
    plain, _ = _run(run_small, "plain", True, grid_model_mean=True)
    for (e1, s1), (e2, s2) in zip(ckks, plain):
        assert torch.equal(e1, e2) and torch.equal(s1, s2)
    assert "fedspray/batch" in {m.tag for m in tc.messages}


def test_specs_merge_only_where_no_part_changes():
    opts = FedSprayOptions()
    assert round_spec(model_spec(4, 4), opts, None, 4, 4) == PROXY_SPEC  # plain default: equal specs
    grid = model_spec(4, 4, None, grid=True)  # ckks default: the model's grid
    assert round_spec(grid, opts, None, 4, 4) == grid  # proxies on the same grid
    merged = round_spec(model_spec(4, 4, 1.0), opts, None, 4, 4)
    assert merged.max_abs == PROXY_SPEC.max_abs and merged.tolerance == min(
        PROXY_SPEC.tolerance, model_spec(4, 4, 1.0).tolerance
    )
    assert round_spec(model_spec(4, 4, 1.0, grid=True), opts, None, 4, 4) is None  # grids differ: two exchanges
    assert round_spec(grid, opts, DPRequest(clip=1.0), 4, 4) is None  # DP: a release per exchange
    assert batch_spec([ValueSpec(integer=True), PROXY_SPEC]) is None


def test_gcflplus_reports_every_norm_of_a_round_in_one_message_per_client():
    from secure_fgl.experiment import run_experiment

    result = run_experiment(
        RunConfig(
            algorithm="gcflplus",
            mode="plain",
            dataset="synthetic-graphs",
            clients=4,
            hidden=8,
            num_layers=2,
            rounds=2,
            seed=0,
        ),
        progress=False,
    )
    per_tag = result["comm"]["per_tag"]
    parts = {f"gcflplus/{p}" for p in ("update_norms", "mean_norm", "grad_norms")}
    assert parts <= set(per_tag) and all(per_tag[p]["batched_in"] == "gcflplus/norms" for p in parts)
    # per client per round: the report exchange's plan down and ONE signed report up (three tags' worth)
    assert {per_tag[p]["messages"] for p in parts} == {2 * 4 * 2}
