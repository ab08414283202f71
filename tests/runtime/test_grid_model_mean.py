"""FedAvg-style model mean on its public grid (``--grid-model-mean``) and CKKS's exact grid fields.

On the grid (:meth:`protocols.precision.MeanPrecision.grid_spec`) every client rounds ``[w v, w]``
to multiples of ``2^-f`` before encoding, so the K-way sum is an integer number of grid steps:
CKKS carries it as exact signed integer fields, both parts of every slot (its default), or as
one float per slot (``--ckks-real-slots``); either way the recipients round back to the grid, so
plain, ckks and ckks with real slots train the same model bit for bit -- and the fields take fewer bytes.
"""

from __future__ import annotations

import pytest
import torch

from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.experiment import run_experiment


def last_client_state(out):
    """Client 0's state in the slot the run's last checkpoint names."""
    slot = torch.load(out / "checkpoint.pt", weights_only=True)["algorithm"]["slot"]
    return torch.load(out / "clients" / f"client0.{slot}.pt", weights_only=True)


def _run(mode: str, out, grid: bool = True, **extra) -> tuple[dict, torch.Tensor]:
    """A 4-round FedGCN run and the global parameters client 0 holds at its end."""
    cfg = RunConfig(
        algorithm="fedgcn",
        dataset="sbm",
        clients=3,
        mode=mode,
        rounds=4,
        local_epochs=2,
        hidden=16,
        seed=3,
        synthetic={"num_nodes": 150, "num_features": 400},
        grid_model_mean=grid,
        update_bound=1.0,
        save_best_model=False,
        out=str(out),
        **extra,
    ).validate()
    result = run_experiment(cfg, progress=False)
    return result, last_client_state(out)["global_params"]


def test_grid_model_mean_trains_the_same_model_in_plain_and_ckks_with_fewer_ckks_bytes(tmp_path):
    runs = {
        "plain": _run("plain", tmp_path / "plain"),
        "ckks": _run("ckks", tmp_path / "ckks"),
        "ckks-real": _run("ckks", tmp_path / "float", ckks_real_slots=True),
    }
    for mode in ("ckks", "ckks-real"):  # bit for bit, not close
        assert torch.equal(runs[mode][1], runs["plain"][1]), mode
        assert [r["train_loss"] for r in runs[mode][0]["rounds"]] == [
            r["train_loss"] for r in runs["plain"][0]["rounds"]
        ]
    # positive control: off the grid, float CKKS misses plain's parameters in the last bits
    assert not torch.equal(_run("ckks", tmp_path / "off", grid=False)[1], runs["plain"][1])
    model = {m: res["comm"]["per_tag"]["fedgcn/model"]["bytes_up"] for m, (res, _) in runs.items()}
    assert model["ckks"] < model["ckks-real"]  # the grid's integer fields


def test_ckks_real_slots_is_a_ckks_option():
    with pytest.raises(ConfigError, match="ckks-real"):
        RunConfig(algorithm="fedgcn", dataset="sbm", mode="mask", ckks_real_slots=True).validate()
    with pytest.raises(ConfigError, match="ckks-real"):
        RunConfig(algorithm="fedgcn", dataset="sbm", mode="ckks", ckks_real_slots=True, fixed_point_bits=20).validate()


def test_every_mode_trains_plains_model_bit_for_bit_by_default(tmp_path):
    """Every mode trains plains model bit for bit by default.

    Without ``--grid-model-mean`` every mode averages on the same public grid: plain, mask, ckks and
    ckks-mp give the same train loss in every round and the same final parameters, bit for bit.
    """

    def run(mode):
        cfg = RunConfig(
            algorithm="fedgcn",
            dataset="sbm",
            clients=3,
            mode=mode,
            rounds=3,
            local_epochs=1,
            hidden=8,
            seed=5,
            synthetic={"num_nodes": 90, "num_features": 40},
            save_best_model=False,
            out=str(tmp_path / mode),
            options={"hops": 1},
        ).validate()
        result = run_experiment(cfg, progress=False)
        params = last_client_state(tmp_path / mode)["global_params"]
        return [r["train_loss"] for r in result["rounds"]], params

    plain = run("plain")
    for mode in ("mask", "ckks", "ckks-mp"):
        losses, params = run(mode)
        assert losses == plain[0], mode
        assert torch.equal(params, plain[1]), mode


def test_ckks_averages_the_model_on_its_grid_by_default_at_the_default_update_bound(tmp_path):
    """Ckks averages the model on its grid by default at the default update bound.

    Without ``--grid-model-mean`` and at the default ``--update-bound`` (100), ckks carries the model
    mean on its grid in exact fields (``grid_model_tolerance`` keeps its ten-client sums within the 41
    bits of a slot half): fewer bytes than the float slots of ``--grid-model-mean false``.
    """
    assert [RunConfig(mode=m).model_mean_on_grid for m in ("plain", "mask", "ckks", "ckks-mp")] == [True] * 4
    assert not RunConfig(mode="plain", grid_model_mean=False).model_mean_on_grid  # plain's float32 mean
    assert not RunConfig(mode="ckks", ckks_real_slots=True).model_mean_on_grid
    assert not RunConfig(mode="ckks", fixed_point_bits=20).model_mean_on_grid
    assert RunConfig(mode="plain", grid_model_mean=True).model_mean_on_grid

    def model_bytes(out, **grid):
        cfg = RunConfig(
            algorithm="fedgcn",
            dataset="sbm",
            clients=10,
            mode="ckks",
            rounds=2,
            local_epochs=1,
            hidden=16,
            seed=3,
            synthetic={"num_nodes": 300, "num_features": 400},
            save_best_model=False,
            out=str(out),
            **grid,
        ).validate()
        return run_experiment(cfg, progress=False)["comm"]["per_tag"]["fedgcn/model"]["bytes_up"]

    assert model_bytes(tmp_path / "default") < model_bytes(tmp_path / "float", grid_model_mean=False)
