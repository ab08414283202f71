"""Run identity in reports and run folders.

Run identity: a report never mixes runs made with other settings, a finished run is never
silently overwritten, unfinished runs are left out (and counted) by every reader.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from secure_fgl.cli.main import main as cli_main
from secure_fgl.config import RunConfig
from secure_fgl.report.cli import main as report_main
from secure_fgl.report.sweep import resolve
from secure_fgl.results import load_runs as load_frame
from secure_fgl.run_identity import differences, fingerprint, identity, stored_run

SYNTH = json.dumps({"num_nodes": 120, "num_features": 20, "avg_degree": 4})


def _report(out, rounds, *extra):
    return report_main(
        [
            "--algorithms",
            "fedgcn",
            "--datasets",
            "sbm",
            "--modes",
            "plain,mask",
            "--seeds",
            "2",
            "--rounds",
            str(rounds),
            "--clients",
            "3",
            "--partition",
            "iid",
            "--attacks",
            "none",
            "--synthetic",
            SYNTH,
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]
    )


def _rounds_of(folder):
    return json.loads((folder / "result.json").read_text())["config"]["rounds"]


def test_a_schema_1_result_with_dp_split_loads_under_the_new_name_and_keeps_its_fingerprint(tmp_path, capsys):
    """A schema 1.x ``config.dp_split`` reads as ``dp_budget_share``; the rename changes no fingerprint."""
    shares = "fedgcn/neighbour_sums=3,fedgcn/model=1"
    old = {"rounds": 2, "seed": 0, "dp_epsilon": 4.0, "dp_split": shares, "options": {"hops": 1}}
    new = {"rounds": 2, "seed": 0, "dp_epsilon": 4.0, "dp_budget_share": shares, "options": {"hops": 1}}
    hashed = {"dp_epsilon": 4.0, "dp_split": shares, "options": {"hops": 1.0}, "rounds": 2.0}  # seed 0: the default
    under_first_name = hashlib.sha256(json.dumps(hashed, sort_keys=True, separators=(",", ":")).encode())
    assert fingerprint(old) == fingerprint(new) == under_first_name.hexdigest()[:16]
    assert identity(old) == identity(new) and not differences(old, new)
    run = tmp_path / "old-run"
    run.mkdir()
    result = {"schema_version": "1.2", "status": "complete", "config": old, "final": {"test_acc": 0.5}}
    (run / "result.json").write_text(json.dumps(result))
    frame = load_frame(tmp_path)
    assert frame["config.dp_budget_share"].tolist() == [shares] and "config.dp_split" not in frame
    assert cli_main(["compare", str(tmp_path)]) == 0 and "old-run" in capsys.readouterr().out


def test_a_setting_added_later_at_its_default_keeps_the_stored_fingerprint(tmp_path):
    """A config written before a setting existed hashes as one with the setting at its default."""
    full = resolve(RunConfig(rounds=2, clients=3))
    before = {k: v for k, v in full.items() if k != "keyswitch_batch_mb"}
    assert full["keyswitch_batch_mb"] is None and fingerprint(before) == fingerprint(full)
    assert fingerprint({**full, "keyswitch_batch_mb": 64}) != fingerprint(full)
    run = tmp_path / "old-run"
    run.mkdir()
    stale = {"status": "complete", "config": before, "config_fingerprint": "0" * 16}
    (run / "result.json").write_text(json.dumps(stale))
    assert stored_run(run)["fingerprint"] == fingerprint(full)  # recomputed from the stored config


def test_fingerprint_ignores_where_files_go_and_names_what_differs():
    a = {"rounds": 20, "seed": 0, "out": "x", "device": "cpu", "options": {"hops": 1}, "beta": 1}
    b = {**a, "out": "y", "device": "cuda", "beta": 1.0}
    assert fingerprint(a) == fingerprint(b) and "out" not in identity(a)
    c = {**a, "rounds": 5, "options": {"hops": 2}}
    assert fingerprint(c) != fingerprint(a)
    assert differences(a, c) == ["rounds: 20 -> 5", "options.hops: 1 -> 2"]


@pytest.mark.usefixtures("png_figures")
def test_a_sweep_with_other_settings_into_the_same_out_never_mixes_runs(tmp_path, capsys):
    """A sweep with other settings into the same out never mixes runs.

    The scenario: an interrupted sweep (one run stopped during its attacks), then a
    sweep with other rounds into the same --out.
    """
    out = tmp_path / "rep"
    assert _report(out, 3) == 0
    first = sorted(p.name for p in out.iterdir() if (p / "result.json").exists())
    assert len(first) == 4 and all(_rounds_of(out / f) == 3 for f in first)
    interrupted = out / first[0] / "result.json"
    result = json.loads(interrupted.read_text())
    interrupted.write_text(json.dumps({**result, "status": "attacks_running"}))
    capsys.readouterr()

    assert _report(out, 2) == 0  # other rounds: nothing of the first sweep is reused
    text = capsys.readouterr().out
    assert "0 finished run(s) reused" in text and "holds other settings (rounds: 3 -> 2)" in text
    assert "plan: estimate" in text and "from 3 past run(s) in --out" in text  # the unfinished one not counted
    assert "sweep: 4 run(s) done, 0 reused" in text
    assert all(_rounds_of(out / f) == 3 for f in first)  # the first sweep's runs are untouched
    md = (out / "report.md").read_text()
    assert "4 finished run(s)" in md and "| rounds | 2 |" in md and "| rounds | 3 |" not in md
    assert "Left out: 4 run folder(s) of other sweeps" in md

    assert _report(out, 3) == 0  # back to the first settings: its finished runs return
    text = capsys.readouterr().out
    assert "3 finished run(s) reused (same settings), 1 to run (1 unfinished, run again)" in text
    assert json.loads(interrupted.read_text())["status"] == "complete"
    md = (out / "report.md").read_text()
    assert "| rounds | 3 |" in md and "| rounds | 2 |" not in md and "4 finished run(s)" in md

    assert _report(out, 3, "--dry-run") == 0  # the plan only
    text = capsys.readouterr().out
    assert "plan: 4 finished run(s) reused (same settings), 0 to run" in text and "nothing to run" in text
    assert "sweep:" not in text


def _tiny_run_config(tmp_path, rounds=1):
    cfg = tmp_path / f"run{rounds}.toml"
    cfg.write_text(
        f"rounds = {rounds}\nclients = 3\npartition = 'iid'\nmode = 'plain'\n"
        "[synthetic]\nnum_nodes = 120\nnum_features = 20\navg_degree = 4\n"
    )
    return str(cfg)


def test_run_refuses_a_finished_folder_without_overwrite_and_a_resume_with_other_settings(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert cli_main(["run", "--config", _tiny_run_config(tmp_path), "--out", out, "--quiet"]) == 0
    capsys.readouterr()
    assert cli_main(["run", "--config", _tiny_run_config(tmp_path), "--out", out, "--quiet"]) == 2
    assert "holds a finished run; add --overwrite" in capsys.readouterr().err
    assert cli_main(["run", "--config", _tiny_run_config(tmp_path, 2), "--out", out, "--resume", "--quiet"]) == 2
    assert "holds a run with other settings (rounds: 1 -> 2)" in capsys.readouterr().err
    assert cli_main(["run", "--config", _tiny_run_config(tmp_path, 2), "--out", out, "--overwrite", "--quiet"]) == 0
    assert _rounds_of(tmp_path / "run") == 2


def test_unfinished_runs_are_left_out_and_counted(tmp_path, capsys):
    done = tmp_path / "runs" / "a"
    assert cli_main(["run", "--config", _tiny_run_config(tmp_path), "--out", str(done), "--quiet"]) == 0
    stopped = tmp_path / "runs" / "b"
    shutil.copytree(done, stopped)
    result = json.loads((stopped / "result.json").read_text())
    (stopped / "result.json").write_text(json.dumps({**result, "status": "attacks_running"}))
    assert "at_chance" in result["final"] and result["config_fingerprint"] == fingerprint(result["config"])
    with pytest.warns(UserWarning, match="left out 1 unfinished run"):
        df = load_frame(tmp_path / "runs")
    assert len(df) == 1 and df.attrs["left_out_unfinished"] == 1
    assert len(load_frame(tmp_path / "runs", include_unfinished=True)) == 2
    capsys.readouterr()
    assert cli_main(["compare", str(tmp_path / "runs")]) == 0
    text = capsys.readouterr().out
    assert "left out 1 unfinished run(s)" in text and str(stopped) not in text.splitlines()[1]


def test_results_of_the_removed_inline_executor_are_still_read(tmp_path, capsys):
    """result.json files an older version wrote with ``executor: inline`` load and compare beside current ones."""
    done = tmp_path / "runs" / "local"
    assert cli_main(["run", "--config", _tiny_run_config(tmp_path), "--out", str(done), "--quiet"]) == 0
    old = tmp_path / "runs" / "inline"
    shutil.copytree(done, old)
    result = json.loads((old / "result.json").read_text())
    result["config"]["executor"] = "inline"
    result.pop("runtime", None)
    (old / "result.json").write_text(json.dumps(result))
    df = load_frame(tmp_path / "runs")
    assert len(df) == 2
    capsys.readouterr()
    assert cli_main(["compare", str(tmp_path / "runs")]) == 0
    assert str(old) in capsys.readouterr().out


def test_time_after_a_resume_counts_every_session(tmp_path):
    """A resumed run's total covers the sessions before it: never less than its phases."""
    from secure_fgl.config import RunConfig
    from secure_fgl.experiment import run_experiment

    base = dict(
        algorithm="fedavg",
        mode="plain",
        clients=3,
        partition="iid",
        out=str(tmp_path),
        synthetic={"num_nodes": 120, "num_features": 20, "avg_degree": 4},
    )
    first = run_experiment(RunConfig(rounds=2, **base), progress=False)["time"]
    t = run_experiment(RunConfig(rounds=4, resume=True, **base), progress=False)["time"]
    assert t["total"] >= t["setup"] + t["train"] + t["eval"]  # train is cumulative: so is the total
    assert t["total"] > first["total"]  # the first session's time is kept


