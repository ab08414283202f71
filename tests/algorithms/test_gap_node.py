"""Node-level GAP (``--dp-unit node`` for ``gap`` and ``fedgcn-gap``).

The out-degree bound holds after sampling (cross-client edges included), the run's one accountant composes the
node-level hop sums with the DP-SGD steps as Opacus does, central and federated GAP agree on one client with the
bound on and no noise, and a DP-SGD client never hands its un-noised loss to the server.
"""

from __future__ import annotations

import math

import pytest
import torch

from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.preflight import preflight
from secure_fgl.runtime.executor import LocalExecutor
from secure_fgl.runtime.wire import unpack

TINY = dict(
    dataset="sbm",
    rounds=2,
    local_epochs=2,
    seed=4,
    hidden=16,
    synthetic={"num_nodes": 120, "num_features": 12},
)


def test_no_node_enters_more_than_d_sums_after_sampling_cross_client_edges_included():
    """Every owner cuts its nodes' outgoing terms to D; what is kept is a subset of the graph's edges."""
    from secure_fgl.algorithms.gap.ops import bound_out_degree, degree_generator

    cfg = RunConfig(algorithm="fedgcn-gap", clients=4, mode="plain", **TINY).validate()
    fed, bound = load_federation(cfg), 2

    def terms(part) -> list[tuple[int, int]]:
        """(sender, receiving row) of every term a client adds to a hop sum, in global ids."""
        a, b = part.edge_index[:, part.edge_index[0] != part.edge_index[1]]
        g = part.global_ids
        return list(zip(g[b].tolist(), g[a].tolist())) + list(zip(*part.cross_edges.tolist()))

    before, after = set(), []
    for c in fed.clients:
        before.update(terms(c))
        after.extend(terms(bound_out_degree(c, bound, degree_generator(cfg.seed, c.client_id))))
    sent = torch.bincount(torch.tensor([s for s, _ in after]), minlength=120)
    degree = torch.bincount(torch.tensor([s for s, _ in before]), minlength=120)
    cross = {(int(s), int(r)) for c in fed.clients for s, r in zip(*c.cross_edges.tolist())}
    assert int(sent.max()) == bound and int(degree.max()) > bound  # the bound binds
    assert set(after) <= before and len(set(after)) == len(after)  # only real edges, none twice
    assert torch.equal(sent, degree.clamp(max=bound))  # a node keeps min(degree, D) of its edges
    assert cross & set(after) and cross - set(after)  # cross-client edges are sampled too


def test_node_level_gap_composes_hops_and_dpsgd_in_one_accountant_as_opacus_does(tmp_path):
    """Central GAP at node level: the degree bound, the hop's sqrt(D + 1) and the total against Opacus' RDP."""
    from opacus.accountants import RDPAccountant

    cfg = RunConfig(
        algorithm="gap",
        clients=1,
        mode="plain",
        dp_epsilon=4.0,
        dp_unit="node",
        dp_accountant="rdp",
        out=str(tmp_path),
        options={"hops": 1, "dpsgd": True, "max_degree": 3},
        **TINY,
    )
    privacy = run_experiment(cfg, progress=False)["privacy"]
    assert privacy["unit"] == "node" and privacy["units"] == ["node"] and privacy["claim_holds"]
    assert privacy["degree_bound"]["max_out_degree"] == 3
    hop = next(r for r in privacy["releases"] if r["tag"] == "fedgcn-gap/hop/1")
    assert hop["sensitivity"] == pytest.approx(math.sqrt(3 + 1), rel=1e-4)  # + the grid's rounding slack
    steps = {r["tag"]: r["releases"] for r in privacy["releases"] if r["tag"].endswith("dpsgd")}
    assert steps == {"gap/encoder/dpsgd": 4, "gap/dpsgd": 4}  # rounds x local epochs
    assert all(r["covered"] for r in privacy["releases"])
    opacus = RDPAccountant()
    opacus.history = [(t["noise_multiplier"], 1.0, t["releases"]) for t in privacy["per_tag"].values()]
    assert opacus.get_epsilon(delta=privacy["delta"]) == pytest.approx(privacy["total_epsilon"], rel=0.02)
    assert 3.96 <= privacy["total_epsilon"] <= 4.0


@pytest.mark.slow
def test_federated_node_level_gap_in_mask_states_its_claim_against_a_coalition(tmp_path):
    """fedgcn-gap at node level over three clients in mask: every release is node level and the claim holds.

    The guarantee against the server plus one colluding client is the run's epsilon (calibrated for it).  With one
    local epoch the DP-SGD steps are plain SGD whatever ``--optimizer`` says (Adam here), so the secure model mean
    carries each step's noise, split over the three clients.
    """
    cfg = RunConfig(
        algorithm="fedgcn-gap",
        clients=3,
        mode="mask",
        dp_epsilon=4.0,
        dp_unit="node",
        dp_colluders=1,
        out=str(tmp_path),
        options={"hops": 1, "dpsgd": True},
        **{**TINY, "local_epochs": 1, "optimizer": "adam"},
    )
    privacy = run_experiment(cfg, progress=False)["privacy"]
    assert privacy["claim_holds"] and privacy["units"] == ["node"] and privacy["degree_bound"]["max_out_degree"] == 10
    assert privacy["placement"] == "distributed"
    assert [r["noise_shares"] for r in privacy["releases"] if r["tag"].endswith("dpsgd")] == [3, 3]
    assert privacy["coalition"]["total_epsilon"] == pytest.approx(privacy["total_epsilon"])
    assert 3.96 <= privacy["total_epsilon"] <= 4.0


