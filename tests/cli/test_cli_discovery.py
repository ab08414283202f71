"""Discovery commands answer fast and whole.

Discovery commands answer fast and whole (no torch for help and listings, no glued columns, no
description cut mid-sentence, every --dataset name listed), and the bad inputs that used to
give tracebacks or misleading hints are one line, exit 2, naming the fix.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from secure_fgl.cli.main import build_parser, config_from_args, main


def test_help_and_listing_commands_do_not_import_torch():
    code = (
        "import sys, io, contextlib; from secure_fgl.cli.main import main\n"
        "for argv in (['--help'], ['report', '--help'], ['algorithms'], ['modes'], ['datasets'],"
        " ['attacks']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main(argv) == 0, argv\n"
        "    heavy = [m for m in ('torch', 'torch_geometric', 'tenseal', 'matplotlib') if m in sys.modules]\n"
        "    assert not heavy, (argv, heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_modes_attacks_and_datasets_listings_are_whole(tmp_path, capsys):
    from protocols.registry import modes

    assert main(["modes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for mode in modes():  # the name, then at least two spaces
        assert any(re.match(rf"{re.escape(mode)}\s{{2,}}\S", line) for line in lines), mode
    assert main(["attacks"]) == 0
    out = capsys.readouterr().out
    from attacks.runner import ATTACKS
    from secure_fgl.cli.discover import first_paragraph

    flat = " ".join(out.split())
    for cls in ATTACKS.values():  # the whole first paragraph, not its first line
        assert " ".join(first_paragraph(cls.__doc__).split()) in flat, cls.name
    from attacks.catalog import attack_catalog  # the listing's torch-free reading of the classes

    assert [(a.name, a.exchange, a.algorithms, first_paragraph(a.doc)) for a in attack_catalog()] == [
        (cls.name, cls.exchange, cls.algorithms, first_paragraph(cls.__doc__)) for cls in ATTACKS.values()
    ]
    assert main(["datasets", "--data-root", str(tmp_path)]) == 0
    names = {line.split()[0] for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
    assert {"synthetic-graphs", "molecules", "biochem", "mix", "small", "sbm", "Cora"} <= names


def test_dp_epsilon_inf_means_no_dp():
    args, extra = build_parser().parse_known_args(["run", "--dp-epsilon", "inf"])
    assert config_from_args(args, extra).dp_epsilon is None


@pytest.mark.parametrize(
    "argv, content, needle",
    [
        (["run", "--algorithm", "fedavg", "--hops", "2"], None, "--hops is an option of --algorithm fedgcn"),
        (["run", "--config", "{file}"], b"rounds = 2\n# \xff\xfe\n", "is not UTF-8 text"),
        (["run", "--config", "{file}"], b"rounds = 2\noptions = 3\n", "options must be a table"),
    ],
)
def test_former_tracebacks_and_wrong_hints_are_one_line_exit_2(tmp_path, capsys, argv, content, needle):
    path = tmp_path / "cfg.toml"
    if content is not None:
        path.write_bytes(content)
    assert main([a.replace("{file}", str(path)) for a in argv]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "did you mean --heads" not in lines[0], err


def test_missing_data_names_the_cli_fix_first(tmp_path, capsys):
    assert main(["run", "--dataset", "cora", "--data-root", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--data-root" in err and "from Python, allow_download=True" in err
    assert "run folder:" not in err  # the data check fails before the folder is announced
