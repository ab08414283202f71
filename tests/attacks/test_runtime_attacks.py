"""The attack suite on the client runtimes.

``--executor local``. Each attacker reads what its party holds, asked of that party's runtime; the numbers equal the
golden run's.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from support.golden import assert_golden
from support.runs import attack_entries, attacked_config, graph_config

from attacks.parties import RuntimeParties
from attacks.runner import resolve_names, run_attacks
from secure_fgl.config import RunConfig
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor

#: the gradient inversions optimise for hundreds of iterations by default: their own test passes small settings
INVERSIONS = ("gradient_inversion", "gradient_inversion_aggregate", "gradient_inversion_isolated")
SMALL_INVERSION = {"iterations": 30, "restarts": 1}


def small(algorithm, mode, executor, attacks) -> RunConfig:
    """The shared small attacked run with only ``attacks`` on."""
    cfg = attacked_config(algorithm, mode, executor)
    cfg.attacks = list(attacks)
    return cfg


@pytest.mark.parametrize(
    "algorithm,mode", [("fedavg", "plain"), ("fedgcn", "mask"), ("fedgcn", "ckks"), ("fedomd", "plain")]
)
def test_local_executor_gives_the_golden_attack_numbers(algorithm, mode, request):
    """Every attack but the gradient inversions (tested below with small settings)."""
    names = [n for n in resolve_names(["all"], algorithm) if n not in INVERSIONS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = attack_entries(run_experiment(small(algorithm, mode, "local", names), progress=False))
    assert any(e.get("value") is not None for n, e in local.items() if n != "transcript_audit")
    assert_golden("runtime_attacks", request.node.name, {"attacks": local})


def _trained(cfg: RunConfig, executor=None):
    """A run of ``cfg`` trained on the local executor; returns what ``run_attacks`` reads."""
    cfg = cfg.validate()
    fed = load_federation(cfg)
    executor = executor or LocalExecutor()
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, {}, executor)
    strategy.setup()
    for rnd in range(cfg.rounds):
        strategy.train_round(rnd)
    return {"algo": strategy, "protocol": protocol, "fed": fed, "cfg": cfg}


def test_gradient_inversions_on_the_local_executor_with_small_settings_golden(request):
    """Gradient inversions on the local executor with small settings golden.

    The three inversions on a FedAvg run, with the iterations and restarts passed in (the defaults
    stay strong for users).
    """
    run = _trained(small("fedavg", "plain", "local", INVERSIONS))
    options = {name: SMALL_INVERSION for name in INVERSIONS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_attacks(list(INVERSIONS), options=options, **run)
    local = attack_entries({"attacks": out})
    assert all(local[n]["applicable"] and local[n]["value"] is not None for n in INVERSIONS), local
    assert_golden("runtime_attacks", request.node.name, {"attacks": local})


class SpyExecutor(LocalExecutor):
    """Logs which client each ``attack`` request goes to."""

    def __init__(self):
        super().__init__()
        self.asked: list[tuple[str, int]] = []

    def _call(self, method, requests):
        if method == "attack":
            from secure_fgl.runtime import wire

            self.asked += [(wire.unpack(r)["what"], k) for k, r in requests.items()]
        return super()._call(method, requests)


def test_a_client_attacker_is_answered_by_its_own_runtime_outside_the_transcript():
    cfg = attacked_config("fedgcn", "ckks", "local").validate()
    fed = load_federation(cfg)
    executor = SpyExecutor()
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, {}, executor)
    strategy.setup()
    strategy.train_round(0)
    before = len(protocol.transcript.messages)
    out = run_attacks(["fedgcn_client_subtraction", "coalition"], algo=strategy, protocol=protocol, fed=fed, cfg=cfg)
    assert len(protocol.transcript.messages) == before  # oracle access, not protocol messages
    by = {e["name"]: e for e in out}
    assert by["fedgcn_client_subtraction"]["applicable"] and by["coalition"]["value"] == 1.0
    # client:each -- every client is asked for its own data and decoded rows only; the coalition
    # [server, 0] asks client 0 for its keys
    assert sorted(executor.asked) == sorted(
        [(w, k) for k in range(3) for w in ("own_data", "received")] + [("keys", 0)]
    )
    own = RuntimeParties(strategy).own_data(1)
    assert torch.equal(own.x, fed.clients[1].x) and torch.equal(own.global_ids, fed.clients[1].global_ids)
    # a run without --attacks: the runtimes hand nothing to the attack suite
    executor.runtimes[1].cfg.attacks = []
    with pytest.raises(PermissionError, match="only in a run started with --attacks"):
        RuntimeParties(strategy).own_data(1)


@pytest.mark.slow  # ~8 s; graph-level parity also checked by hand (docs/runtime.md)
def test_graph_level_attacks_on_the_runtimes_give_the_golden_numbers(request):
    """Graph level attacks on the runtimes give the golden numbers.

    gc-fedavg (plain): the server's same-dataset inference and the GIN inversion that reads the
    victim's model (asked of the victim's runtime, built in its own GIN shape).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = attack_entries(
            run_experiment(
                graph_config("gc-fedavg", "plain", executor="local", rounds=3, attacks=["all"]), progress=False
            )
        )
    assert set(local) == {"transcript_audit", "gcfl_same_dataset", "gin_gradient_inversion", "graph_property"}
    assert local["gin_gradient_inversion"]["value"] is not None
    assert_golden("runtime_attacks", request.node.name, {"attacks": local})


def test_the_centralized_reference_is_attacked_on_the_default_executor_golden(request):
    """The centralized reference is attacked on the default executor golden.

    The one runtime holds the whole graph; each client's view is asked of it: the posteriors of the
    nodes the client owns and queries on its own subgraph (golden numbers: equal to the in-process
    algorithm's when they were recorded).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_experiment(attacked_config("centralized", "plain", "local"), progress=False)
    assert run["config"]["executor"] == "local"
    local = attack_entries(run)
    model_attacks = {n: local[n] for n in ("membership", "link_posterior", "link_influence")}
    assert all(e["applicable"] and e["value"] is not None and "error" not in e for e in model_attacks.values())
    assert_golden("runtime_attacks", request.node.name, {"attacks": model_attacks})
