"""FedGCN-GAP: no exact edge reaches the model; only the noisy hop sums depend on edges."""

from __future__ import annotations

import copy

import pytest
import torch

import secure_fgl.algorithms.gap.client as gap_client
from secure_fgl.config import RunConfig
from secure_fgl.data import make_federated


def drop_one_local_edge(fed):
    """A copy of ``fed`` with one undirected local edge of some client removed."""
    fed2 = copy.deepcopy(fed)
    c = next(c for c in fed2.clients if (c.edge_index[0] != c.edge_index[1]).any())
    a, b = c.edge_index
    u, v = int(a[a != b][0]), int(b[a != b][0])
    keep = ~(((a == u) & (b == v)) | ((a == v) & (b == u)))
    c.edge_index = c.edge_index[:, keep]
    return fed2


def gap_inputs(run_small, monkeypatch, fed, fixed_sums: bool):
    """Each client's head input and edge index after the encoder and hop stages, and its encoder."""
    cfg = RunConfig(algorithm="fedgcn-gap", mode="plain", clients=3, rounds=3, seed=1, options={"hops": 2})
    real = gap_client.rows_result
    if fixed_sums:  # stand-in for the DP release: values that do not depend on the edges
        monkeypatch.setattr(
            gap_client, "rows_result", lambda half, rows, rpb, dim: 0 * real(half, rows, rpb, dim) + 1.0
        )
    run = run_small(cfg, fed)
    run.strategy.setup()
    monkeypatch.setattr(gap_client, "rows_result", real)
    logics = [run.logic(k) for k in range(3)]
    return [lg.inputs()[0] for lg in logics], [lg.inputs()[1] for lg in logics], [lg.encoder.model for lg in logics]


def test_a_local_edge_reaches_the_head_only_through_the_hop_sums(run_small, monkeypatch):
    fed = make_federated("sbm", num_clients=3, seed=0, num_nodes=120, num_features=12)
    fed2 = drop_one_local_edge(fed)
    d = RunConfig().hidden
    for fixed in (True, False):
        (x1, e1, m1), (x2, e2, m2) = (gap_inputs(run_small, monkeypatch, f, fixed) for f in (fed, fed2))
        assert all(e.numel() == 0 for e in e1 + e2)  # the head sees no edge index
        for k in range(3):  # encoder part: edge-free
            assert torch.equal(x1[k][:, :d], x2[k][:, :d])
        assert all(torch.equal(p, q) for a, b in zip(m1, m2) for p, q in zip(a.parameters(), b.parameters()))
        hops_equal = all(torch.equal(x1[k], x2[k]) for k in range(3))
        # with the sums replaced by edge-independent values nothing changes; with the real
        # sums the edge shows up, only in the hop columns (the test is not vacuous)
        assert hops_equal == fixed


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_gap_privacy_section_is_edge_level_and_spends_the_budget():
    from secure_fgl.experiment import run_experiment

    cfg = RunConfig(
        algorithm="fedgcn-gap",
        mode="plain",
        clients=3,
        rounds=2,
        dp_epsilon=2.0,
        synthetic={"num_nodes": 120, "num_features": 12},
    )
    p = run_experiment(cfg, progress=False)["privacy"]
    assert p["unit"] == "edge" and p["claim_holds"] and 0.99 * 2.0 <= p["total_epsilon"] <= 2.0
    dp_tags = [r["tag"] for r in p["releases"] if r["dp"]]
    assert dp_tags == ["fedgcn-gap/hop/1", "fedgcn-gap/hop/2"]
    assert all("edges" not in r["touches"] for r in p["releases"] if not r["dp"])


