"""The secure-fgl command, in-process.

Runs, config files, presets, discovery, and one-line errors with exit code 2 for every bad input (a table of them).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from secure_fgl.cli.main import build_parser, config_from_args, main

SMALL = "dataset = 'sbm'\n[synthetic]\nnum_nodes = 200\nnum_features = 32\nnum_classes = 3\n"


@pytest.fixture
def small_cfg(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def _run_small(tmp_path, small_cfg, *extra, out="run"):
    return main(
        [
            "run",
            "--algorithm",
            "fedavg",
            "--mode",
            "plain",
            "--clients",
            "3",
            "--rounds",
            "3",
            "--partition",
            "iid",
            "--out",
            str(tmp_path / out),
            "--quiet",
            "--config",
            str(small_cfg),
            *extra,
        ]
    )


def test_run_plain_fedavg_writes_result(tmp_path, small_cfg, capsys):
    assert _run_small(tmp_path, small_cfg) == 0
    out = capsys.readouterr().out
    assert "test accuracy" in out and "fedavg/model" in out and "None" not in out
    assert "privacy: no DP" in out and f"result: {tmp_path / 'run'}/result.json" in out
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["config"]["algorithm"] == "fedavg" and len(res["rounds"]) == 3


def test_config_file_mirrors_flags_and_flags_override(tmp_path, capsys):
    path = tmp_path / "run.toml"
    path.write_text(
        "algorithm = 'local'\nmode = 'plain'\nclients = 2\nrounds = 2\npartition = 'iid'\n"
        "[synthetic]\nnum_nodes = 150\nnum_features = 16\nnum_classes = 2\n"
    )
    assert main(["run", "--config", str(path), "--rounds", "3", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    res = json.loads((tmp_path / "o" / "result.json").read_text())
    assert res["config"]["algorithm"] == "local" and res["config"]["rounds"] == 3


def test_names_are_case_insensitive():
    from secure_fgl.preflight import preflight

    cfg = config_from_args(
        *build_parser().parse_known_args(
            ["run", "--algorithm", "FedAvg", "--mode", "CKKS", "--optimizer", "SGD", "--dataset", "CORA"]
        )
    )
    preflight(cfg)
    assert (cfg.algorithm, cfg.mode, cfg.optimizer, cfg.dataset) == ("fedavg", "ckks", "sgd", "cora")


def test_optional_numeric_flags_are_parsed_as_numbers():
    args, extra = build_parser().parse_known_args(
        ["run", "--dp-epsilon", "8", "--patience", "3", "--dp-row-clip", "4.5"]
    )
    cfg = config_from_args(args, extra)
    from secure_fgl.algorithms import get_spec
    from secure_fgl.preflight import check_options

    check_options(cfg, get_spec(cfg.algorithm).options)
    assert cfg.dp_epsilon == 8.0 and isinstance(cfg.dp_epsilon, float)
    assert cfg.patience == 3 and cfg.options["dp_row_clip"] == 4.5


def test_keyswitch_batch_flag_and_config_key_reach_the_ckks_mp_protocol(tmp_path):
    """``--keyswitch-batch-mb`` (config key ``keyswitch-batch-mb``) sets the protocol's ``keyswitch_batch_bytes``.

    Unset, the protocol keeps its default and its public options (the setup's bytes) do not name it.
    """
    from protocols.ckks_mp.backend import KEYSWITCH_BATCH_BYTES
    from secure_fgl.runtime.build import make_run_protocol

    (tmp_path / "run.toml").write_text("mode = 'ckks-mp'\nclients = 3\nkeyswitch-batch-mb = 8\n")
    runs = {
        "flag": ["run", "--mode", "ckks-mp", "--clients", "3", "--keyswitch-batch-mb", "64"],
        "config": ["run", "--config", str(tmp_path / "run.toml")],
        "unset": ["run", "--mode", "ckks-mp", "--clients", "3"],
    }
    protocols = {}
    for name, argv in runs.items():
        cfg = config_from_args(*build_parser().parse_known_args(argv))
        protocols[name] = make_run_protocol(cfg, cfg.clients)
    assert protocols["flag"].keyswitch_batch_bytes == 64 << 20
    assert protocols["flag"].public_options()["keyswitch_batch_bytes"] == 64 << 20
    assert protocols["config"].keyswitch_batch_bytes == 8 << 20
    assert protocols["unset"].keyswitch_batch_bytes == KEYSWITCH_BATCH_BYTES
    assert "keyswitch_batch_bytes" not in protocols["unset"].public_options()


def test_datasets_lists_every_dataset(data_root, capsys):
    assert main(["datasets", "--data-root", str(data_root)]) == 0
    out = capsys.readouterr().out
    for name in ("cora", "citeseer", "pubmed", "mutag", "sbm"):
        assert name in out.lower()
    assert "yes" in out


# --------------------------------------------------------------------------- bad input table
BAD = [
    # names (case-insensitive, with suggestions)
    (["run", "--algorithm", "nope"], "--algorithm"),
    (["run", "--algorithm", "fedgc"], "did you mean fedgcn"),
    (["run", "--dataset", "nope"], "nope"),
    (["run", "--dataset", "mutag"], "graph-classification"),
    (["run", "--mode", "nope"], "--mode"),
    (["run", "--mode", "CKK"], "did you mean ckks"),
    (["run", "--partition", "dirichlett"], "did you mean dirichlet"),
    (["run", "--model", "gcnn"], "did you mean gcn"),
    (["run", "--optimizer", "sgdd"], "did you mean sgd"),
    (["run", "--dp-placement", "central"], "--dp-placement"),
    (["run", "--split", "publc"], "did you mean public"),
    (["run", "--device", "gpu"], "--device"),
    (["run", "--attacks", "membershp"], "did you mean membership"),
    (["run", "--attacks", "all,nope"], "nope"),
    (["run", "--log", "csvv"], "did you mean csv"),
    (["run", "--preset", "fedgcn-tabel2"], "did you mean fedgcn-table2"),
    (["run", "--lrr", "0.1"], "did you mean --lr"),
    (["runn"], "did you mean run"),
    (["algorithms", "fedgcm"], "did you mean fedgcn"),
    (["--versio"], "--versio"),
    # types and ranges of run flags
    (["run", "--clients", "0"], "--clients"),
    (["run", "--clients", "abc"], "whole number"),
    (["run", "--clients", "2.5"], "whole number"),
    (["run", "--rounds", "0"], "--rounds"),
    (["run", "--rounds", "-3"], "--rounds"),
    (["run", "--local-epochs", "0"], "--local-epochs"),
    (["run", "--lr", "-1"], "--lr"),
    (["run", "--lr", "0"], "--lr"),
    (["run", "--lr", "abc"], "number"),
    (["run", "--lr", "nan"], "finite"),
    (["run", "--weight-decay", "-0.1"], "--weight-decay"),
    (["run", "--seed", "-1"], "--seed"),
    (["run", "--dropout", "1.5"], "--dropout"),
    (["run", "--dropout", "-0.1"], "--dropout"),
    (["run", "--hidden", "0"], "--hidden"),
    (["run", "--num-layers", "0"], "--num-layers"),
    (["run", "--beta", "0"], "--beta"),
    (["run", "--beta", "-1"], "--beta"),
    (["run", "--resolution", "0"], "--resolution"),
    (["run", "--client-fraction", "0"], "--client-fraction"),
    (["run", "--client-fraction", "1.5"], "--client-fraction"),
    (["run", "--patience", "0"], "--patience"),
    (["run", "--dp-epsilon", "0"], "--dp-epsilon"),
    (["run", "--dp-epsilon", "-1"], "--dp-epsilon"),
    (["run", "--dp-delta", "0"], "--dp-delta"),
    (["run", "--dp-delta", "2"], "--dp-delta"),
    (["run", "--dp-clip", "0"], "--dp-clip"),
    (["run", "--dp-exchanges", "fedgcn/neighbour_sums"], "--dp-epsilon"),
    (["run", "--dp-budget-share", "fedgcn/model=1"], "--dp-epsilon"),
    # renamed settings: the old flag or config key names the new one
    (["run", "--dp-epsilon", "4", "--dp-split", "fedgcn/model=1"], "renamed --dp-budget-share"),
    (["run", "--dp-epsilon", "4", "--dp-split=fedgcn/model=1"], "renamed --dp-budget-share"),
    (["run", "--config", "{tmp}/renamed.toml"], "renamed --dp-budget-share"),
    (["run", "--keep-largest", "maybe"], "true or false"),
    # algorithm options
    (["run", "--algorithm", "fedavg", "--hops", "2"], "--hops"),
    (["run", "--hops", "3"], "--hops"),
    (["run", "--layout", "diagonal"], "--layout"),
    (["run", "--row-order", "random"], "--row-order"),
    (["run", "--degree-cap", "0"], "--degree-cap"),
    (["run", "--dp-level", "graph"], "--dp-level"),
    (["run", "--norm", "l2"], "--norm"),
    (["run", "--feature-bound", "0"], "--feature-bound"),
    (["run", "--dp-row-clip", "abc"], "--dp-row-clip"),
    (["run", "--algorithm", "fedomd", "--stats-nodes", "bogus"], "--stats-nodes"),
    (["run", "--algorithm", "fedomd", "--stats-pass", "test"], "--stats-pass"),
    (["run", "--algorithm", "fedomd", "--cmd-order", "0"], "--cmd-order"),
    (["run", "--algorithm", "fedomd", "--act-low", "1", "--act-high", "0"], "--act-low"),
    (["run", "--algorithm", "fedomd", "--orthogonal", "maybe"], "--orthogonal"),
    (["run", "--algorithm", "fedspray", "--backbone", "gat"], "--backbone"),
    (["run", "--algorithm", "fedspray", "--phase-epochs", "0"], "--phase-epochs"),
    (["run", "--algorithm", "fedspray", "--proxy-weighting", "uniform"], "--proxy-weighting"),
    (["run", "--algorithm", "fedprox", "--mu", "-1"], "--mu"),
    (["run", "--algorithm", "fedprox", "--mu", "abc"], "--mu"),
    (["run", "--algorithm", "gcfl", "--eps1", "-1"], "--eps1"),
    (["run", "--algorithm", "gcflplus", "--seq-length", "0"], "--seq-length"),
    (["run", "--algorithm", "gcfl", "--mode", "mask"], "--mode ckks"),
    (["run", "--mode", "mask", "--keyswitch-batch-mb", "64"], "use --mode ckks-mp"),
    (["run", "--mode", "ckks-mp", "--keyswitch-batch-mb", "0"], "--keyswitch-batch-mb"),
    (["run", "--algorithm", "gcfl", "--dataset", "cora"], "graph-classification dataset"),
    # folders, files, leftovers
    (["run", "--resume"], "--resume"),
    (["run", "--resume", "--out", "{tmp}/empty"], "no checkpoint"),
    (["run", "--resume", "--out", "{tmp}/corrupt"], "corrupt"),
    (["run", "--out", "{tmp}/a_file"], "is a file"),
    (["run", "--config", "{tmp}/missing.toml"], "does not exist"),
    (["run", "--config", "{tmp}/syntax.toml"], "not valid TOML"),
    (["run", "--config", "{tmp}/wrongtype.toml"], "--clients"),
    (["run", "--config", "{tmp}/unknown.toml"], "did you mean lr"),
    (["run", "--config", "{tmp}/notes.txt"], ".toml"),
    (["run", "--config", "{tmp}/list.json"], "table"),
    (["run", "--dataset", "cora", "--data-root", "/nonexistent/secure_fgl_root"], "/nonexistent/secure_fgl_root"),
    (["run", "extra"], "extra"),
    (["bench"], "--suite"),
    (["bench", "--suite", "nope"], "--suite"),
    (["compare", "/nonexistent/runs"], "no result.json"),
    (["plot", "/nonexistent/run"], "no result.json"),
    (["datasets", "--bogus"], "--bogus"),
    (["report", "--algorithms", "fedgcn", "--datasets", "coraa", "--out", "{tmp}/rep"], "did you mean cora"),
    (
        ["report", "--datasets", "sbm", "--options", '{"fedgcn": {"hopz": 1}}', "--out", "{tmp}/rep"],
        "did you mean --hops",
    ),
    (["run", "--mode", "plain", "--model", "gat", "--rounds", "1"], "--model gcn"),
    # found only once the graph is loaded (its size): still one line (--quiet: no progress lines)
    (["run", "--mode", "plain", "--algorithm", "fedavg", "--clients", "100000", "--quiet"], "100000"),
]


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "syntax.toml").write_text("clients = = 3\n")
    (tmp_path / "wrongtype.toml").write_text("clients = 'ten'\n")
    (tmp_path / "unknown.toml").write_text("lrr = 0.1\n")
    (tmp_path / "renamed.toml").write_text('dp-epsilon = 4\ndp-split = "fedgcn/model=1"\n')
    (tmp_path / "notes.txt").write_text("clients = 3\n")
    (tmp_path / "list.json").write_text("[1, 2]")
    return tmp_path


def test_bad_input_table_has_at_least_60_cases():
    assert len(BAD) >= 60


@pytest.mark.parametrize("args, needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(args, needle, bad_files, capsys, monkeypatch):
    monkeypatch.chdir(bad_files)  # a run that slipped through would write here, not in runs/
    argv = [a.replace("{tmp}", str(bad_files)) for a in args]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err
    lines = [ln for ln in captured.err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and re.match(r"secure-fgl( report)?: error: ", lines[0]), captured.err
    assert needle.lower() in lines[0].lower(), lines[0]


# --------------------------------------------------------------------------- help, discovery, presets
def test_help_and_version_do_not_import_torch():
    code = (
        "import sys; from secure_fgl.cli.main import main; "
        "assert main(['run', '--help']) == 0 and main(['--version']) == 0; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "fedgcn options" in proc.stdout and "--hops HOPS" in proc.stdout and "secure-fgl 0" in proc.stdout


def test_run_help_is_grouped_and_every_option_has_its_own_help(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for group in (
        "data:",
        "federation:",
        "model:",
        "training:",
        "privacy:",
        "secure mode:",
        "output:",
        "attacks:",
        "fedomd options",
    ):
        assert group in out
    from secure_fgl.algorithms import SPECS

    helps: dict[str, str] = {}  # one line per flag (algorithms may share an option)
    for name, spec in SPECS.items():
        for f in dataclasses.fields(spec.options):
            assert f.metadata.get("help"), f"{name} --{f.name} has no help line"
            helps.setdefault(f.name, f.metadata["help"])
    assert len(set(helps.values())) == len(helps)
    assert "gcfl options" in out and "--eps1 EPS1" in out and "--seq-length SEQ_LENGTH" in out


def test_model_names_match_the_model_registry():
    from secure_fgl.config import MODEL_NAMES
    from secure_fgl.models import MODELS

    assert set(MODEL_NAMES) == set(MODELS)


def test_discovery_commands(capsys):
    assert main(["algorithms"]) == 0
    assert "fedspray" in capsys.readouterr().out
    assert main(["algorithms", "FedGCN"]) == 0
    out = capsys.readouterr().out
    assert "NeurIPS 2023" in out and "--hops" in out and "fedgcn-table2" in out and "fedgcn/neighbour_sums" in out
    assert main(["algorithms", "gcfl"]) == 0
    out = capsys.readouterr().out
    assert "NeurIPS 2021" in out and "modes: plain, ckks" in out and "--eps1" in out and "gcfl/similarity" in out
    assert main(["attacks"]) == 0
    assert "fedgcn_readout" in capsys.readouterr().out
    assert main(["modes"]) == 0
    assert "mask" in capsys.readouterr().out


@pytest.mark.parametrize("preset", ["fedgcn-table2", "fedomd-table4", "fedspray-table2"])
def test_presets_parse_and_flags_override(preset):
    from secure_fgl.algorithms import get_spec
    from secure_fgl.preflight import check_options

    args, extra = build_parser().parse_known_args(["run", "--preset", preset, "--dataset", "citeseer", "--rounds", "7"])
    cfg = config_from_args(args, extra)
    assert cfg.dataset == "citeseer" and cfg.rounds == 7
    check_options(cfg, get_spec(cfg.algorithm).options)
    if preset == "fedgcn-table2":
        assert (cfg.optimizer, cfg.lr, cfg.local_epochs, cfg.options["hops"]) == ("sgd", 0.5, 3, 1)


def test_cli_modes_are_the_protocol_registry():
    """Cli modes are the protocol registry.

    config.py stays torch/protocol-free for a fast --help, so its mode choices are a copy:
    they must name exactly the protocols' modes, and `secure-fgl modes` describes each.
    """
    import dataclasses

    import protocols
    from secure_fgl.cli.discover import MODES as described
    from secure_fgl.config import RunConfig

    field = {f.name: f for f in dataclasses.fields(RunConfig)}["mode"]
    assert tuple(field.metadata["choices"]) == tuple(protocols.MODES)
    assert set(described) == set(protocols.MODES)


def test_bench_runtime_passes_its_grid_overrides(monkeypatch, tmp_path):
    """Bench runtime passes its grid overrides.

    ``bench --suite runtime --clients/--features/--modes/--executors/--repeats/--ray-cpus`` reach
    the benchmark unchanged (the documented 100-client rows are run this way).
    """
    import secure_fgl.bench.runtime as runtime_bench

    seen = {}
    monkeypatch.setattr(runtime_bench, "run_runtime_bench", lambda out, **kw: seen.update(out=out, **kw))
    rc = main(
        [
            "bench",
            "--suite",
            "runtime",
            "--out",
            str(tmp_path),
            "--clients",
            "100",
            "--features",
            "16",
            "--modes",
            "mask",
            "--executors",
            "local",
            "ray",
            "--repeats",
            "1",
            "--ray-cpus",
            "2",
        ]
    )
    assert rc == 0
    assert seen == {
        "out": str(tmp_path),
        "quick": False,
        "executors": ("local", "ray"),
        "modes": ("mask",),
        "ray_cpus": 2,
        "repeats": 1,
        "clients": [100],
        "features": 16,
    }


def test_bench_dropout_column_takes_ckks_mp_with_its_threshold(monkeypatch, tmp_path, capsys):
    """Bench dropout column takes ckks-mp with its threshold.

    ``bench --suite runtime --dropouts --modes ckks-mp --threshold 7`` reaches the dropout column;
    ckks-mp or --threshold without --dropouts is a usage error.
    """
    import secure_fgl.bench.runtime as runtime_bench

    seen = {}
    monkeypatch.setattr(runtime_bench, "run_dropout_bench", lambda out, **kw: seen.update(kw))
    base = ["bench", "--suite", "runtime", "--out", str(tmp_path), "--modes", "ckks-mp", "--threshold", "7"]
    assert main([*base, "--dropouts"]) == 0
    assert seen["modes"] == ("ckks-mp",) and seen["threshold"] == 7
    assert main(base) == 2
    assert "add --dropouts" in capsys.readouterr().err
