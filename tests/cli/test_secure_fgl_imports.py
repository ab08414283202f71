"""secure_fgl/ imports without cycles, and the command line's first imports need no torch.

The import graph is read statically (:mod:`support.imports`), function-level imports included, and
with the packages each import loads (importing ``secure_fgl.engine.rng`` runs
``secure_fgl/engine/__init__.py`` first).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.imports import ROOT, import_graph, strongly_connected


def test_the_graph_sees_the_package():
    graph = import_graph("secure_fgl", parents=True)
    assert "secure_fgl.runtime.messages" in graph["secure_fgl.runtime.strategy"]
    assert "secure_fgl.engine" in graph["secure_fgl.algorithms.fedavg.client"]  # the package of engine.rng


def test_secure_fgl_has_no_import_cycle():
    assert strongly_connected(import_graph("secure_fgl", parents=True)) == []


@pytest.mark.parametrize(
    "module,absent",
    [
        ("secure_fgl.cli.main", "torch"),  # --help and every one-line refusal before a run
        ("secure_fgl.preflight", "torch"),
        ("secure_fgl.engine.rng", "secure_fgl.config"),  # a client logic's randomness, not the round loop
    ],
)
def test_a_module_imports_first_on_its_own_without(module, absent):
    code = f"import sys, {module}; assert {absent!r} not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
