"""Memory of the client runtimes.

100 clients within 8 GB. A client holds its compact rows while a row sum streams, keeps only the rows it asked for
of the blocks it decodes, and a host process can measure itself and give freed memory back.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
from support.runs import small

from protocols.party import ClientHalf
from protocols.row_blocks import BlockRows
from secure_fgl.algorithms.fedgcn import client as fedgcn_client
from secure_fgl.algorithms.fedgcn.ops import TAG
from secure_fgl.experiment import run_experiment
from secure_fgl.runtime import memory
from secure_fgl.runtime.exchange import keep_rows, rows_table


@pytest.mark.parametrize("layout", ["sparse", "dense"])
def test_a_row_contribution_stays_compact_and_reads_as_its_dense_blocks(layout):
    rng = np.random.default_rng(0)
    rpb, dim, num_blocks = 4, 3, 6
    ids = rng.choice(num_blocks * rpb, size=9, replace=False)
    rows = rng.normal(size=(ids.size, dim))
    table = rows_table(SimpleNamespace(block_len=rpb * dim, num_blocks=num_blocks, layout=layout), ids, rows)
    assert isinstance(table.values, BlockRows)  # nothing dense is held
    full = np.zeros((num_blocks * rpb, dim))
    full[ids] = rows
    expected_ids = np.arange(num_blocks) if layout == "dense" else np.unique(ids // rpb)
    assert np.array_equal(table.ids, expected_ids)
    assert np.array_equal(np.asarray(table.values), full.reshape(num_blocks, rpb * dim)[expected_ids])
    assert np.array_equal(table.values[1:3], np.asarray(table.values)[1:3])  # a chunk, as the ckks half reads it


@pytest.mark.parametrize("mode", ["mask", "ckks"])
def test_a_fedgcn_client_keeps_only_the_rows_it_requested(mode, monkeypatch):
    """A fedgcn client keeps only the rows it requested.

    The neighbour sums decode in whole blocks; each client half keeps exactly its requested
    rows of them (not the blocks), and the run is the one whose clients kept whole blocks.
    """
    kept = {}
    deliver = ClientHalf.deliver

    def spy(self, blocks):
        deliver(self, blocks)
        if self.plan.tag == TAG:
            logic = self.provider.__self__
            kept[self.id] = (
                sum(v.size for v in self._result[1].values()),
                np.unique(logic.request_rows).size * (logic.facts.num_features + 1),
                len(blocks) * self.plan.block_len,
            )

    monkeypatch.setattr(ClientHalf, "deliver", spy)
    cfg = small("fedgcn", mode, executor="local", rounds=2)
    rows_only = run_experiment(cfg, progress=False)
    assert sorted(kept) == [0, 1, 2]
    for k, (held, requested, whole) in kept.items():
        assert held == requested < whole, k
    monkeypatch.setattr(fedgcn_client, "keep_rows", lambda *a, whole_blocks: keep_rows(*a, whole_blocks=True))
    kept.clear()
    whole = run_experiment(cfg, progress=False)
    assert all(held == whole for held, _, whole in kept.values())
    losses = [[r["train_loss"] for r in run["rounds"]] for run in (rows_only, whole)]
    assert losses[0] == pytest.approx(losses[1], abs=1e-6 if mode == "ckks" else 0)


#: run in a fresh interpreter: a test process's heap holds free chunks of earlier tests, from which
#: the pins could be served, so freeing the buffers would shrink the heap before any trim
_FREED_BUFFERS_CHECK = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("memory", sys.argv[1])
memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory)
if memory._glibc() is None:
    sys.exit(3)
size = 1 << 16                       # below glibc's mmap threshold: heap memory
buffers, pins = [], []
for _ in range(1024):
    buffers.append(bytearray(size))
    buffers[-1][::4096] = b"\\1" * len(buffers[-1][::4096])       # touch every page
    pins.append(bytearray(2048))     # a live block after each buffer: the heap cannot shrink from its top
held = memory.process_pss(os.getpid())["Pss_Anon"]
del buffers
after_free = memory.process_pss(os.getpid())["Pss_Anon"]
memory.release_freed_memory()
print(held, after_free, memory.process_pss(os.getpid())["Pss_Anon"])
"""


