"""Dropouts at every protocol stage of every mode (``--simulate-dropouts``, secure_fgl/runtime/dropouts.py).

The matrix drops k clients at one stage of one dense exchange and checks the backend's answer
against its dropout policy: a client dropped before its contribution counted is excluded and the
survivors get the exact sum over the clients the server says it included; one dropped after
(unmask, download) is included but gets no result; past the backend's tolerance (mask: fewer than
t survivors; ckks-mp: any dropout, n-of-n; t-out-of-n ckks-mp (``ckks-mp:t=3``): more than n - t at
key set-up, upload or key switching; every mode: a client missing at key registration; the key dealer of ckks's
and mask's set-up) a DropoutError names the missing clients and no client gets a result.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from protocols import DropoutError, ValueSpec, make_protocol
from protocols.errors import InconsistentViewError
from secure_fgl.cli.main import main
from secure_fgl.config import ConfigError, RunConfig
from secure_fgl.experiment import load_federation, run_experiment
from secure_fgl.runtime.build import make_executor, make_runtime_protocol, make_strategy
from secure_fgl.runtime.dropouts import DropoutSchedule, DroppingLink, DropRule, drop_stages, parse_dropouts
from secure_fgl.runtime.exchange import dense_result, plan_dense, run_server_half

SPEC = ValueSpec(max_abs=1.0, tolerance=1e-4)
LENGTH = 24

#: what a dropout at each stage does: 'fatal' (DropoutError naming the dropped clients, nothing
#: delivered), 'excluded' (not a contributor: the survivors' sum), 'undelivered' (its contribution
#: is in the sum, it gets no result)
POLICY = {
    "plain": {"register": "fatal", "upload": "excluded", "download": "undelivered"},
    "mask": {
        "register": "fatal",
        "group_seed": "fatal",
        "advertise_keys": "excluded",
        "share_keys": "excluded",
        "masked_upload": "excluded",
        "consistency": "undelivered",
        "unmask": "undelivered",
        "download": "undelivered",
    },
    "ckks": {"register": "fatal", "key_setup": "fatal", "upload": "excluded", "download": "undelivered"},
    "ckks-mp": {
        "register": "fatal",
        "key_setup": "fatal",
        "upload": "fatal",
        "keyswitch": "fatal",
        "download": "undelivered",
    },
    # t-out-of-n (threshold 3 of 4): a client gone at key set-up or before its upload is left out, a key
    # switcher gone is replaced
    "ckks-mp:t=3": {
        "register": "fatal",
        "key_setup": "excluded",
        "upload": "excluded",
        "keyswitch": "undelivered",
        "download": "undelivered",
    },
}
#: stages only the set-up dealer (client 0) answers: ckks's key pair, mask's output-mask group seed
DEALER_STAGES = {("ckks", "key_setup"), ("mask", "group_seed")}
CLIENTS = {"plain": 5, "mask": 5, "ckks": 4, "ckks-mp": 4, "ckks-mp:t=3": 4}


def backend(mode: str) -> tuple[str, dict]:
    """``mode`` of the matrix -> (the backend's mode, its options): ``ckks-mp:t=3`` is t-out-of-n ckks-mp."""
    name, _, t = mode.partition(":t=")
    return name, ({"threshold": int(t)} if t else {})


def tolerance(mode: str, stage: str, n: int) -> int:
    """The most dropouts at ``stage`` after which the exchange still completes."""
    if POLICY[mode][stage] == "fatal":
        return 0
    if mode == "mask" and stage != "download":  # Shamir threshold t = n // 2 + 1
        return n - (n // 2 + 1)
    threshold = backend(mode)[1].get("threshold")
    if threshold is not None and stage in ("key_setup", "upload", "keyswitch"):
        return n - threshold
    return n - 1 if POLICY[mode][stage] == "excluded" else n


def dropped_sets(mode: str, stage: str, n: int) -> list[tuple[int, ...]]:
    if (mode, stage) in DEALER_STAGES:
        return [(0,)]
    t = tolerance(mode, stage, n)
    counts = sorted({1, max(t, 1), min(t + 1, n)})
    return [tuple(range(n - k, n)) for k in counts] + [(0,)]


def exchange(mode: str, n: int, spec: str):
    """One dense sum of every client's vector to every client, clients dropping by ``spec``."""
    name, options = backend(mode)
    proto = make_protocol(name, n, **options)
    schedule = DropoutSchedule(parse_dropouts(spec, n, name))
    proto.link = DroppingLink(proto.link, schedule)
    rng = np.random.default_rng(n)
    x = {k: rng.uniform(-1, 1, LENGTH) for k in range(n)}
    for k, half in proto.clients.items():
        half.provider = lambda plan, v=x[k]: plan.dense_table(v)
    return proto, schedule, x, plan_dense(proto, "t/drop", 0, range(n), range(n), LENGTH, SPEC)


def delivered(proto) -> dict[int, np.ndarray]:
    out = {}
    for k, half in proto.clients.items():
        try:
            out[k] = dense_result(half.result(), LENGTH)
        except DropoutError:
            pass
    return out


def check_case(mode: str, stage: str, dropped: tuple[int, ...]) -> None:
    n = CLIENTS[mode]
    proto, schedule, x, ctx = exchange(mode, n, ",".join(map(str, dropped)) + ",@" + stage)
    survivors = tuple(k for k in range(n) if k not in dropped)
    if len(dropped) > tolerance(mode, stage, n):
        with pytest.raises(DropoutError) as err:
            run_server_half(proto, ctx)
        named = getattr(err.value, "clients", None)
        if named is not None:
            assert set(named) == set(dropped)
        else:  # registration and the dealer's set-up: the first one
            assert f"client {min(dropped)} did not" in str(err.value)
        assert delivered(proto) == {}
    else:
        included = run_server_half(proto, ctx)
        assert included == (survivors if POLICY[mode][stage] == "excluded" else tuple(range(n)))
        got = delivered(proto)
        assert sorted(got) == list(survivors)
        for total in got.values():
            np.testing.assert_allclose(total, sum(x[k] for k in included), atol=1e-3)
    assert schedule.events == {(0, stage): list(dropped)}  # the dropout happened, at that stage


CASES = [(m, s, d) for m in POLICY for s in POLICY[m] for d in dropped_sets(m, s, CLIENTS[m])]


@pytest.mark.parametrize("mode,stage,dropped", CASES)
def test_dropout_at_every_stage(mode, stage, dropped):
    check_case(mode, stage, dropped)


def test_the_matrix_covers_every_stage_a_dense_exchange_calls():
    """The matrix covers every stage a dense exchange calls.

    Every stage of each mode is in the policy table, except those a dense sum never calls
    (block ids: the sparse layout; report: a value published in the clear; release: the commitment
    to rows released per recipient, tests/protocols/test_release_view.py).
    """
    for mode, policy in POLICY.items():
        new = set(drop_stages(backend(mode)[0])) - set(policy) - {"block_ids", "report", "release"}
        assert not new, f"{mode} has stage(s) {sorted(new)}: add what a dropout there does to POLICY"


# ---------------------------------------------------------------------- the spec
def test_spec_parses_counts_ids_stages_and_rounds():
    assert parse_dropouts("2@upload", 10, "plain") == (DropRule((8, 9), "upload"),)
    assert parse_dropouts("2@upload:r3", 10, "mask", rounds=5) == (DropRule((8, 9), "masked_upload", 3, 3),)
    assert parse_dropouts(" 1,4@unmask:r1-2 ; 3,@download", 10, "mask") == (
        DropRule((1, 4), "unmask", 1, 2),
        DropRule((3,), "download"),
    )


@pytest.mark.parametrize(
    "spec,message",
    [
        ("two@upload", "expected WHO@STAGE"),
        ("2@unmask", "mode ckks has no stage 'unmask'"),
        ("11@upload", "a count of 1..10"),
        ("1,12@upload", r"client id\(s\) \[12\] out of range"),
        ("1@upload:r7", "rounds must be an increasing range in 0..4"),
        ("1@upload:r3-1", "increasing range"),
        (";", "empty spec"),
    ],
)
def test_bad_spec_is_one_clear_error(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_dropouts(spec, 10, "ckks", rounds=5)


def test_bad_spec_exits_2_before_any_work(capsys, tmp_path):
    code = main(
        [
            "run",
            "--mode",
            "mask",
            "--clients",
            "3",
            "--rounds",
            "1",
            "--simulate-dropouts",
            "2@keyswitch",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "mode mask has no stage 'keyswitch'" in err[0]
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------- runtimes
def small(mode: str, spec: str, **kw) -> RunConfig:
    return RunConfig(
        algorithm="fedavg",
        dataset="sbm",
        clients=4,
        mode=mode,
        simulate_dropouts=spec,
        synthetic={"num_nodes": 240, "num_features": 32},
        **{"rounds": 2, **kw},
    ).validate()


def test_runtime_mask_drops_in_its_round_only_and_then_sits_out():
    """Runtime mask drops in its round only and then sits out.

    Client 3 drops at its masked upload of round 0 (on the client runtimes, local executor): mask
    recovers the sum of the 3 survivors (t = 3 of 4).  Silent to the end of the round, it got no
    download of round 0's mean update, which each client adds to its model: it answers again in
    round 1 but trains on another model from then on, so it contributes no more (the clients bind
    every broadcast each contributor received, protocols/broadcast_view.py).
    """
    cfg = small("mask", "3,@upload:r0")
    fed = load_federation(cfg)
    executor = make_executor(cfg)
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, {}, executor)
    try:
        strategy.train_round(0)
        assert protocol.last_included == (0, 1, 2) and protocol.server.last_undelivered == (3,)
        strategy.train_round(1)
        assert protocol.last_included == (0, 1, 2) and strategy.lost == {} and strategy.out_of_sync == {3}
    finally:
        executor.shutdown()
    assert executor.describe()["simulated_dropouts"]["dropped"] == [
        {"round": 0, "stage": "masked_upload", "clients": [3]}
    ]


def test_runtime_mask_a_client_silent_only_at_the_download_sits_out(tmp_path):
    """Runtime mask a client silent only at the download sits out.

    Client 3 answers every stage of round 0's model exchange but its download: its update is in
    round 0's sum (it counted) but it got no result, so the server puts it out of sync and rounds 1
    and 2 sum the others only, instead of refusing (InconsistentViewError) with it in.  The set is
    in the checkpoint (``--resume`` keeps it out).
    """
    cfg = small("mask", "3,@download:r0", rounds=3, out=str(tmp_path / "run"))
    fed = load_federation(cfg)
    executor = make_executor(cfg)
    protocol = make_runtime_protocol(cfg, fed.num_clients, executor)
    strategy = make_strategy(cfg, fed, protocol, {}, executor)
    try:
        strategy.train_round(0)
        assert protocol.last_included == (0, 1, 2, 3) and protocol.server.last_undelivered == (3,)
        assert strategy.out_of_sync == {3}
        for rnd in (1, 2):
            strategy.train_round(rnd)
            assert protocol.last_included == (0, 1, 2) and protocol.server.last_undelivered == ()
        assert strategy.lost == {} and strategy.out_of_sync == {3}
        state = strategy.state_dict()
        strategy.out_of_sync = set()
        strategy.load_state_dict(state)
        assert state["out_of_sync"] == [3] and strategy.out_of_sync == {3}
    finally:
        executor.shutdown()


def test_protocol_a_missed_download_is_known_to_the_server_and_later_sums_without_it_are_exact():
    """Protocol a missed download is known to the server and later sums without it are exact.

    The server half records who left a download unanswered; the next broadcast sums without
    that client are exact in mask, and with it they are refused (its chain of broadcasts differs).
    """
    n, rnd = 4, [0]
    proto = make_protocol("mask", n, roles={"t/model": "broadcast"})
    proto.link = DroppingLink(proto.link, DropoutSchedule(parse_dropouts("3,@download:r0", n, "mask")), lambda: rnd[0])
    rng = np.random.default_rng(1)
    for r, contributors in ((0, range(n)), (1, range(3)), (2, range(3))):
        rnd[0] = r
        x = {k: rng.uniform(-1, 1, LENGTH) for k in range(n)}
        for k, half in proto.clients.items():
            half.provider = lambda plan, v=x[k]: plan.dense_table(v)
        included = run_server_half(proto, plan_dense(proto, "t/model", r, contributors, range(n), LENGTH, SPEC))
        assert proto.server.last_undelivered == ((3,) if r == 0 else ())
        got = delivered(proto)
        assert sorted(got) == ([0, 1, 2] if r == 0 else list(range(n)))
        for total in got.values():
            np.testing.assert_allclose(total, sum(x[k] for k in included), atol=1e-3)
    rnd[0] = 3
    with pytest.raises(InconsistentViewError):
        run_server_half(proto, plan_dense(proto, "t/model", 3, range(n), range(n), LENGTH, SPEC))


def test_runtime_ckks_mp_a_missed_model_download_stops_the_run_naming_the_client():
    """Runtime ckks-mp a missed model download stops the run naming the client.

    Every ckks-mp client key-switches every exchange bound to the models it received: the round
    whose download client 3 missed stops with a DropoutError, not the next with a view mismatch.
    """
    with pytest.raises(DropoutError, match=r"client\(s\) \[3\] got no result of this model broadcast") as err:
        run_experiment(small("ckks-mp", "3,@download:r0"), progress=False)
    assert err.value.round == 0


def test_runtime_ckks_mp_dropout_is_a_clean_error_naming_the_client():
    with pytest.raises(DropoutError, match=r"client\(s\) 3 did not send its key-switching"):
        run_experiment(small("ckks-mp", "1@keyswitch:r1"), progress=False)


def test_result_json_records_the_spec_and_the_dropouts(tmp_path):
    result = run_experiment(small("ckks", "2@upload", out=str(tmp_path / "run")), progress=False)
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["config"]["simulate_dropouts"] == "2@upload"
    assert (
        saved["runtime"]["simulated_dropouts"]
        == result["runtime"]["simulated_dropouts"]
        == {
            "rules": [{"clients": [2, 3], "stage": "upload", "rounds": "all"}],
            # out of sync after missing round 0's model, 2 and 3 upload no more (nothing to drop at in round 1)
            "dropped": [{"round": 0, "stage": "upload", "clients": [2, 3]}],
        }
    )


def test_bench_dropout_column_measures_the_survivors_round():
    from secure_fgl.bench.runtime import dropout_counts, dropout_round

    assert dropout_counts(10) == (0, 1, 4) and dropout_counts(100) == (0, 1, 49)
    full, recovered = (dropout_round("mask", 5, k, features=16, nodes=200) for k in (0, 2))
    assert (full["included"], recovered["included"]) == (5, 3)
    assert recovered["bytes_up"] < full["bytes_up"] and recovered["server_s"] > 0


def test_bench_run_keeps_the_runs_executor_for_its_statistics():
    """The runtime bench reads the executor of the run it timed (its statistics, the per-message overhead)."""
    from secure_fgl.bench import runtime as bench

    s = {"nodes": 200, "features": 8, "rounds": 1}
    rec = bench.one_run("local", "mask", 3, s, load_federation(bench._config("local", "mask", 3, s, 1)), 1)
    assert rec["executor_stats"]["messages"] > 0 and rec["per_message_overhead_s"] > 0


def test_bench_dropout_column_runs_t_of_n_ckks_mp_up_to_n_minus_t_dropouts():
    from secure_fgl.bench.runtime import dropout_counts, dropout_round

    assert dropout_counts(10, 7) == (0, 1, 3) and dropout_counts(10, 10) == (0,)
    full, recovered = (dropout_round("ckks-mp", 4, k, features=16, nodes=200, threshold=3) for k in (0, 1))
    assert full["mode"] == recovered["mode"] == "ckks-mp:t=3"
    assert (full["included"], recovered["included"]) == (4, 3)
    assert recovered["bytes_up"] < full["bytes_up"] and recovered["round_cpu_s"] > 0


def test_cli_threshold_ckks_mp_runs_on_without_a_client_missing_at_key_set_up(tmp_path, capsys):
    """Cli threshold ckks-mp runs on without a client missing at key set-up.

    ``--threshold 3`` of 4 clients, client 3 silent at the key set-up: the run finishes on the other three, and
    ``result.json`` names client 3 lost with the reason; two clients missing there (past n - t) stop the run with a
    DropoutError naming both, before any round.
    """
    run = ["run", "--algorithm", "fedavg", "--mode", "ckks-mp", "--threshold", "3", "--clients", "4", "--quiet"]
    with pytest.warns(RuntimeWarning, match=r"client\(s\) \[3\] lost in half:key_setup of round 0"):
        assert main([*run, "--rounds", "2", "--simulate-dropouts", "3,@key_setup", "--out", str(tmp_path / "ok")]) == 0
    saved = json.loads((tmp_path / "ok" / "result.json").read_text())
    assert saved["final"]["rounds_run"] == 2 and list(saved["final"]["clients_lost"]) == ["3"]
    assert "did not finish the ckks-mp key set-up" in saved["final"]["clients_lost"]["3"]
    assert [c["client"] for c in saved["final"]["per_client"]] == [0, 1, 2]
    assert saved["runtime"]["simulated_dropouts"]["dropped"] == [{"round": 0, "stage": "key_setup", "clients": [3]}]
    capsys.readouterr()
    with pytest.warns(RuntimeWarning, match="did not finish the ckks-mp key set-up"):
        assert main([*run, "--rounds", "1", "--simulate-dropouts", "2@key_setup", "--out", str(tmp_path / "no")]) != 0
    assert "client(s) 2, 3 did not send its public keys" in capsys.readouterr().err


@pytest.mark.parametrize("mode,extra", [("mask", {}), ("ckks-mp", {"threshold": 4})])
def test_fedgcn_dp_survives_a_pre_training_dropout_within_the_provisioned_dropouts(mode, extra, tmp_path):
    """FedGCN with DP on its neighbour sums, client 4 of 5 dropped at the pre-training upload.

    Each contributor adds ``sigma / sqrt(max(1, n - d - c))`` of the noise (distributed placement): with
    ``--dp-dropouts 0`` the survivors' sum would be short of noise, so the exchange is refused naming client 4 and
    nothing is written; with ``--dp-dropouts 1`` the run completes, ``final.pretrain_dropouts`` records the
    dropout, client 4 is lost for the run (its data enters no later release) and the sums are one release spending
    the asked epsilon.
    """
    sums = "fedgcn/neighbour_sums"
    run = dict(
        algorithm="fedgcn",
        mode=mode,
        dataset="sbm",
        clients=5,
        rounds=2,
        synthetic={"num_nodes": 300, "num_features": 40},
        dp_epsilon=4.0,
        dp_clip=3.0,
        dp_exchanges=sums,
        simulate_dropouts="4,@upload:r0",
        **extra,
    )
    with pytest.raises(DropoutError, match=r"client\(s\) 4 .*short of DP noise \(--dp-dropouts\)") as err:
        run_experiment(RunConfig(**run, out=str(tmp_path / "short")).validate(), progress=False)
    assert err.value.clients == (4,) and not (tmp_path / "short" / "result.json").exists()
    with pytest.warns(RuntimeWarning, match=r"client\(s\) \[4\] lost"):
        run_experiment(RunConfig(**run, dp_dropouts=1, out=str(tmp_path / "ok")).validate(), progress=False)
    saved = json.loads((tmp_path / "ok" / "result.json").read_text())
    assert saved["final"]["pretrain_dropouts"] == {
        "left_out": [4],
        "without_inputs": [4],
        "graph": "induced by the nodes of clients [0, 1, 2, 3]",
    }
    assert list(saved["final"]["clients_lost"]) == ["4"] and saved["final"]["rounds_run"] == 2
    privacy = saved["privacy"]
    assert privacy["per_tag"][sums]["releases"] == 1 and privacy["coalition"]["dropouts"] == 1
    assert privacy["total_epsilon"] == privacy["per_tag"][sums]["epsilon"] == pytest.approx(4.0, rel=1e-2)
    assert privacy["total_epsilon"] <= privacy["epsilon_budget"] == 4.0


@pytest.mark.slow
def test_simulated_dropouts_over_flower_give_the_local_run(tmp_path):
    """``--simulate-dropouts`` over ``--executor flower`` is the local run.

    Four clients behind their SuperNodes on 127.0.0.1, client 3 dropped at the masked upload of round 1: the same
    clients drop at the same stage (recorded alike in ``result.json``), the round is the survivors' sum (mask
    recovery) and the run's losses, accuracy and protocol bytes equal the local run's.
    """
    pytest.importorskip("flwr", reason="the flower extra is not installed: pip install -e '.[flower]'")
    from support.flower import Federation, serving

    local = run_experiment(small("mask", "3,@upload:r1"), progress=False)
    with serving(Federation(tmp_path, clients=4)):
        flower = run_experiment(small("mask", "3,@upload:r1", executor="flower", round_timeout=60), progress=False)
    assert flower["runtime"]["executor"] == "flower"
    assert flower["runtime"]["simulated_dropouts"] == local["runtime"]["simulated_dropouts"]
    assert local["runtime"]["simulated_dropouts"]["dropped"] == [{"round": 1, "stage": "masked_upload", "clients": [3]}]
    assert [r["train_loss"] for r in flower["rounds"]] == [r["train_loss"] for r in local["rounds"]]
    assert flower["final"]["test_acc"] == local["final"]["test_acc"]
    assert flower["comm"]["per_tag"] == local["comm"]["per_tag"]


def test_a_client_dropped_at_upload_over_some_rounds_ends_alike_in_every_mode():
    """A client dropped at upload in rounds 1-2 of 4 ends with the same model in plain, mask and t-of-n ckks-mp.

    Client 3 drops at its upload in round 1 (so it misses that model broadcast too) and would answer
    again in round 3: in every mode it keeps training its own model, is out of sync from round 1 on
    and neither contributes to nor receives a later model sum, so every round's loss
    and every client's final accuracy are the plain run's.  Positive control: without the dropout
    the plain run's losses differ.
    """
    spec = "3,@upload:r1-2"
    modes = (("plain", "plain", {}), ("mask", "mask", {}), ("ckks-mp:t=3", "ckks-mp", {"threshold": 3}))
    runs = {name: run_experiment(small(mode, spec, rounds=4, **extra), progress=False) for name, mode, extra in modes}
    control = run_experiment(small("plain", "3,@upload:r3", rounds=4), progress=False)

    def losses(result):
        return [r["train_loss"] for r in result["rounds"]]

    def per_client(result):
        return [(c["client"], c["train_acc"], c["val_acc"], c["test_acc"]) for c in result["final"]["per_client"]]

    plain = runs.pop("plain")
    # out of sync after round 1, it has no upload of round 2 to drop at
    assert plain["runtime"]["simulated_dropouts"]["dropped"] == [{"round": 1, "stage": "upload", "clients": [3]}]
    for name, result in runs.items():
        assert losses(result) == pytest.approx(losses(plain), abs=1e-6), name
        assert per_client(result) == per_client(plain), name
    assert losses(control)[1:] != pytest.approx(losses(plain)[1:], abs=1e-6)
