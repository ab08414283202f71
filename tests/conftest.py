"""Shared fixtures: small synthetic federations and the real-data root."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from hypothesis import settings

# timing on a shared 2-core machine is noisy: no per-example deadline; in CI the examples are
# derandomized so a green run is reproducible (locally hypothesis keeps exploring)
settings.register_profile("default", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_finish(session):
    """Freeze what collection imported (torch, PyG, TenSEAL, the packages) out of the garbage collector's reach.

    Every later full collection -- the runs' ``release_freed_memory`` at each executor shutdown, and Python's own --
    then walks only the objects the tests made, not the hundreds of thousands the imports made (which live to the
    end of the session anyway).
    """
    gc.collect()
    gc.freeze()


def real_data_root() -> Path | None:
    """``$SECURE_FGL_DATA`` or ``../shared/datasets`` beside the checkout, if it exists."""
    env = os.environ.get("SECURE_FGL_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "datasets"]:
        if cand.is_dir():
            return cand
    return None


@pytest.fixture
def data_root() -> Path:
    root = real_data_root()
    if root is None:
        pytest.skip("real datasets absent: set SECURE_FGL_DATA to a torch_geometric raw-layout root")
    return root


@pytest.fixture(scope="session", autouse=True)
def _cached_rdp():
    """Opacus' sampled-Gaussian RDP memoized for the session (:func:`support.cached.cache_sampled_gaussian_rdp`)."""
    from support.cached import cache_sampled_gaussian_rdp

    restore = cache_sampled_gaussian_rdp()
    yield
    restore()


@pytest.fixture(autouse=True)
def _one_thread():
    """The CI box has 2 shared cores: one torch thread beats contended threads on tiny graphs."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Processed dataset copies go to a per-session temp cache, never into the data root."""
    monkeypatch.setenv("SECURE_FGL_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def run_small():
    """Start a small run's parties without training them.

    ``run_small(cfg, fed=None, executor=None, transcript=None)``: the run's parties, started but not trained
    (:func:`secure_fgl.runtime.build.start_run`: ``.strategy``, ``.protocol``, ``.runtimes``,
    ``.logic(k)``, ``.train(rounds)``); every executor it started is shut down after the test.
    """
    from secure_fgl.runtime.build import start_run

    started = []

    def run(cfg, fed=None, executor=None, transcript=None):
        started.append(start_run(cfg, fed, executor, transcript))
        return started[-1]

    yield run
    for s in started:
        s.executor.shutdown()