def test_a_process_reads_its_pss_and_gives_freed_buffers_back():
    import subprocess
    import sys

    own = memory.process_pss(os.getpid())
    if own is None:
        pytest.skip("no /proc/PID/smaps_rollup on this system")
    assert own["Pss"] >= own["Pss_Anon"] > 0
    assert memory.process_pss(2**31 - 1) is None  # no such process
    done = subprocess.run(
        [sys.executable, "-c", _FREED_BUFFERS_CHECK, memory.__file__], capture_output=True, text=True, timeout=60
    )
    if done.returncode == 3:
        pytest.skip("the C library is not glibc")
    assert done.returncode == 0, done.stderr
    held, after_free, after_release = map(int, done.stdout.split())
    assert after_free > held - 16 * (1 << 20)  # freed, still held
    assert after_release < held - 48 * (1 << 20)


def test_a_pinned_client_loads_its_own_partition_and_refuses_another():
    """A pinned client loads its own partition and refuses another.

    A client pinned to a node gets the digest of its data, not the data; its runtime loads and
    partitions the dataset there and holds exactly the subgraph the driver planned.
    """
    import dataclasses

    import torch

    from secure_fgl.experiment import load_federation
    from secure_fgl.runtime import partition, wire
    from secure_fgl.runtime.client import DATA_FIELDS, ClientRuntime
    from secure_fgl.runtime.facts import PublicFacts
    from secure_fgl.runtime.strategy import Strategy

    cfg = small("fedavg", "plain", executor="ray", ray_client_resources="site_a:1").validate()
    fed = load_federation(cfg)
    frames = Strategy.client_frames(fed, cfg, PublicFacts.of(fed), {}, None)
    shipped, pinned = wire.unpack(frames[0]), wire.unpack(frames[1])
    assert "x" in shipped and not set(DATA_FIELDS) & set(pinned) and "far_owner" not in pinned
    assert len(frames[1]) < len(frames[0]) / 10
    partition.forget()
    built = ClientRuntime(frames[1])
    c = fed.clients[1]
    assert all(torch.equal(getattr(built.data, f), getattr(c, f)) for f in DATA_FIELDS)
    assert torch.equal(built.far_owner, partition.far_owners(fed, c))
    other = dataclasses.replace(cfg, seed=cfg.seed + 1)  # another partition of the same dataset
    forged = wire.pack({**pinned, "config": other.to_dict()})
    partition.forget()
    with pytest.raises(ValueError, match="differs from the driver's"):
        ClientRuntime(forged)
    partition.forget()


@pytest.mark.parametrize("attacks", [[], ["fedgcn_client_subtraction"]])
def test_a_run_keeps_message_payloads_only_for_its_attacks(attacks, monkeypatch):
    """A run keeps message payloads only for its attacks.

    Without ``--attacks`` the transcript keeps metadata only: the neighbour sums' uploads and
    downloads are not held for the rest of the run (``runtime.build.run_transcript``); the byte counts
    are the same either way.
    """
    import secure_fgl.runtime.build as build

    made, real = [], build.make_run_protocol
    monkeypatch.setattr(build, "make_run_protocol", lambda *a, **kw: made.append(real(*a, **kw)) or made[-1])
    result = run_experiment(small("fedgcn", "plain", executor="local", rounds=1, attacks=attacks), progress=False)
    sums = [m for m in made[0].transcript.messages if m.tag == TAG and m.kind == "plain"]
    assert sums and result["comm"]["per_tag"][TAG]["bytes_up"] > 0
    assert all((m.payload is not None) == bool(attacks) for m in sums)