def test_report_states_settings_per_cell_when_they_differ():
    from secure_fgl.report.tables import settings_of_runs

    def run(mode, rounds):
        return {
            "config": {
                "algorithm": "fedgcn",
                "dataset": "sbm",
                "mode": mode,
                "dp_epsilon": None,
                "seed": 0,
                "rounds": rounds,
                "clients": 3,
                "options": {"hops": 1},
            }
        }

    common, per_cell = settings_of_runs([run("plain", 20), run("plain", 5), run("mask", 5)])
    assert common == {"clients": "3", "options of fedgcn": "{hops=1}"}
    assert per_cell.header[-1] == "rounds"
    assert [r[2:] for r in per_cell.rows] == [["mask", "∞", "5"], ["plain", "∞", "20 | 5"]]


def test_a_run_at_chance_says_so_on_its_own_line():
    from secure_fgl.cli.summary import format_summary
    from secure_fgl.results import accuracy_at_chance

    assert accuracy_at_chance(0.178, 6) and not accuracy_at_chance(0.6, 6) and accuracy_at_chance(0.5, None) is None
    result = {
        "config": {
            "algorithm": "fedgcn",
            "dataset": "citeseer",
            "mode": "mask",
            "dp_epsilon": 4.0,
            "dp_delta": 1e-5,
            "dp_placement": "auto",
        },
        "num_clients": 10,
        "device": "cpu",
        "num_classes": 6,
        "final": {"test_acc": 0.178, "val_acc": 0.2, "best_round": 3, "rounds_run": 50, "at_chance": True},
        "comm": {"per_tag": {}, "bytes_up": 0, "bytes_down": 0},
        "time": {},
        "privacy": None,
    }
    lines = format_summary(result).splitlines()
    assert any(line.startswith("AT CHANCE: test accuracy 0.1780") for line in lines)
