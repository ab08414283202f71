"""protocols/ imports without cycles: every module of the package can be imported first, on its own.

The import graph is read statically (:mod:`support.imports`): an edge ``a -> b`` for every
``import`` of module ``b`` of the package in module ``a``, at module level or inside a function (a
function-level import that closes a cycle only hides it until that function runs).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.imports import ROOT, import_graph, strongly_connected


def test_the_graph_sees_the_package():
    graph = import_graph("protocols")
    assert "protocols.exchange" in graph["protocols.base"]
    assert "protocols.mask.client" in graph["protocols.mask.backend"]


def test_protocols_has_no_import_cycle():
    assert strongly_connected(import_graph("protocols")) == []


def test_a_cycle_is_found():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "module", ["protocols.dp", "protocols.exchange", "protocols.mask.server", "protocols.similarity"]
)
def test_a_module_imports_first_on_its_own(module):
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