def test_the_central_reference_is_one_client_on_the_default_executor():
    """The central reference is one client on the default executor.

    The DP central reference (docs/dp.md: one party holding the whole graph) is ``--clients 1``
    on the default executor: the party's encoder, noisy hop sums and head; edge-level DP spends
    the budget on the hop sums only.
    """
    from secure_fgl.experiment import run_experiment

    cfg = RunConfig(
        algorithm="fedgcn-gap",
        dataset="sbm",
        clients=1,
        mode="plain",
        rounds=2,
        seed=4,
        hidden=16,
        dp_epsilon=4.0,
        synthetic={"num_nodes": 120, "num_features": 12},
        options={"hops": 1},
    )
    result = run_experiment(cfg, progress=False)
    assert result["config"]["executor"] == "local" and result["num_clients"] == 1
    assert 0.0 <= result["final"]["test_acc"] <= 1.0 and "encoder_test_acc" in result["final"]
    p = result["privacy"]
    assert p["unit"] == "edge" and 0.99 * 4.0 <= p["total_epsilon"] <= 4.0
    assert [r["tag"] for r in p["releases"] if r["dp"]] == ["fedgcn-gap/hop/1"]


def test_encoder_mu_trains_the_encoder_as_fedprox_trains_the_mlp(run_small):
    """``--encoder-mu`` is FedProx on the encoder: after a round its weights are FedProx-MLP's (same mu, seed, data)."""
    from torch.nn.utils import parameters_to_vector

    from secure_fgl.algorithms.gap.ops import ENCODER_TAG

    fed = make_federated("sbm", num_clients=3, seed=0, num_nodes=120, num_features=12)
    base = dict(mode="plain", clients=3, rounds=1, local_epochs=5, seed=0)

    def weights(algorithm, options, encoder=False):
        run = run_small(RunConfig(algorithm=algorithm, model="mlp", options=options, **base), fed)
        if encoder:
            run.strategy.train_round(0, ENCODER_TAG)
        else:
            run.train(1)
        return [
            parameters_to_vector((run.logic(k).encoder if encoder else run.logic(k)).model.parameters())
            for k in range(3)
        ]

    gap = weights("fedgcn-gap", {"hops": 1, "encoder_mu": 5.0}, encoder=True)
    fedprox, fedavg = weights("fedprox", {"mu": 5.0}), weights("fedavg", {})
    assert all(torch.allclose(a, b) for a, b in zip(gap, fedprox))
    assert not any(torch.allclose(a, b) for a, b in zip(fedprox, fedavg))  # the term changes the training


def test_encoder_mu_with_dpsgd_is_refused_in_one_line():
    from secure_fgl.preflight import preflight
    from secure_fgl.validation import ConfigError

    options = {"encoder_mu": 0.1, "dpsgd": True}
    with pytest.raises(ConfigError, match="--encoder-mu .* drop it with --dpsgd"):
        preflight(RunConfig(algorithm="fedgcn-gap", dp_epsilon=4.0, options=options), check_data=False)


def test_head_local_epochs_sets_the_head_steps_and_leaves_the_encoder(run_small):
    """``--head-local-epochs`` sets the head's optimiser steps per round; the encoder keeps ``--local-epochs``."""
    from torch.nn.utils import parameters_to_vector

    fed = make_federated("sbm", num_clients=3, seed=0, num_nodes=120, num_features=12)
    base = dict(mode="plain", clients=3, rounds=2, local_epochs=3, seed=0)

    def adam_steps(optimizer) -> int:
        return int(max(float(s["step"]) for s in optimizer.state.values()))

    def one_head_round(**options):
        """Adam steps of the heads and of the encoders, the encoders' and the heads' weights after one head round."""
        run = run_small(RunConfig(algorithm="fedgcn-gap", model="mlp", options={"hops": 1, **options}, **base), fed)
        run.strategy.setup()
        run.strategy.train_round(0)
        logics = [run.logic(k) for k in range(3)]
        assert all(lg.data.train_mask.any() for lg in logics)
        return (
            {adam_steps(lg.optimizer) for lg in logics},
            {adam_steps(lg.encoder.optimizer) for lg in logics},
            [parameters_to_vector(lg.encoder.model.parameters()) for lg in logics],
            [parameters_to_vector(lg.model.parameters()) for lg in logics],
        )

    head_steps, encoder_steps, encoders, heads = one_head_round()
    assert head_steps == {3} and encoder_steps == {2 * 3}  # default: --local-epochs for both stages
    same = one_head_round(head_local_epochs=3)
    assert same[:2] == (head_steps, encoder_steps)
    assert all(torch.equal(a, b) for a, b in zip(encoders + heads, same[2] + same[3]))
    one_steps, one_encoder_steps, one_encoders, one_heads = one_head_round(head_local_epochs=1)
    assert one_steps == {1} and one_encoder_steps == {2 * 3}
    assert all(torch.equal(a, b) for a, b in zip(encoders, one_encoders))  # the encoder and its hops unchanged
    assert not any(torch.allclose(a, b) for a, b in zip(heads, one_heads))


