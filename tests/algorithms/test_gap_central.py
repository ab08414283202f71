"""Central GAP (``--algorithm gap``): fedgcn-gap's modules on one party holding the whole graph."""

from __future__ import annotations

import pytest

from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.preflight import preflight

SMALL = dict(
    dataset="sbm",
    clients=1,
    mode="plain",
    rounds=3,
    local_epochs=2,
    seed=4,
    hidden=16,
    synthetic={"num_nodes": 120, "num_features": 12},
    options={"hops": 1},
)


def test_central_gap_and_federated_gap_agree_on_one_client_without_noise(tmp_path):
    """Central gap and federated gap agree on one client without noise.

    The central reference and the federated pipeline with one client (the party as a client
    runtime, every stage through the protocol's exchanges) give the same output without noise.
    """
    from secure_fgl.experiment import run_experiment

    central = run_experiment(RunConfig(algorithm="gap", out=str(tmp_path / "c"), **SMALL), progress=False)
    federated = run_experiment(RunConfig(algorithm="fedgcn-gap", out=str(tmp_path / "f"), **SMALL), progress=False)
    assert [r["train_loss"] for r in central["rounds"]] == [r["train_loss"] for r in federated["rounds"]]
    for key in ("test_acc", "val_acc", "encoder_test_acc", "uses_head"):
        assert central["final"][key] == federated["final"][key]


@pytest.mark.parametrize(
    "change, says",
    [({"clients": 10}, "--clients 1"), ({"mode": "mask"}, "--mode plain")],
)
def test_gap_refuses_a_federation_before_work_starts(change, says):
    with pytest.raises(ConfigError, match=says):
        preflight(RunConfig(algorithm="gap", **{**SMALL, **change}), check_data=False)


def test_gap_states_the_edge_level_claim_of_its_hop_releases(tmp_path):
    """Under edge-level DP the hop sums are the only releases that touch edges, and they carry the noise."""
    from secure_fgl.experiment import run_experiment

    res = run_experiment(RunConfig(algorithm="gap", dp_epsilon=4.0, out=str(tmp_path), **SMALL), progress=False)
    privacy = res["privacy"]
    assert privacy["unit"] == "edge" and privacy["claim_holds"] and privacy["uncovered"] == []
    assert 3.96 <= privacy["total_epsilon"] <= 4.0
    touching_edges = [r for r in privacy["releases"] if "edges" in r["touches"]]
    assert [r["tag"] for r in touching_edges] == ["fedgcn-gap/hop/1"] and touching_edges[0]["dp"]


@pytest.mark.parametrize(
    "name",
    [
        "dp-gap-central-cora.toml",
        "dp-gap-federated-cora.toml",
        "dp-gap-central-citeseer.toml",
        "dp-gap-federated-citeseer.toml",
        "dp-gap-central-pubmed.toml",
        "dp-gap-federated-pubmed.toml",
    ],
)
def test_shipped_central_and_federated_sweep_files_plan_runs_preflight_accepts(name, tmp_path):
    """Every run the two sweep files plan passes preflight (no data loaded), with the same width and hops."""
    from pathlib import Path

    import secure_fgl
    from secure_fgl.report.sweep import spec_from_file

    spec = spec_from_file(Path(secure_fgl.__file__).parent / "configs" / name)
    runs = [cfg for _, cfg in spec.runs(tmp_path)]
    assert runs and len(spec.seeds) == 5
    for cfg in runs:
        options = preflight(cfg, check_data=False)
        assert cfg.hidden == 64 and (cfg.algorithm == "fedavg" or options.hops == 1)


@pytest.mark.parametrize("dataset", ["cora", "citeseer", "pubmed"])
def test_central_reference_trains_and_selects_on_the_federated_schedule(dataset, tmp_path):
    """The central sweep's GAP runs have the federated GAP runs' epochs, validation checks and module settings.

    Each round ends with one validation check and the best round is kept, so equal encoder rounds, head
    rounds and local epochs give both sides the same training and the same selection (the matched rule);
    the encoder's proximal term and the centring of its embeddings are the same modules on both sides.
    """
    from pathlib import Path

    import secure_fgl
    from secure_fgl.algorithms.options import GAPOptions
    from secure_fgl.report.sweep import spec_from_file

    def schedules(name: str, algorithm: str) -> set[tuple]:
        spec = spec_from_file(Path(secure_fgl.__file__).parent / "configs" / name)
        gap = [cfg for _, cfg in spec.runs(tmp_path / name) if cfg.algorithm == algorithm]
        assert gap
        options = [GAPOptions(**c.options) for c in gap]
        return {
            (o.encoder_rounds or c.rounds, c.rounds, c.local_epochs, c.hidden, c.dropout, c.lr)
            + (o.encoder_mu, o.center_embeddings, o.head_local_epochs)
            for o, c in zip(options, gap)
        }

    central = schedules(f"dp-gap-central-{dataset}.toml", "gap")
    assert len(central) == 1 and central == schedules(f"dp-gap-federated-{dataset}.toml", "fedgcn-gap")
