"""Fixtures of the report tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def png_figures(monkeypatch):
    """Write the report's figures as PNG only (the report embeds them in its HTML).

    For tests of what a report holds; drawing every figure as PDF and SVG too costs most of their time. The three
    formats are checked by ``test_report_figures.py``, ``test_report_references.py`` and
    ``test_report_sweep_file.py``.
    """
    from secure_fgl.report import style

    monkeypatch.setattr(style, "FORMATS", (".png",))
