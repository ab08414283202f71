"""FedOMD and FedSpray as client runtimes.

The golden run (exact in plain/mask, within the CKKS tolerance in ckks), the same protocol bytes per tag, no shared
tensors between runtimes, resume from each client's checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.golden import assert_golden
from support.runs import attack_entries, attacked_config, reachable_tensors, small

from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.runtime import wire
from secure_fgl.runtime.build import make_runtime_protocol, make_strategy
from secure_fgl.runtime.executor import LocalExecutor
from secure_fgl.runtime.strategy import EVAL_TAG

#: (algorithm, mode, options): every statistics shape of FedOMD once (batched two-stage, one-stage raw
#: moments, per layer), FedSpray's encoder mean and class-wise proxy mean in each backend
CASES = [
    ("fedomd", "plain", {"raw_moments": True}),
    ("fedomd", "mask", {}),
    ("fedomd", "ckks", {"batch_stats": False, "stats_pass": "train"}),
    ("fedspray", "plain", {"gnn_dropout": 0.5, "proxy_weighting": "count"}),
    ("fedspray", "mask", {}),
    ("fedspray", "ckks", {}),
]
#: per-round metrics each algorithm adds to the train loss and accuracies
TERMS = {
    "fedomd": ("ce_loss", "ortho_loss", "cmd_loss"),
    "fedspray": ("teacher_test_acc", "minority_acc", "val_minority_acc"),
}


@pytest.mark.parametrize("algorithm,mode,options", CASES)
def test_local_executor_gives_the_golden_run_and_its_bytes(algorithm, mode, options, request):
    b = run_experiment(small(algorithm, mode, rounds=2, options=dict(options)), progress=False)
    keys = ("train_loss",) + TERMS[algorithm] + ("test_acc", "val_acc")
    observed = {"rounds": [[r[key] for key in keys] for r in b["rounds"]], "per_tag": b["comm"]["per_tag"]}
    if mode != "ckks":  # ckks: fresh encryption noise, equal within the exchanges' tolerance
        observed["final"] = {k: b["final"][k] for k in ("test_acc", "per_client", "minority_acc") if k in b["final"]}
    assert_golden(
        "runtime_fedomd_fedspray", request.node.name, observed, tolerance={"rounds": 1e-4} if mode == "ckks" else {}
    )
    stats = b["runtime"]["stats"]["per_method"]
    assert b["comm"]["per_tag"][EVAL_TAG]["bytes_up"] == stats["evaluate"]["bytes_from_clients"] > 0


@pytest.mark.parametrize("algorithm", ["fedomd", "fedspray"])
def test_a_runtime_holds_no_other_clients_tensors(algorithm):
    cfg = small(algorithm, "mask", rounds=1).validate()
    fed = load_federation(cfg)
    executor = LocalExecutor()
    strategy = make_strategy(cfg, fed, make_runtime_protocol(cfg, fed.num_clients, executor), {}, executor)
    strategy.setup()
    strategy.train_round(0)
    held = {k: reachable_tensors(rt) for k, rt in executor.runtimes.items()}
    driver = {t.untyped_storage().data_ptr() for c in fed.clients for t in (c.x, c.y, c.edge_index)}
    for k in held:
        assert executor.runtimes[k].data.x.untyped_storage().data_ptr() in held[k]
        assert not set(held[k]) & driver
        for j in held:
            assert j == k or not set(held[k]) & set(held[j]), f"runtime {k} shares a tensor with runtime {j}"


@pytest.mark.parametrize("algorithm", ["fedomd", "fedspray"])
def test_resume_continues_from_the_clients_checkpoints(algorithm, tmp_path):
    run = lambda out, rounds, **kw: run_experiment(
        small(
            algorithm,
            "plain",
            executor="local",
            rounds=rounds,  # noqa
            out=str(tmp_path / out),
            **kw,
        ),
        progress=False,
    )
    full = run("a", 3)
    run("b", 2)
    resumed = run("b", 3, resume=True)
    assert [r["train_loss"] for r in resumed["rounds"]] == [r["train_loss"] for r in full["rounds"]]
    assert all(
        resumed["final"][k] == full["final"][k]
        for k in ("test_acc", "best_round", "per_client", "minority_acc")
        if k in full["final"]
    )


class AnswerLog(LocalExecutor):
    """Keeps every unpacked answer to ``contribute`` (what the server side receives outside the protocol)."""

    answers: list = []

    def _call(self, method, requests):
        responses, lost = super()._call(method, requests)
        if method == "contribute":
            self.answers = self.answers + [wire.unpack(r) for r in responses.values()]
        return responses, lost


@pytest.mark.parametrize("algorithm", ["fedomd", "fedspray"])
def test_server_gets_only_vector_lengths_the_statistics_and_proxies_stay_in_the_halves(algorithm):
    """Server gets only vector lengths the statistics and proxies stay in the halves.

    mask: the halves (and keys) live in the runtimes; a contribution leaves its client only as masked
    protocol messages, the strategy is answered the public vector length and nothing else.
    """
    cfg = small(algorithm, "mask", executor="local", rounds=1).validate()
    fed = load_federation(cfg)
    executor = AnswerLog()
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, {}, executor)
    strategy.setup()
    strategy.train_round(0)
    assert protocol.clients == {}
    assert executor.answers and all(set(a) == {"length"} for a in executor.answers)
    tags = {"fedomd": {"fedomd/stats/mean", "fedomd/stats/moments", "fedomd/model"}, "fedspray": {"fedspray/batch"}}[
        algorithm
    ]  # encoder and proxies in one upload
    uploads = [
        m for m in protocol.transcript.messages if m.tag in tags and m.receiver == "server" and m.kind != "control"
    ]
    assert {m.tag for m in uploads} == tags  # every value upload masked; the rest is key agreement
    assert {m.kind for m in uploads} == {"masked", "public_key", "share"}


@pytest.mark.parametrize("algorithm", ["fedomd", "fedspray"])
def test_attack_suite_on_the_runtimes_gives_the_golden_numbers(algorithm, request):
    """Attack suite on the runtimes gives the golden numbers.

    plain: the label-distribution attacks read the statistics / proxies off the transcript; the
    posterior attacks ask each client's runtime for its deployed model's output.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        local = attack_entries(run_experiment(attacked_config(algorithm, "plain", "local"), progress=False))
    assert local[f"{algorithm}_label_dist"]["applicable"]
    assert_golden("runtime_fedomd_fedspray", request.node.name, {"attacks": local})


@pytest.mark.parametrize("algorithm", ["fedomd", "fedspray"])
def test_client_lost_inside_a_statistics_or_proxy_exchange_is_a_mask_dropout(algorithm):
    """Client lost inside a statistics or proxy exchange is a mask dropout.

    Client 1 vanishes before a masked upload of round 0 (FedOMD: its second, the moments stage;
    FedSpray: its first, the round's batch of encoder update and proxies): the server half recovers the survivors' sum, the run goes on
    without client 1, whose later exchanges it is no longer asked for.
    """
    from support.runs import FlakyExecutor, run_with

    executor = FlakyExecutor(victim=1, method="half:masked_upload", nth={"fedomd": 2, "fedspray": 1}[algorithm])
    with pytest.warns(RuntimeWarning, match=r"client\(s\) \[1\] lost in half:masked_upload of round 0"):
        strategy, protocol, rows = run_with(small(algorithm, "mask"), executor)
    assert [r["clients_lost"] for r in rows] == [1, 1, 1] and protocol.last_included == (0, 2)
    assert all(np.isfinite(r["train_loss"]) for r in rows)
    assert {r["client"] for r in strategy.evaluate()["per_client"]} == {0, 2}