def test_central_and_federated_gap_agree_on_one_client_with_the_degree_bound_and_no_noise(tmp_path):
    """With the out-degree bound on and no noise, gap and fedgcn-gap on one client give the same output.

    The bound changes the hop sums (the unbounded run trains to other losses).
    """
    small = dict(clients=1, mode="plain", **TINY)
    runs = {
        (algorithm, bound): run_experiment(
            RunConfig(
                algorithm=algorithm,
                out=str(tmp_path / f"{algorithm}{bound}"),
                options={"hops": 1, **({"max_degree": bound} if bound else {})},
                **small,
            ),
            progress=False,
        )
        for algorithm, bound in (("gap", 1), ("fedgcn-gap", 1), ("gap", None))
    }
    central, federated, unbounded = runs["gap", 1], runs["fedgcn-gap", 1], runs["gap", None]
    assert [r["train_loss"] for r in central["rounds"]] == [r["train_loss"] for r in federated["rounds"]]
    for key in ("test_acc", "val_acc", "encoder_test_acc", "uses_head"):
        assert central["final"][key] == federated["final"][key]
    assert [r["train_loss"] for r in central["rounds"]] != [r["train_loss"] for r in unbounded["rounds"]]


def test_noise_free_node_level_dpsgd_learns_what_non_private_training_learns():
    """Node-level DP-SGD steps are plain SGD at the node default whatever ``--optimizer``/``--lr`` say.

    Without noise they train a sparse binary-feature MLP (per-node gradients above the clip) nearly as far as
    non-private Adam does in the same 30 steps; FedGCN's SGD at lr 0.5 on the clipped mean does not.
    """
    import numpy as np
    from torch.nn import functional as F

    from secure_fgl.algorithms.options import GAPOptions
    from secure_fgl.dpsgd import DPSGD
    from secure_fgl.models import build_model

    cfg = RunConfig(algorithm="gap", clients=1, mode="plain", optimizer="sgd", lr=0.5, dp_epsilon=8.0, dp_unit="node")
    step = GAPOptions(dpsgd=True).dpsgd_settings(cfg)
    assert (step.optimizer, step.momentum) == ("sgd", 0.0) and step.lr != cfg.lr
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (300,), generator=gen)
    x = (torch.rand(300, 200, generator=gen) < 0.02 + 0.06 * (torch.arange(200) % 4 == y[:, None])).float()
    train, test = torch.arange(300) < 60, torch.arange(300) >= 60

    def accuracy(make_optimizer, dpsgd: DPSGD | None) -> float:
        torch.manual_seed(1)
        model = build_model("mlp", 200, 16, 4, num_layers=2, dropout=0.0)
        optimizer = make_optimizer(model.parameters())
        for _ in range(30):
            optimizer.zero_grad()
            if dpsgd is not None:
                dpsgd.step(model, optimizer, np.zeros, x, None, y, train)
            else:
                F.cross_entropy(model(x, None)[train], y[train]).backward()
                optimizer.step()
        return float((model(x, None).argmax(1)[test] == y[test]).float().mean())

    non_private = accuracy(lambda p: torch.optim.Adam(p, lr=0.01), None)
    node_level = accuracy(lambda p: torch.optim.SGD(p, lr=step.lr, weight_decay=step.weight_decay), DPSGD(1.0))
    run_lr = accuracy(lambda p: torch.optim.SGD(p, lr=cfg.lr, weight_decay=cfg.weight_decay), DPSGD(1.0))
    assert node_level >= non_private - 0.1 and non_private > 0.45  # chance: 0.25
    assert run_lr < node_level - 0.1  # clipping shrinks every step: lr 0.5 under-trains


@pytest.mark.parametrize(
    "change, says",
    [
        ({"algorithm": "gap", "clients": 1, "options": {"hops": 1}}, "add --dpsgd"),
        ({"algorithm": "fedgcn-gap", "clients": 3, "options": {"dpsgd": True}}, "--mode mask"),
        ({"algorithm": "gap", "clients": 1, "options": {"hops": 1, "dpsgd_lr": 1.0}}, "--dpsgd-lr .* add --dpsgd"),
    ],
)
def test_node_level_gap_refuses_what_it_cannot_protect_before_work_starts(change, says):
    cfg = RunConfig(mode="plain", dp_epsilon=4.0, dp_unit="node", **{**TINY, **change})
    with pytest.raises(ConfigError, match=says):
        preflight(cfg, check_data=False)


class ReplyRecorder(LocalExecutor):
    """The server's view of every client's local-update reply."""

    def _call(self, method, requests):
        responses, lost = super()._call(method, requests)
        if method == "local_update":  # the frames as they reach the server
            self.replies = getattr(self, "replies", []) + [unpack(f) for f in responses.values()]
        return responses, lost


@pytest.mark.parametrize("dpsgd", [True, False])
def test_a_dpsgd_client_never_hands_its_raw_loss_to_the_server(dpsgd, tmp_path):
    """Under DP-SGD no local-update reply holds a loss (it is computed from un-noised gradients).

    Without DP-SGD the same replies carry it.
    """
    from secure_fgl.runtime.build import make_runtime_protocol, make_strategy

    dp = {"dp_epsilon": 4.0} if dpsgd else {}
    cfg = RunConfig(
        algorithm="fedgcn-gap", clients=2, mode="plain", options={"hops": 1, "dpsgd": dpsgd}, **dp, **TINY
    ).validate()
    executor = ReplyRecorder()
    fed = load_federation(cfg)
    strategy = make_strategy(cfg, fed, make_runtime_protocol(cfg, fed.num_clients, executor), cfg.options, executor)
    strategy.setup()
    row = strategy.train_round(0)
    assert len(executor.replies) == 2 * (cfg.rounds + 1) and all(r["trained"] for r in executor.replies)
    assert all(("loss" in r) is not dpsgd for r in executor.replies)
    assert ("train_loss" in row) is not dpsgd
