"""The reproduction scripts' shared run loop (``examples/sweep.py``)."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from sweep import Job, cli_command, run_sweep  # noqa: E402

from secure_fgl.cli.main import build_parser, config_from_args  # noqa: E402
from secure_fgl.config import RunConfig  # noqa: E402


def _cfg(**kw) -> RunConfig:
    return RunConfig(
        **{
            **dict(
                algorithm="fgssl",
                dataset="sbm",
                clients=3,
                model="gat",
                hidden=16,
                heads=1,
                optimizer="sgd",
                momentum=0.9,
                lr=0.05,
                rounds=1,
                local_epochs=1,
                seed=3,
                options={"lambda_c": 1.0, "lambda_d": 2.0},
            ),
            **kw,
        }
    )


def test_cli_command_makes_the_same_run():
    cfg = _cfg(out="runs/somewhere")
    argv = shlex.split(cli_command(cfg))
    assert argv[:4] == ["python", "-m", "secure_fgl.cli.main", "run"]
    args, extra = build_parser().parse_known_args(argv[3:])
    again = config_from_args(args, extra)
    for f in dataclasses.fields(RunConfig):
        if f.name != "options":
            assert getattr(again, f.name) == getattr(cfg, f.name), f.name
    assert {k: float(v) for k, v in again.options.items()} == cfg.options


def test_run_sweep_runs_once_logs_and_cleans_up(tmp_path):
    jobs = [Job(tmp_path / "a", _cfg(), {"method": "FGSSL"}), Job(tmp_path / "b", _cfg(algorithm="fedavg", options={}))]
    done = []
    run_sweep(jobs, lambda job, r, s: done.append((job.dir.name, r["final"]["test_acc"])), log=tmp_path / "log.txt")
    assert [name for name, _ in done] == ["a", "b"]
    assert json.loads((tmp_path / "a" / "meta.json").read_text()) == {"method": "FGSSL"}
    assert not (tmp_path / "b" / "meta.json").exists()
    for d in ("a", "b"):
        assert (tmp_path / d / "result.json").exists() and not (tmp_path / d / "checkpoint.pt").exists()
    assert (tmp_path / "log.txt").read_text().splitlines() == [cli_command(j.cfg) for j in jobs]
    run_sweep(jobs, lambda *a: done.append(a))  # finished runs are skipped
    assert len(done) == 2


def test_run_sweep_resumes_a_run_from_its_checkpoint(tmp_path):
    from secure_fgl.experiment import run_experiment

    first = run_experiment(_cfg(out=str(tmp_path / "a")), progress=False)
    (tmp_path / "a" / "result.json").unlink()  # as if stopped after round 1 of 2
    assert (tmp_path / "a" / "checkpoint.pt").exists()
    done = []
    run_sweep([Job(tmp_path / "a", _cfg(rounds=2))], lambda job, r, s: done.append(r), log=tmp_path / "log.txt")
    assert len(done[0]["rounds"]) == 2
    assert done[0]["time"]["setup"] == first["time"]["setup"]  # restored, not measured again
    assert "--resume True" in (tmp_path / "log.txt").read_text()


def test_run_sweep_skips_or_raises_a_failing_run(tmp_path):
    bad = Job(tmp_path / "bad", _cfg(mode="no-such-mode"))
    run_sweep([bad], lambda *a: None)  # reported, the sweep goes on
    assert not (bad.dir / "result.json").exists()
    with pytest.raises(Exception, match="no-such-mode"):
        run_sweep([bad], lambda *a: None, skip_errors=False)


def test_amazon_coauthor_table_pairs_secure_with_plain_on_the_same_device():
    from fedgcn_amazon_coauthor import table

    row = dict(dataset="cs", rounds=100, method="2-hop", seconds=10.0)
    runs = [
        {**row, "mode": "plain", "seed": 0, "test_acc": 0.80},  # a row without a device: cpu
        {**row, "mode": "mask", "seed": 0, "device": "cpu", "test_acc": 0.80},
        {**row, "mode": "plain", "seed": 0, "device": "cuda:0", "test_acc": 0.70},
        {**row, "mode": "mask", "seed": 0, "device": "cuda:0", "test_acc": 0.71},
    ]
    lines = table(runs).splitlines()
    assert lines[0].split(" | ")[3] == "device"
    cpu, cuda = (next(ln for ln in lines if f"| {d} |" in ln) for d in ("cpu", "cuda"))
    assert "+0.00 (0.00)" in cpu and "+1.00 (1.00)" in cuda


def test_exchange_exactness_script_compares_every_received_total(tmp_path, monkeypatch, capsys):
    import fedgcn_exchange_exactness as ex

    out = tmp_path / "ex.jsonl"
    monkeypatch.setattr(sys, "argv", ["x", "--datasets", "sbm", "--modes", "mask", "--float-path", "--out", str(out)])
    ex.main()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["integer_fields"], r["bit_identical"]) for r in rows] == [(True, True), (False, True)]
    assert rows[0]["max_abs_diff"] == 0.0 and rows[1]["bytes_up"] > rows[0]["bytes_up"] > 0
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["x", "--table-only", "--out", str(out)])
    ex.main()
    assert "| sbm | 1 | 0 | mask | integer fields | 0.0e+00 | yes |" in capsys.readouterr().out


def test_secure_minus_plain_table_has_a_column_per_mode_and_names_the_rounds_that_differ():
    from secure_minus_plain import table

    def run(mode, seed, acc, loss):
        return dict(experiment="E", rounds=3, mode=mode, seed=seed, test_acc=acc[-1], trajectory=acc, train_loss=loss)

    runs = [
        run("plain", 0, [0.5, 0.6, 0.7], [1.0, 0.9, 0.8]),
        run("plain", 1, [0.5, 0.6, 0.8], [1.0, 0.9, 0.7]),
        run("mask", 0, [0.5, 0.6, 0.7], [1.0, 0.9, 0.8]),
        run("mask", 1, [0.5, 0.6, 0.8], [1.0, 0.9, 0.7]),
        run("ckks", 0, [0.5, 0.6, 0.7], [1.0, 0.9000001, 0.8]),  # one round's loss off plain's, accuracy equal
        {**run("ckks-mp", 0, [0.5, 0.61, 0.72], [1.0, 0.9, 0.8]), "trajectory": [0.5, 0.61, 0.72]},
    ]
    del runs[-1]["train_loss"]  # a run without losses recorded
    lines = table(runs).splitlines()
    header, row = lines[0].split(" | "), lines[2].split(" | ")
    assert header[4:7] == [
        "ckks − plain: best val / last",
        "mask − plain: best val / last",
        "ckks-mp − plain: best val / last",
    ]
    assert row[5] == "+0.00 (0.00) / +0.00 (0.00)"  # mask, both seeds
    assert row[4] == "+0.00 (0.00) / +0.00 (0.00) (seed 0 only)"
    assert row[6].startswith("+2.00 (2.00)")
    assert row[7] == "3/3, 6/6, 1/3" and row[8].rstrip(" |") == "2/3, 6/6, not recorded"
    assert "- E, seed 0, ckks, train loss: round 1 (plain ran 3 rounds, ckks 3)" in lines
    assert "- E, seed 0, ckks-mp, trajectory: rounds 1-2 (plain ran 3 rounds, ckks-mp 3)" in lines


def test_secure_minus_plain_puts_fedspray_and_fedomd_on_the_dirichlet_grid_in_their_own_settings():
    from secure_minus_plain import build_parser, plan

    args = build_parser().parse_args(
        "--algorithms fedspray fedomd --datasets cora --betas 1 --seeds 0 --other-seeds "
        "--fedspray-rounds 4 --fedomd-rounds 6 --modes plain ckks".split()
    )
    jobs = plan(args)
    assert [(name, cfg.mode) for name, _, cfg in jobs] == [
        ("FedSpray cora β=1", "plain"),
        ("FedSpray cora β=1", "ckks"),
        ("FedOMD cora β=1", "plain"),
        ("FedOMD cora β=1", "ckks"),
    ]
    spray, omd = jobs[0][2], jobs[2][2]
    for cfg in (spray, omd):
        assert (cfg.dataset, cfg.partition, cfg.beta, cfg.keep_largest) == ("cora", "dirichlet", 1.0, False)
    assert (spray.clients, spray.split, spray.rounds, spray.options) == (7, "fedspray", 4, {"backbone": "gcn"})
    assert (omd.clients, omd.split, omd.rounds, omd.lr) == (5, "fedomd", 6, 0.01)
