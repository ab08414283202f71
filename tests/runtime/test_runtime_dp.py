"""DP on the client runtimes.

Each client clips and noises its own contribution with its own OS-keyed keystream; the driver's one accountant
composes the releases as in the golden runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from support.golden import assert_golden
from support.runs import small

from protocols import PrivacyBudgetError
from protocols.csprng import SecureRandom
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor

#: FedGCN: edge-level noise on the neighbour sums only, terms clipped to 4 (binary rows keep 15 ones)
SUMS_ONLY = dict(dp_exchanges="fedgcn/neighbour_sums", options={"dp_row_clip": 4.0})


def dp_run(algorithm, mode, eps, executor="local", **kw):
    return run_experiment(small(algorithm, mode, executor=executor, dp_epsilon=eps, lr=0.1, **kw), progress=False)


@pytest.mark.parametrize(
    "algorithm,mode,extra",
    [
        ("fedavg", "mask", {}),
        ("fedgcn", "mask", SUMS_ONLY),
        ("fedgcn", "plain", SUMS_ONLY),
        ("fedgcn", "ckks", SUMS_ONLY),
        ("fedgcn-gap", "ckks", {}),
    ],
)
def test_runtime_spends_the_budget_and_reports_the_golden_privacy_section(algorithm, mode, extra, request):
    b = dp_run(algorithm, mode, 4.0, **extra)["privacy"]
    assert_golden("runtime_dp", request.node.name, {"privacy": b})  # unit, releases, noise multipliers, epsilon ...
    assert b["total_epsilon"] == pytest.approx(4.0, rel=1e-2)
    assert b["placement"] == ("local" if mode == "plain" else "distributed")
    assert {r["tag"] for r in b["releases"] if r["dp"]} == set(b["per_tag"])


@pytest.mark.parametrize("algorithm,mode,extra", [("fedavg", "mask", {}), ("fedgcn", "plain", SUMS_ONLY)])
def test_at_a_huge_epsilon_the_runtime_trains_as_the_golden_run(algorithm, mode, extra, request):
    """At a huge epsilon the runtime trains as the golden run.

    Noise negligible: the clipped DP pipeline on the runtimes learns what the golden run learned
    (fresh noise each run: test accuracy measured 0.38-0.47 over repeats; chance is 0.2).
    """
    run = dp_run(algorithm, mode, 1e6, rounds=8, **extra)
    assert_golden(
        "runtime_dp",
        request.node.name,
        {"train_loss": [r["train_loss"] for r in run["rounds"]], "test_acc": run["final"]["test_acc"]},
        tolerance={"train_loss": 1e-2, "test_acc": 0.1},
    )
    assert run["final"]["test_acc"] > 0.25


def test_a_client_refuses_to_upload_without_noise():
    """A server asking for a noise-free DP release (std 0) gets a refusal, not the clipped values."""
    from protocols import PrivacyBudgetError
    from secure_fgl.runtime.dp import ClientNoise
    from secure_fgl.runtime.messages import PrivatizeIns

    ask = PrivatizeIns("t", 0, 0.0, clip=1.0, per_row=False, integer=False)
    with pytest.raises(PrivacyBudgetError, match="positive, finite std"):
        ClientNoise().privatize((np.ones(4),), ask)
    noisy = ClientNoise().privatize((np.ones(4),), dataclasses.replace(ask, std=1e-3))[0]
    assert np.linalg.norm(noisy) == pytest.approx(1.0, abs=0.01)  # clipped to 1 on the client, then noised


@pytest.mark.parametrize(
    "algorithm,mode", [("fedomd", "plain"), ("fedomd", "mask"), ("fedspray", "plain"), ("fedspray", "mask")]
)
def test_statistics_and_means_are_privatised_on_the_clients_golden(algorithm, mode, request):
    """Statistics and means are privatised on the clients golden.

    FedOMD's hidden statistics and FedSpray's encoder and class-wise proxy means: the same releases,
    calibration and epsilon as the golden run, each client noising with its own keystream.
    """
    b = dp_run(algorithm, mode, 4.0, rounds=2)["privacy"]
    assert_golden("runtime_dp", request.node.name, {"privacy": b})
    assert b["total_epsilon"] == pytest.approx(4.0, rel=1e-2)
    tags = set(b["per_tag"])
    expected = (
        {"fedomd/model", "fedomd/hidden1/mean", "fedomd/hidden1/moments"}
        if algorithm == "fedomd"
        else {"fedspray/encoder", "fedspray/proxies"}
    )
    assert expected <= tags and all(b["per_tag"][t]["releases"] == 2 for t in expected)


@pytest.mark.parametrize("algorithm", ["fedgcn", "fedomd", "fedspray"])
def test_noise_is_drawn_in_each_runtime_and_not_from_the_seed(algorithm):
    extra = SUMS_ONLY if algorithm == "fedgcn" else {}
    cfg = small(algorithm, "mask", executor="local", dp_epsilon=4.0, lr=0.1, rounds=2, **extra).validate()

    def train(check_sources: bool) -> list[float]:
        """Both rounds' train losses, the driver unable to draw noise."""
        fed = load_federation(cfg)
        executor = LocalExecutor()
        protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
        strategy = make_strategy(cfg, fed, protocol, {}, executor)
        protocol.dp._noise = None  # the driver draws no noise: any draw there would fail
        strategy.setup()
        losses = [strategy.train_round(0)["train_loss"]]
        if check_sources:
            sources = [rt.logic.noise._rng for rt in executor.runtimes.values()]
            assert all(isinstance(s, SecureRandom) for s in sources) and len({id(s) for s in sources}) == len(sources)
            per_tag = protocol.dp.accountant.report()["per_tag"]
            assert per_tag and all(t["releases"] == 1 for t in per_tag.values())
        losses.append(strategy.train_round(1)["train_loss"])
        executor.shutdown()
        return losses

    # the same seed twice: different noise, so different training
    assert train(check_sources=True)[1:] != train(check_sources=False)[1:]