def test_head_local_epochs_with_dpsgd_is_refused_in_one_line():
    from secure_fgl.preflight import preflight
    from secure_fgl.validation import ConfigError

    options = {"head_local_epochs": 1, "dpsgd": True}
    with pytest.raises(ConfigError, match="--head-local-epochs .* drop it with --dpsgd"):
        preflight(RunConfig(algorithm="fedgcn-gap", dp_epsilon=4.0, options=options), check_data=False)


def test_center_embeddings_subtracts_the_mean_unit_embedding_of_every_node(run_small):
    """``--center-embeddings``: each client's ``H_0``: its unit embeddings minus the mean over all nodes, renormalised.

    The mean comes from the secure weighted mean of the clients' own means (mask); it is checked against the mean
    of every node's unit embedding computed here in one place.  At edge level the exchange is no DP release: the
    budget goes to the hop sum only, and the mean touches no edge.
    """
    from secure_fgl.algorithms.gap.ops import MEAN_TAG, row_normalise
    from secure_fgl.experiment import run_experiment

    fed = make_federated("sbm", num_clients=3, seed=0, num_nodes=120, num_features=12)
    options = {"hops": 1, "center_embeddings": True}
    run = run_small(RunConfig(algorithm="fedgcn-gap", mode="mask", clients=3, rounds=2, seed=0, options=options), fed)
    run.strategy.setup()
    logics = [run.logic(k) for k in range(3)]
    units = [lg.unit_embeddings() for lg in logics]
    mean = torch.cat(units).mean(0)
    assert mean.norm() > 0.1  # ReLU embeddings share a direction: the centring is not vacuous
    for lg, u in zip(logics, units):
        assert torch.allclose(lg.embedding_mean, mean, atol=1e-6)
        assert torch.allclose(lg.hops[0], row_normalise(u - mean), atol=1e-5)

    cfg = RunConfig(
        algorithm="fedgcn-gap",
        mode="plain",
        clients=3,
        rounds=1,
        dp_epsilon=2.0,
        synthetic={"num_nodes": 120, "num_features": 12},
        options=options,
    )
    p = run_experiment(cfg, progress=False)["privacy"]
    assert p["claim_holds"] and 0.99 * 2.0 <= p["total_epsilon"] <= 2.0
    assert [r["tag"] for r in p["releases"] if r["dp"]] == ["fedgcn-gap/hop/1"]
    assert any(r["tag"] == MEAN_TAG and "edges" not in r["touches"] for r in p["releases"])


@pytest.mark.parametrize(("unit", "dpsgd"), [(None, True), ("node", True), ("client", False)])
def test_center_embeddings_beyond_edge_level_is_refused_in_one_line(unit, dpsgd):
    from secure_fgl.preflight import preflight
    from secure_fgl.validation import ConfigError

    options = {"center_embeddings": True, "dpsgd": dpsgd}
    cfg = RunConfig(algorithm="fedgcn-gap", dp_epsilon=4.0, dp_unit=unit, options=options)
    with pytest.raises(ConfigError, match="--center-embeddings .* edge-level DP only"):
        preflight(cfg, check_data=False)