#: fedgcn-gap --dpsgd: the encoder and the head trained by DP-SGD, 2 local steps a round
DPSGD = dict(options={"dpsgd": True}, rounds=2, local_epochs=2)


def test_dpsgd_runs_on_the_runtimes_and_reports_the_golden_privacy_section(request):
    runs = {"local": dp_run("fedgcn-gap", "mask", 4.0, **DPSGD)}
    assert runs["local"]["config"]["executor"] == "local"
    b = runs["local"]["privacy"]
    assert_golden("runtime_dp", request.node.name, {"privacy": b})
    steps = {r["tag"]: r["releases"] for r in b["releases"] if r.get("unit") == "sample"}
    assert steps == {"fedgcn-gap/encoder/dpsgd": 4, "fedgcn-gap/dpsgd": 4}  # rounds x local epochs
    assert b["total_epsilon"] == pytest.approx(4.0, rel=1e-2)
    assert runs["local"]["runtime"]["stats"]["per_method"]["local_update"]["calls"] == 4  # encoder + head rounds


def test_dpsgd_noise_is_drawn_by_each_client_and_sized_by_the_driver():
    from secure_fgl.algorithms.gap.ops import ENCODER_TAG

    cfg = small("fedgcn-gap", "mask", executor="local", dp_epsilon=4.0, **DPSGD).validate()
    fed = load_federation(cfg)
    executor = LocalExecutor()
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, cfg.options, executor)
    protocol.dp._noise = None  # the driver draws no noise: any draw there would fail
    ask = strategy.local_update_request(0, ENCODER_TAG)
    assert ask.dpsgd_tag == "fedgcn-gap/encoder/dpsgd" and len(ask.dpsgd_std) == 2 and min(ask.dpsgd_std) > 0
    strategy.train_round(1, ENCODER_TAG)
    assert protocol.dp.accountant.releases("fedgcn-gap/encoder/dpsgd") == 4
    sources = [rt.logic.noise._rng for rt in executor.runtimes.values()]
    assert all(isinstance(s, SecureRandom) for s in sources) and len({id(s) for s in sources}) == len(sources)
    with pytest.raises(PrivacyBudgetError, match="positive, finite std"):  # a client refuses a noise-free step
        executor.runtimes[0].logic.local_update(dataclasses.replace(ask, round=2, dpsgd_std=[0.0, 1.0]))
